"""Plan an epoch of packed batches from weights alone: pure functions, numpy arrays in and out.

Stage 5 never needs a sample's tokens or pixels to decide where it goes: its weight (tokens,
images) is enough. So an epoch is planned once, up front, and every rank and DataLoader worker
computes the same plan and takes its share. In the blog's terms:

1. Filter (`filter_rows`): rows whose text is unusable, longer than `max_length` tokens or with
   more than `max_images` images are dropped and counted by reason.
2. Shuffle the rest with (seed, epoch), pack them buffer by buffer (mmdp.packing.packers: a
   token budget and an image budget per pack) and shuffle the packs (`shuffle_and_pack`).
3. Deal the packs to ranks a step at a time (`deal_steps`): a step is
   world_size * packs_per_batch packs, and within a step each rank gets packs_per_batch of them,
   heaviest first to the rank with the fewest images (then tokens) so far. Every rank gets the
   same number of batches (DDP would hang otherwise): the last step is shared evenly, and the
   at most world_size - 1 packs that cannot be are left out and counted.

Everything is a flat array, so that 24 M rows plan in seconds and a worker receives a few bytes
per row. An EpochPlan holds:

    rows          [packed rows]   every planned row, pack after pack, batch after batch
    pack_starts   [packs + 1]     pack p holds rows[pack_starts[p] : pack_starts[p + 1]]
    batch_starts  [batches + 1]   batch b holds packs batch_starts[b] : batch_starts[b + 1];
                                  batches go step after step, and within a step rank after
                                  rank: batch (step, rank) is number step * world_size + rank

Example (tests/test_planner.py traces it): lengths [3, 6, 2, 5], max_length 8, binpack,
1 pack per batch, 2 ranks, no shuffling: packs [6, 2] and [5, 3] (rows [1, 2] and [3, 0]); one
step of 2 packs, the heavier first: rank 0 gets [1, 2] (8 tokens), rank 1 gets [3, 0].
"""

from collections import Counter
from dataclasses import dataclass

import numpy as np

from mmdp.drop_reasons import (
    CODE,
    LEFT_OUT_BY_MIXTURE,
    LEFT_OUT_TO_EQUALISE_RANKS,
    REASONS,
    TOO_LONG,
    TOO_MANY_IMAGES,
    TOO_MANY_PATCHES,
)
from mmdp.packing.packers import pack_flat


@dataclass(frozen=True)
class Weights:
    """What planning knows of each row of a dataset: one entry per row."""

    lengths: np.ndarray  # int32: tokens of the sample (text + image tokens); 0 if unusable
    image_counts: np.ndarray  # int32: images of the sample
    reasons: np.ndarray  # uint8: 0, or why the row is unusable (its position in REASONS)
    # int32: the vision encoder's patches for the sample's images (None: one per image)
    patch_counts: np.ndarray | None = None

    def __post_init__(self):
        if self.patch_counts is None:
            object.__setattr__(self, "patch_counts", self.image_counts)

    def __len__(self) -> int:
        return len(self.lengths)

    @classmethod
    def from_lists(cls, lengths, image_counts, reasons=None, patch_counts=None) -> "Weights":
        """Weights from plain lists; reasons are None or names from mmdp.drop_reasons."""
        reasons = [None] * len(lengths) if reasons is None else reasons
        return cls(
            np.asarray(lengths, dtype=np.int32),
            np.asarray(image_counts, dtype=np.int32),
            np.array([CODE[reason] for reason in reasons], dtype=np.uint8),
            None if patch_counts is None else np.asarray(patch_counts, dtype=np.int32),
        )


