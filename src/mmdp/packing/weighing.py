"""Weigh every row of a dataset once: its tokens, images, vision patches and drop reason, in
parallel, cached.

Planning an epoch (mmdp.packing.planner) needs each row's weight: its tokens, images and the
vision encoder's patches, by its model family's rules (mmdp.models.family: TinyVLM's 64 tokens
per image, or a real processor's count for each image's width and height), without decoding a
single image. Tokenizing the text of millions of rows takes minutes, so it is done once and kept:

1. Count each row's images from the encoded column (offsets only, a chunk of rows at a time).
2. Weigh the rows with `datasets.map(batched=True, num_proc=...)`, on every core for large
   datasets, with a progress bar: the family's `weigh` (a real family reads each image's
   header, never its pixels). With `pretokenize=True` the same pass keeps each sample's
   input_ids and labels, so that building a pack later only slices them and decodes images.
3. Save the result under the cache folder (MMDP_CACHE), keyed by everything it depends on: the
   dataset's fingerprint, the family's fingerprint (tokenizer, chat template, the processor's
   settings that change a count), and this module's version. A second run, another rank or a
   restart loads it.

Under torchrun the rows are weighed once per machine: local rank 0 weighs, the other ranks of the
machine wait for its result to appear in the cache and load it. Waiting on the cache rather than
on a barrier keeps weighing a local affair: a rank that builds a dataset the others do not (only
rank 0 building a reference, say) cannot hang them.
"""

import hashlib
import json
import os
import shutil
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import numpy as np
import pyarrow.compute as pc
import torch
from datasets import Dataset, Features, List, Value, load_from_disk

from mmdp.data.conversation import BadConversation
from mmdp.data.images import BadImage
from mmdp.data.sources import cache_dir
from mmdp.drop_reasons import CODE
from mmdp.models.families import family_for
from mmdp.packing.planner import Weights

# Bump when what a weight means changes (the chat template rendering, how images are counted...),
# so that older caches are not reused.
WEIGHING_VERSION = 2  # 2: patch counts, and the model family's rules
# Below this many rows, starting processes costs more than it saves: weigh in this process.
PARALLEL_FROM_ROWS = 20_000
# How long the other ranks of a machine wait for local rank 0 to weigh (tens of millions of rows
# on a small machine take a while), and how often they look.
WAIT_FOR_WEIGHING = timedelta(hours=6)
POLL_SECONDS = 0.5

WEIGHT_FEATURES = {
    "length": Value("int32"),
    "image_count": Value("int32"),
    "patches": Value("int32"),
    "reason": Value("uint8"),
}
TOKEN_FEATURES = {"input_ids": List(Value("int32")), "labels": List(Value("int32"))}


@dataclass
class Weighing:
    """The weights of every row, and how they were obtained."""

    weights: Weights
    tokens: Dataset | None  # input_ids and labels per row, with pretokenize=True
    weighed_here: bool  # False when this process loaded them (from the cache, or from rank 0)
    seconds: float
    path: Path


def weigh_rows(
    rows: Dataset, processor, *, pretokenize: bool = False, num_proc: int | None = None
) -> Weighing:
    """Weights of every row of `rows` (the_cauldron's schema), from the cache when it has them.

    `processor`: a tokenizer (TinyVLM), a transformers processor of a supported family, or a
    mmdp.models.family.ModelFamily. num_proc: processes (default: every core from
    PARALLEL_FROM_ROWS rows on, else 1).
    """
    start = time.perf_counter()
    family = family_for(processor)
    path = cache_dir() / "weights" / cache_key(rows, family, pretokenize)
    local_rank = int(os.environ.get("LOCAL_RANK", 0))  # set by torchrun
    weighed_here = local_rank == 0 and not is_complete(path)
    if weighed_here:
        compute(rows, family, pretokenize, num_proc, path)
    else:
        wait_for(path, local_rank)
    weights, tokens = load(path, pretokenize)
    return Weighing(weights, tokens, weighed_here, time.perf_counter() - start, path)


def cache_key(rows: Dataset, family, pretokenize: bool) -> str:
    """A name for the weights that changes whenever anything they depend on changes."""
    depends_on = {
        "version": WEIGHING_VERSION,
        "dataset": rows._fingerprint,
        "rows": len(rows),
        "family": family.fingerprint(),
        "pretokenize": pretokenize,
    }
    digest = hashlib.sha256(json.dumps(depends_on, sort_keys=True, default=str).encode())
    return digest.hexdigest()[:20]


def is_complete(path: Path) -> bool:
    return (path / "weights.npz").exists()


def wait_for(path: Path, local_rank: int) -> None:
    """Wait until local rank 0 of this machine has saved the weights under `path`."""
    deadline = time.monotonic() + WAIT_FOR_WEIGHING.total_seconds()
    if not is_complete(path):
        print(f"local rank {local_rank}: waiting for local rank 0 to weigh the rows", flush=True)
    while not is_complete(path):
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"local rank {local_rank} waited {WAIT_FOR_WEIGHING} for local rank 0 to weigh "
                f"the rows into {path}; did local rank 0 build the same dataset?"
            )
        time.sleep(POLL_SECONDS)


