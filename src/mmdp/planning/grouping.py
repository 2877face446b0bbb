"""Stage 3, grouped by modality and length: padded batches for trainers that cannot pack.

LLaVA (`group_by_modality_length`) and OpenVLA pad rather than pack, and make padding cheap by
choosing which samples share a batch. The plan needs only each row's weight (its tokens and
images, from mmdp.weighing.weigh: no image decoded, nothing tokenized twice), and every rank
computes the same plan for (seed, epoch) and takes its share:

1. Filter: rows that cannot be used, or longer than max_length, are left out and counted.
2. Split the text-only rows (no image) from the multimodal ones: a batch holds one or the other.
3. Within each modality, shuffle, sort windows of `window_steps` steps by length (longest first)
   and cut them into steps of world_size * batch_size rows: the rows of a step have similar
   lengths, so padding each batch to its longest costs little, and the shuffle before sorting
   mixes the rows differently every epoch.
4. Deal each step's rows to the ranks, longest first, each to the rank with the fewest tokens so
   far (then fewest images) that still needs rows: every rank's batch gets about the same
   tokens, and its longest row, which sets its padded length, is one of the step's longest.
5. A modality's last rows that do not fill a step are shared evenly in a smaller last step; the
   at most world_size - 1 that cannot be are left out and counted as
   left_out_to_equalise_ranks, so that every rank has the same number of batches (DDP would
   hang otherwise).
6. Shuffle the steps of both modalities together, then put the heaviest step first (the most
   padded tokens on one rank): a batch that runs out of memory does so in the first minute,
   not hours into the epoch.

Example (tests/test_grouping.py traces it): batch_size 2, 2 ranks, max_length 512,
    row      0   1   2   3   4   5   6   7   8   9  10  11
    tokens  30 200  25 120  90  40 150 100  35 600  20  80
    images   0   2   0   1   1   0   1   1   0   1   0   1
row 9 is too long; text-only 5, 8, 0, 2 (40, 35, 30, 25) fill one step, row 10 is left over
alone and left out; multimodal 1, 6, 3, 7 (200, 150, 120, 100) fill one step and 4, 11 share a
last step of one row per rank. Dealt: [1, 7] | [6, 3], [5, 2] | [8, 0] and [4] | [11]. The
multimodal step comes first: 2 x 200 padded tokens on rank 0, the most of any batch.
"""

import numpy as np
from torch.utils.data import Sampler

from mmdp.drop_reasons import LEFT_OUT_TO_EQUALISE_RANKS
from mmdp.packing.weights import Budgets, Weights
from mmdp.planning.planner import EpochPlan, deal_equal_steps, filter_rows, gather_packs
from mmdp.ranks import rank_and_world_size

# Steps sorted together by length (HuggingFace's LengthGroupedSampler sorts 50 batches at a
# time): a longer window sorts similar lengths together better, a shorter one leaves more of
# the order to chance.
WINDOW_STEPS = 50
NO_IMAGE_BUDGET = np.iinfo(np.int32).max  # stage 3 has no image budget: filter on tokens only