@dataclass
class EpochPlan:
    """Which rows go into which pack, batch and rank for one epoch (see the module docstring)."""

    rows: np.ndarray
    pack_starts: np.ndarray
    batch_starts: np.ndarray
    world_size: int
    dropped: dict  # rows left out while planning, by reason

    def num_steps(self) -> int:
        """Batches per rank: every rank has the same number."""
        return (len(self.batch_starts) - 1) // self.world_size

    def batch(self, step: int, rank: int = 0) -> list[np.ndarray]:
        """The packs of one rank's batch at one step, each an array of rows."""
        b = step * self.world_size + rank
        starts = self.pack_starts[self.batch_starts[b] : self.batch_starts[b + 1] + 1]
        return [self.rows[a:z] for a, z in zip(starts[:-1].tolist(), starts[1:].tolist())]

    def packs(self) -> list[np.ndarray]:
        """Every pack of the epoch, in batch order (all ranks)."""
        starts = self.pack_starts.tolist()
        return [self.rows[a:z] for a, z in zip(starts[:-1], starts[1:])]

    def for_rank(self, rank: int) -> "EpochPlan":
        """The part of the plan one rank needs, as a plan with world_size 1 (what its DataLoader
        workers receive: a few bytes per row)."""
        batches = np.arange(rank, len(self.batch_starts) - 1, self.world_size)
        first, end = self.batch_starts[batches], self.batch_starts[batches + 1]
        rows, pack_starts = gather_packs(self.rows, self.pack_starts, ranges(first, end))
        return EpochPlan(
            rows=rows.astype(np.int32) if len(rows) and rows.max() < 2**31 else rows,
            pack_starts=pack_starts,
            batch_starts=np.r_[0, np.cumsum(end - first)],
            world_size=1,
            dropped=self.dropped,
        )


def filter_rows(
    weights: Weights, max_length: int, max_images: int, max_patches: int | None = None
) -> tuple[np.ndarray, Counter]:
    """Step 1: the rows that can be packed, and the others counted by reason (a row over
    several budgets counts once: too long first, then too many images, then patches).

    Example: row 2 has no texts, row 1 is too long, row 3 has too many images:

    >>> weights = Weights.from_lists([3, 9, 0, 5], [1, 0, 0, 4], [None, None, "no_texts", None])
    >>> rows, dropped = filter_rows(weights, max_length=8, max_images=3)
    >>> rows.tolist(), sorted(dropped.items())
    ([0], [('no_texts', 1), ('too_long', 1), ('too_many_images', 1)])
    """
    usable = weights.reasons == 0
    too_long = usable & (weights.lengths > max_length)
    too_many_images = usable & ~too_long & (weights.image_counts > max_images)
    over_patches = (
        np.zeros_like(usable) if max_patches is None else weights.patch_counts > max_patches
    )
    too_many_patches = usable & ~too_long & ~too_many_images & over_patches
    codes = np.bincount(weights.reasons, minlength=len(REASONS))
    dropped = Counter({REASONS[code]: int(n) for code, n in enumerate(codes) if code and n})
    dropped[TOO_LONG] += int(too_long.sum())
    dropped[TOO_MANY_IMAGES] += int(too_many_images.sum())
    dropped[TOO_MANY_PATCHES] += int(too_many_patches.sum())
    rows = np.flatnonzero(usable & ~too_long & ~too_many_images & ~too_many_patches)
    return rows, +dropped  # + drops zero counts


def pack_buffers(
    rows: np.ndarray,
    weights: Weights,
    *,
    max_length: int,
    max_images: int,
    max_patches: int | None = None,
    strategy: str,
    buffer_size: int,
) -> tuple[np.ndarray, np.ndarray]:
    """Step 2: pack `rows`, in their order, buffer_size at a time (as the blog's producer does).

    Returns (rows in pack order, pack_starts). Packs never cross a buffer.
    """
    chunks, sizes = [], []
    for start in range(0, len(rows), buffer_size):
        buffer = rows[start : start + buffer_size]
        patch_budget = {}  # the third budget, only when there is one
        if max_patches is not None:
            patch_budget = {
                "patch_counts": weights.patch_counts[buffer],
                "max_patches": max_patches,
            }
        items, starts = pack_flat(
            weights.lengths[buffer],
            max_length,
            strategy,
            weights.image_counts[buffer],
            max_images,
            **patch_budget,
        )
        chunks.append(buffer[items])
        sizes.append(np.diff(starts))
    if not chunks:
        return np.zeros(0, dtype=np.int64), np.zeros(1, dtype=np.int64)
    return np.concatenate(chunks), np.r_[0, np.cumsum(np.concatenate(sizes))]


