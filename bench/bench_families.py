"""What weighing a row costs for each model family: TinyVLM's rule beside the real processors'.

    uv run bench/bench_families.py              # about a minute on 2 cores
    uv run bench/bench_families.py --rows 1000 --repeats 5

Every family weighs the same rows of the embedded dataset in this process (no datasets.map, no
cache: `ModelFamily.weigh` itself, which is what every DataLoader worker of the streaming loader
and every process of the planned weighing run), in turns, so that all meet the same load; the
median of the repeats, in microseconds a row. A real family reads every image's header (never
its pixels) and renders its own chat template; TinyVLM counts images and renders ChatML. The
last line: the real families' time a row against TinyVLM's, fastest to slowest.
"""

import argparse
import statistics
import time

from mmdp.data.families import OFFLINE, family_for, offline_processor
from mmdp.data.reading.sources import load_vqa_dataset
from mmdp.data.tokenizer import get_tokenizer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=500, help="rows weighed per run (default 500)")
    parser.add_argument("--repeats", type=int, default=3, help="runs per family (default 3)")
    args = parser.parse_args()
    rows = load_vqa_dataset(None, num_rows=max(args.rows, 2000)).select(range(args.rows))
    texts, images = rows["texts"], rows["images"]
    families = {"tiny": family_for(get_tokenizer())}
    families.update({name: family_for(offline_processor(name)) for name in OFFLINE})
    seconds = {name: [] for name in families}
    for _ in range(args.repeats):
        for name, family in families.items():
            start = time.perf_counter()
            family.weigh(texts, images)
            seconds[name].append(time.perf_counter() - start)
    tiny = statistics.median(seconds["tiny"])
    print(f"Weighing {args.rows:,} rows in one process, median of {args.repeats} runs:\n")
    print("| family | µs a row | against tiny |")
    print("| --- | ---: | ---: |")
    against = {name: statistics.median(runs) / tiny for name, runs in seconds.items()}
    for name, runs in seconds.items():
        median = statistics.median(runs)
        print(f"| {name} | {median / args.rows * 1e6:,.0f} | {against[name]:.2f}x |")
    real = [ratio for name, ratio in against.items() if name != "tiny"]
    print(f"\nthe real families weigh a row in {min(real):.2f}x-{max(real):.2f}x tiny's time")


if __name__ == "__main__":
    main()
