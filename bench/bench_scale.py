"""Stage 5 at real dataset sizes: weigh once (in parallel, cached), plan with flat arrays, start fast.

    uv run bench/bench_scale.py                                   # 20k, 200k, 1M rows (~22 min on 2 cores)
    uv run bench/bench_scale.py --sizes 20000 --plan-rows 2000000 # quicker
    uv run bench/bench_scale.py --plan-only --rows 100000000      # planning alone (1-4 min)
    uv run bench/bench_scale.py --plan-only --rows 100000000 --planning-workers 1  # one process
    uv run bench/bench_scale.py --plan-only --rows 400            # the smallest run (the tests')

The embedded dataset (2,000 rows) is replicated with `datasets.concatenate_datasets` to each size.
Every measurement runs in a fresh process (peak memory is per process), on this machine:

1. Weighing, cold (an empty cache) with 1 process and with every core, then warm (cached).
2. A warm start, as a restart or another rank sees it: load the dataset and the cached weights,
   plan the epoch, start the DataLoader (2 workers) and get the first batch; peak memory of the
   main process and of the largest worker over the first batches; what each worker receives
   (the pickled PackedDataset) per row; planning alone.
3. Loader speed over the first --batches batches against a floor that only decodes and resizes
   the images of the same rows, with and without pre-tokenized rows.
4. Planning alone for --plan-rows rows (the embedded weights tiled): its time, and its peak
   memory over what the process held just before planning (the weights included), read from
   /proc/self/status after resetting the peak (`clear_refs`), in bytes a row. Fewer rows than
   the embedded dataset's are weighed alone, not tiled. The last line: the rows planned, the
   seconds and the peak bytes a row over the weights.
"""

import argparse
import json
import os
import pickle
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch
from datasets import concatenate_datasets
from torch.utils.data import DataLoader

from mmdp.data.images import load_image
from mmdp.data.reading.sources import load_vqa_dataset
from mmdp.data.tokenizer import get_tokenizer
from mmdp.data.vqa_dataset import VQADataset
from mmdp.loading.packed_dataset import PackedDataLoader, PackedDataset
from mmdp.packing.packing_config import PackingConfig
from mmdp.packing.weights import Weights
from mmdp.planning import planner
from mmdp.planning.planner import plan_epoch
from mmdp.weighing.weigh import weigh_rows

BASE_ROWS = 2_000
CONFIG = PackingConfig(max_length=512, max_images=18, packs_per_batch=8)


