"""Stage 5 from a stream: pack a dataset you cannot (or will not) download first.

This is the blog's stage 5 as it tells it: read samples into a buffer, pack the buffer with
knapsacks, yield the packs, refill. `mmdp.loading.packed_dataset` plans a whole epoch from
lengths instead, which packs a little better when the dataset is on disk; this module is for
`load_dataset(..., streaming=True)` (the_cauldron's 50 subsets, FineVision's ~24 M rows) or any
other stream of rows in the_cauldron's schema. Same batches (mmdp.batch), same
strategies, same two budgets, the same filter and packing steps as the planner
(mmdp.planning.planner), applied to one buffer at a time.

Every DataLoader worker of every rank is a *reader* with its own share of the stream. A reader:

1. Fills a buffer with the next `buffer_size` rows of its share and weighs them without decoding
   an image, by its model family's rules (as mmdp.weighing.weigh weighs a dataset on disk).
2. Skips, and counts by reason, the rows that are too long for `max_length`, have more images
   than `max_images`, or have no usable conversation.
3. Shuffles the buffer, packs it under both budgets and shuffles the packs: the buffer is the
   shuffle window.
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
  no shard stays idle), and the loader warns (`sharding_warning`). A plain Python iterable has
  no shards: every reader reads all of it and keeps 1 row in (ranks x workers).
- **Ranks end together, nothing lost silently.** No rank knows how many batches its share
  makes. StreamingDataLoader all-reduces "I have a batch" at every step and every rank stops at
  the first step where some rank has none: no DDP hang. What the other ranks still held (the
  batch in hand, and the rest of the buffer it came from) is counted as dropped,
  `held_when_ranks_stopped`, in `loader.dropped_at_end`.
- **Resume exactly.** Every batch carries its reader's state as of producing it
  (`reader_state`, a ReaderState): its reader's state where its buffer starts, and how
  many of that buffer's packs are yielded with it. The loader keeps the latest per worker. On
  resume each reader goes back to the start of its buffer, reads and packs it again (the same
  packs: packing is deterministic given the buffer and the seed), skips the packs already
  yielded and goes on.

Rows read: a reader counts the rows of every buffer a yielded batch came from. `samples +
sum(dropped) == rows read` holds for every epoch, on one rank or many, once
`loader.dropped_at_end` is added (see StreamingDataLoader).
"""

import copy
import dataclasses
import warnings
from collections import Counter, deque
from collections.abc import Iterable, Iterator
from datetime import timedelta
from itertools import islice

import datasets
import numpy as np
import torch.distributed as dist
from datasets.distributed import split_dataset_by_node
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from mmdp import config as defaults
from mmdp.batch import build_pack, collate_packs
from mmdp.data.families import family_for
from mmdp.data.images import undecoded
from mmdp.data.reading.sources import first_line, first_unreadable
from mmdp.drop_reasons import HELD_WHEN_RANKS_STOPPED
from mmdp.errors import UserError
from mmdp.loading.background import iterate_in_background
from mmdp.loading.guards import RefusesAcceleratePrepare, iterated_elsewhere
from mmdp.loading.workers import check_temp_folder, name_failed_worker
from mmdp.packing.packing_config import PackingConfig, PackingSettings, check_resume, default_config
from mmdp.packing.weights import Weights
from mmdp.planning.planner import pack_buffer
from mmdp.ranks import ANSWER_TIMEOUT, all_ranks_have_a_batch, rank_and_world_size

# 1. A reader's share of the stream, and where it is (what a resume starts from) ----------------


