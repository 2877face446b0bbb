"""Weigh every row of a dataset once: its tokens, images, vision patches and drop reason, in
parallel, cached.

Planning an epoch (mmdp.planning.planner) needs each row's weight: its tokens, images and
the vision encoder's patches, by its model family's rules (mmdp.data.families.base: TinyVLM's 64
tokens per image, or a real processor's count for each image's width and height), without decoding a
single image. Tokenizing the text of millions of rows takes minutes, so it is done once and kept:

1. Count each row's images from the encoded column (offsets only, a chunk of rows at a time).
2. Weigh the rows with `datasets.map(batched=True, num_proc=...)`, with a progress bar: the
   family's `weigh` (a real family reads each image's header, never its pixels). With
   `pretokenize=True` the same pass keeps each sample's input_ids and labels, so that building
   a pack later only slices them and decodes images.
3. Save the result under the cache folder (MMDP_CACHE), keyed by everything it depends on: the
   dataset's fingerprint, the family's fingerprint (tokenizer, chat template, the processor's
   settings that change a count), and this module's version. A second run, another rank or a
   restart loads it (mmdp.weighing.cache: saved atomically, checked when loaded: a truncated or
   edited cache is weighed again). Weights with a remote file that did not answer
   (`unreachable_file`) are not saved when no other process waits for them: the network failed,
   not the file, and the next run reads it again (under torchrun, where the machine's other ranks
   wait for the cache, they are saved, and a warning names the folder to delete to read them).

Two ways under torchrun:
- `across_ranks=True` (PackedDataset's choice when its ranks come from torch.distributed): every
  rank of every machine weighs its share of the rows (1/world of them, the shares of the machines
  that have no cache), the shares are all-gathered, and each machine caches the whole. A machine
  whose cache is warm weighs nothing and only takes part in the gathers.
- otherwise (a dataset built on one rank only, say): local rank 0 of each machine weighs all the
  rows, and the other local ranks wait for its cache, with no collective call.
"""

import contextlib
import hashlib
import json
import os
import shutil
import socket
import sys
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import numpy as np
import pyarrow.compute as pc
import torch
import torch.distributed as dist
from datasets import Dataset, Features, List, Value

from mmdp.data.conversation import BadConversation
from mmdp.data.families import family_for
from mmdp.data.images import BadImage, undecoded
from mmdp.data.reading.sources import cache_dir
from mmdp.data.videos import BadVideo
from mmdp.drop_reasons import CODE, UNREACHABLE_FILE
from mmdp.packing.weights import Weights
from mmdp.ranks import ranks_answering
from mmdp.weighing.cache import (
    ARRAYS,
    is_complete,
    load,
    load_if_sound,
    process_exists,
    save,
    scratch_path,
    weights_of,
)

# Bump when what a weight means changes (the chat template rendering, how images are counted...),
# so that older caches are not reused.
WEIGHING_VERSION = 3  # 2: patch counts and the model family's rules; 3: a checked manifest
# Below this many rows, starting processes costs more than it saves: weigh in this process.
PARALLEL_FROM_ROWS = 20_000
# Rows each call of weigh_batch weighs (a batch of datasets.map, or of Ray Data: on_ray)
BATCH_ROWS = 256
# How long the other ranks of a machine wait for local rank 0 to weigh (tens of millions of rows
# on a small machine take a while), and how often they look.
WAIT_FOR_WEIGHING = timedelta(hours=6)
WHILE_WEIGHING = "while the ranks weighed the rows together"
POLL_SECONDS = 0.5

# A row's weight as weigh_batch writes it, in the order of its arrays (mmdp.weighing.cache.ARRAYS)
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
    rows_weighed_here: int  # 0 when this process loaded them (from a cache)
    seconds: float
    path: Path

    @property
    def weighed_here(self) -> bool:
        return self.rows_weighed_here > 0


