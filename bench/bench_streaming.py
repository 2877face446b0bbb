"""Benchmark stage 5 from a stream (mmdp.loading.streaming) against the planned
loader (mmdp.loading.packed_dataset).

    uv run bench/bench_streaming.py                      # 2,000, 10,000 and 20,000 rows
    uv run bench/bench_streaming.py --sizes 2000 --repeats 1

Same data (the embedded dataset), same settings (512 tokens, 18 images, 8 packs per batch,
images_first_bfd, a 4,096-row buffer, 2 DataLoader workers). Two streams of the same rows:
`Dataset.to_iterable_dataset(num_shards=8)` (the arrow file the planned loader reads, memory-
mapped), and 8 parquet files read with `load_dataset(..., streaming=True)`, as a Hub stream is.

1. Peak memory and utilization. One full epoch of each loader runs in a fresh process, for each
   size; the table gives the share of real tokens and the peak resident memory of the main
   process and of the largest worker (getrusage). Pages of a memory-mapped file count as
   resident once read: with an arrow file, both loaders grow by the part of the file they read.
2. Speed. On the first size, alternating, --repeats times each: a full epoch of each stream,
   and a full planned epoch with and without weighing the rows first (PackedDataset's
   constructor weighs every row once; a stream is weighed buffer by buffer, in every epoch).
   Medians of samples/s, and of the CPU time of the epoch (main process and workers), which
   other jobs on the machine disturb less than the wall time.
"""

import argparse
import json
import statistics
import time
from pathlib import Path

from datasets import load_dataset
from loader_epochs import cpu_seconds, in_fresh_process, peak_mib

from mmdp.data.reading.sources import cache_dir, load_vqa_dataset
from mmdp.data.tokenizer import get_tokenizer
from mmdp.data.vqa_dataset import VQADataset
from mmdp.loading.packed_dataset import PackedDataLoader, PackedDataset
from mmdp.loading.streaming import StreamingDataLoader, StreamingPackedDataset
from mmdp.packing.packing_config import PackingConfig

BUFFER_SIZE = 4096
SHARDS = 8


def streaming_epoch(rows, tokenizer, workers: int) -> dict:
    return stream_epoch(rows.to_iterable_dataset(num_shards=SHARDS), tokenizer, workers)


def parquet_epoch(rows, tokenizer, workers: int) -> dict:
    files = [str(path) for path in parquet_files(rows)]
    stream = load_dataset("parquet", data_files=files, split="train", streaming=True)
    return stream_epoch(stream, tokenizer, workers)


def stream_epoch(stream, tokenizer, workers: int) -> dict:
    start = time.perf_counter()
    loader = StreamingDataLoader(
        StreamingPackedDataset(stream, tokenizer, config=PackingConfig(buffer_size=BUFFER_SIZE)),
        num_workers=workers,
    )
    return epoch_of(loader, start, start)


def parquet_files(rows) -> list[Path]:
    """The rows as SHARDS parquet files, written once next to the embedded dataset."""
    folder = cache_dir() / f"bench-parquet-rows{len(rows)}"
    files = [folder / f"{i}.parquet" for i in range(SHARDS)]
    if not all(f.exists() for f in files):
        folder.mkdir(parents=True, exist_ok=True)
        for i, path in enumerate(files):
            rows.shard(SHARDS, i, contiguous=True).to_parquet(str(path))
    return files


def planned_epoch(rows, tokenizer, workers: int) -> dict:
    start = time.perf_counter()
    dataset = PackedDataset(
        VQADataset(rows, tokenizer), config=PackingConfig(buffer_size=BUFFER_SIZE)
    )
    return epoch_of(PackedDataLoader(dataset, num_workers=workers), start, time.perf_counter())


def epoch_of(loader, start: float, weighed: float) -> dict:
    samples = real = computed = 0
    for batch in loader:
        samples += len(batch["sample_index"])
        real += int(batch["real_token_mask"].sum())
        computed += batch["real_token_mask"].numel()
    end = time.perf_counter()
    return {
        "samples": samples,
        "utilization": real / computed,
        "seconds": end - start,
        "epoch_seconds": end - weighed,
    }


LOADERS = {
    "streaming (arrow file)": streaming_epoch,
    "streaming (parquet files)": parquet_epoch,
    "planned": planned_epoch,
}


def child(loader: str, size: int, workers: int):
    """One full epoch of one loader in this process; prints its figures and peak memory."""
    result = LOADERS[loader](load_vqa_dataset(num_rows=size), get_tokenizer(), workers)
    print(json.dumps({**result, **peak_mib()}))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[2_000, 10_000, 20_000])
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--child", nargs=2, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        return child(args.child[0], int(args.child[1]), args.workers)

    print(f"One epoch in a fresh process ({args.workers} workers, buffer {BUFFER_SIZE:,}):\n")
    print("| loader | rows | samples | utilization | epoch s | main peak MiB | worker peak MiB |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for size in args.sizes:
        parquet_files(load_vqa_dataset(num_rows=size))  # written once, outside the measurement
        for loader in LOADERS:
            r = in_fresh_process(__file__, "--child", loader, size, "--workers", args.workers)
            print(
                f"| {loader} | {size:,} | {r['samples']:,} | {r['utilization']:.4f} | "
                f"{r['seconds']:.1f} | {r['main_peak_mib']:.0f} | "
                f"{r['largest_worker_peak_mib']:.0f} |",
                flush=True,
            )

    size = args.sizes[0]
    rows = load_vqa_dataset(num_rows=size)
    tokenizer = get_tokenizer()
    rates = {name: [] for name in (*LOADERS, "planned, rows already weighed")}
    cpu = {name: [] for name in LOADERS}  # CPU ms per sample
    for _ in range(args.repeats):
        for name, epoch in LOADERS.items():
            before = cpu_seconds()
            result = epoch(rows, tokenizer, args.workers)
            cpu[name].append(1000 * (cpu_seconds() - before) / result["samples"])
            rates[name].append(result["samples"] / result["seconds"])
            if name == "planned":
                rate = result["samples"] / result["epoch_seconds"]
                rates["planned, rows already weighed"].append(rate)
    planned = statistics.median(rates["planned"])
    planned_cpu = statistics.median(cpu["planned"])
    print(
        f"\nSpeed on {size:,} rows, {args.workers} workers, median of {args.repeats} "
        "alternating runs:\n"
    )
    print("| loader | samples/s | vs planned | CPU ms per sample | vs planned |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for name, values in rates.items():
        rate = statistics.median(values)
        line = f"| {name} | {rate:,.0f} | {rate / planned - 1:+.1%} |"
        if name in cpu:
            ms = statistics.median(cpu[name])
            line += f" {ms:.2f} | {ms / planned_cpu - 1:+.1%} |"
        print(line + ("" if name in cpu else " | |"))


if __name__ == "__main__":
    main()