class ReaderStream:
    """One reader's rows, as (row id, row) pairs, and where it is in the stream.

    `state` is what `state_dict()` returned earlier, to continue from (None: the start of the
    epoch). Row ids are unique in an epoch: for a plain iterable, the row's place in it; for a
    datasets.IterableDataset, (rows this reader took before it) * readers + reader.
    """

    def __init__(self, rows: Iterable[dict], reader: int, readers: int, state: dict | None):
        self.reader, self.readers = reader, readers
        self.rows_taken = state["rows"] if state else 0  # rows read from the stream so far
        if isinstance(rows, datasets.IterableDataset):
            # A copy, so that the resume point stays with this reader (copy.copy of a
            # datasets.IterableDataset shares its attributes: give it its own). Iterated inside
            # a DataLoader worker, datasets gives the worker its own shards.
            self.stream = copy.copy(rows)
            self.stream.__dict__ = dict(rows.__dict__)
            if state is not None:
                self.stream.load_state_dict(state["stream"])
            self.iterator = iter(self.stream)
        else:
            self.stream = None
            self.iterator = iter(rows)
            for _ in islice(self.iterator, self.rows_taken):  # read again up to where we were
                pass

    def take(self, n: int) -> list[tuple[int, dict]]:
        """The next n rows of this reader (fewer at the end), without reading one row further."""
        taken = []
        if self.stream is not None:
            try:
                for row in islice(self.iterator, n):
                    taken.append((self.rows_taken * self.readers + self.reader, row))
                    self.rows_taken += 1
            except Exception as error:  # a damaged or vanished file: say which, in one sentence
                named = first_unreadable(stream_files(self.stream))  # else the error itself
                raise UserError(
                    named
                    or f"the stream failed after {self.rows_taken:,} rows of reader {self.reader} "
                    f"({error.__class__.__name__}: {first_line(error)})"
                ) from error
            return taken
        for row in self.iterator:  # a plain iterable: keep 1 row in `readers`
            if self.rows_taken % self.readers == self.reader:
                taken.append((self.rows_taken, row))
            self.rows_taken += 1
            if len(taken) == n:
                break
        return taken

    def state_dict(self) -> dict:
        """Where this reader is: rows taken, and the datasets stream's own state."""
        stream = self.stream.state_dict() if self.stream is not None else None
        return {"rows": self.rows_taken, "stream": stream}

    def close(self) -> None:
        """Close the underlying generator now (a parquet reader, say), not at interpreter exit."""
        if hasattr(self.iterator, "close"):
            self.iterator.close()


def stream_files(stream: datasets.IterableDataset) -> list[str]:
    """The data files behind a datasets stream of files (parquet, arrow...), [] for others.

    datasets keeps them in the `files` argument of the innermost examples iterable (not public
    API: anything else gives [], and the error then names the reader instead of a file)."""
    files, iterable = [], getattr(stream, "_ex_iterable", None)
    while iterable is not None:
        for group in (getattr(iterable, "kwargs", None) or {}).get("files", []):
            files += [group] if isinstance(group, str) else [str(f) for f in group]
        iterable = getattr(iterable, "ex_iterable", None)
    return [f for f in files if "://" not in f]  # local files only: remote ones cannot be checked


@dataclasses.dataclass(frozen=True)
class ReaderState:
    """A reader's state as of producing a batch: what a resume starts from.

    buffer_start     the reader's state_dict() where the batch's last buffer starts (None: at the
                     start)
    buffer           that buffer's number in the reader's epoch (it seeds the buffer's shuffle)
    packs_done       how many of that buffer's packs are yielded with this batch
    rows_held        rows of that buffer's packs still to come (counted if the ranks stop now)
    ended            the reader has nothing more (its end of stream was seen)
    """

    worker: int
    buffer_start: dict | None = None
    buffer: int = 0
    packs_done: int = 0
    rows_held: int = 0
    ended: bool = False


