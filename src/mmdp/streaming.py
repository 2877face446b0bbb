"""Stage 5 from a stream: pack a dataset you cannot (or will not) download first.

This is the blog's stage 5 as it tells it: read samples into a buffer, pack the buffer with
knapsacks, yield the packs, refill. `mmdp.packed_dataset` plans a whole epoch from lengths
instead, which packs a little better when the dataset is on disk; this module is for
`load_dataset(..., streaming=True)` (the_cauldron's 50 subsets, FineVision's ~24 M rows) or any
other stream of rows in the_cauldron's schema. Same batches (mmdp.packed_batch), same strategies,
same two budgets.

Every DataLoader worker of every rank is a *reader* with its own share of the stream. A reader:

1. Fills a buffer with the next `buffer_size` rows of its share and weighs them without decoding
   an image: text tokens + 64 per image (mmdp.conversation.count_tokens_batch).
2. Skips, and counts by reason, the rows that are too long for `max_length`, have more images
   than `max_images`, or have no usable conversation.
3. Shuffles the buffer, packs it under both budgets (mmdp.packing.pack_flat) and shuffles the
   packs: the buffer is the shuffle window.
4. Builds the packs, `packs_per_batch` at a time, into batches (tokenize, decode and resize the
   images, lay out) in a producer thread, and goes back to 1. A batch may take its first packs
   from one buffer and its last from the next; only a reader's last batch may be short.

Memory is the buffer plus a few batches in flight per reader: flat in the dataset's size.

What a stream makes hard, and how it is done here:

- **Sharding without repeats.** Ranks split a `datasets.IterableDataset` with
  `datasets.distributed.split_dataset_by_node`; inside a DataLoader worker, datasets gives each
  worker its own shards of the rank's share (mmdp never splits again: doing both would skip
  rows). Every row is read by exactly one reader. With too few shards datasets falls back to a
  correct but slower split (every rank reads every row and keeps 1 in world_size; a worker with
  no shard stays idle), and the loader warns. A plain Python iterable has no shards: every
  reader reads all of it and keeps 1 row in (ranks x workers).
- **Ranks end together, nothing lost silently.** No rank knows how many batches its share
  makes. StreamingDataLoader all-reduces "I have a batch" at every step and every rank stops at
  the first step where some rank has none: no DDP hang. What the other ranks still held (the
  batch in hand, and the rest of the buffer it came from) is counted as dropped,
  `held_when_ranks_stopped`, in `loader.dropped_at_end`.
- **Resume exactly.** Every batch carries its reader's position as of producing it
  (`stream_state`): where its buffer starts in the stream, and how many of that buffer's packs
  are yielded with it. The loader keeps the latest per worker. On resume each reader goes back
  to the start of its buffer, reads and packs it again (the same packs: packing is
  deterministic given the buffer and the seed), skips the packs already yielded and goes on.

Rows read: a reader counts the rows of every buffer a yielded batch came from. `samples +
sum(dropped) == rows read` holds for every epoch, on one rank or many, once
`loader.dropped_at_end` is added (see StreamingDataLoader).
"""

import copy
import warnings
from collections import Counter, deque
from collections.abc import Iterable, Iterator
from itertools import islice

import datasets
import numpy as np
import torch
import torch.distributed as dist
from datasets.distributed import split_dataset_by_node
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from mmdp import config
from mmdp.background import iterate_in_background
from mmdp.conversation import count_tokens_batch
from mmdp.data import UNDECODED_IMAGES
from mmdp.drop_reasons import HELD_AT_STOP, TOO_LONG, TOO_MANY_IMAGES
from mmdp.metrics import spread
from mmdp.packed_batch import collate_packs, layout_pack
from mmdp.packed_dataset import rank_and_world_size
from mmdp.packing import Strategy, pack_flat
from mmdp.vqa_dataset import make_sample

# 2-3. Pack one buffer (pure: weights in, packs out) --------------------------------------------


