"""Stage 5: multimodal knapsack packing (the blog's ConstantLengthDataset), ready for a trainer.

How an epoch is made, in the blog's terms:

1. Weigh every item without decoding it: a sample weighs its tokens (text + 64 per image) and
   carries its image count (mmdp.conversation.count_tokens_batch; images stay encoded).
2. Filter: samples longer than `max_length` or with more images than `max_images` are
   skipped and counted by reason, like rows whose conversation is unusable.
3. Shuffle the rest with (seed, epoch), and pack them buffer by buffer with
   `mmdp.packing.pack(..., strategy="images_first_bfd")`: a token budget and an image budget per pack.
4. Shuffle the packs, and cut them into steps of `world_size * packs_per_batch` packs. Within a
   step, deal the packs to the ranks so that each rank gets about the same number of images.
   Every rank gets the same number of batches (DDP would hang otherwise); the at most
   `world_size - 1` packs that cannot be shared evenly are left out and counted.
5. Each rank's batches are split over its DataLoader workers (batch k goes to worker
   k % num_workers, which is the order the DataLoader yields them in). In each worker a producer
   thread builds the packs of its batches (tokenize, decode and resize images, concatenate, pad
   to `max_length`) and fills a bounded queue; the DataLoader collates them with `collate_packs`.

Steps 1-4 use only lengths, so every rank and worker computes the same plan and no sample is
yielded twice or lost. Images are decoded only for packs about to be yielded.

The packs and batches it yields are described in mmdp.packed_batch.
"""

import copy
from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import pyarrow.compute as pc
import torch.distributed as dist
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from mmdp import config
from mmdp.background import iterate_in_background
from mmdp.conversation import count_tokens_batch
from mmdp.drop_reasons import RANK_REMAINDER, TOO_LONG, TOO_MANY_IMAGES
from mmdp.metrics import spread
from mmdp.packed_batch import collate_packs, layout_pack, model_inputs  # noqa: F401
from mmdp.packing import pack
from mmdp.vqa_dataset import VQADataset


@dataclass
class EpochPlan:
    """Which rows go into which pack, batch and rank for one epoch; computed from lengths only."""

    rank_batches: list[list[list[list[int]]]]  # [rank][batch][pack] -> dataset rows
    dropped: Counter = field(default_factory=Counter)  # rows left out while planning, by reason
    rows_read: int = 0