def sharding_warning(
    total_shards: int | None, rank_shards: int | None, world_size: int, num_workers: int, kind: str
) -> str | None:
    """Why a stream is read more slowly than it could be by ranks x workers, or None.

    `total_shards`: the stream's shards (None for a plain iterable, `kind` its type name);
    `rank_shards`: the shards of this rank's share.

    >>> sharding_warning(8, 4, world_size=2, num_workers=4, kind="IterableDataset") is None
    True
    >>> note = sharding_warning(3, 3, world_size=1, num_workers=4, kind="IterableDataset")
    >>> print(note)  # doctest: +NORMALIZE_WHITESPACE
    the stream has too few shards for ranks x workers: a rank has 3 shard(s) for 4 DataLoader
    workers, so 1 worker(s) per rank stay idle. Correct, but slower: use a multiple of 4 shards
    (more parquet files, or IterableDataset.reshard())
    """
    workers = max(num_workers, 1)
    readers = world_size * workers
    if total_shards is None:
        if readers == 1:
            return None
        return (
            f"a {kind} has no shards: each of the {readers} readers ({world_size} rank(s) x "
            f"{workers} worker(s)) reads every row and keeps 1 in {readers}. Correct, but the "
            f"stream is read {readers} times; a datasets.IterableDataset with a multiple of "
            f"{readers} shards is read once"
        )
    notes = []
    if world_size > 1 and total_shards % world_size:
        notes.append(
            f"its {total_shards} shard(s) are not a multiple of the {world_size} ranks, so every "
            f"rank reads every row and keeps 1 in {world_size}"
        )
    if rank_shards < workers:
        notes.append(
            f"a rank has {rank_shards} shard(s) for {workers} DataLoader workers, so "
            f"{workers - rank_shards} worker(s) per rank stay idle"
        )
    if not notes:
        return None
    return (
        "the stream has too few shards for ranks x workers: "
        + "; ".join(notes)
        + f". Correct, but slower: use a multiple of {readers} shards (more parquet files, or "
        "IterableDataset.reshard())"
    )


# Steps 1-4: what each reader runs -------------------------------------------------------------


