"""Benchmark the stage-5 loader: peak memory of a full epoch, and its time over a decode floor.

    uv run bench/bench_stage5.py                      # memory at 2,000 and 20,000 rows; speed on 2,000
    uv run bench/bench_stage5.py --sizes 600 --no-memory --repeats 5   # the speed part, a few minutes

1. Peak memory. A full epoch of PackedDataLoader (2 workers) runs in a fresh process; the table
   gives the peak resident memory of the main process and of the largest worker (getrusage).
   Packs are planned from lengths, and images are decoded only for packs about to be yielded, so
   neither should grow with the dataset: compare the rows for 2,000 and 20,000 samples.
2. Speed, for each of --paths (TinyVLM, and a real family's processor built offline): in one
   process, alternating, --repeats times, each a whole epoch with the same --workers:
   - floor: a DataLoader that only decodes the images of the rows the loader yields and makes
     the model's pixels of them (TinyVLM: resize to a square float tensor, `load_image`; a real
     family: its own image processor on each sample's images), in batches of as many samples as
     the loader's, concatenated with torch.cat: the work no pipeline can skip;
   - the shared floor: the same, each batch concatenated straight into shared memory as stage
     5's collate does, so that the worker hands it over without another copy;
   - the PackedDataLoader epoch (planning, packing, decoding, padding, collating), tokenizing
     each pack, and with pre-tokenized rows (`pretokenize=True`); building its PackedDataset
     (loading the cached weights), which a trainer does once per run, is timed apart.
   Every other repeat runs the four in the reverse order. It prints the median seconds an
   epoch, the loader's time over each floor (the median of each repeat's ratio), the same for
   CPU seconds (this process and its workers), the tensors a batch holds (each its own
   shared-memory segment), and the build's seconds, alone and added to the epoch's.
3. JPEG draft decoding: `load_image` of JPEGs 2x and 4x the target side against the full decode
   resized (what it did before), alternating in this process, medians.

    uv run bench/bench_stage5.py --profile --sizes 600                       # a few minutes
    uv run bench/bench_stage5.py --profile --sizes 600 --image-format jpeg

4. --profile, instead of the above: where a worker's time goes. Every batch of an epoch is built
   in this process (one thread) by the loader's own functions, each step timed on its own
   (`timed_steps`): read the rows, decode, resize to TinyVLM's pixels or the family's image
   processor, tokenize or slice the pre-computed tokens, Qwen's positions, the rest of making a
   sample, lay out the pack, collate the batch, and hand it to the main process (pickled with
   torch's reductions, its tensors moved to shared memory, and unpickled: what a worker's queue
   does); tensors and bytes a batch. Then decoding alone (`--decoding-only`: that table only):
   Pillow as mmdp decodes against torchvision's libjpeg-turbo / libpng decoder on the same
   images, its tensor alone and turned into the PIL image the processors take, ms an image.
--image-format jpeg runs the speed and profile parts on the embedded rows with every image
re-encoded as a JPEG (quality 90), as most VLM datasets store them.
"""

import argparse
import io
import json
import pickle
import resource
import statistics
import subprocess
import sys
import time
from collections import Counter

import numpy as np
import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset

from mmdp import config
from mmdp.data import images as image_module
from mmdp.data.families import base as family_module
from mmdp.data.families import family_for
from mmdp.data.families import tiny as tiny_module
from mmdp.data.families.tiny import TinyFamily
from mmdp.data.images import decode_image, load_image
from mmdp.data.reading.sources import load_vqa_dataset
from mmdp.data.tokenizer import get_tokenizer
from mmdp.data.vqa_dataset import VQADataset
from mmdp.packing.loading.packed_dataset import PackedDataLoader, PackedDataset


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


def with_image_format(rows, image_format: str):
    """The rows with their images stored as `image_format`: "png" as embedded; "jpeg" each
    image re-encoded as a JPEG of quality 90, as most VLM datasets store them (modes JPEG
    cannot hold go to RGB first; bytes that do not decode stay as they are, to be dropped)."""
    if image_format == "png":
        return rows

    def to_jpeg(cell: dict) -> dict:
        try:
            pil = Image.open(io.BytesIO(cell["bytes"]))
            pil.load()
        except (OSError, ValueError, SyntaxError):
            return cell
        if pil.mode not in ("RGB", "L"):
            pil = pil.convert("RGB")
        buffer = io.BytesIO()
        pil.save(buffer, "JPEG", quality=90)
        return {"bytes": buffer.getvalue(), "path": None}

    def row_to_jpeg(row: dict) -> dict:
        images = row["images"]
        return {"images": None if images is None else [to_jpeg(cell) for cell in images]}

    return rows.map(row_to_jpeg, features=rows.features, desc="JPEG variant")


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