def replicated(size: int):
    base = load_vqa_dataset(num_rows=BASE_ROWS)
    copies = -(-size // BASE_ROWS)
    return concatenate_datasets([base] * copies).select(range(size))


def peak_mib() -> dict:
    kib = 1024  # ru_maxrss is in KiB on Linux
    return {
        "main_peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / kib,
        "largest_child_peak_mib": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / kib,
    }


def status_kib(field: str) -> int:
    """A figure of /proc/self/status, in KiB: VmRSS (resident now) or VmHWM (peak resident)."""
    with open("/proc/self/status") as status:
        return int(re.search(rf"{field}:\s+(\d+)", status.read()).group(1))


def reset_peak() -> None:
    """From now on VmHWM counts from the resident memory of this moment (Linux: clear_refs 5)."""
    with open("/proc/self/clear_refs", "w") as clear_refs:
        clear_refs.write("5")


def child_weigh(size: int, num_proc: int) -> dict:
    """Weigh `size` rows into the (empty) cache given by MMDP_CACHE, then again (warm)."""
    rows, tokenizer = replicated(size), get_tokenizer()
    cold = weigh_rows(rows, tokenizer, num_proc=num_proc)
    warm = weigh_rows(rows, tokenizer, num_proc=num_proc)
    assert cold.weighed_here and not warm.weighed_here
    return {"cold_s": cold.seconds, "warm_s": warm.seconds, **peak_mib()}


def child_start(size: int, batches: int, pretokenize: bool) -> dict:
    """A warm start to the first batch, then --batches batches; the cache holds the weights."""
    start = time.perf_counter()
    rows = replicated(size)
    dataset = PackedDataset(
        VQADataset(rows, get_tokenizer()), config=CONFIG, pretokenize=pretokenize
    )
    assert batches == 1 or not dataset.weighing.weighed_here, "the weights should be cached"
    plan_start = time.perf_counter()
    dataset.plan()
    planned = time.perf_counter()
    worker_bytes = len(pickle.dumps(dataset))
    loader = iter(PackedDataLoader(dataset, num_workers=2))
    first = next(loader)
    first_batch_s = time.perf_counter() - start
    samples, timed_start = 0, time.perf_counter()
    rows_seen = first["sample_index"].tolist()
    for _, batch in zip(range(batches), loader):
        samples += len(batch["sample_index"])
        rows_seen += batch["sample_index"].tolist()
    seconds = time.perf_counter() - timed_start
    return {
        "first_batch_s": first_batch_s,
        "plan_s": planned - plan_start,
        "worker_bytes_per_row": worker_bytes / size,
        "samples_per_s": samples / seconds,
        "rows": rows_seen,
        **peak_mib(),
    }


class ImagesOnly(torch.utils.data.Dataset):
    """The floor: decode and resize a row's images, nothing else."""

    def __init__(self, rows, indices):
        self.rows, self.indices = rows.select_columns(["images"]), indices

    def __len__(self):
        return len(self.indices)

    def __getitem__(self, i):
        images = [load_image(image)[0] for image in self.rows[self.indices[i]]["images"] or []]
        return torch.stack(images) if images else torch.zeros(0, 3, 256, 256)


def child_floor(size: int, rows_seen: list[int]) -> dict:
    """Decode and resize the images of the rows the loader yielded, timed as the loader is: from
    the first batch on (the workers have started), over the batches after it."""
    rows = replicated(size)
    loader = DataLoader(
        ImagesOnly(rows, rows_seen),
        batch_size=32,
        num_workers=2,
        collate_fn=lambda images: (len(images), torch.cat(images)),
    )
    batches = iter(loader)
    next(batches)
    samples, start = 0, time.perf_counter()
    for count, _ in batches:
        samples += count
    return {"samples_per_s": samples / (time.perf_counter() - start)}


def child_plan(rows: int, workers: int | None = None) -> dict:
    """Plan `rows` rows: the embedded dataset's weights, tiled; `workers` processes pack the
    buffers (None: as many as the planner chooses,
    mmdp.planning.planner.planning_workers)."""
    if workers is not None:
        planner.planning_workers = lambda num_buffers: workers
    embedded = load_vqa_dataset(num_rows=min(rows, BASE_ROWS))  # a smoke run weighs fewer
    base = weigh_rows(embedded, get_tokenizer()).weights
    copies = -(-rows // len(embedded))
    weights = Weights(
        *(np.tile(a, copies)[:rows] for a in (base.lengths, base.image_counts, base.reasons))
    )
    del base
    baseline_kib = status_kib("VmRSS")  # torch, datasets, the tokenizer, and the weights
    reset_peak()
    start, cpu_start = time.perf_counter(), time.process_time()
    plan = plan_epoch(weights, CONFIG)
    seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu_start
    peak_kib = status_kib("VmHWM")
    plan_bytes = sum(a.nbytes for a in (plan.rows, plan.pack_starts, plan.batch_starts))
    mine = plan.for_rank(0)
    return {
        "plan_s": seconds,
        "plan_cpu_s": cpu_seconds,
        "workers": planner.planning_workers(-(-rows // CONFIG.buffer_size)),
        "packs": len(plan.pack_starts) - 1,
        "baseline_mib": baseline_kib / 1024,
        "weights_bytes_per_row": sum({id(a): a.nbytes for a in vars(weights).values()}.values())
        / rows,
        "over_baseline_mib": (peak_kib - baseline_kib) / 1024,
        "over_baseline_bytes_per_row": (peak_kib - baseline_kib) * 1024 / rows,
        "plan_bytes_per_row": plan_bytes / rows,
        "rank_plan_bytes_per_row": (mine.rows.nbytes + mine.pack_starts.nbytes) / rows,
        **peak_mib(),
    }


def run_child(kind: str, *values) -> dict:
    """Run child_<kind>(*values) in a fresh process; returns what it measured."""
    out = subprocess.run(
        [sys.executable, __file__, "--child", kind, *map(json.dumps, values)],
        capture_output=True,
        text=True,
    )
    if out.returncode:
        raise RuntimeError(out.stderr[-3000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[20_000, 200_000, 1_000_000])
    parser.add_argument("--plan-rows", "--rows", type=int, default=24_000_000)
    parser.add_argument(
        "--plan-only", action="store_true", help="only plan --rows rows (step 4), nothing else"
    )
    parser.add_argument(
        "--planning-workers",
        type=int,
        default=None,
        help="processes that pack the buffers when planning (default: the planner's choice)",
    )
    parser.add_argument("--batches", type=int, default=150, help="batches timed per loader run")
    parser.add_argument("--repeats", type=int, default=3, help="loader and floor runs (median)")
    parser.add_argument(
        "--pretokenized-up-to",
        type=int,
        default=200_000,
        help="time the pre-tokenized loader up to this many rows (pre-tokenizing "
        "is a slower weighing, once per size)",
    )
    parser.add_argument("--child", nargs="+", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        kind, *rest = args.child
        functions = {
            "weigh": child_weigh,
            "start": child_start,
            "floor": child_floor,
            "plan": child_plan,
        }
        values = [json.loads(value) for value in rest]
        print(json.dumps(functions[kind](*values)))
        return

    cores = os.cpu_count()
    print(f"{cores} cores; every figure from a fresh process\n")
    if args.plan_only:
        return print_plan(args.plan_rows, run_child("plan", args.plan_rows, args.planning_workers))
    with tempfile.TemporaryDirectory(prefix="mmdp-bench-") as cache:
        os.environ["MMDP_CACHE"] = cache  # the children inherit it
        weights_dir = os.path.join(cache, "weights")
        load_vqa_dataset(num_rows=BASE_ROWS)  # generate the embedded dataset, outside timings
        for size in args.sizes:
            shutil.rmtree(weights_dir, ignore_errors=True)
            one = run_child("weigh", size, 1)
            shutil.rmtree(weights_dir, ignore_errors=True)
            every = run_child("weigh", size, cores)
            modes = (False, True) if size <= args.pretokenized_up_to else (False,)
            if True in modes:
                run_child("start", size, 1, True)  # pre-tokenize once, untimed
            runs, floors = {False: [], True: []}, []
            for _ in range(args.repeats):
                for pretokenize in modes:
                    runs[pretokenize].append(run_child("start", size, args.batches, pretokenize))
                floors.append(run_child("floor", size, runs[False][-1]["rows"]))
            floor = statistics.median(f["samples_per_s"] for f in floors)
            print_size(size, cores, one, every, runs, floor)
        plan = run_child("plan", args.plan_rows)
    print_plan(args.plan_rows, plan)


def print_plan(rows: int, plan: dict) -> None:
    print(
        f"\nPlanning alone, {rows:,} rows (the embedded weights tiled): "
        f"{plan['plan_s']:.1f} s ({plan['plan_cpu_s']:.1f} s of CPU in the main process), "
        f"{plan['packs']:,} packs, {plan['workers']} packing process(es)"
    )
    print(
        f"  peak memory {plan['over_baseline_mib']:,.0f} MiB over the "
        f"{plan['baseline_mib']:,.0f} MiB the process held before planning "
        f"({plan['over_baseline_bytes_per_row']:.1f} bytes a row; the weights, "
        f"{plan['weights_bytes_per_row']:.0f} bytes a row, are in the baseline); "
        f"process peak {plan['main_peak_mib']:,.0f} MiB"
    )
    print(
        f"  the plan holds {plan['plan_bytes_per_row']:.1f} bytes a row, "
        f"a rank's plan {plan['rank_plan_bytes_per_row']:.1f}"
    )
    print(
        f"{rows:,} rows planned in {plan['plan_s']:.1f} s, peak "
        f"{plan['over_baseline_bytes_per_row']:.1f} bytes a row over the weights"
    )


def print_size(size: int, cores: int, one: dict, every: dict, runs: dict, floor: float) -> None:
    def median(key, pretokenize=False):
        return statistics.median(r[key] for r in runs[pretokenize])

    print(f"{size:,} rows:")
    print(
        f"  weighing cold, 1 process: {one['cold_s']:.1f} s ({1e6 * one['cold_s'] / size:.0f} µs a row)"
    )
    print(
        f"  weighing cold, {cores} processes: {every['cold_s']:.1f} s ({one['cold_s'] / every['cold_s']:.2f}x)"
    )
    print(f"  weighing warm (cached): {every['warm_s']:.2f} s")
    print(f"  planning: {median('plan_s'):.2f} s")
    print(f"  warm start to the first batch: {median('first_batch_s'):.2f} s")
    print(f"  a worker receives {median('worker_bytes_per_row'):.1f} bytes per row")
    print(
        f"  peak memory: main {median('main_peak_mib'):.0f} MiB, largest worker {median('largest_child_peak_mib'):.0f} MiB"
    )
    for pretokenize in [p for p in (False, True) if runs[p]]:
        rate = median("samples_per_s", pretokenize)
        name = "pre-tokenized" if pretokenize else "tokenizing each pack"
        print(
            f"  loader, {name}: {rate:,.0f} samples/s ({floor / rate - 1:+.1%} over the decode floor, {floor:,.0f} samples/s)",
            flush=True,
        )


if __name__ == "__main__":
    main()