def compute(rows, family, pretokenize, num_proc, path: Path) -> None:
    # 1. Image counts from the list offsets of the encoded column: no image bytes are decoded.
    image_counts = count_images(rows)
    # 2. Weigh the rows, in parallel for large datasets. A real family reads each image's header.
    if num_proc is None:
        num_proc = os.cpu_count() if len(rows) >= PARALLEL_FROM_ROWS else 1
    columns = ["texts", "images"] if family.needs_image_sizes else ["texts"]
    features = {**WEIGHT_FEATURES, **(TOKEN_FEATURES if pretokenize else {})}
    partial = path.with_name(f"{path.name}.partial-{os.getpid()}")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    selected = rows.select_columns(columns)
    weighed = selected.map(
        weigh_batch,
        batched=True,
        batch_size=256,
        with_indices=True,
        num_proc=num_proc if num_proc > 1 else None,
        fn_kwargs={"family": family, "pretokenize": pretokenize, "image_counts": image_counts},
        remove_columns=columns,
        features=Features(features),
        keep_in_memory=not pretokenize,
        cache_file_name=None if not pretokenize else str(partial / "map.arrow"),
        desc=f"Weighing rows ({num_proc} process{'es' * (num_proc > 1)})",
    )
    # 3. Save (write next to the final place, then rename: an interrupted run leaves no cache).
    # one read of whole columns: indexing a formatted column row by row would take longer than
    # tokenizing (bench/bench_scale.py measured it)
    columns = weighed.select_columns(list(WEIGHT_FEATURES)).with_format("numpy")[:]
    np.savez(
        partial / "weights.npz",
        lengths=columns["length"],
        image_counts=columns["image_count"],
        patch_counts=columns["patches"],
        reasons=columns["reason"],
    )
    if pretokenize:
        weighed.select_columns(list(TOKEN_FEATURES)).save_to_disk(str(partial / "tokens"))
        for leftover in partial.glob("map*.arrow"):
            leftover.unlink()
    try:
        partial.rename(path)
    except OSError:  # another machine sharing this folder got there first, with the same weights
        shutil.rmtree(partial, ignore_errors=True)


def count_images(rows: Dataset, chunk_rows: int = 4096) -> np.ndarray:
    """Images per row, read from the list lengths of the `images` column, a chunk at a time."""
    images = rows.select_columns(["images"]).with_format("arrow")
    counts = [
        pc.fill_null(pc.list_value_length(images[start : start + chunk_rows]["images"]), 0)
        .to_numpy()
        .astype(np.int32)
        for start in range(0, len(rows), chunk_rows)
    ]
    return np.concatenate(counts) if counts else np.zeros(0, np.int32)


def weigh_batch(batch: dict, indices, family, pretokenize: bool, image_counts) -> dict:
    """datasets.map's function: the weights (and, with pretokenize, the tokens) of a few rows.

    `image_counts` (every row's, by index): all a family that needs no image sizes reads of the
    images, so their bytes stay on disk.
    """
    images = batch["images"] if family.needs_image_sizes else image_counts[indices].tolist()
    if not pretokenize:
        lengths, counts, patches, reasons = family.weigh(batch["texts"], images)
        return {
            "length": lengths,
            "image_count": counts,
            "patches": patches,
            "reason": [CODE[reason] for reason in reasons],
        }
    keys = ("length", "image_count", "patches", "reason", "input_ids", "labels")
    out = {key: [] for key in keys}
    for texts, row_images in zip(batch["texts"], images):
        try:
            input_ids, labels, count, patches = family.tokenize(texts, row_images)
            reason = None
        except (BadConversation, BadImage) as error:
            input_ids = labels = torch.zeros(0, dtype=torch.long)
            count = row_images if isinstance(row_images, int) else len(row_images or [])
            patches, reason = 0, error.reason
        out["length"].append(len(input_ids))
        out["image_count"].append(count)
        out["patches"].append(patches)
        out["reason"].append(CODE[reason])
        out["input_ids"].append(input_ids.numpy().astype(np.int32))
        out["labels"].append(labels.numpy().astype(np.int32))
    return out


def load(path: Path, pretokenize: bool) -> tuple[Weights, Dataset | None]:
    arrays = np.load(path / "weights.npz")
    weights = Weights(
        arrays["lengths"].astype(np.int32, copy=False),
        arrays["image_counts"].astype(np.int32, copy=False),
        arrays["reasons"].astype(np.uint8, copy=False),
        arrays["patch_counts"].astype(np.int32, copy=False),
    )
    tokens = load_from_disk(str(path / "tokens")) if pretokenize else None
    return weights, tokens