def plan_grouped_epoch(
    weights: Weights,
    *,
    batch_size: int,
    max_length: int | None = None,
    world_size: int = 1,
    window_steps: int = WINDOW_STEPS,
    seed: int = 0,
    epoch: int = 0,
) -> EpochPlan:
    """Steps 1-6: the epoch's padded batches for every rank, the same wherever computed.

    Returned as an EpochPlan whose packs hold one row each: plan.batch(step, rank) is a batch,
    and mmdp.planning.planner.batch_loads gives every batch's tokens and images.
    """
    # 1. Filter
    budget = NO_IMAGE_BUDGET if max_length is None else max_length
    rows, dropped = filter_rows(weights, Budgets(budget, NO_IMAGE_BUDGET))
    rng = np.random.default_rng([seed, epoch])
    # 2-5. Each modality apart: text-only rows, then rows with images
    has_images = weights.image_counts[rows] > 0
    parts = [
        modality_steps(
            rows[has_images == multimodal], weights, rng, batch_size, world_size, window_steps
        )
        for multimodal in (False, True)
    ]
    step_rows = np.concatenate([part[0] for part in parts])
    step_sizes = np.concatenate([part[1] for part in parts])
    left_out = sum(part[2] for part in parts)
    if left_out:
        dropped[LEFT_OUT_TO_EQUALISE_RANKS] += left_out
    # 6. Shuffle the steps, the heaviest first
    step_starts = np.r_[0, np.cumsum(step_sizes)]
    order = heaviest_first(
        rng.permutation(len(step_sizes)),
        padded_per_step(step_rows, step_sizes, weights, world_size),
    )
    planned_rows, step_starts = gather_packs(step_rows, step_starts, order)
    batch_sizes = np.repeat(np.diff(step_starts) // world_size, world_size)
    return EpochPlan(
        rows=planned_rows,
        pack_starts=np.arange(len(planned_rows) + 1),
        batch_starts=np.r_[0, np.cumsum(batch_sizes)],
        world_size=world_size,
        dropped=dict(+dropped),
    )


def modality_steps(
    rows: np.ndarray,
    weights: Weights,
    rng: np.random.Generator,
    batch_size: int,
    world_size: int,
    window_steps: int,
) -> tuple[np.ndarray, np.ndarray, int]:
    """Steps 3-5 for the rows of one modality: (rows step after step, each step rank after
    rank; rows per step; rows left out)."""
    per_step = world_size * batch_size
    rows = sort_in_windows(rng.permutation(rows), weights.lengths, window_steps * per_step)
    full = len(rows) // per_step * per_step
    shared = (len(rows) - full) // world_size * world_size
    dealt, sizes = [], []
    for first, end in ((0, full), (full, full + shared)):
        if end == first:
            continue
        part = rows[first:end]
        per_rank = batch_size if first == 0 else shared // world_size
        # stage 5's dealer (mmdp.planning.planner), with tokens as its first key: they are
        # what a padded batch costs, 64 per image included (on the default data, 2 ranks: images
        # first left up to 377 tokens between ranks in a step, tokens first 11)
        order, _ = deal_equal_steps(
            weights.lengths[part], weights.image_counts[part], world_size, per_rank
        )
        dealt.append(part[order])
        sizes.append(np.full((end - first) // (world_size * per_rank), world_size * per_rank))
    if not dealt:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64), len(rows)
    return np.concatenate(dealt), np.concatenate(sizes), len(rows) - full - shared


def sort_in_windows(rows: np.ndarray, lengths: np.ndarray, window_rows: int) -> np.ndarray:
    """Sort each window of `window_rows` consecutive rows by length, longest first (ties keep
    their order).

    >>> sort_in_windows(np.array([0, 1, 2, 3, 4]), np.array([5, 9, 7, 2, 8]), 3).tolist()
    [1, 2, 0, 4, 3]
    """
    window = np.arange(len(rows)) // window_rows
    return rows[np.lexsort((-lengths[rows].astype(np.int64), window))]


def padded_per_step(
    rows: np.ndarray, step_sizes: np.ndarray, weights: Weights, world_size: int
) -> np.ndarray:
    """The padded tokens (rows x longest row) of each step's heaviest batch."""
    if len(rows) == 0:
        return np.zeros(0, dtype=np.int64)
    batch_sizes = np.repeat(step_sizes // world_size, world_size)
    batch_starts = np.r_[0, np.cumsum(batch_sizes)[:-1]]
    longest = np.maximum.reduceat(weights.lengths[rows].astype(np.int64), batch_starts)
    return (longest * batch_sizes).reshape(-1, world_size).max(axis=1)


def heaviest_first(order: np.ndarray, padded: np.ndarray) -> np.ndarray:
    """`order` with the step of the most padded tokens moved to the front (the first such step
    in `order` when several tie); the others keep their order.

    >>> heaviest_first(np.array([2, 0, 1, 3]), np.array([10, 40, 30, 40])).tolist()
    [1, 2, 0, 3]
    """
    if len(order) == 0:
        return order
    heaviest = int(np.argmax(padded[order]))
    return np.r_[order[heaviest], np.delete(order, heaviest)]


class ModalityLengthBatchSampler(Sampler[list[int]]):
    """A DataLoader's batch_sampler for stage 3 grouped: this rank's batches of dataset rows,
    planned from the weights (see the module docstring). Every rank gets the same number of
    batches; rank and world size come from torch.distributed when it is initialised.

        sampler = ModalityLengthBatchSampler(weigh_rows(rows, tokenizer).weights, batch_size=8,
                                             max_length=512, seed=0)
        loader = DataLoader(VQADataset(rows, tokenizer), batch_sampler=sampler,
                            collate_fn=NaivePadCollator(tokenizer.pad_token_id))
        sampler.set_epoch(epoch)  # a new shuffle, the same on every rank

    `dropped`: the rows the plan left out, by reason (a report adds them to the collator's).
    """

    def __init__(
        self,
        weights: Weights,
        *,
        batch_size: int,
        max_length: int | None = None,
        window_steps: int = WINDOW_STEPS,
        seed: int = 0,
        rank: int | None = None,
        world_size: int | None = None,
    ):
        self.weights = weights
        self.batch_size = batch_size
        self.max_length = max_length
        self.window_steps = window_steps
        self.seed = seed
        self.rank, self.world_size = rank_and_world_size(rank, world_size)
        self.set_epoch(0)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        self.plan = plan_grouped_epoch(
            self.weights,
            batch_size=self.batch_size,
            max_length=self.max_length,
            world_size=self.world_size,
            window_steps=self.window_steps,
            seed=self.seed,
            epoch=epoch,
        )

    @property
    def dropped(self) -> dict:
        return self.plan.dropped

    def __len__(self) -> int:
        return self.plan.num_steps()

    def __iter__(self):
        for step in range(self.plan.num_steps()):
            yield np.concatenate(self.plan.batch(step, self.rank)).tolist()


def plan_batches(plan: EpochPlan) -> list[np.ndarray]:
    """Every batch of a plan as one array of rows, step after step, rank after rank."""
    return [
        np.concatenate(plan.batch(step, rank))
        for step in range(plan.num_steps())
        for rank in range(plan.world_size)
    ]