def weigh_rows(
    rows: Dataset,
    processor,
    *,
    pretokenize: bool = False,
    num_proc: int | None = None,
    across_ranks: bool = False,
) -> Weighing:
    """Weights of every row of `rows` (the_cauldron's schema), from the cache when it has them.

    `processor`: a tokenizer (TinyVLM), a transformers processor of a supported family, or a
    mmdp.data.families.base.ModelFamily. num_proc: processes (default: every core from
    PARALLEL_FROM_ROWS rows on, else 1). `across_ranks`: every rank weighs its share (see the
    module docstring); every rank must then call weigh_rows with the same rows.
    """
    start = time.perf_counter()
    rows = undecoded(rows)  # weighing reads headers: datasets' Image() must not decode them
    family = family_for(processor)
    key = cache_key(rows, family, pretokenize)
    path = cache_dir() / "weights" / key
    shared = across_ranks and not pretokenize and dist.is_available() and dist.is_initialized()
    if shared and dist.get_world_size() > 1:
        weights, weighed = weigh_across_ranks(rows, family, key, path, num_proc)
        tokens = None
    else:
        weights, tokens, weighed = weigh_on_this_machine(rows, family, pretokenize, num_proc, path)
    return Weighing(weights, tokens, weighed, time.perf_counter() - start, path)


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


# One machine: local rank 0 weighs -------------------------------------------------------------


def weigh_on_this_machine(rows, family, pretokenize: bool, num_proc, path: Path):
    """(weights, tokens, rows weighed here): local rank 0 weighs unless its cache holds them,
    the other local ranks wait for that cache."""
    local_rank = int(os.environ.get("LOCAL_RANK", 0))  # set by torchrun
    if local_rank != 0:
        wait_for(path, local_rank)
        return (*load(path, pretokenize), 0)
    cached = load_if_sound(path, pretokenize)
    if cached is not None:
        return (*cached, 0)
    weigher = path.with_name(f"{path.name}.weigher")  # who weighs: for the waiting ranks
    weigher.parent.mkdir(parents=True, exist_ok=True)
    weigher.write_text(json.dumps({"host": socket.gethostname(), "pid": os.getpid()}))
    try:
        scratch = scratch_path(path)
        arrays, tokens = weigh(rows, family, pretokenize, num_proc, scratch)
        alone = int(os.environ.get("LOCAL_WORLD_SIZE", 1)) == 1  # no local rank waits for it
        if unreachable(arrays, None if alone else path) and alone:
            return weights_of(arrays), tokens, len(rows)
        save(path, arrays, tokens)
    finally:
        weigher.unlink(missing_ok=True)
    return (*load(path, pretokenize), len(rows))


def wait_for(path: Path, local_rank: int) -> None:
    """Wait until local rank 0 of this machine has saved the weights under `path`, with no
    collective call; raise at once if it stopped while weighing (its process is gone), or after
    WAIT_FOR_WEIGHING, looking every POLL_SECONDS."""
    deadline = time.monotonic() + WAIT_FOR_WEIGHING.total_seconds()
    if not is_complete(path):
        print(f"local rank {local_rank}: waiting for local rank 0 to weigh the rows", flush=True)
    while not is_complete(path):
        gone = weigher_gone(path.with_name(f"{path.name}.weigher"))
        if gone is not None:
            raise RuntimeError(
                f"local rank {local_rank}: local rank 0 (pid {gone}) stopped while weighing the "
                f"rows into {path}; its own error says why"
            )
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"local rank {local_rank} waited {WAIT_FOR_WEIGHING} for local rank 0 to weigh "
                f"the rows into {path}; did local rank 0 build the same dataset?"
            )
        time.sleep(POLL_SECONDS)


def weigher_gone(weigher: Path) -> int | None:
    """The pid of the process of this machine that was weighing, if it no longer runs."""
    try:
        who = json.loads(weigher.read_text())
    except (OSError, ValueError):  # nobody is weighing yet, or the file is being written
        return None
    if who.get("host") != socket.gethostname():
        return None  # a cache shared with another machine: its processes cannot be seen
    return None if process_exists(who["pid"]) else who["pid"]


# Every rank of every machine weighs a share ---------------------------------------------------