class PackedDataset(IterableDataset):
    """Packs a VQADataset into fixed-length rows under a token and an image budget.

    Use it with `PackedDataLoader` (or a DataLoader with batch_size=packs_per_batch and
    collate_fn=collate_packs). Works unchanged under torchrun: rank and world size come from
    torch.distributed when it is initialised.
    """

    def __init__(
        self,
        dataset: VQADataset,
        *,
        max_length: int = config.MAX_LENGTH,
        max_images: int = config.MAX_IMAGES,
        packs_per_batch: int = config.BATCH_SIZE,
        strategy: str = "images_first_bfd",
        buffer_size: int = 4096,
        seed: int = 0,
        rank: int | None = None,
        world_size: int | None = None,
        max_queued_packs: int = 16,
    ):
        self.dataset = dataset
        self.max_length = max_length
        self.max_images = max_images
        self.packs_per_batch = packs_per_batch
        self.strategy = strategy
        self.buffer_size = buffer_size
        self.seed = seed
        self.max_queued_packs = max_queued_packs
        distributed = dist.is_available() and dist.is_initialized()
        self.rank = rank if rank is not None else (dist.get_rank() if distributed else 0)
        self.world_size = (
            world_size if world_size is not None else (dist.get_world_size() if distributed else 1)
        )
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank {self.rank} is not in [0, world_size={self.world_size})")
        self.epoch = 0
        self.batches_done = 0  # where the next iteration starts in this epoch (see state_dict)
        self._plans = {}
        self.lengths, self.image_counts, self.text_problems = self.weigh_rows()

    # 1. Weigh every item --------------------------------------------------------------------

    def weigh_rows(self, chunk_rows: int = 1024):
        """Tokens and images of every row, from the text and the image count only.

        Reads the rows a chunk at a time, so memory does not grow with the dataset.
        """
        rows = self.dataset.dataset
        texts = rows.select_columns(["texts"])
        images = rows.select_columns(["images"]).with_format("arrow")
        lengths, image_counts, problems = [], [], []
        for start in range(0, len(rows), chunk_rows):
            stop = min(start + chunk_rows, len(rows))
            counts = pc.fill_null(pc.list_value_length(images[start:stop]["images"]), 0)
            counts = counts.to_numpy().astype(np.int64)
            chunk_lengths, chunk_problems = count_tokens_batch(
                texts[start:stop]["texts"],
                counts,
                self.dataset.tokenizer,
                self.dataset.image_token_length,
            )
            lengths += chunk_lengths
            problems += chunk_problems
            image_counts.append(counts)
        image_counts = np.concatenate(image_counts) if image_counts else np.zeros(0, np.int64)
        return np.asarray(lengths, dtype=np.int64), image_counts, problems

    # 2-4. Plan the epoch ------------------------------------------------------------------------

    def plan(self, epoch: int) -> EpochPlan:
        if epoch not in self._plans:
            self._plans = {epoch: self.make_plan(epoch)}  # keep only the current epoch's plan
        return self._plans[epoch]

    def make_plan(self, epoch: int) -> EpochPlan:
        rows = np.arange(len(self.lengths))
        dropped = Counter(reason for reason in self.text_problems if reason is not None)
        usable = np.array([reason is None for reason in self.text_problems], dtype=bool)
        too_long = usable & (self.lengths > self.max_length)
        too_many_images = usable & ~too_long & (self.image_counts > self.max_images)
        dropped[TOO_LONG] += int(too_long.sum())
        dropped[TOO_MANY_IMAGES] += int(too_many_images.sum())
        usable &= ~too_long & ~too_many_images
        dropped = +dropped  # drop zero counts

        rng = np.random.default_rng([self.seed, epoch])
        shuffled = rng.permutation(rows[usable])
        packs = []
        for start in range(0, len(shuffled), self.buffer_size):
            buffer = shuffled[start : start + self.buffer_size]
            for indices in pack(
                self.lengths[buffer],
                self.max_length,
                self.strategy,
                self.image_counts[buffer],
                self.max_images,
            ):
                packs.append(buffer[indices].tolist())
        packs = [packs[i] for i in rng.permutation(len(packs))]

        # Deal whole steps of world_size * packs_per_batch packs, then share the last packs evenly.
        per_step = self.world_size * self.packs_per_batch
        steps = [packs[i : i + per_step] for i in range(0, len(packs), per_step)]
        last = steps[-1] if steps else []
        shared = len(last) - len(last) % self.world_size
        if shared < len(last):
            dropped[RANK_REMAINDER] += sum(len(p) for p in last[shared:])
            steps[-1] = last[:shared]
        if steps and not steps[-1]:
            steps.pop()
        rank_batches = [[] for _ in range(self.world_size)]
        for step in steps:
            for rank, batch in enumerate(self.deal(step)):
                rank_batches[rank].append(batch)
        return EpochPlan(rank_batches, dropped, rows_read=len(rows))

    def deal(self, step: list[list[int]]) -> list[list[list[int]]]:
        """Share one step's packs between the ranks, evening out images (and then tokens).

        Packs go heaviest first, each to the rank with the fewest images so far among those that
        still need packs; every rank gets len(step) / world_size packs.
        """
        per_rank = len(step) // self.world_size
        weight = [(int(self.image_counts[p].sum()), int(self.lengths[p].sum())) for p in step]
        batches = [[] for _ in range(self.world_size)]
        images = [0] * self.world_size
        tokens = [0] * self.world_size
        for i in sorted(range(len(step)), key=lambda i: (-weight[i][0], -weight[i][1], i)):
            open_ranks = [r for r in range(self.world_size) if len(batches[r]) < per_rank]
            rank = min(open_ranks, key=lambda r: (images[r], tokens[r], r))
            batches[rank].append(step[i])
            images[rank] += weight[i][0]
            tokens[rank] += weight[i][1]
        return batches

    def with_strategy(self, strategy: str) -> "PackedDataset":
        """The same dataset, already weighed, packed with another strategy."""
        other = copy.copy(self)
        other.strategy = strategy
        other._plans = {}
        return other

    def rank_balance(self) -> dict:
        """How evenly each step's tokens and images are shared between ranks, from the plan.

        For every step, the spread (max - min over ranks) of tokens and images; reports the worst
        step and the mean, and the batches per rank (always equal).
        """
        plan = self.plan(self.epoch)
        token_spreads, image_spreads = [], []
        for step in zip(*plan.rank_batches):
            tokens = [sum(int(self.lengths[p].sum()) for p in batch) for batch in step]
            images = [sum(int(self.image_counts[p].sum()) for p in batch) for batch in step]
            token_spreads.append(max(tokens) - min(tokens))
            image_spreads.append(max(images) - min(images))
        return {
            "world_size": self.world_size,
            "batches_per_rank": [len(batches) for batches in plan.rank_batches],
            "token_spread_per_step": spread(token_spreads),
            "image_spread_per_step": spread(image_spreads),
        }

    def __len__(self) -> int:
        """Packs this rank yields in the current epoch (so len(DataLoader) is its batch count)."""
        return sum(len(batch) for batch in self.plan(self.epoch).rank_batches[self.rank])

    def num_batches(self) -> int:
        return len(self.plan(self.epoch).rank_batches[self.rank])

    # Epochs, and resuming mid-epoch ---------------------------------------------------------

    def set_epoch(self, epoch: int) -> None:
        """Reshuffle for a new epoch (call it before iterating, as with DistributedSampler)."""
        self.epoch = epoch
        self.batches_done = 0

    def state_dict(self) -> dict:
        return {"seed": self.seed, "epoch": self.epoch, "batches_done": self.batches_done}

    def load_state_dict(self, state: dict) -> None:
        """Continue an epoch after `batches_done` batches: the next iteration yields the rest."""
        if state["seed"] != self.seed:
            raise ValueError(
                f"state is for seed {state['seed']}, this dataset has seed {self.seed}"
            )
        self.epoch = state["epoch"]
        self.batches_done = state["batches_done"]

    # 5. Build the packs -----------------------------------------------------------------------

    def __iter__(self):
        batches = self.plan(self.epoch).rank_batches[self.rank]
        worker = get_worker_info()
        worker_id, num_workers = (0, 1) if worker is None else (worker.id, worker.num_workers)
        mine = range(self.batches_done + worker_id, len(batches), num_workers)

        def produce():
            for batch_index in mine:
                for rows in batches[batch_index]:
                    yield self.build_pack(rows, batch_index)

        return iterate_in_background(produce, max_queued=self.max_queued_packs)

    def build_pack(self, rows: list[int], batch_index: int) -> dict:
        """Tokenize the rows, decode their images, and lay them out in one padded row."""
        samples = [self.dataset[row] for row in rows]
        dropped = Counter(s["drop_reason"] for s in samples if s["drop_reason"] is not None)
        samples = [s for s in samples if s["drop_reason"] is None]
        for s in samples:
            if len(s["input_ids"]) != self.lengths[s["row"]]:
                raise RuntimeError(
                    f"row {s['row']}: planned {self.lengths[s['row']]} tokens, tokenized "
                    f"{len(s['input_ids'])}; the tokenizer is not deterministic"
                )
        pack = layout_pack(
            samples, self.max_length, self.dataset.tokenizer.pad_token_id, self.dataset.image_size
        )
        return {**pack, "batch_index": batch_index, "dropped": dropped}