class StreamingPackedDataset(PackingSettings, IterableDataset):
    """Packs a stream of rows (the_cauldron's schema) into fixed-length rows under a token and an
    image budget, buffer by buffer. Iterate it with StreamingDataLoader.

    `rows`: a datasets.IterableDataset (`load_dataset(..., streaming=True)`,
    `Dataset.to_iterable_dataset(num_shards=...)`), or any iterable that starts over at every
    `iter()` and gives the same rows in the same order (a list, a reader of files): not an
    iterator, which can be read only once. `processor`: a tokenizer (mmdp's TinyVLM) or a
    transformers processor of a supported family, as for VQADataset. `config`: a PackingConfig
    (default: the family's budgets, `default_config(family)`). Under torchrun,
    rank and world size come from torch.distributed; with tensor or pipeline parallelism, pass
    the data-parallel process group (`group=mesh.get_group("dp")`) or `rank` and `world_size`.
    """

    def __init__(
        self,
        rows: Iterable[dict],
        processor,
        *,
        config: PackingConfig | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        group=None,
        image_size: int = defaults.IMAGE_SIZE,
        image_token_length: int = defaults.IMAGE_TOKEN_LENGTH,
        max_queued_batches: int = 2,
    ):
        if isinstance(rows, Iterator):
            raise TypeError(
                "rows is an iterator, which can be read only once: pass something that starts "
                "over at every iter() (a datasets.IterableDataset, a list, a reader of files), "
                "so that the next epoch and a resume can read it again"
            )
        self.family = family_for(
            processor, image_size=image_size, image_token_length=image_token_length
        )
        self.config = default_config(self.family) if config is None else config
        if self.config.overflow != "drop":
            raise UserError(
                f"overflow={self.config.overflow!r} needs the planned loader (PackedDataset): a "
                "stream weighs each buffer as it reads it, and fits no row over max_length"
            )
        self.max_queued_batches = max_queued_batches
        self.rank, self.world_size = rank_and_world_size(rank, world_size, group)
        self.total_shards = None  # a plain iterable has none
        rows = undecoded(rows)  # a datasets stream or Dataset: images and videos kept encoded
        if isinstance(rows, datasets.IterableDataset):
            self.total_shards = rows.num_shards
            if self.world_size > 1:
                rows = split_dataset_by_node(rows, self.rank, self.world_size)
        self.rows = rows  # this rank's share
        self.epoch = 0
        # Each worker's ReaderState to resume from (None: the start of the epoch); set by
        # StreamingDataLoader, it reaches the workers with the dataset.
        self.resume_states = None
        self.set_epoch(0)

    def set_epoch(self, epoch: int) -> None:
        """A new shuffle of every buffer (and, for datasets, of the shards if it shuffles them)."""
        self.epoch = epoch
        if isinstance(self.rows, datasets.IterableDataset):
            self.rows.set_epoch(epoch)

    def sharding_note(self, num_workers: int) -> str | None:
        """A warning when the stream has too few shards for ranks x workers, else None."""
        rank_shards = None if self.total_shards is None else self.rows.num_shards
        return sharding_warning(
            self.total_shards, rank_shards, self.world_size, num_workers, type(self.rows).__name__
        )

    def __iter__(self):
        if self.resume_states is None:  # only StreamingDataLoader.__iter__ sets them
            raise RuntimeError(iterated_elsewhere("StreamingPackedDataset", "StreamingDataLoader"))
        worker = get_worker_info()
        worker_id, num_workers = (0, 1) if worker is None else (worker.id, worker.num_workers)
        resume = self.resume_states[worker_id]
        produced = iterate_in_background(
            lambda: self.produce(worker_id, num_workers, resume), max_queued=self.max_queued_batches
        )
        # Collate here, while the producer thread builds the next packs (as a DataLoader does
        # with its batches in the worker's main thread).
        for item in produced:
            if "end_of_stream" not in item:  # a batch's packs, and its reader's state
                state = item["reader_state"]
                item = {**collate_packs(item["packs"], self.family), "reader_state": state}
            yield item

    def produce(self, worker: int, num_workers: int, resume: ReaderState | None):
        """Steps 1-4 for one reader: the packs of each batch with the reader's state, then an
        end-of-stream item with its ended state and the rows dropped after its last batch.
        `resume`: the state of the last batch yielded before a restart (None: the epoch's start)."""
        resume = resume or ReaderState(worker)
        ended = ReaderState(worker, ended=True)  # the state its end-of-stream item carries
        if resume.ended:
            yield {"end_of_stream": True, "reader_state": ended, "dropped": Counter()}
            return
        reader = self.rank * num_workers + worker
        stream = ReaderStream(self.rows, reader, self.world_size * num_workers, resume.buffer_start)
        buffer = dataclasses.replace(resume, rows_held=0)  # the buffer being read
        not_reported = Counter()  # rows dropped that no yielded pack has reported yet
        packs, state = [], None
        try:
            while rows := stream.take(self.buffer_size):
                plan, dropped, lengths = self.pack_rows(rows, reader, buffer.buffer)
                if buffer.packs_done == 0:  # else the packs yielded before a resume reported them
                    not_reported.update(dropped)
                for k in range(buffer.packs_done, len(plan)):
                    pack = self.load_pack([rows[i] for i in plan[k]], lengths[plan[k]].tolist())
                    pack["dropped"].update(not_reported)
                    not_reported.clear()
                    packs.append(pack)
                    held = sum(len(p) for p in plan[k + 1 :])
                    state = dataclasses.replace(buffer, packs_done=k + 1, rows_held=held)
                    if len(packs) == self.packs_per_batch:
                        yield {"packs": packs, "reader_state": state}
                        packs = []
                buffer = ReaderState(worker, stream.state_dict(), buffer.buffer + 1)
            if packs:  # the reader's last, short batch
                yield {"packs": packs, "reader_state": state}
            yield {"end_of_stream": True, "reader_state": ended, "dropped": not_reported}
        finally:
            stream.close()

    def pack_rows(self, rows: list[tuple[int, dict]], reader: int, buffer_number: int):
        """Steps 1-3: weigh the buffer's rows, filter, shuffle and pack them."""
        lengths, image_counts, patches, reasons = self.family.weigh(
            [row["texts"] for _, row in rows],
            [row["images"] for _, row in rows],
            [row.get("videos") for _, row in rows],
        )
        weights = Weights.from_lists(lengths, image_counts, reasons, patches)
        rng = np.random.default_rng([self.seed, self.epoch, reader, buffer_number])
        plan, dropped = pack_buffer(weights, rng, self.config)
        return plan, dropped, weights.lengths

    def load_pack(self, rows: list[tuple[int, dict]], planned: list[int]) -> dict:
        """Load the rows' samples (tokenized, images decoded) and build them into one pack
        (build_pack); `planned` are the rows' tokens in the buffer's plan."""
        samples = [self.family.make_sample(row, row_id) for row_id, row in rows]
        # batch_index is set by the loader: the batch's place in this rank's epoch
        return build_pack(
            samples,
            planned,
            max_length=self.max_length,
            pad_token_id=self.family.pad_token_id,
            batch_index=-1,
            family=self.family,
        )