def weigh_across_ranks(rows, family, key: str, path: Path, num_proc) -> tuple[Weights, int]:
    """(weights, rows weighed here): the ranks of machines without the cache weigh a share each;
    all ranks gather the shares; local rank 0 of each such machine caches the whole."""
    # the shares cross as CPU tensors over a gloo group of their own, whatever the training
    # backend; a rank that stops answering fails the others after WAIT_FOR_WEIGHING (gloo fails
    # them at once when its process is gone)
    group = dist.new_group(backend="gloo", timeout=WAIT_FOR_WEIGHING)
    rank, world_size = dist.get_rank(group), dist.get_world_size(group)
    cached = load_if_sound(path, pretokenize=False)
    keys_and_caches = [None] * world_size
    with ranks_answering(group, "weighing-keys", WHILE_WEIGHING, "the gather of cache keys"):
        dist.all_gather_object(keys_and_caches, (key, cached is not None), group=group)
    if len({k for k, _ in keys_and_caches}) > 1:
        raise RuntimeError(
            "the ranks weighing together built different datasets or processors (their weights' "
            "cache keys differ); build the same dataset on every rank"
        )
    cold = [r for r, (_, warm) in enumerate(keys_and_caches) if not warm]
    if not cold:
        return cached[0], 0
    share = np.arange(cold.index(rank), len(rows), len(cold)) if rank in cold else np.arange(0)
    if len(share):
        mine, _ = weigh(rows.select(share), family, False, num_proc, None)
    else:
        mine = {name: np.zeros(0, np.int32) for name in ARRAYS}
    arrays = gather_shares(mine, cold, len(rows), group)
    print(f"rank {rank}: weighed {len(share):,} of {len(rows):,} rows (its share)", flush=True)
    if rank in cold and int(os.environ.get("LOCAL_RANK", 0)) == 0 and not unreachable(arrays):
        save(path, arrays)  # (the ranks have the weights: none waits for this cache)
    return weights_of(arrays), len(share)