class PackedDataLoader(DataLoader):
    """A DataLoader over a PackedDataset that keeps track of where the epoch is.

    `state_dict()` after k batches says so; a new loader whose dataset gets it through
    `load_state_dict` yields exactly the batches after those k. After a full epoch the position
    resets, and `set_epoch` picks the next shuffle.
    """

    def __init__(self, dataset: PackedDataset, num_workers: int = 2, **kwargs):
        if kwargs.get("persistent_workers"):
            # persistent workers keep the dataset copy of the first epoch: set_epoch and
            # load_state_dict would not reach them
            raise ValueError("PackedDataLoader does not support persistent_workers")
        super().__init__(
            dataset,
            batch_size=dataset.packs_per_batch,
            collate_fn=collate_packs,
            num_workers=num_workers,
            **kwargs,
        )

    def __iter__(self):
        self.dataset.plan(self.dataset.epoch)  # plan once here; workers get it with the dataset
        for batch in super().__iter__():
            self.dataset.batches_done = batch["batch_index"] + 1
            yield batch
        self.dataset.batches_done = 0

    def __len__(self) -> int:
        return self.dataset.num_batches() - self.dataset.batches_done

    def set_epoch(self, epoch: int) -> None:
        self.dataset.set_epoch(epoch)

    def state_dict(self) -> dict:
        return self.dataset.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.dataset.load_state_dict(state)
