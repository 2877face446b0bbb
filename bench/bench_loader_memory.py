"""Does the stage-5 loader's memory stay flat as the dataset grows?

    uv run bench/bench_loader_memory.py                   # 2,000 and 20,000 rows, a few minutes
    uv run bench/bench_loader_memory.py --sizes 600 6000

A full epoch of PackedDataLoader (2 workers) runs in a fresh process for each of --sizes rows of
the embedded dataset. Packs are planned from lengths, and images are decoded only for packs about
to be yielded, so neither should grow with the dataset. It prints one table: for each size the
samples yielded, the epoch's seconds (weighing the rows included when their weights are not
cached yet), and the peak resident memory of the main process and of the largest worker
(getrusage).
"""

import argparse
import json
import time

from loader_epochs import in_fresh_process, loader_epoch, packed_dataset, peak_mib

from mmdp.data.reading.sources import load_vqa_dataset
from mmdp.data.tokenizer import get_tokenizer


def child(size: int, workers: int):
    """One full stage-5 epoch in this process; prints its peak memory as JSON."""
    rows = load_vqa_dataset(num_rows=size)
    start = time.perf_counter()
    _, seen = loader_epoch(packed_dataset(rows, get_tokenizer()), workers)
    seconds = time.perf_counter() - start  # weighing the rows (once) included
    samples = sum(len(indices) for indices, _ in seen)
    print(json.dumps({"size": size, "samples": samples, "seconds": seconds, **peak_mib()}))


def memory(sizes: list[int], workers: int) -> None:
    print("Peak memory of one stage-5 epoch (fresh process each):\n")
    print("| samples | epoch s | main process peak MiB | largest worker peak MiB |")
    print("| ---: | ---: | ---: | ---: |")
    for size in sizes:
        load_vqa_dataset(num_rows=size)  # generate the cache first, outside the measurement
        r = in_fresh_process(__file__, "--child", size, "--workers", workers)
        print(
            f"| {r['samples']:,} of {size:,} | {r['seconds']:.1f} | "
            f"{r['main_peak_mib']:.0f} | {r['largest_worker_peak_mib']:.0f} |",
            flush=True,
        )


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--sizes", type=int, nargs="+", default=[2_000, 20_000], help="rows, one epoch each"
    )
    parser.add_argument("--workers", type=int, default=2, help="DataLoader workers")
    parser.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        return child(args.child, args.workers)
    memory(args.sizes, args.workers)


if __name__ == "__main__":
    main()