def pack_buffer(
    lengths,
    image_counts,
    problems: list[str | None],
    rng: np.random.Generator,
    *,
    max_length: int,
    max_images: int,
    strategy: Strategy = "images_first_bfd",
) -> tuple[list[np.ndarray], Counter]:
    """Steps 2-3 for one buffer: its packs (positions in the buffer) and its drops, by reason.

    `problems[i]` is why row i has no usable conversation, or None. Same buffer, same rng state:
    same packs. Example: lengths [3, 9, 6, 2, 5], no images, max_length 8, "binpack": row 1 is
    too long; FFD takes 6, 5, 3, 2 and makes the packs [2, 3] (6 + 2) and [4, 0] (5 + 3), in a
    shuffled order; dropped {"too_long": 1}.
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    image_counts = np.asarray(image_counts, dtype=np.int64)
    dropped = Counter(reason for reason in problems if reason is not None)
    usable = np.array([reason is None for reason in problems], dtype=bool)
    too_long = usable & (lengths > max_length)
    too_many_images = usable & ~too_long & (image_counts > max_images)
    dropped[TOO_LONG] += int(too_long.sum())
    dropped[TOO_MANY_IMAGES] += int(too_many_images.sum())
    rows = rng.permutation(np.flatnonzero(usable & ~too_long & ~too_many_images))
    items, starts = pack_flat(lengths[rows], max_length, strategy, image_counts[rows], max_images)
    packs = [rows[items[a:b]] for a, b in zip(starts[:-1].tolist(), starts[1:].tolist())]
    return [packs[i] for i in rng.permutation(len(packs))], +dropped


# 1. Read a reader's share of the stream -------------------------------------------------------

END = object()  # the end of a plain iterable


class ReaderStream:
    """One reader's rows, as (row id, row) pairs, and where it is in the stream.

    `start` is a `position()` to continue from (None: the start of the epoch). Row ids are unique
    in an epoch: for a plain iterable, the row's position in it; for a datasets.IterableDataset,
    (rows this reader read before it) * readers + reader.
    """

    def __init__(self, rows: Iterable[dict], reader: int, readers: int, start: dict | None):
        self.reader, self.readers = reader, readers
        self.pulled = start["rows"] if start else 0  # rows taken from the stream so far
        if isinstance(rows, datasets.IterableDataset):
            # A copy, so that the resume point stays with this reader (copy.copy of a
            # datasets.IterableDataset shares its attributes: give it its own). Iterated inside
            # a DataLoader worker, datasets gives the worker its own shards.
            self.stream = copy.copy(rows)
            self.stream.__dict__ = dict(rows.__dict__)
            if start is not None:
                self.stream.load_state_dict(start["stream"])
            self.iterator = iter(self.stream)
        else:
            self.stream = None
            self.iterator = iter(rows)
            for _ in islice(self.iterator, self.pulled):  # read again up to where we were
                pass

    def take(self, n: int) -> list[tuple[int, dict]]:
        """The next n rows of this reader (fewer at the end), without reading one row further."""
        taken = []
        if self.stream is not None:
            for row in islice(self.iterator, n):
                taken.append((self.pulled * self.readers + self.reader, row))
                self.pulled += 1
            return taken
        while len(taken) < n:  # a plain iterable: keep 1 row in `readers`
            row = next(self.iterator, END)
            if row is END:
                break
            if self.pulled % self.readers == self.reader:
                taken.append((self.pulled, row))
            self.pulled += 1
        return taken

    def position(self) -> dict:
        stream = self.stream.state_dict() if self.stream is not None else None
        return {"rows": self.pulled, "stream": stream}

    def close(self) -> None:
        """Close the underlying generator now (a parquet reader, say), not at interpreter exit."""
        if hasattr(self.iterator, "close"):
            self.iterator.close()


# 1-4. The dataset: what every reader runs ----------------------------------------------------


class StreamingPackedDataset(IterableDataset):
    """Packs a stream of rows (the_cauldron's schema) into fixed-length rows under a token and an
    image budget, buffer by buffer. Iterate it with StreamingDataLoader.

    `rows`: a datasets.IterableDataset (`load_dataset(..., streaming=True)`,
    `Dataset.to_iterable_dataset(num_shards=...)`), or any iterable that starts over at every
    `iter()` and gives the same rows in the same order (a list, a reader of files): not an
    iterator, which can be read only once. Under torchrun, rank and world size come from
    torch.distributed.
    """

    def __init__(
        self,
        rows: Iterable[dict],
        tokenizer,
        *,
        max_length: int = config.MAX_LENGTH,
        max_images: int = config.MAX_IMAGES,
        packs_per_batch: int = config.BATCH_SIZE,
        strategy: Strategy = "images_first_bfd",
        buffer_size: int = 4096,
        seed: int = 0,
        rank: int | None = None,
        world_size: int | None = None,
        image_size: int = config.IMAGE_SIZE,
        image_token_length: int = config.IMAGE_TOKEN_LENGTH,
        max_queued_batches: int = 2,
    ):
        if isinstance(rows, Iterator):
            raise TypeError(
                "rows is an iterator, which can be read only once: pass something that starts "
                "over at every iter() (a datasets.IterableDataset, a list, a reader of files), "
                "so that the next epoch and a resume can read it again"
            )
        if buffer_size < 1:
            raise ValueError(f"buffer_size must be positive, got {buffer_size}")
        self.tokenizer = tokenizer
        self.max_length = max_length
        self.max_images = max_images
        self.packs_per_batch = packs_per_batch
        self.strategy = strategy
        self.buffer_size = buffer_size
        self.seed = seed
        self.image_size = image_size
        self.image_token_length = image_token_length
        self.max_queued_batches = max_queued_batches
        self.rank, self.world_size = rank_and_world_size(rank, world_size)
        self.total_shards = None  # a plain iterable has none
        if isinstance(rows, datasets.IterableDataset):
            rows = with_undecoded_images(rows)
            self.total_shards = rows.num_shards
            if self.world_size > 1:
                rows = split_dataset_by_node(rows, self.rank, self.world_size)
        self.rows = rows  # this rank's share
        self.epoch = 0
        # Where each worker starts (None: at the start of the epoch); set by StreamingDataLoader,
        # it reaches the workers with the dataset.
        self.start_positions = None
        self.set_epoch(0)

    def set_epoch(self, epoch: int) -> None:
        """A new shuffle of every buffer (and, for datasets, of the shards if it shuffles them)."""
        self.epoch = epoch
        if isinstance(self.rows, datasets.IterableDataset):
            self.rows.set_epoch(epoch)

    def sharding_note(self, num_workers: int) -> str | None:
        """A warning when the stream has too few shards for ranks x workers, else None."""
        workers = max(num_workers, 1)
        readers = self.world_size * workers
        if self.total_shards is None:
            if readers == 1:
                return None
            return (
                f"a {type(self.rows).__name__} has no shards: each of the {readers} readers "
                f"({self.world_size} rank(s) x {workers} worker(s)) reads every row and keeps 1 in "
                f"{readers}. Correct, but the stream is read {readers} times; a "
                f"datasets.IterableDataset with a multiple of {readers} shards is read once"
            )
        notes = []
        if self.world_size > 1 and self.total_shards % self.world_size:
            notes.append(
                f"its {self.total_shards} shard(s) are not a multiple of the {self.world_size} "
                f"ranks, so every rank reads every row and keeps 1 in {self.world_size}"
            )
        if self.rows.num_shards < workers:
            notes.append(
                f"a rank has {self.rows.num_shards} shard(s) for {workers} DataLoader workers, so "
                f"{workers - self.rows.num_shards} worker(s) per rank stay idle"
            )
        if not notes:
            return None
        return (
            "the stream has too few shards for ranks x workers: "
            + "; ".join(notes)
            + f". Correct, but slower: use a multiple of {readers} shards (more parquet files, "
            "or IterableDataset.reshard())"
        )

    def __iter__(self):
        worker = get_worker_info()
        worker_id, num_workers = (0, 1) if worker is None else (worker.id, worker.num_workers)
        start = self.start_positions[worker_id] if self.start_positions else None
        produced = iterate_in_background(
            lambda: self.produce(worker_id, num_workers, start), max_queued=self.max_queued_batches
        )
        # Collate here, while the producer thread builds the next packs (as a DataLoader does
        # with its batches in the worker's main thread).
        for item in produced:
            yield item if "end_of_stream" in item else collate(item)

    def produce(self, worker: int, num_workers: int, start: dict | None):
        """Steps 1-4 for one reader: the packs of each batch with the reader's state, then an
        end-of-stream item with the rows dropped after its last batch. `start` is a batch's
        `stream_state` to continue after."""
        if start is not None and start["ended"]:
            yield {"end_of_stream": True, "worker": worker, "dropped": Counter()}
            return
        reader = self.rank * num_workers + worker
        stream = ReaderStream(self.rows, reader, self.world_size * num_workers, start_of(start))
        buffer_start = start_of(start)  # where the current buffer starts in the stream
        buffer_number = start["buffer"] if start else 0
        skip = start["packs_done"] if start else 0  # packs of this buffer yielded before a resume
        not_reported = Counter()  # rows dropped that no yielded pack has reported yet
        packs, state = [], None
        try:
            while buffer := stream.take(self.buffer_size):
                plan, dropped, lengths = self.pack_rows(buffer, reader, buffer_number)
                if skip == 0:  # else the first pack, yielded before the resume, reported them
                    not_reported.update(dropped)
                for k in range(skip, len(plan)):
                    pack = self.build_pack([buffer[i] for i in plan[k]], lengths[plan[k]])
                    pack["dropped"].update(not_reported)
                    not_reported.clear()
                    packs.append(pack)
                    state = {
                        "worker": worker, "ended": False, "position": buffer_start,
                        "buffer": buffer_number, "packs_done": k + 1,
                        "rows_held": sum(len(p) for p in plan[k + 1 :]),
                    }  # fmt: skip
                    if len(packs) == self.packs_per_batch:
                        yield {"packs": packs, "stream_state": state}
                        packs = []
                skip = 0
                buffer_number += 1
                buffer_start = stream.position()
            if packs:  # the reader's last, short batch
                yield {"packs": packs, "stream_state": state}
            yield {"end_of_stream": True, "worker": worker, "dropped": not_reported}
        finally:
            stream.close()

    def pack_rows(self, buffer: list[tuple[int, dict]], reader: int, buffer_number: int):
        """Steps 1-3: weigh the buffer's rows, filter, shuffle and pack them."""
        image_counts = np.array([len(row["images"] or []) for _, row in buffer], dtype=np.int64)
        lengths, problems = count_tokens_batch(
            [row["texts"] for _, row in buffer],
            image_counts,
            self.tokenizer,
            self.image_token_length,
        )
        lengths = np.asarray(lengths, dtype=np.int64)
        rng = np.random.default_rng([self.seed, self.epoch, reader, buffer_number])
        plan, dropped = pack_buffer(
            lengths, image_counts, problems, rng,
            max_length=self.max_length, max_images=self.max_images, strategy=self.strategy,
        )  # fmt: skip
        return plan, dropped, lengths

    def build_pack(self, rows: list[tuple[int, dict]], lengths: np.ndarray) -> dict:
        """Tokenize the rows, decode their images, and lay them out in one padded row."""
        samples = [
            make_sample(row, row_id, self.tokenizer, self.image_size, self.image_token_length)
            for row_id, row in rows
        ]
        for s, length in zip(samples, lengths.tolist()):
            if s["drop_reason"] is None and len(s["input_ids"]) != length:
                raise RuntimeError(
                    f"row {s['row']}: weighed {length} tokens, tokenized {len(s['input_ids'])}; "
                    "the tokenizer is not deterministic"
                )
        dropped = Counter(s["drop_reason"] for s in samples if s["drop_reason"] is not None)
        samples = [s for s in samples if s["drop_reason"] is None]
        pack = layout_pack(samples, self.max_length, self.tokenizer.pad_token_id, self.image_size)
        # batch_index is set by the loader: the batch's position in this rank's epoch
        return {**pack, "batch_index": -1, "dropped": dropped}


def collate(item: dict) -> dict:
    """A reader's packs, collated into a batch that carries its reader's state."""
    return {**collate_packs(item["packs"]), "stream_state": item["stream_state"]}


def start_of(state: dict | None) -> dict | None:
    """The stream position a batch's reader state starts its buffer from (None: the start)."""
    return None if state is None else state["position"]


def with_undecoded_images(stream: datasets.IterableDataset) -> datasets.IterableDataset:
    """Images as encoded bytes, as mmdp.data's loaders give them: counting them costs nothing."""
    features = stream.features
    if features is not None and features.get("images") not in (None, UNDECODED_IMAGES):
        stream = stream.cast_column("images", UNDECODED_IMAGES)
    return stream


# The loader: order, positions, ranks that stop together --------------------------------------


class StreamingDataLoader(DataLoader):
    """A DataLoader over a StreamingPackedDataset: yields its batches (mmdp.packed_batch, plus
    `stream_state`), keeps every worker's position for `state_dict()`, and under torchrun stops
    every rank at the same step.

        loader = StreamingDataLoader(StreamingPackedDataset(stream, tokenizer), num_workers=2)
        for batch in loader:
            ...
        report.dropped.update(loader.dropped_at_end)

    `loader.dropped_at_end` (after an epoch): the rows read that no yielded batch reports, by
    reason: those dropped after a worker's last batch, and `held_when_ranks_stopped`.

    `stop_together` (default: when torch.distributed runs more than one rank) all-reduces one
    flag per step over `group` (default: the world). With NCCL the flag is a GPU tensor and
    reading it waits for the GPU; pass a gloo group (`dist.new_group(backend="gloo")`) to keep
    it on the CPU.
    """

    def __init__(
        self,
        dataset: StreamingPackedDataset,
        num_workers: int = 2,
        *,
        stop_together: bool | None = None,
        group=None,
        **kwargs,
    ):
        for name in ("batch_size", "collate_fn", "persistent_workers"):
            if kwargs.get(name):
                # batches are made in the workers; persistent workers would keep the first
                # epoch's copy of the dataset, and never see a new epoch or a resume
                raise ValueError(f"StreamingDataLoader does not take {name}")
        super().__init__(
            dataset, batch_size=None, collate_fn=as_is, num_workers=num_workers, **kwargs
        )
        self.stop_together = stop_together  # None: decided when iterating
        self.group = group
        self.readers = max(num_workers, 1)
        self.dropped_at_end = Counter()
        self.start_epoch()

    def start_epoch(self) -> None:
        self.workers = [None] * self.readers  # each worker's latest stream_state, None: not started
        self.next_worker = 0  # whose batch comes next
        self.batches_done = 0

    def set_epoch(self, epoch: int) -> None:
        self.dataset.set_epoch(epoch)
        self.start_epoch()

    def __iter__(self):
        note = self.dataset.sharding_note(self.num_workers)
        if note and self.dataset.rank == 0:
            warnings.warn(note, stacklevel=2)
        self.dropped_at_end = Counter()
        stop_together = self.stop_together
        if stop_together is None:
            distributed = dist.is_available() and dist.is_initialized()
            stop_together = distributed and dist.get_world_size(self.group) > 1
        # Where each worker starts: travels to the workers with the dataset.
        self.dataset.start_positions = list(self.workers)
        items = in_turns(super().__iter__(), self.readers, self.next_worker)
        batches = self.follow(items)
        try:
            while True:
                batch = next(batches, None)
                if stop_together and not all_ranks_have_a_batch(batch is not None, self.group):
                    self.count_held(batch)
                    break
                if batch is None:
                    break
                yield batch
            self.start_epoch()  # the epoch is over: state_dict() says so
        finally:
            batches.close()  # and with it the DataLoader's iterator: the workers stop now
            self.dataset.start_positions = None

    def follow(self, items):
        """The batches of `items`, keeping each worker's position and the drops at the end."""
        for item in items:
            worker = worker_of(item)
            if "end_of_stream" in item:
                self.workers[worker] = {"worker": worker, "ended": True, "rows_held": 0}
                self.dropped_at_end.update(item["dropped"])
                continue
            self.workers[worker] = item["stream_state"]
            self.next_worker = (worker + 1) % self.readers
            item["batch_index"] = self.batches_done
            self.batches_done += 1
            yield item

    def count_held(self, in_hand: dict | None) -> None:
        """Count what this rank still held when the ranks stopped: the batch in hand, and the
        rows of the packs its workers had not yielded yet from their current buffers."""
        held = sum(state["rows_held"] for state in self.workers if state is not None)
        if in_hand is not None:
            held += len(in_hand["sample_index"])
            self.dropped_at_end.update(in_hand["dropped"])
        if held:
            self.dropped_at_end[HELD_AT_STOP] += held

    def settings(self) -> dict:
        """What decides which rows a reader reads and how it packs them: a resume needs the same."""
        d = self.dataset
        return {
            "seed": d.seed, "rank": d.rank, "world_size": d.world_size,
            "num_workers": self.num_workers, "buffer_size": d.buffer_size,
            "packs_per_batch": d.packs_per_batch, "strategy": d.strategy,
            "max_length": d.max_length, "max_images": d.max_images,
            "image_token_length": d.image_token_length,
        }  # fmt: skip

    def state_dict(self) -> dict:
        """Where this rank is in the epoch. Save it per rank: each rank reads its own share."""
        return copy.deepcopy(
            {
                **self.settings(), "epoch": self.dataset.epoch,
                "batches_done": self.batches_done, "next_worker": self.next_worker,
                "workers": self.workers,
            }
        )  # fmt: skip

    def load_state_dict(self, state: dict) -> None:
        """Continue an epoch: the next iteration yields exactly the rows not yet yielded.

        Needs the same settings (seed, rank, world size, workers, budgets, buffer...) and the
        same tokenizer: they decide which rows each reader reads and how it packs them.
        """
        now = self.settings()
        different = [f"{k} {state[k]} (now {v})" for k, v in now.items() if state[k] != v]
        if different:
            raise ValueError(
                "cannot resume: the state was saved with " + ", ".join(different)
                + "; they decide which rows each reader reads and how it packs them"
            )  # fmt: skip
        self.dataset.set_epoch(state["epoch"])
        self.workers = copy.deepcopy(state["workers"])
        self.next_worker = state["next_worker"]
        self.batches_done = state["batches_done"]


def as_is(item):
    """The DataLoader's collate_fn: batches are collated in the workers already."""
    return item


def in_turns(items, readers: int, first: int):
    """The items of several workers, each worker's in its own order, one worker after the other
    from `first` on, skipping workers that have ended.

    A DataLoader takes its workers in turn from worker 0; after a resume the next batch may be due
    from another worker, and this yields the batches in the order an uninterrupted epoch would.
    """
    waiting = [deque() for _ in range(readers)]
    active = [True] * readers
    turn = first
    for item in items:
        waiting[worker_of(item)].append(item)
        while active[turn] and waiting[turn]:
            item = waiting[turn].popleft()
            if "end_of_stream" in item:
                active[turn] = False
            yield item
            turn = next_active(turn, active)
    if any(waiting):
        raise RuntimeError("a worker's batches came after its end of stream")


def worker_of(item: dict) -> int:
    """The worker that produced a batch or an end-of-stream item."""
    return item["worker"] if "end_of_stream" in item else item["stream_state"]["worker"]


def next_active(turn: int, active: list[bool]) -> int:
    """The next worker after `turn` (cyclically) that has not ended; `turn` when none is left."""
    readers = len(active)
    later = [(turn + step) % readers for step in range(1, readers + 1)]
    return next((worker for worker in later if active[worker]), turn)


def all_ranks_have_a_batch(have_one: bool, group=None) -> bool:
    """True when every rank has a batch for this step: one all-reduce (MIN) of a 0/1 flag."""
    on_gpu = dist.get_backend(group) == "nccl"
    device = torch.device("cuda", torch.cuda.current_device()) if on_gpu else torch.device("cpu")
    flag = torch.tensor([int(have_one)], device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=group)
    return bool(flag.item())


def rank_balance(steps: list[list[tuple[int, int]]]) -> dict:
    """PackedDataset.rank_balance for batches already yielded: `steps[rank]` lists the (tokens,
    images) of each of that rank's batches."""
    token_spreads, image_spreads = [], []
    for step in zip(*steps):
        token_spreads.append(max(t for t, _ in step) - min(t for t, _ in step))
        image_spreads.append(max(i for _, i in step) - min(i for _, i in step))
    return {
        "world_size": len(steps),
        "batches_per_rank": [len(batches) for batches in steps],
        "token_spread_per_step": spread(token_spreads),
        "image_spread_per_step": spread(image_spreads),
    }
