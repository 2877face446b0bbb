"""Weigh every row of a dataset once: its tokens, images and drop reason, in parallel, cached.

Planning an epoch (mmdp.packing.planner) needs each row's weight: tokens (text + 64 per image) and image
count, without decoding a single image. Tokenizing the text of millions of rows takes minutes, so
it is done once and kept:

1. Count each row's images from the encoded column (offsets only, a chunk of rows at a time).
2. Tokenize the texts with `datasets.map(batched=True, num_proc=...)`, on every core for large
   datasets, with a progress bar. With `pretokenize=True` the same pass keeps each sample's
   input_ids and labels, so that building a pack later only slices them and decodes images.
3. Save the result under the cache folder (MMDP_CACHE), keyed by everything it depends on: the
   dataset's fingerprint, the tokenizer (vocabulary, special tokens, chat template), the image
   tokens per image, and this module's version. A second run, another rank or a restart loads it.

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

from mmdp import config
from mmdp.data.conversation import BadConversation, count_tokens_batch, tokenize_conversation
from mmdp.data.sources import cache_dir
from mmdp.drop_reasons import CODE
from mmdp.packing.planner import Weights

# Bump when what a weight means changes (the chat template rendering, how images are counted...),
# so that older caches are not reused.
WEIGHING_VERSION = 1
# Below this many rows, starting processes costs more than it saves: weigh in this process.
PARALLEL_FROM_ROWS = 20_000
# How long the other ranks of a machine wait for local rank 0 to weigh (tens of millions of rows
# on a small machine take a while), and how often they look.
WAIT_FOR_WEIGHING = timedelta(hours=6)
POLL_SECONDS = 0.5

WEIGHT_FEATURES = {
    "length": Value("int32"),
    "image_count": Value("int32"),
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
    rows: Dataset,
    tokenizer,
    image_token_length: int = config.IMAGE_TOKEN_LENGTH,
    *,
    pretokenize: bool = False,
    num_proc: int | None = None,
) -> Weighing:
    """Weights of every row of `rows` (the_cauldron's schema), from the cache when it has them.

    num_proc: processes for tokenizing (default: every core from PARALLEL_FROM_ROWS rows on,
    else 1).
    """
    start = time.perf_counter()
    path = cache_dir() / "weights" / cache_key(rows, tokenizer, image_token_length, pretokenize)
    local_rank = int(os.environ.get("LOCAL_RANK", 0))  # set by torchrun
    weighed_here = local_rank == 0 and not is_complete(path)
    if weighed_here:
        compute(rows, tokenizer, image_token_length, pretokenize, num_proc, path)
    else:
        wait_for(path, local_rank)
    weights, tokens = load(path, pretokenize)
    return Weighing(weights, tokens, weighed_here, time.perf_counter() - start, path)


def cache_key(rows: Dataset, tokenizer, image_token_length: int, pretokenize: bool) -> str:
    """A name for the weights that changes whenever anything they depend on changes."""
    vocabulary = (
        tokenizer.backend_tokenizer.to_str()
        if getattr(tokenizer, "is_fast", False)
        else json.dumps(tokenizer.get_vocab(), sort_keys=True)
    )
    tokenizer_state = {
        "vocabulary": hashlib.sha256(vocabulary.encode()).hexdigest(),
        "special": tokenizer.special_tokens_map,
        "image_token": tokenizer.image_token,
        "chat_template": tokenizer.chat_template,
    }
    depends_on = {
        "version": WEIGHING_VERSION,
        "dataset": rows._fingerprint,
        "rows": len(rows),
        "tokenizer": tokenizer_state,
        "image_token_length": image_token_length,
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


def compute(rows, tokenizer, image_token_length, pretokenize, num_proc, path: Path) -> None:
    # 1. Image counts from the list offsets of the encoded column: no image bytes are decoded.
    image_counts = count_images(rows)
    # 2. Tokenize the texts, in parallel for large datasets.
    if num_proc is None:
        num_proc = os.cpu_count() if len(rows) >= PARALLEL_FROM_ROWS else 1
    texts = rows.select_columns(["texts"]).add_column("image_count", image_counts)
    features = {**WEIGHT_FEATURES, **(TOKEN_FEATURES if pretokenize else {})}
    partial = path.with_name(f"{path.name}.partial-{os.getpid()}")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    weighed = texts.map(
        weigh_batch,
        batched=True,
        batch_size=256,
        num_proc=num_proc if num_proc > 1 else None,
        fn_kwargs={
            "tokenizer": tokenizer,
            "image_token_length": image_token_length,
            "pretokenize": pretokenize,
        },
        remove_columns=texts.column_names,
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


def weigh_batch(batch: dict, tokenizer, image_token_length: int, pretokenize: bool) -> dict:
    """datasets.map's function: the weights (and, with pretokenize, the tokens) of a few rows."""
    counts = batch["image_count"]
    if not pretokenize:
        lengths, reasons = count_tokens_batch(batch["texts"], counts, tokenizer, image_token_length)
        return {
            "length": lengths,
            "image_count": counts,
            "reason": [CODE[reason] for reason in reasons],
        }
    out = {"length": [], "image_count": counts, "reason": [], "input_ids": [], "labels": []}
    for texts, count in zip(batch["texts"], counts):
        try:
            input_ids, labels = tokenize_conversation(texts, count, tokenizer, image_token_length)
            reason = None
        except BadConversation as error:
            input_ids = labels = torch.zeros(0, dtype=torch.long)
            reason = error.reason
        out["length"].append(len(input_ids))
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
    )
    tokens = load_from_disk(str(path / "tokens")) if pretokenize else None
    return weights, tokens
