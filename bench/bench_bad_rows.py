"""Benchmark what bad rows cost: a clean epoch against one where 1 row in 10 is bad (issue 22).

    uv run bench/bench_bad_rows.py                        # 2,000 rows, 5 runs of each
    uv run bench/bench_bad_rows.py --num-rows 10000 --repeats 3

The same rows twice: the embedded dataset's first 2,000 rows (repeated, for more), and a
copy with every 10th row broken by tests/bad_rows.py (its 23 ways in turn: dropped with a
reason, converted, or trained on as they are). For each, alternating clean and bad, --repeats
times: weighing every row (without the cache) and one planned epoch (512 tokens, 8 packs per
batch, images_first_bfd), in this process (no DataLoader workers: the figure is the work itself,
and CPU time, which other jobs on a busy machine disturb less than wall time, is given too).
Prints the medians, per trained sample, and the bad epoch's time over the clean one's. Takes
about 2 minutes for 2,000 rows on a busy 2-core machine.
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

from mmdp.data.families import family_for
from mmdp.data.reading.sources import load_vqa_dataset
from mmdp.data.tokenizer import get_tokenizer
from mmdp.data.vqa_dataset import VQADataset
from mmdp.loading.packed_dataset import PackedDataLoader, PackedDataset
from mmdp.packing.packing_config import PackingConfig
from mmdp.report.pack_report import PackReport
from mmdp.weighing import weigh as weighing

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from bad_rows import with_bad_rows  # noqa: E402 (the fault tests' bad rows)

GOOD_ROWS = 2000  # distinct rows of the embedded dataset; more are repeats of these


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--num-rows", type=int, default=2000, help="rows in each dataset")
    parser.add_argument("--every", type=int, default=10, help="1 row in this many is bad")
    parser.add_argument("--repeats", type=int, default=5, help="runs of each, alternating")
    return parser.parse_args()


def timed(work, *args) -> tuple[float, float, object]:
    """(wall seconds, CPU seconds of this process, result) of `work(*args)`."""
    wall, cpu = time.perf_counter(), time.process_time()
    result = work(*args)
    return time.perf_counter() - wall, time.process_time() - cpu, result


def weigh_all(rows, tokenizer) -> None:
    weighing.weigh(rows, family_for(tokenizer), False, 1, None)  # every row, no cache


def epoch(dataset: PackedDataset) -> PackReport:
    report = PackReport()
    for batch in PackedDataLoader(dataset, num_workers=0):
        report.add_batch(batch)
    return report


def measure(datasets: dict, tokenizer, repeats: int) -> dict:
    """{(name, phase): [(wall, cpu), ...]}, clean and bad in turn, weighing then an epoch."""
    times = {(name, phase): [] for name in datasets for phase in ("weigh", "epoch")}
    samples = {}
    for run in range(repeats):
        for name, (rows, packed) in datasets.items():
            wall, cpu, _ = timed(weigh_all, rows, tokenizer)
            times[name, "weigh"].append((wall, cpu))
            wall, cpu, report = timed(epoch, packed)
            times[name, "epoch"].append((wall, cpu))
            samples[name] = report.samples
            print(f"run {run + 1}/{repeats} {name}: epoch {wall:.1f} s, {report.samples:,} samples")
    return {"times": times, "samples": samples}


def main():
    args = parse_args()
    tokenizer = get_tokenizer()
    good = load_vqa_dataset(None, num_rows=GOOD_ROWS)
    good = good.select([i % len(good) for i in range(args.num_rows)])
    bad, drops, _ = with_bad_rows(good, args.every)
    print(f"{args.num_rows:,} rows; bad: 1 in {args.every}, {sum(drops.values()):,} to drop")
    config = PackingConfig(max_length=512, packs_per_batch=8)
    datasets = {
        name: (rows, PackedDataset(VQADataset(rows, tokenizer), config=config))
        for name, rows in (("clean", good), ("bad", bad))
    }
    measured = measure(datasets, tokenizer, args.repeats)
    median = {
        key: [statistics.median(t[i] for t in runs) for i in (0, 1)]
        for key, runs in measured["times"].items()
    }
    print(f"\nmedians of {args.repeats} runs (wall s, CPU s; per trained sample in ms)")
    for (name, phase), (wall, cpu) in median.items():
        per_sample = 1000 * wall / measured["samples"][name]
        print(f"  {name:5} {phase:5} {wall:7.2f} {cpu:7.2f}   {per_sample:.2f} ms/sample")
    for phase in ("weigh", "epoch"):
        ratio = median["bad", phase][0] / median["clean", phase][0]
        cpu_ratio = median["bad", phase][1] / median["clean", phase][1]
        print(f"bad / clean, {phase}: {ratio:.3f} wall, {cpu_ratio:.3f} CPU")
    kept = measured["samples"]["bad"] / measured["samples"]["clean"]
    print(f"samples trained, bad / clean: {kept:.3f}")
    wall, cpu = (median["bad", "epoch"][i] / median["clean", "epoch"][i] / kept for i in (0, 1))
    print(f"epoch time per trained sample, bad / clean: {wall:.3f} wall, {cpu:.3f} CPU")


if __name__ == "__main__":
    main()
