"""Benchmark the stage-5 loader: peak memory of a full epoch, and its speed against a floor.

    uv run bench/bench_stage5.py                      # 2,000 and 20,000 samples, 3 repeats
    uv run bench/bench_stage5.py --sizes 2000 --repeats 1

1. Peak memory. A full epoch of PackedDataLoader (2 workers) runs in a fresh process; the table
   gives the peak resident memory of the main process and of the largest worker (getrusage).
   Packs are planned from lengths, and images are decoded only for packs about to be yielded, so
   neither should grow with the dataset: compare the rows for 2,000 and 20,000 samples.
2. Speed. In the same run, alternating, each --repeats times:
   - floor: a DataLoader (2 workers, same batch size in samples) that only decodes and resizes
     the images of the same rows: the work no pipeline can skip;
   - stage 5: the whole PackedDataLoader epoch (planning, packing, tokenizing, decoding,
     padding, collating) with the weights cached (every run after the first), with pre-tokenized
     rows (`pretokenize=True`, tokens cached), and with the weighing done from scratch (an empty
     cache: the very first run).
   It reports the median samples/s of each and how much stage 5 adds on top of the floor.
"""

import argparse
import contextlib
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

import torch
from torch.utils.data import DataLoader, Dataset

from mmdp.data.images import load_image
from mmdp.data.sources import load_vqa_dataset
from mmdp.data.tokenizer import get_tokenizer
from mmdp.data.vqa_dataset import VQADataset
from mmdp.packing.packed_dataset import PackedDataLoader, PackedDataset


class ImagesOnly(Dataset):
    """The floor: decode and resize a row's images, nothing else."""

    def __init__(self, rows):
        self.rows = rows

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, index):
        images = [load_image(image)[0] for image in self.rows[index]["images"] or []]
        return torch.stack(images) if images else torch.zeros(0, 3, 256, 256)


def floor_epoch(rows, workers: int, batch_size: int) -> tuple[float, int]:
    start = time.perf_counter()
    loader = DataLoader(
        ImagesOnly(rows), batch_size=batch_size, num_workers=workers, collate_fn=torch.cat
    )
    for _ in loader:
        pass
    return time.perf_counter() - start, len(rows)


def stage5_epoch(rows, tokenizer, workers: int, pretokenize=False) -> tuple[float, float, int]:
    """(seconds to weigh the rows or load their weights, seconds for the epoch itself, samples)."""
    start = time.perf_counter()
    dataset = PackedDataset(VQADataset(rows, tokenizer), pretokenize=pretokenize)
    weighed = time.perf_counter()
    samples = 0
    for batch in PackedDataLoader(dataset, num_workers=workers):
        samples += len(batch["sample_index"])
    return weighed - start, time.perf_counter() - weighed, samples


@contextlib.contextmanager
def cache_at(path: str):
    """Weigh into (and read weights from) another cache folder for a while."""
    saved = os.environ.get("MMDP_CACHE")
    os.environ["MMDP_CACHE"] = path
    try:
        yield
    finally:
        if saved is None:
            del os.environ["MMDP_CACHE"]
        else:
            os.environ["MMDP_CACHE"] = saved


def child(size: int, workers: int):
    """One full stage-5 epoch in this process; prints its peak memory as JSON."""
    rows = load_vqa_dataset(num_rows=size)
    weigh, epoch, samples = stage5_epoch(rows, get_tokenizer(), workers)
    seconds = weigh + epoch
    kib = 1024  # ru_maxrss is in KiB on Linux
    print(
        json.dumps(
            {
                "size": size,
                "samples": samples,
                "seconds": seconds,
                "main_peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / kib,
                "largest_worker_peak_mib": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
                / kib,
            }
        )
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[2_000, 20_000])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        return child(args.child, args.workers)

    print("Peak memory of one stage-5 epoch (fresh process each):\n")
    print("| samples | epoch s | main process peak MiB | largest worker peak MiB |")
    print("| ---: | ---: | ---: | ---: |")
    for size in args.sizes:
        load_vqa_dataset(num_rows=size)  # generate the cache first, outside the measurement
        out = subprocess.run(
            [sys.executable, __file__, "--child", str(size), "--workers", str(args.workers)],
            capture_output=True,
            text=True,
            check=True,
        )
        r = json.loads(out.stdout.strip().splitlines()[-1])
        print(
            f"| {r['samples']:,} of {size:,} | {r['seconds']:.1f} | "
            f"{r['main_peak_mib']:.0f} | {r['largest_worker_peak_mib']:.0f} |",
            flush=True,
        )

    size = args.sizes[0]
    rows = load_vqa_dataset(num_rows=size)
    tokenizer = get_tokenizer()
    floor, cached, pretokenized, cold = [], [], [], []
    stage5_epoch(rows, tokenizer, args.workers, pretokenize=True)  # cache the tokens, untimed
    for _ in range(args.repeats):
        seconds, samples = floor_epoch(rows, args.workers, batch_size=32)
        floor.append(samples / seconds)
        weigh, epoch, samples = stage5_epoch(rows, tokenizer, args.workers)
        cached.append(samples / (weigh + epoch))
        weigh, epoch, samples = stage5_epoch(rows, tokenizer, args.workers, pretokenize=True)
        pretokenized.append(samples / (weigh + epoch))
        with tempfile.TemporaryDirectory() as empty, cache_at(empty):
            weigh, epoch, samples = stage5_epoch(rows, tokenizer, args.workers)
        cold.append(samples / (weigh + epoch))
    floor_rate = statistics.median(floor)
    rates = {
        "stage 5, weights cached (every run after the first)": cached,
        "stage 5, pre-tokenized rows (`--pretokenize`, cached)": pretokenized,
        "stage 5, weighing every row first (an empty cache: the very first run)": cold,
    }
    print(
        f"\nSpeed on {size:,} samples, {args.workers} workers, median of {args.repeats} "
        f"alternating runs:\n"
    )
    print("| loader | samples/s | time over the floor |")
    print("| --- | ---: | ---: |")
    print(f"| floor: decode + resize the images only | {floor_rate:,.0f} | |")
    for name, values in rates.items():
        rate = statistics.median(values)
        print(f"| {name} | {rate:,.0f} | {floor_rate / rate - 1:+.1%} |")


if __name__ == "__main__":
    main()