# The loader: order, reader states, ranks that stop together ---------------------------------


class StreamingDataLoader(RefusesAcceleratePrepare, DataLoader):
    """A DataLoader over a StreamingPackedDataset: yields its batches (mmdp.batch,
    plus `reader_state`), keeps every worker's latest reader state for `state_dict()`, and under
    torchrun stops every rank at the same step.

        loader = StreamingDataLoader(StreamingPackedDataset(stream, tokenizer), num_workers=2)
        for batch in loader:
            ...
        report.dropped.update(loader.dropped_at_end)

    `loader.dropped_at_end` (after an epoch): the rows read that no yielded batch reports, by
    reason: those dropped after a worker's last batch, and `held_when_ranks_stopped`.

    `stop_together` (default: when torch.distributed runs more than one rank) all-reduces one
    flag per step over `group` (default: the world; the data-parallel group is enough). With NCCL
    the flag is a GPU tensor and reading it waits for the GPU; pass a gloo group
    (`dist.new_group(backend="gloo")`) to keep it on the CPU. A rank that does not answer that
    all-reduce within `answer_timeout` (it died or hangs) makes the others raise
    RanksStoppedAnswering, naming it.

    `len()` is not known ahead: a trainer needs a number of steps. It owns its dataset, as
    PackedDataLoader does (mmdp.loading.guards).
    """

    def __init__(
        self,
        dataset: StreamingPackedDataset,
        num_workers: int = 2,
        *,
        stop_together: bool | None = None,
        group=None,
        answer_timeout: timedelta = ANSWER_TIMEOUT,
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
        self.answer_timeout = answer_timeout
        self.readers = max(num_workers, 1)
        self.dropped_at_end = Counter()
        self.start_epoch()

    def start_epoch(self) -> None:
        self.reader_states = [None] * self.readers  # each worker's latest; None: not started
        self.next_worker = 0  # whose batch comes next
        self.batches_done = 0

    def set_epoch(self, epoch: int) -> None:
        """A new shuffle for a new epoch; the epoch it is already in keeps its position (a resume
        followed by a trainer's set_epoch: PackedDataset.set_epoch)."""
        if epoch != self.dataset.epoch:
            self.dataset.set_epoch(epoch)
            self.start_epoch()

    def __iter__(self):
        check_temp_folder(self.num_workers)
        note = self.dataset.sharding_note(self.num_workers)
        if note and self.dataset.rank == 0:
            warnings.warn(note, stacklevel=2)
        self.dropped_at_end = Counter()
        stop_together = self.stop_together
        if stop_together is None:
            distributed = dist.is_available() and dist.is_initialized()
            stop_together = distributed and dist.get_world_size(self.group) > 1
        # Where each worker resumes from: travels to the workers with the dataset.
        self.dataset.resume_states = list(self.reader_states)
        loaded = super().__iter__()
        where = lambda: (self.dataset.rank, self.batches_done)  # noqa: E731
        items = in_turns(name_failed_worker(loaded, where), self.readers, self.next_worker)
        batches = self.follow(items)
        try:
            while True:
                batch = next(batches, None)
                have_one = batch is not None
                step = batch["batch_index"] if have_one else self.batches_done
                if stop_together and not all_ranks_have_a_batch(
                    have_one, self.group, self.answer_timeout, step
                ):
                    self.count_held(batch)
                    break
                if batch is None:
                    break
                batch["epoch"] = self.dataset.epoch  # the batch's own, whatever is fetched ahead
                yield batch
            self.start_epoch()  # the epoch is over: state_dict() says so
        finally:
            batches.close()  # and with it the DataLoader's iterator: the workers stop now
            self.dataset.resume_states = None

    def follow(self, items):
        """The batches of `items`, keeping each worker's reader state and the drops at the end."""
        for item in items:
            worker = item["reader_state"].worker
            self.reader_states[worker] = item["reader_state"]
            if "end_of_stream" in item:
                self.dropped_at_end.update(item["dropped"])
                continue
            self.next_worker = (worker + 1) % self.readers
            item["batch_index"] = self.batches_done
            self.batches_done += 1
            yield item

    def count_held(self, in_hand: dict | None) -> None:
        """Count what this rank still held when the ranks stopped: the batch in hand, and the
        rows of the packs its workers had not yielded yet from their current buffers."""
        held = sum(state.rows_held for state in self.reader_states if state is not None)
        if in_hand is not None:
            held += len(in_hand["sample_index"])
            self.dropped_at_end.update(in_hand["dropped"])
        if held:
            self.dropped_at_end[HELD_WHEN_RANKS_STOPPED] += held

    def settings(self) -> dict:
        """What decides which rows a reader reads and how it packs them: a resume needs the same."""
        d = self.dataset
        return {
            **d.config.settings(),
            "rank": d.rank,
            "world_size": d.world_size,
            "num_workers": self.num_workers,
            "model_family": d.family.name,
            "shards": d.total_shards,  # another dataset has other shards (often)
        }

    def state_dict(self) -> dict:
        """Where this rank is in the epoch, as plain Python values (torch.save and
        torch.load(weights_only=True) take it). Save it per rank: each rank reads its own share."""
        states = [None if s is None else dataclasses.asdict(s) for s in self.reader_states]
        return copy.deepcopy(
            {
                **self.settings(),
                "epoch": self.dataset.epoch,
                "batches_done": self.batches_done,
                "next_worker": self.next_worker,
                "reader_states": states,
            }
        )

    def load_state_dict(self, state: dict) -> None:
        """Continue an epoch: the next iteration yields exactly the rows not yet yielded.

        Needs the same settings (seed, rank, world size, workers, budgets, buffer...) and the
        same tokenizer: they decide which rows each reader reads and how it packs them.
        """
        check_resume(
            state, self.settings(), "they decide which rows each reader reads and how it packs them"
        )
        self.dataset.set_epoch(state["epoch"])
        self.reader_states = [
            None if s is None else ReaderState(**copy.deepcopy(s)) for s in state["reader_states"]
        ]
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
        waiting[item["reader_state"].worker].append(item)
        while active[turn] and waiting[turn]:
            item = waiting[turn].popleft()
            if "end_of_stream" in item:
                active[turn] = False
            yield item
            turn = next_active(turn, active)
    if any(waiting):
        raise RuntimeError("a worker's batches came after its end of stream")


def next_active(turn: int, active: list[bool]) -> int:
    """The next worker after `turn` (cyclically) that has not ended; `turn` when none is left."""
    readers = len(active)
    later = [(turn + step) % readers for step in range(1, readers + 1)]
    return next((worker for worker in later if active[worker]), turn)