def tensors_in(value) -> int:
    """How many tensors a batch holds, nested lists and dicts included."""
    if isinstance(value, torch.Tensor):
        return 1
    if isinstance(value, dict):
        return sum(tensors_in(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return sum(tensors_in(v) for v in value)
    return 0


def packed_dataset(rows, processor, pretokenize=False) -> PackedDataset:
    samples = VQADataset(rows, processor)  # no config: the family's budgets
    return PackedDataset(samples, pretokenize=pretokenize)


def loader_epoch(dataset: PackedDataset, workers: int) -> tuple[float, list]:
    """(seconds for an epoch as a trainer runs it: plan it, start the workers, every batch;
    each batch's (sample indices, tensors))."""
    start = time.perf_counter()
    loader = PackedDataLoader(dataset, num_workers=workers)
    seen = [(batch["sample_index"].tolist(), tensors_in(batch)) for batch in loader]
    return time.perf_counter() - start, seen


def child(size: int, workers: int):
    """One full stage-5 epoch in this process; prints its peak memory as JSON."""
    rows = load_vqa_dataset(num_rows=size)
    start = time.perf_counter()
    _, seen = loader_epoch(packed_dataset(rows, get_tokenizer()), workers)
    seconds = time.perf_counter() - start  # weighing the rows (once) included
    kib = 1024  # ru_maxrss is in KiB on Linux
    print(
        json.dumps(
            {
                "size": size,
                "samples": sum(len(indices) for indices, _ in seen),
                "seconds": seconds,
                "main_peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / kib,
                "largest_worker_peak_mib": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
                / kib,
            }
        )
    )


def memory(sizes: list[int], workers: int) -> None:
    print("Peak memory of one stage-5 epoch (fresh process each):\n")
    print("| samples | epoch s | main process peak MiB | largest worker peak MiB |")
    print("| ---: | ---: | ---: | ---: |")
    for size in sizes:
        load_vqa_dataset(num_rows=size)  # generate the cache first, outside the measurement
        out = subprocess.run(
            [sys.executable, __file__, "--child", str(size), "--workers", str(workers)],
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


def processor_of(path: str):
    if path == "tiny":
        return get_tokenizer()
    from mmdp.data.families import offline_processor

    return offline_processor(path)


def cpu_seconds() -> float:
    """User and system CPU seconds of this process and of its children that have ended: a
    DataLoader's workers end with its epoch (they are not persistent), so an epoch's CPU is the
    difference of this around it, workers included."""
    own, ended = (
        resource.getrusage(resource.RUSAGE_SELF),
        resource.getrusage(resource.RUSAGE_CHILDREN),
    )
    return own.ru_utime + own.ru_stime + ended.ru_utime + ended.ru_stime


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


# 4. Where a worker's time goes: each step of building a batch, timed -------------------------


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
        ("build_pack", "lay out the pack"),
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
    tensors = [v for v in flat_values(batch) if isinstance(v, torch.Tensor)]
    return seconds, len(tensors), sum(t.numel() * t.element_size() for t in tensors)


def flat_values(value):
    if isinstance(value, dict):
        for v in value.values():
            yield from flat_values(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from flat_values(v)
    else:
        yield value


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
                    dataset.build_pack(plan.rows[a:z].tolist(), planned[a:z].tolist(), step)
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


def decoders(rows, repeats: int) -> None:
    """Decoding alone, ms an image: Pillow as mmdp.data.images decodes (Image.open, load: the
    PIL image the processors take) against torchvision.io.decode_image, its CHW tensor alone and
    turned into that PIL image (channels last, one copy), on the rows' images that all decode,
    alternating; medians of each repeat's time and of its ratio to Pillow's."""
    import warnings

    from torchvision.io import ImageReadMode
    from torchvision.io import decode_image as torchvision_decode

    def pillow(data: bytes):
        image = Image.open(io.BytesIO(data))
        image.load()
        return image

    def torchvision(data: bytes):
        encoded = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        return torchvision_decode(encoded, mode=ImageReadMode.RGB)

    def torchvision_to_pil(data: bytes):
        Image.open(io.BytesIO(data))  # decode_image reads the header (size, mode, EXIF) first
        pixels = torchvision(data).numpy().transpose(1, 2, 0)
        return Image.fromarray(np.ascontiguousarray(pixels), "RGB")

    warnings.simplefilter("ignore", DeprecationWarning)  # torchvision 0.29 deprecates its decoders
    torch.set_num_threads(1)
    images, formats = [], Counter()
    for row in rows:
        for cell in row["images"] or []:
            try:
                pillow(cell["bytes"]), torchvision(cell["bytes"])
            except Exception:  # noqa: BLE001 (a broken image of the dataset: left out)
                continue
            images.append(cell["bytes"])
            formats[Image.open(io.BytesIO(cell["bytes"])).format] += 1
    times = {pillow: [], torchvision: [], torchvision_to_pil: []}
    for _ in range(repeats):
        for decode, spent in times.items():
            start = time.perf_counter()
            for data in images:
                decode(data)
            spent.append((time.perf_counter() - start) / len(images) * 1e3)

    def ratio(decode) -> float:
        return statistics.median(t / p for t, p in zip(times[decode], times[pillow]))

    kinds = ", ".join(f"{n} {name}" for name, n in formats.most_common())
    print(f"\nDecoding alone, one thread, {len(images)} images ({kinds}), ms an image, median:\n")
    print("| Pillow (open, load) | torchvision, CHW tensor | torchvision, as a PIL image |")
    print("| ---: | ---: | ---: |")
    ms = {decode: statistics.median(spent) for decode, spent in times.items()}
    print(
        f"| {ms[pillow]:.2f} | {ms[torchvision]:.2f} ({ratio(torchvision):.2f}x the time) | "
        f"{ms[torchvision_to_pil]:.2f} ({ratio(torchvision_to_pil):.2f}x) |"
    )


def jpeg_cells(side: int, count: int) -> list[dict]:
    """`count` different JPEGs of side x side pixels: gradients with some grain, quality 90."""
    generator = np.random.default_rng(side)
    ramp = np.linspace(0, 255, side, dtype=np.float32)
    cells = []
    for _ in range(count):
        pixels = (ramp[None, :, None] + ramp[:, None, None]) / 2 + generator.normal(
            0, 4, (side, side, 3)
        )
        buffer = io.BytesIO()
        Image.fromarray(pixels.clip(0, 255).astype(np.uint8)).save(buffer, "JPEG", quality=90)
        cells.append({"bytes": buffer.getvalue(), "path": None})
    return cells


def full_decode(cell, size: int) -> torch.Tensor:
    """load_image as it was before draft decoding: the full decode, resized."""
    pil = decode_image(cell)[0].resize((size, size), Image.Resampling.BILINEAR)
    return torch.from_numpy(np.asarray(pil).copy()).permute(2, 0, 1).float().div_(255)


def jpeg_draft(size: int, repeats: int) -> None:
    """One thread, as in a DataLoader worker: on a busy machine torch's threads contend."""
    torch.set_num_threads(1)
    print(
        f"\nJPEG draft decoding, one process and thread, ms an image to a {size}x{size} tensor, median:\n"
    )
    print("| JPEG side | full decode + resize | load_image (draft) | speed-up | mean abs diff |")
    print("| ---: | ---: | ---: | ---: | ---: |")
    for side in (2 * size, 4 * size):
        cells = jpeg_cells(side, 20)
        full, draft = [], []
        for _ in range(repeats):
            for runs, decode in ((full, full_decode), (draft, lambda c, s: load_image(c, s)[0])):
                start = time.perf_counter()
                for cell in cells:
                    decode(cell, size)
                runs.append((time.perf_counter() - start) / len(cells) * 1e3)
        diff = statistics.mean(
            (full_decode(c, size) - load_image(c, size)[0]).abs().mean().item() * 255 for c in cells
        )
        f, d = statistics.median(full), statistics.median(draft)
        print(f"| {side} | {f:.2f} | {d:.2f} | {f / d:.2f}x | {diff:.2f} levels |")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[2_000, 20_000])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--paths", nargs="+", default=["tiny", "qwen2_5_vl"])
    parser.add_argument("--no-memory", action="store_true", help="skip the peak-memory table")
    parser.add_argument(
        "--image-format",
        choices=["png", "jpeg"],
        default="png",
        help="the images as embedded (png), or each re-encoded as a JPEG (speed and profile)",
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="only the per-step profile of a worker's batches, for each of --paths",
    )
    parser.add_argument(
        "--decoding-only",
        action="store_true",
        help="only the table of decoding alone: Pillow against torchvision (a few seconds)",
    )
    parser.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        return child(args.child, args.workers)
    if args.decoding_only:
        rows = with_image_format(load_vqa_dataset(num_rows=args.sizes[0]), args.image_format)
        return decoders(rows, args.repeats)
    if args.profile:
        rows = with_image_format(load_vqa_dataset(num_rows=args.sizes[0]), args.image_format)
        for path in args.paths:
            for pretokenize in (True, False):
                profile(path, rows, pretokenize)
        return decoders(rows, args.repeats)
    if not args.no_memory:
        memory(args.sizes, args.workers)
    rows = with_image_format(load_vqa_dataset(num_rows=args.sizes[0]), args.image_format)
    for path in args.paths:
        speed(path, rows, args.workers, args.repeats)
    jpeg_draft(config.IMAGE_SIZE, args.repeats)


if __name__ == "__main__":
    main()
