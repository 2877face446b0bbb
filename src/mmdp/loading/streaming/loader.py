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
   an image, by its model family's rules (mmdp.data.families.base: TinyVLM's 64 tokens per image, or
   a real processor's tokens and patches from each image's header).
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
from datetime import timedelta

import torch.distributed as dist
from torch.utils.data import DataLoader

from mmdp.drop_reasons import HELD_WHEN_RANKS_STOPPED
from mmdp.loading.guards import RefusesAcceleratePrepare
from mmdp.loading.streaming.dataset import StreamingPackedDataset
from mmdp.loading.streaming.reader import ReaderState
from mmdp.loading.workers import check_temp_folder, name_failed_worker
from mmdp.packing.packing_config import check_resume
from mmdp.ranks import ANSWER_TIMEOUT, all_ranks_have_a_batch

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

    `len()` is not known ahead: a trainer needs a number of steps. It owns its dataset: another
    DataLoader that iterates the dataset (accelerate's, torchdata's) gets one sentence saying what
    to do instead, and so does `accelerator.prepare(loader)` (mmdp.loading.guards).
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
        """A new shuffle for a new epoch. The epoch it is already in keeps its position:
        trainers call set_epoch before every pass (Trainer._run_epoch, transformers 5.23), and right
        after a resume that call must not restart the epoch."""
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
        pids = [worker.pid for worker in getattr(loaded, "_workers", [])]
        where = lambda: (self.dataset.rank, self.batches_done)  # noqa: E731
        items = in_turns(name_failed_worker(loaded, where, pids), self.readers, self.next_worker)
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
            worker = worker_of(item)
            if "end_of_stream" in item:
                self.reader_states[worker] = ReaderState(worker, ended=True)
                self.dropped_at_end.update(item["dropped"])
                continue
            self.reader_states[worker] = item["reader_state"]
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
    return item["worker"] if "end_of_stream" in item else item["reader_state"].worker


def next_active(turn: int, active: list[bool]) -> int:
    """The next worker after `turn` (cyclically) that has not ended; `turn` when none is left."""
    readers = len(active)
    later = [(turn + step) % readers for step in range(1, readers + 1)]
    return next((worker for worker in later if active[worker]), turn)