def gather_shares(mine: dict, cold: list[int], num_rows: int, group) -> dict:
    """Every row's weights, from the shares: cold rank k weighed rows k, k + C, k + 2C, ...
    (C cold ranks); the other ranks send nothing."""
    longest = -(-num_rows // len(cold))
    sent = torch.zeros(longest, len(ARRAYS), dtype=torch.int32)
    for column, name in enumerate(ARRAYS):
        sent[: len(mine[name]), column] = torch.from_numpy(mine[name].astype(np.int32))
    received = [torch.zeros_like(sent) for _ in range(dist.get_world_size(group))]
    with ranks_answering(group, "weighing-shares", WHILE_WEIGHING, "the gather of the weights"):
        dist.all_gather(received, sent, group=group)
    whole = torch.zeros(num_rows, len(ARRAYS), dtype=torch.int32)
    for k, rank in enumerate(cold):
        count = len(range(k, num_rows, len(cold)))
        whole[k :: len(cold)] = received[rank][:count]
    return {name: whole[:, column].numpy() for column, name in enumerate(ARRAYS)}


def unreachable(arrays: dict, cached_at: Path | None = None) -> int:
    """Rows whose remote file did not answer (mmdp.data.files), said once: their weights are not
    cached, so that the next run reads those files again, or (`cached_at`) are, and the warning
    names the folder to delete to read them again."""
    count = int((arrays["reasons"] == CODE[UNREACHABLE_FILE]).sum())
    if count:
        then = (
            f"cached in {cached_at} (other ranks wait for it): delete it to read them again"
            if cached_at
            else "not cached: the next run reads them again"
        )
        print(
            f"warning: {count:,} rows name a remote file that did not answer "
            f"({UNREACHABLE_FILE}); these weights are {then}",
            file=sys.stderr,
        )
    return count


# Weighing ---------------------------------------------------------------------


def weigh(rows, family, pretokenize: bool, num_proc, scratch: Path | None):
    """(arrays, tokens) of `rows`: steps 1-2 (tokens: a Dataset with pretokenize, else None)."""
    image_counts = count_images(rows)  # from the list offsets: no image bytes read
    if num_proc is None:
        num_proc = os.cpu_count() if len(rows) >= PARALLEL_FROM_ROWS else 1
    columns = ["texts", "images"] if family.needs_image_sizes else ["texts"]
    columns += ["videos"] if "videos" in rows.column_names else []  # headers read: frames, sizes
    features = {**WEIGHT_FEATURES, **(TOKEN_FEATURES if pretokenize else {})}
    if pretokenize:
        shutil.rmtree(scratch, ignore_errors=True)
        scratch.mkdir(parents=True)
    with environment_kept():
        weighed = rows.select_columns(columns).map(
            weigh_batch,
            batched=True,
            batch_size=BATCH_ROWS,
            with_indices=True,
            num_proc=num_proc if num_proc > 1 else None,
            fn_kwargs={"family": family, "pretokenize": pretokenize, "image_counts": image_counts},
            remove_columns=columns,
            features=Features(features),
            keep_in_memory=not pretokenize,
            cache_file_name=str(scratch / "map.arrow") if pretokenize else None,
            desc=f"Weighing rows ({num_proc} process{'es' * (num_proc > 1)})",
        )
    # one read of whole columns: indexing a formatted column row by row would take longer than
    # tokenizing (bench/bench_scale.py measured it)
    columns = weighed.select_columns(list(WEIGHT_FEATURES)).with_format("numpy")[:]
    arrays = {name: columns[feature] for name, feature in zip(ARRAYS, WEIGHT_FEATURES)}
    tokens = weighed.select_columns(list(TOKEN_FEATURES)) if pretokenize else None
    return arrays, tokens


@contextlib.contextmanager
def environment_kept():
    """Leave os.environ as it was: the same object, the same variables.

    datasets' map with num_proc sets TOKENIZERS_PARALLELISM=false for its forked processes, then
    puts in os.environ's place a copy of it taken before (Dataset.map, datasets 5.2). Afterwards the
    process's own environment still says "false" where os.environ does not, and os.environ is
    another object: a variable set or restored through the old one (as pytest's monkeypatch restores
    what it changed) no longer shows in os.environ.
    """
    environ, parallelism = os.environ, os.environ.get("TOKENIZERS_PARALLELISM")
    try:
        yield
    finally:
        os.environ = environ  # noqa: B003 (the object datasets took away, not a new one)
        if parallelism is None:
            environ.pop("TOKENIZERS_PARALLELISM", None)
        else:
            environ["TOKENIZERS_PARALLELISM"] = parallelism


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
    """datasets.map's function (and Ray Data's: mmdp.weighing.on_ray): the weights (and, with
    pretokenize, the tokens) of a few rows.

    `image_counts` (every row's, by index): all a family that needs no image sizes reads of the
    images, so their bytes stay on disk.
    """
    images = batch["images"] if family.needs_image_sizes else image_counts[indices].tolist()
    videos = batch.get("videos") or [None] * len(images)
    if not pretokenize:
        lengths, counts, patches, reasons = family.weigh(batch["texts"], images, videos)
        return dict(zip(WEIGHT_FEATURES, (lengths, counts, patches, [CODE[r] for r in reasons])))
    out = {key: [] for key in (*WEIGHT_FEATURES, *TOKEN_FEATURES)}
    family.read_settings()  # once for the batch: tokenize reads what it found
    for texts, row_images, row_videos in zip(batch["texts"], images, videos):
        try:
            input_ids, labels, count, patches = family.tokenize(texts, row_images, row_videos)
            reason = None
        except (BadConversation, BadImage, BadVideo) as error:
            input_ids = labels = torch.zeros(0, dtype=torch.long)
            count = row_images if isinstance(row_images, int) else len(row_images or [])
            patches, reason = 0, error.reason
        input_ids, labels = (tokens.numpy().astype(np.int32) for tokens in (input_ids, labels))
        row = (len(input_ids), count, patches, CODE[reason], input_ids, labels)  # out's columns
        for column, value in zip(out.values(), row):
            column.append(value)
    return out