def deal_steps(
    pack_patches: np.ndarray, pack_tokens: np.ndarray, world_size: int, packs_per_batch: int
) -> tuple[np.ndarray, np.ndarray, int]:
    """Step 3: deal packs (in the order given) to ranks, one step at a time.

    Returns (pack order, batch_starts, packs left out): pack_order lists the packs batch after
    batch, batch (step, rank) being number step * world_size + rank, as in EpochPlan.

    Within a step the packs go heaviest first (most vision-encoder patches, then most tokens,
    then first in the step), each to the rank with the fewest patches so far (then fewest
    tokens, then lowest number) among those that still need packs: each rank's vision encoder
    and language model get about the same work. (Without patch counts, a row's patches are its
    images.) All steps are dealt at once: the loop runs over the positions within a step, not
    over the steps.
    """
    per_step = world_size * packs_per_batch
    num_packs = len(pack_patches)
    last = num_packs % per_step
    left_out = last % world_size  # the last step must share evenly between ranks
    # (first pack, end, packs per rank): the full steps, then the last one, shared evenly
    steps = [(0, num_packs - last, packs_per_batch)]
    if last - left_out:
        steps.append((num_packs - last, num_packs - left_out, (last - left_out) // world_size))
    orders, batch_sizes = [], []
    for first, end, per_rank in steps:
        if end == first:
            continue
        order, sizes = deal_equal_steps(
            pack_patches[first:end], pack_tokens[first:end], world_size, per_rank
        )
        orders.append(order + first)
        batch_sizes.append(sizes)
    if not orders:
        return np.zeros(0, dtype=np.int64), np.zeros(1, dtype=np.int64), left_out
    sizes = np.concatenate(batch_sizes)
    return np.concatenate(orders), np.r_[0, np.cumsum(sizes)], left_out


def deal_equal_steps(
    patches, tokens, world_size: int, per_rank: int
) -> tuple[np.ndarray, np.ndarray]:
    """deal_steps for packs that fill whole steps of world_size * per_rank packs."""
    per_step = world_size * per_rank
    num_steps = len(patches) // per_step
    patches = patches.reshape(num_steps, per_step).astype(np.int64)
    tokens = tokens.reshape(num_steps, per_step).astype(np.int64)
    # 1. Within each step, the packs heaviest first (ties: the first in the step).
    position = np.broadcast_to(np.arange(per_step), patches.shape)
    heaviest_first = np.lexsort((position, -tokens, -patches), axis=-1)  # each step's own order
    # 2. Each goes to the lightest rank that still needs packs, in all steps at once.
    rank_patches = np.zeros((num_steps, world_size), dtype=np.int64)
    rank_tokens = np.zeros((num_steps, world_size), dtype=np.int64)
    rank_count = np.zeros((num_steps, world_size), dtype=np.int64)
    rank_of = np.empty((num_steps, per_step), dtype=np.int64)  # by position in the step
    everyone = np.arange(num_steps)
    never = np.iinfo(np.int64).max
    for i in range(per_step):
        chosen_pack = heaviest_first[:, i]
        full = rank_count == per_rank
        by_patches = np.where(full, never, rank_patches)
        fewest = by_patches == by_patches.min(axis=1, keepdims=True)
        rank = np.where(fewest, rank_tokens, never).argmin(axis=1)  # ties: lowest rank
        rank_of[everyone, chosen_pack] = rank
        rank_patches[everyone, rank] += patches[everyone, chosen_pack]
        rank_tokens[everyone, rank] += tokens[everyone, chosen_pack]
        rank_count[everyone, rank] += 1
    # 3. Batch (step, rank) holds its packs in the order they were dealt.
    dealt_at = np.empty_like(rank_of)
    np.put_along_axis(dealt_at, heaviest_first, np.arange(per_step)[None, :], axis=1)
    step = np.repeat(np.arange(num_steps), per_step)
    order = np.lexsort((dealt_at.ravel(), rank_of.ravel(), step))
    return order, np.full(num_steps * world_size, per_rank, dtype=np.int64)


def plan_epoch(
    weights: Weights,
    *,
    max_length: int,
    max_images: int,
    max_patches: int | None = None,
    packs_per_batch: int,
    world_size: int = 1,
    strategy: str = "images_first_bfd",
    buffer_size: int = 4096,
    seed: int = 0,
    epoch: int = 0,
    mixture=None,
) -> EpochPlan:
    """Steps 1-3: the epoch's plan for every rank, the same wherever it is computed.

    `mixture` (a mmdp.data.mixture.MixturePlan): the rows come from several sources, each with
    its share; after step 1 it chooses the epoch's rows (some left out, some repeated), and after
    step 3 each step's batches go to the ranks so that every rank's share of every source holds.
    """
    rows, dropped = filter_rows(weights, max_length, max_images, max_patches)
    if mixture is not None:
        usable = rows
        rows = mixture.choose(usable, weights.lengths, epoch)
        left_out = len(usable) - len(np.intersect1d(usable, rows))
        if left_out:
            dropped[LEFT_OUT_BY_MIXTURE] += left_out
    rng = np.random.default_rng([seed, epoch])
    packed_rows, pack_starts, shuffled = shuffle_and_pack(
        rows,
        weights,
        rng,
        max_length=max_length,
        max_images=max_images,
        max_patches=max_patches,
        strategy=strategy,
        buffer_size=buffer_size,
    )
    num_packs = len(pack_starts) - 1
    pack_of_row = np.repeat(np.arange(num_packs), np.diff(pack_starts))
    pack_tokens = np.bincount(pack_of_row, weights.lengths[packed_rows], minlength=num_packs)
    pack_patches = np.bincount(pack_of_row, weights.patch_counts[packed_rows], minlength=num_packs)
    order, batch_starts, left_out = deal_steps(
        pack_patches[shuffled], pack_tokens[shuffled], world_size, packs_per_batch
    )
    if left_out:
        remainder = shuffled[num_packs - left_out :]
        dropped[LEFT_OUT_TO_EQUALISE_RANKS] += int(np.diff(pack_starts)[remainder].sum())
    rows, pack_starts = gather_packs(packed_rows, pack_starts, shuffled[order])
    plan = EpochPlan(rows, pack_starts, batch_starts, world_size, dict(dropped))
    if mixture is not None and world_size > 1:
        plan = balance_groups(plan, mixture.source_of_row, weights.lengths)
    return plan


def balance_groups(plan: EpochPlan, group_of_row: np.ndarray, lengths: np.ndarray) -> EpochPlan:
    """Step 3b (mixtures): the same batches, given to the ranks of each step so that every
    rank's tokens of every group (a mixture's source) stay even over the epoch.

    Steps in order; within a step, the batch with the most tokens first, each to the rank whose
    tokens per group then come closest (squared distance) to an even share of the epoch so far.
    The batches of a step do not change, so neither does the balance the dealer gave them.
    """
    world_size, num_groups = plan.world_size, int(group_of_row.max(initial=0)) + 1
    num_batches = len(plan.batch_starts) - 1
    pack_of_row = np.repeat(np.arange(len(plan.pack_starts) - 1), np.diff(plan.pack_starts))
    batch_of_pack = np.repeat(np.arange(num_batches), np.diff(plan.batch_starts))
    loads = np.zeros((num_batches, num_groups))
    np.add.at(loads, (batch_of_pack[pack_of_row], group_of_row[plan.rows]), lengths[plan.rows])
    loads = loads.reshape(-1, world_size, num_groups)  # [step, batch of the step, group]
    held = np.zeros((world_size, num_groups))
    order = np.empty(num_batches, dtype=np.int64)
    for step, step_loads in enumerate(loads):
        even = (held.sum(axis=0) + step_loads.sum(axis=0)) / world_size
        free = list(range(world_size))
        for b in np.argsort(-step_loads.sum(axis=1), kind="stable"):
            cost = ((held[free] + step_loads[b] - even) ** 2).sum(axis=1)
            rank = free.pop(int(np.argmin(cost)))
            order[step * world_size + rank] = step * world_size + b
            held[rank] += step_loads[b]
    sizes = np.diff(plan.batch_starts)[order]
    packs = ranges(plan.batch_starts[order], plan.batch_starts[order + 1])
    rows, pack_starts = gather_packs(plan.rows, plan.pack_starts, packs)
    return EpochPlan(rows, pack_starts, np.r_[0, np.cumsum(sizes)], world_size, plan.dropped)


def shuffle_and_pack(
    rows: np.ndarray,
    weights: Weights,
    rng: np.random.Generator,
    *,
    max_length: int,
    max_images: int,
    max_patches: int | None = None,
    strategy: str,
    buffer_size: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Step 2: shuffle the rows, pack them buffer by buffer, and shuffle the packs.

    Returns (rows in pack order, pack_starts, a shuffled order of the packs). The planned loader
    packs a whole epoch this way, the streaming one each buffer it reads (buffer_size: all).
    """
    rows = rng.permutation(rows)
    packed_rows, pack_starts = pack_buffers(
        rows,
        weights,
        max_length=max_length,
        max_images=max_images,
        max_patches=max_patches,
        strategy=strategy,
        buffer_size=buffer_size,
    )
    return packed_rows, pack_starts, rng.permutation(len(pack_starts) - 1)


def gather_packs(rows, pack_starts, packs) -> tuple[np.ndarray, np.ndarray]:
    """The rows of the given packs, in that order: (rows, pack_starts) again."""
    sizes = np.diff(pack_starts)[packs]
    return rows[ranges(pack_starts[packs], pack_starts[packs + 1])], np.r_[0, np.cumsum(sizes)]


def ranges(first: np.ndarray, end: np.ndarray) -> np.ndarray:
    """The integers first[0]..end[0]-1, then first[1]..end[1]-1, ... as one array.

    >>> ranges(np.array([3, 0]), np.array([5, 2])).tolist()
    [3, 4, 0, 1]
    """
    sizes = end - first
    starts = np.cumsum(sizes) - sizes  # where each range begins in the output
    return np.arange(int(sizes.sum())) + np.repeat(first - starts, sizes)


def batch_loads(plan: EpochPlan, weights: Weights) -> dict[str, np.ndarray]:
    """The tokens, images and patches of every rank's batch at every step: arrays [steps,
    world_size] (for mmdp.report.metrics.rank_balance)."""
    pack_of_row = np.repeat(np.arange(len(plan.pack_starts) - 1), np.diff(plan.pack_starts))
    batch_of_pack = np.repeat(np.arange(len(plan.batch_starts) - 1), np.diff(plan.batch_starts))
    batch_of_row = batch_of_pack[pack_of_row]
    num_batches = len(plan.batch_starts) - 1
    loads = {
        "tokens": weights.lengths,
        "images": weights.image_counts,
        "patches": weights.patch_counts,
    }
    return {
        name: np.bincount(batch_of_row, per_row[plan.rows], minlength=num_batches)
        .astype(np.int64)
        .reshape(-1, plan.world_size)
        for name, per_row in loads.items()
    }
