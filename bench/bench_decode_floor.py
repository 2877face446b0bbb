"""Is the stage-5 loader at its decode floor?

    uv run bench/bench_decode_floor.py                    # 2,000 rows, both paths: ~10 min
    uv run bench/bench_decode_floor.py --rows 600 --repeats 5 [--image-format jpeg]   # ~4 min

For each of --paths (TinyVLM, and a real family's processor built offline), in one process,
alternating, --repeats times, each a whole epoch with the same --workers:
- floor: a DataLoader that only decodes the images of the rows the loader yields and makes the
  model's pixels of them (TinyVLM: resize to a square float tensor, `load_image`; a real family:
  its own image processor on each sample's images), in batches of as many samples as the
  loader's, concatenated with torch.cat: the work no pipeline can skip;
- the shared floor: the same, each batch concatenated straight into shared memory as stage 5's
  collate does, so that the worker hands it over without another copy;
- the PackedDataLoader epoch (planning, packing, decoding, padding, collating), tokenizing each
  pack, and with pre-tokenized rows (`pretokenize=True`); building its PackedDataset (loading the
  cached weights), which a trainer does once per run, is timed apart.
Every other repeat runs the four in the reverse order. It prints, for each path, one table: the
median seconds an epoch, the loader's time over each floor (the median of each repeat's ratio),
the same for CPU seconds (this process and its workers), the tensors a batch holds (each its own
shared-memory segment), and the build's seconds, alone and added to the epoch's.
--image-format jpeg runs it on the rows with every image re-encoded as a JPEG (quality 90), as
most VLM datasets store them.
"""

import argparse
import statistics
import time

import torch
from loader_epochs import (
    IMAGE_FORMAT_HELP,
    IMAGE_FORMATS,
    cpu_seconds,
    embedded_rows,
    loader_epoch,
    packed_dataset,
    processor_of,
)
from torch.utils.data import DataLoader, Dataset

from mmdp.data.families import base as family_module
from mmdp.data.families import family_for
from mmdp.data.families.tiny import TinyFamily
from mmdp.data.images import decode_image, load_image


class ImagesOnly(Dataset):
    """The floor: a row's images decoded and made into the model's pixels, nothing else."""

    def __init__(self, rows, family):
        self.rows = rows
        self.family = family

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, index):
        images = self.rows[index]["images"] or []
        if isinstance(self.family, TinyFamily):
            size = self.family.image_size
            pixels = [load_image(image, size)[0] for image in images]
            return {
                "pixel_values": torch.stack(pixels) if pixels else torch.zeros(0, 3, size, size)
            }
        if not images:
            return {}
        return self.family.vision_inputs([decode_image(image)[0] for image in images])


def concatenate(samples: list[dict]) -> dict:
    """The floor's collate: each key's tensors of the batch in one (torch.cat; the worker then
    copies them into shared memory to hand them over)."""
    keys = {key for sample in samples for key in sample}
    return {key: torch.cat([s[key] for s in samples if key in s]) for key in keys}


def concatenate_shared(samples: list[dict]) -> dict:
    """The same, each written straight into shared memory in a worker, as stage 5's collate does
    (mmdp.data.families.base.concatenate): handing the batch over copies nothing more."""
    keys = {key for sample in samples for key in sample}
    return {key: family_module.concatenate([s[key] for s in samples if key in s]) for key in keys}


def floor_epoch(rows, family, workers: int, batch_size: int, collate=concatenate) -> float:
    start = time.perf_counter()
    loader = DataLoader(
        ImagesOnly(rows, family),
        batch_size=batch_size,
        num_workers=workers,
        collate_fn=collate,
    )
    for _ in loader:
        pass
    return time.perf_counter() - start


