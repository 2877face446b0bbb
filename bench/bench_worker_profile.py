"""Where does a stage-5 DataLoader worker's time go?

    uv run bench/bench_worker_profile.py --rows 600                     # a few minutes
    uv run bench/bench_worker_profile.py --rows 600 --paths tiny --image-format jpeg

For each of --paths, pre-tokenized and then tokenizing each pack, every batch of an epoch is
built in this process (one thread, as in a worker) by the loader's own functions, each step
timed on its own (`timed_steps`): read the rows, decode, resize to TinyVLM's pixels or the
family's image processor, tokenize or slice the pre-computed tokens, Qwen's positions, the rest
of making a sample, lay out the pack, collate the batch, and hand it to the main process
(pickled with torch's reductions, its tensors moved to shared memory, and unpickled: what a
worker's queue does). It prints one table for each: ms a batch and share of each step, after a
line with the batches, and the tensors and MiB of tensor data a batch (median).
--image-format jpeg runs it on the rows with every image re-encoded as a JPEG (quality 90).
"""

import argparse
import pickle
import statistics
import time
from collections import Counter

import torch
from loader_epochs import (
    IMAGE_FORMAT_HELP,
    IMAGE_FORMATS,
    embedded_rows,
    packed_dataset,
    processor_of,
    tensors_in,
)

from mmdp.data import images as image_module
from mmdp.data.families import base as family_module
from mmdp.data.families import tiny as tiny_module
from mmdp.data.families.tiny import TinyFamily
from mmdp.loading.packed_dataset import PackedDataset


class StepClock:
    """Seconds per step, each step's own: a step that calls another leaves out that one's time
    (decode inside load_image is decode's, not resize's)."""

    def __init__(self):
        self.seconds = Counter()
        self.inner = []  # for each step running, the seconds spent in the steps it called

    def wrap(self, step: str, function):
        def timed(*args, **kwargs):
            start = time.perf_counter()
            self.inner.append(0.0)
            try:
                return function(*args, **kwargs)
            finally:
                spent = time.perf_counter() - start
                self.seconds[step] += spent - self.inner.pop()
                if self.inner:
                    self.inner[-1] += spent

        return timed


class TimedRows:
    """A datasets.Dataset whose reads (`rows[i]`, `rows[list]`) are timed as "read rows"."""

    def __init__(self, rows, clock: StepClock):
        self.rows = rows
        self.read = clock.wrap("read rows", rows.__getitem__)

    def __getitem__(self, key):
        return self.read(key)

    def __len__(self):
        return len(self.rows)

    def __getattr__(self, name):
        return getattr(self.rows, name)


def timed_steps(dataset: PackedDataset, clock: StepClock) -> list[tuple]:
    """Wrap each step a worker runs to build a batch in `clock`; returns what to undo.

    The wrapped functions are the loader's own (the worker calls the same ones): reads of the
    dataset (or of the pre-computed tokens), decode_image, load_image's resize, the family's
    image processor, tokenizing, Qwen's positions, the rest of making a sample, slicing the
    pre-computed tokens (PackedDataset.samples), laying out a pack and collating the batch."""
    family = dataset.dataset.family
    undo = []

    def patch(owner, name, step):
        undo.append((owner, name, getattr(owner, name)))
        setattr(owner, name, clock.wrap(step, getattr(owner, name)))

    patch(image_module, "decode_image", "decode")  # inside load_image (TinyVLM)
    patch(family_module, "decode_image", "decode")  # ModelFamily.make_sample (real families)
    patch(tiny_module, "load_image", "resize to the model's pixels")  # TinyFamily's
    patch(tiny_module, "tokenize_conversation", "tokenize")
    for name, step in (
        ("vision_inputs", "image processor"),
        ("encode", "tokenize"),
        ("positions", "positions (rope index)"),
        ("make_sample", "make the sample (the rest)"),
    ):
        if not isinstance(family, TinyFamily) or name == "make_sample":
            patch(family, name, step)
    for name, step in (
        ("samples", "slice the pre-computed tokens"),
        ("load_pack", "lay out the pack"),
        ("collate", "collate the batch"),
    ):
        patch(dataset, name, step)
    for owner, name in ((dataset, "tokens"), (dataset, "image_rows"), (dataset.dataset, "dataset")):
        rows = getattr(owner, name)
        if rows is not None:
            undo.append((owner, name, rows))
            setattr(owner, name, TimedRows(rows, clock))
    return undo


def hand_off(batch: dict) -> tuple[float, int, int]:
    """What handing a batch to the main process costs, as a worker does it: (seconds to
    pickle it with torch's reductions, each tensor's storage moved to shared memory, and
    unpickle it; tensors; bytes of tensor data)."""
    from multiprocessing.reduction import ForkingPickler

    import torch.multiprocessing  # noqa: F401  (registers torch's reductions, as a worker has)

    start = time.perf_counter()
    pickle.loads(ForkingPickler.dumps(batch))
    seconds = time.perf_counter() - start
    tensors = tensors_in(batch)
    return seconds, len(tensors), sum(t.numel() * t.element_size() for t in tensors)


def profile(path: str, rows, pretokenize: bool) -> None:
    """Build every batch of an epoch in this process as a worker does, each step timed; one
    table of milliseconds a batch."""
    torch.set_num_threads(1)  # as in a DataLoader worker
    processor = processor_of(path)
    dataset = packed_dataset(rows, processor, pretokenize)
    plan, planned = dataset.rank_plan()
    clock = StepClock()
    undo = timed_steps(dataset, clock)
    handed, tensors, data_bytes = 0.0, [], []
    start = time.perf_counter()
    try:
        for step in range(plan.num_steps()):
            packs = []
            for p in range(plan.batch_starts[step], plan.batch_starts[step + 1]):
                a, z = plan.pack_starts[p], plan.pack_starts[p + 1]
                packs.append(
                    dataset.load_pack(plan.rows[a:z].tolist(), planned[a:z].tolist(), step)
                )
            batch = dataset.collate(packs)
            seconds, count, size = hand_off(batch)
            handed += seconds
            tensors.append(count)
            data_bytes.append(size)
    finally:
        for owner, name, value in reversed(undo):
            setattr(owner, name, value)
    total = time.perf_counter() - start
    steps = {**clock.seconds, "hand to the main process (pickle, shared memory)": handed}
    steps["other (the loop, the plan's arrays)"] = total - sum(steps.values())
    batches = plan.num_steps()
    mode = "pre-tokenized" if pretokenize else "tokenizing each pack"
    print(
        f"\n{path}, {mode}: {batches} batches built in one process (one thread), "
        f"{statistics.median(tensors):.0f} tensors and "
        f"{statistics.median(data_bytes) / 2**20:.2f} MiB of tensor data a batch (median):\n"
    )
    print("| step | ms a batch | share |")
    print("| --- | ---: | ---: |")
    for name, seconds in sorted(steps.items(), key=lambda item: -item[1]):
        print(f"| {name} | {seconds / batches * 1e3:.1f} | {seconds / total:.0%} |")
    print(f"| all | {total / batches * 1e3:.1f} | |")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=2_000, help="rows of the embedded dataset")
    parser.add_argument(
        "--paths", nargs="+", default=["tiny", "qwen2_5_vl"], help="tiny or a family"
    )
    parser.add_argument(
        "--image-format", choices=IMAGE_FORMATS, default="png", help=IMAGE_FORMAT_HELP
    )
    args = parser.parse_args()
    rows = embedded_rows(args.rows, args.image_format)
    for path in args.paths:
        for pretokenize in (True, False):
            profile(path, rows, pretokenize)


if __name__ == "__main__":
    main()
