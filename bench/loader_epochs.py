"""What the loader's benches share: the embedded rows (PNGs, or each image as a JPEG), the
processor of a path ("tiny" or a real family's, offline), a PackedDataset of them, one epoch of
its PackedDataLoader as a trainer runs it, and the CPU seconds and peak memory of an epoch.

Used by bench_loader_memory.py, bench_decode_floor.py, bench_worker_profile.py,
bench_decoders.py and bench_streaming.py; not a script itself.
"""

import io
import json
import resource
import subprocess
import sys
import time

import torch
from PIL import Image

from mmdp.data.reading.sources import load_vqa_dataset
from mmdp.data.tokenizer import get_tokenizer
from mmdp.data.vqa_dataset import VQADataset
from mmdp.loading.packed_dataset import PackedDataLoader, PackedDataset

IMAGE_FORMATS = ["png", "jpeg"]
IMAGE_FORMAT_HELP = "the images as embedded (png), or each re-encoded as a JPEG (quality 90)"


def embedded_rows(num_rows: int, image_format: str = "png"):
    """The first `num_rows` rows of the embedded dataset, their images as `image_format`."""
    return with_image_format(load_vqa_dataset(num_rows=num_rows), image_format)


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


def processor_of(path: str):
    """TinyVLM's tokenizer for "tiny", else the family's processor built offline."""
    if path == "tiny":
        return get_tokenizer()
    from mmdp.data.families import offline_processor

    return offline_processor(path)


def packed_dataset(rows, processor, pretokenize=False) -> PackedDataset:
    samples = VQADataset(rows, processor)  # no config: the family's budgets
    return PackedDataset(samples, pretokenize=pretokenize)


def loader_epoch(dataset: PackedDataset, workers: int) -> tuple[float, list]:
    """(seconds for an epoch as a trainer runs it: plan it, start the workers, every batch;
    each batch's (sample indices, tensors))."""
    start = time.perf_counter()
    loader = PackedDataLoader(dataset, num_workers=workers)
    seen = [(batch["sample_index"].tolist(), len(tensors_in(batch))) for batch in loader]
    return time.perf_counter() - start, seen


def tensors_in(value) -> list[torch.Tensor]:
    """The tensors a batch holds, nested lists and dicts included."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (list, tuple)):
        return [tensor for v in value for tensor in tensors_in(v)]
    return []


def cpu_seconds() -> float:
    """User and system CPU seconds of this process and of its children that have ended: a
    DataLoader's workers end with its epoch (they are not persistent), so an epoch's CPU is the
    difference of this around it, workers included."""
    own, ended = (
        resource.getrusage(resource.RUSAGE_SELF),
        resource.getrusage(resource.RUSAGE_CHILDREN),
    )
    return own.ru_utime + own.ru_stime + ended.ru_utime + ended.ru_stime


def peak_mib() -> dict:
    """The peak resident memory so far of this process and of its largest ended child (a
    DataLoader worker), MiB (getrusage)."""
    kib = 1024  # ru_maxrss is in KiB on Linux
    return {
        "main_peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / kib,
        "largest_worker_peak_mib": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / kib,
    }


def in_fresh_process(script: str, *args) -> dict:
    """Run `script` with `args` in a fresh Python process; the JSON its last line prints."""
    command = [sys.executable, script, *map(str, args)]
    out = subprocess.run(command, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])