def speed(path: str, rows, workers: int, repeats: int) -> None:
    """The floor and the loader, alternating, whole epochs; one table. Each epoch's CPU too.
    The loaders' PackedDataset is built afresh in each repeat (the cached weights loaded) and
    timed apart: a trainer builds it once per run, and plans each epoch inside the epoch."""
    processor = processor_of(path)
    family = family_for(processor)
    packed_dataset(rows, processor, pretokenize=True)  # weigh and cache, untimed
    _, seen = loader_epoch(packed_dataset(rows, processor), workers)
    yielded = rows.select(sorted(i for indices, _ in seen for i in indices))
    per_batch = max(1, round(len(yielded) / len(seen)))
    seconds = {"floor": [], "shared floor": [], "tokenizing": [], "pretokenized": []}
    cpu = {name: [] for name in seconds}
    built = {"tokenizing": [], "pretokenized": []}
    tensors = {}

    def floor(name, collate):
        start = cpu_seconds()
        seconds[name].append(floor_epoch(yielded, family, workers, per_batch, collate))
        cpu[name].append(cpu_seconds() - start)

    def loader(name, pretokenize):
        start = time.perf_counter()
        dataset = packed_dataset(rows, processor, pretokenize)
        built[name].append(time.perf_counter() - start)
        start = cpu_seconds()
        took, seen = loader_epoch(dataset, workers)
        cpu[name].append(cpu_seconds() - start)
        seconds[name].append(took)
        tensors[name] = statistics.median(count for _, count in seen)

    epochs = [
        lambda: floor("floor", concatenate),
        lambda: floor("shared floor", concatenate_shared),
        lambda: loader("tokenizing", False),
        lambda: loader("pretokenized", True),
    ]
    for repeat in range(repeats):
        # every other repeat in the reverse order: a drift of the machine (its load, its caches)
        # during a repeat then favours each epoch as often as it hurts it
        for epoch in epochs if repeat % 2 == 0 else reversed(epochs):
            epoch()
    floor_s = statistics.median(seconds["floor"])
    shared = statistics.median(seconds["shared floor"])

    def over(name: str, base: str, spent: dict = seconds, extra: dict | None = None) -> str:
        """`name`'s time (plus `extra`'s) over `base`'s: the median of each repeat's ratio (a
        shared machine's load moves the epochs of a repeat alike, and whole repeats apart)."""
        added = extra[name] if extra else [0.0] * repeats
        ratio = statistics.median((t + e) / b for t, e, b in zip(spent[name], added, spent[base]))
        return f"{ratio - 1:+.1%}"

    print(
        f"\n{path}: {len(yielded):,} of {len(rows):,} samples yielded in {len(seen)} batches, "
        f"{workers} workers, median of {repeats} alternating epochs (over a floor: the median "
        "of each repeat's ratio):\n"
    )
    print(
        "| loader | s an epoch | over the floor | over the shared floor | CPU s an epoch "
        "| CPU over the floor | tensors a batch | building the PackedDataset, s | "
        "over the floor, building included |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    floor_tensors = len(family.vision_keys) if path != "tiny" else 1
    print(
        f"| floor: decode + the model's pixels only | {floor_s:.2f} | | | "
        f"{statistics.median(cpu['floor']):.2f} | | {floor_tensors} | | |"
    )
    print(
        f"| floor, its batches concatenated into shared memory | {shared:.2f} | "
        f"{over('shared floor', 'floor')} | | {statistics.median(cpu['shared floor']):.2f} | "
        f"{over('shared floor', 'floor', cpu)} | {floor_tensors} | | |"
    )
    for name, label in (("tokenizing", "tokenizing each pack"), ("pretokenized", "pre-tokenized")):
        took = statistics.median(seconds[name])
        print(
            f"| stage 5, {label} | {took:.2f} | {over(name, 'floor')} | "
            f"{over(name, 'shared floor')} | {statistics.median(cpu[name]):.2f} | "
            f"{over(name, 'floor', cpu)} | {tensors[name]:.0f} | "
            f"{statistics.median(built[name]):.2f} | {over(name, 'floor', extra=built)} |"
        )


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=2_000, help="rows of the embedded dataset")
    parser.add_argument("--repeats", type=int, default=5, help="alternating epochs of each")
    parser.add_argument("--workers", type=int, default=2, help="DataLoader workers")
    parser.add_argument(
        "--paths", nargs="+", default=["tiny", "qwen2_5_vl"], help="tiny or a family"
    )
    parser.add_argument(
        "--image-format", choices=IMAGE_FORMATS, default="png", help=IMAGE_FORMAT_HELP
    )
    args = parser.parse_args()
    rows = embedded_rows(args.rows, args.image_format)
    for path in args.paths:
        speed(path, rows, args.workers, args.repeats)


if __name__ == "__main__":
    main()
