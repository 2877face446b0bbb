"""Plan an epoch of packed batches from weights alone: pure functions, numpy arrays in and out.

Stage 5 never needs a sample's tokens or pixels to decide where it goes: its weight (tokens,
images) is enough. So an epoch is planned once, up front, and every rank and DataLoader worker
computes the same plan and takes its share. In the blog's terms:

0. With an eval split (PackedDataset's eval_ratio), hold out rows for evaluation from the seed
   alone (`eval_split`): an epoch plans the training rows, or the held-out ones.
1. Filter (`filter_rows`): rows whose text is unusable, longer than `max_length` tokens or with
   more than `max_images` images are dropped and counted by reason.
2. Shuffle the rest with (seed, epoch), pack them buffer by buffer (mmdp.packing.packers: a
   token budget and an image budget per pack; the buffers are independent, so a big epoch's
   go to several processes, `pack_buffers`) and shuffle the packs (`shuffle_and_pack`).
3. Deal the packs to ranks a step at a time (`deal_steps`): a step is world_size * packs_per_batch
   packs, and within a step each rank gets packs_per_batch of them, heaviest first to the rank with
   the fewest images (then tokens) so far. Every rank gets the same number of batches (DDP would
   hang otherwise) and no pack is left out: the last step is shared as evenly as it goes (some
   ranks one pack more), and when it holds fewer packs than ranks, a rank without one gets a
   `filler` batch (a copy of another rank's pack that trains nothing: every label -100,
   mmdp.batch.filler_batch).

The streaming loader runs steps 1-2 on each buffer it reads (`pack_buffer`).

Everything is a flat array, so that 24 M rows plan in seconds and a worker receives a few bytes
per row. An EpochPlan holds:

    rows          [packed rows]   every planned row, pack after pack, batch after batch
    pack_starts   [packs + 1]     pack p holds rows[pack_starts[p] : pack_starts[p + 1]]
    batch_starts  [batches + 1]   batch b holds packs batch_starts[b] : batch_starts[b + 1];
                                  batches go step after step, and within a step rank after
                                  rank: batch (step, rank) is number step * world_size + rank;
                                  a batch of no pack is a rank's filler in the last step
    fillers       [batches]       (a rank's plan, `for_rank`) True for a filler batch: its one
                                  pack is a copy of another rank's, trained by that rank only

Example (tests/test_planner.py traces it): lengths [3, 6, 2, 5], max_length 8, binpack,
1 pack per batch, 2 ranks, no shuffling: packs [6, 2] and [5, 3] (rows [1, 2] and [3, 0]); one
step of 2 packs, the heavier first: rank 0 gets [1, 2] (8 tokens), rank 1 gets [3, 0].
"""

import multiprocessing
import os
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace

import numpy as np

from mmdp.drop_reasons import (
    LEFT_OUT_BY_MIXTURE,
    REASONS,
    TOO_LONG,
    TOO_MANY_IMAGES,
    TOO_MANY_PATCHES,
)
from mmdp.packing.packers import pack_weights
from mmdp.packing.packing_config import PackingConfig
from mmdp.packing.weights import Budgets, Weights

# Whole-epoch arrays are int32 (`index_dtype`) and written in place; element-wise work on them
# goes a slice at a time, so that its temporaries (numpy's int64 indices, masks) stay a few MB
# at any size: 100 M rows plan in about 12 bytes a row at the peak (docs/benchmarks.md).
CHUNK_ROWS = 1 << 20  # rows per slice
CHUNK_PACKS = 1 << 16  # packs per slice
EVAL_SPLIT_STREAM = 11  # a seed word of the eval split's own: it never replays a shuffle
# Processes pack buffers only from this many on: below, starting them costs more than it saves
# (a buffer of 4,096 rows packs in a few ms; a forked process starts in tens of ms).
PARALLEL_MIN_BUFFERS = 256
RANGE_ROWS = 1 << 20  # at most this many rows go to a process at a time


@dataclass
class EpochPlan:
    """Which rows go into which pack, batch and rank for one epoch (see the module docstring)."""

    rows: np.ndarray
    pack_starts: np.ndarray
    batch_starts: np.ndarray
    world_size: int
    dropped: dict  # rows left out while planning, by reason
    fillers: np.ndarray | None = None  # bool per batch, in a rank's plan: None, no filler
    truncated: int = 0  # planned rows cut to max_length (overflow="truncate": PackedDataset)

    def is_filler(self, batch: int) -> bool:
        """Whether a batch of this (rank's) plan is a filler, which trains nothing."""
        return self.fillers is not None and bool(self.fillers[batch])

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
        workers receive: a few bytes per row).

        A batch of no pack (the rank's filler in a last step of fewer packs than ranks) becomes
        one pack, a copy of the step's first pack on another rank, marked in `fillers`: the rank
        still runs a forward and backward with the others (DDP and FSDP meet there), and the
        copy trains nothing (mmdp.batch.filler_batch)."""
        if self.world_size == 1:
            return self  # the whole plan: its arrays, not a copy
        batches = np.arange(rank, len(self.batch_starts) - 1, self.world_size)
        first, end = self.batch_starts[batches], self.batch_starts[batches + 1]
        fillers = first == end
        for step in np.flatnonzero(fillers).tolist():
            step_batches = step * self.world_size  # the step's first batch (rank 0's)
            sizes = np.diff(self.batch_starts[step_batches : step_batches + self.world_size + 1])
            source = step_batches + int(np.flatnonzero(sizes)[0])  # every step has a pack
            first[step] = self.batch_starts[source]
            end[step] = first[step] + 1
        rows, pack_starts = gather_packs(self.rows, self.pack_starts, ranges(first, end))
        return EpochPlan(
            rows=rows,
            pack_starts=pack_starts,
            batch_starts=np.r_[0, np.cumsum(end - first)],
            world_size=1,
            dropped=self.dropped,
            fillers=fillers if fillers.any() else None,
        )


def eval_split(
    num_rows: int, eval_ratio: float, seed: int, source_of_row: np.ndarray | None = None
) -> np.ndarray:
    """The rows held out for evaluation, as a bool mask [num_rows]: round(eval_ratio x rows) of
    them (of each source's rows, in a mixture, so that every source is evaluated), drawn with
    (seed, EVAL_SPLIT_STREAM). Deterministic: the same on every rank and in every run with this
    seed, whatever the budgets, ranks and epochs (the training split is the rest).

    >>> eval_split(10, 0.3, seed=0).sum()
    np.int64(3)
    """
    if not 0 <= eval_ratio < 1:
        raise ValueError(f"eval_ratio must be in [0, 1), got {eval_ratio}")
    held_out = np.zeros(num_rows, dtype=bool)
    rng = np.random.default_rng([seed, EVAL_SPLIT_STREAM])
    sources = np.zeros(num_rows, np.int16) if source_of_row is None else source_of_row
    for source in np.unique(sources):
        rows = np.flatnonzero(sources == source)
        held_out[rng.choice(rows, size=round(eval_ratio * len(rows)), replace=False)] = True
    if eval_ratio and not held_out.any():
        raise ValueError(f"eval_ratio {eval_ratio} of {num_rows:,} rows holds out no row")
    return held_out


def filter_rows(
    weights: Weights, budgets: Budgets, split: np.ndarray | None = None
) -> tuple[np.ndarray, Counter]:
    """Step 1: the rows that can be packed under `budgets` (a PackingConfig's `budgets`), and
    the others counted by reason (a row over several budgets counts once: too long first, then
    too many images, then patches).
    `split` (bool per row, `eval_split`): only the rows it marks are judged and counted; the
    others belong to another split of the dataset.

    Example: row 2 has no texts, row 1 is too long, row 3 has too many images:

    >>> weights = Weights.from_lists([3, 9, 0, 5], [1, 0, 0, 4], [None, None, "no_texts", None])
    >>> rows, dropped = filter_rows(weights, Budgets(max_length=8, max_images=3))
    >>> rows.tolist(), sorted(dropped.items())
    ([0], [('no_texts', 1), ('too_long', 1), ('too_many_images', 1)])

    A slice of CHUNK_ROWS rows at a time, so that its temporaries stay a few MB at any size; the
    rows come as int32 (`index_dtype`).
    """
    keep = np.empty(len(weights), dtype=bool)
    codes = np.zeros(len(REASONS), dtype=np.int64)  # rows unusable, by reason
    over = np.zeros(3, dtype=np.int64)  # rows too long, with too many images, too many patches
    for start in range(0, len(weights), CHUNK_ROWS):
        part = slice(start, start + CHUNK_ROWS)
        keep[part], part_codes, part_over = judge_rows(
            weights, part, budgets, None if split is None else split[part]
        )
        codes += part_codes
        over += part_over
    dropped = Counter({REASONS[code]: int(n) for code, n in enumerate(codes) if code and n})
    for reason, n in zip((TOO_LONG, TOO_MANY_IMAGES, TOO_MANY_PATCHES), over.tolist()):
        dropped[reason] += n
    rows = np.empty(int(np.count_nonzero(keep)), dtype=index_dtype(len(weights)))
    done = 0
    for start in range(0, len(weights), CHUNK_ROWS):
        found = np.flatnonzero(keep[start : start + CHUNK_ROWS]) + start
        rows[done : done + len(found)] = found
        done += len(found)
    return rows, +dropped  # + drops zero counts


def judge_rows(
    weights: Weights, part: slice, budgets: Budgets, in_split: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """filter_rows on weights[part]: (which rows can be packed, the unusable ones counted by
    reason code, how many are too long / have too many images / too many patches); only the
    rows `in_split` when given."""
    reasons = weights.reasons[part]
    if in_split is not None:
        reasons = np.where(in_split, reasons, 0)  # out of the split: neither kept nor counted
    usable = reasons == 0 if in_split is None else (reasons == 0) & in_split
    too_long, over_images, over_patches = budgets.over([c[part] for c in weights.columns()])
    too_long &= usable
    too_many_images = usable & ~too_long & over_images
    too_many_patches = usable & ~too_long & ~too_many_images & over_patches
    keep = usable & ~too_long & ~too_many_images & ~too_many_patches
    codes = np.bincount(reasons, minlength=len(REASONS))  # code 0 (usable) is never reported
    over = [np.count_nonzero(m) for m in (too_long, too_many_images, too_many_patches)]
    return keep, codes, np.array(over)


def index_dtype(size: int) -> type:
    """The integer type for positions in an array of `size`: int32 (4 bytes, not numpy's 8)
    below 2**31."""
    return np.int32 if size < 2**31 else np.int64


def pack_buffers(
    rows: np.ndarray,
    weights: Weights,
    budgets: Budgets,
    *,
    strategy: str,
    buffer_size: int,
    workers: int | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Step 2: pack `rows`, in their order, buffer_size at a time (as the blog's producer does).

    Returns (rows in pack order, pack_starts): `rows` itself, reordered in place (packs never
    cross a buffer, so each buffer's rows stay in its slice), and pack_starts as `index_dtype`.
    Buffers are independent: `workers` processes pack them (None: `planning_workers`), each a
    range of buffers at a time, and their results come back in order: the same plan.
    """
    job = PackingJob(weights, budgets, strategy, buffer_size)
    num_buffers = -(-len(rows) // buffer_size)
    workers = planning_workers(num_buffers) if workers is None else workers
    if workers > 1 and num_buffers > 1:
        sizes = pack_in_processes(rows, job, workers)
    else:
        sizes = [job.pack(rows)]  # in place
    sizes = np.concatenate(sizes) if sizes else np.zeros(0, dtype=np.int32)
    return rows, starts_of(sizes, index_dtype(len(rows)))


# Step 2 in several processes: ranges of whole buffers, the same plan ---------------------------


@dataclass
class PackingJob:
    """What packing a range of buffers needs: the weights, the budgets, the strategy."""

    weights: Weights
    budgets: Budgets  # a PackingConfig's, whole
    strategy: str
    buffer_size: int

    def pack(self, rows: np.ndarray) -> np.ndarray:
        """Pack `rows` buffer_size at a time, reordering them in place; the rows per pack."""
        weights, budgets, sizes = self.weights, self.budgets, []
        for start in range(0, len(rows), self.buffer_size):
            buffer = rows[start : start + self.buffer_size]
            lengths, images, patches = (column[buffer] for column in weights.columns())
            of_buffer = Weights(lengths, images, patch_counts=patches)
            items, starts = pack_weights(of_buffer, budgets, self.strategy)
            buffer[:] = buffer[items]  # buffer[items] is a copy: safe to write back
            sizes.append(np.diff(starts).astype(np.int32))
        return np.concatenate(sizes) if sizes else np.zeros(0, dtype=np.int32)


def planning_workers(num_buffers: int) -> int:
    """How many processes pack `num_buffers` buffers: the cores this process may use, shared
    between the ranks of this machine (torchrun's LOCAL_WORLD_SIZE); 1 below
    PARALLEL_MIN_BUFFERS buffers, in a daemon process (a DataLoader worker may not start
    processes), and where processes cannot be forked (Windows)."""
    if (
        num_buffers < PARALLEL_MIN_BUFFERS
        or multiprocessing.current_process().daemon
        or "fork" not in multiprocessing.get_all_start_methods()
    ):
        return 1
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, (cores or 1) // int(os.environ.get("LOCAL_WORLD_SIZE", "1")))


_job: PackingJob | None = None  # a packing process's job, set once as it starts


def start_packing_process(job: PackingJob) -> None:
    global _job
    _job = job


def pack_range(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """In a packing process: a range of buffers' rows -> (rows in pack order, rows per pack)."""
    sizes = _job.pack(rows)
    return rows, sizes


def pack_in_processes(rows: np.ndarray, job: PackingJob, workers: int) -> list[np.ndarray]:
    """`job.pack` over ranges of whole buffers in `workers` processes, reordering `rows` in
    place; the rows per pack of each range, in order.

    The processes are forked, so they share the weights (copy on write, read only) instead of
    receiving them; each range's rows go and come back through a pipe (4 bytes a row each way).
    About four ranges per process, at most RANGE_ROWS rows each, so that a slow process holds
    the others up little.
    """
    num_buffers = -(-len(rows) // job.buffer_size)
    per_range = max(1, min(RANGE_ROWS // job.buffer_size, num_buffers // (4 * workers)))
    step = per_range * job.buffer_size
    bounds = [(a, min(a + step, len(rows))) for a in range(0, len(rows), step)]
    sizes = []
    with ProcessPoolExecutor(
        workers,
        mp_context=multiprocessing.get_context("fork"),
        initializer=start_packing_process,
        initargs=(job,),
    ) as pool:
        for (a, z), (packed, part_sizes) in zip(
            bounds, pool.map(pack_range, (rows[a:z] for a, z in bounds))
        ):
            rows[a:z] = packed
            sizes.append(part_sizes)
    return sizes


def starts_of(sizes: np.ndarray, dtype) -> np.ndarray:
    """[0, sizes[0], sizes[0] + sizes[1], ...]: where each pack begins, and the end."""
    starts = np.zeros(len(sizes) + 1, dtype=dtype)
    np.cumsum(sizes, dtype=dtype, out=starts[1:])
    return starts


def pack_sums(per_row: np.ndarray, rows: np.ndarray, pack_starts: np.ndarray) -> np.ndarray:
    """The sum of per_row over each pack's rows (tokens, patches), a slice of packs at a time."""
    num_packs = len(pack_starts) - 1
    sums = np.empty(num_packs, dtype=per_row.dtype)
    for first in range(0, num_packs, CHUNK_PACKS):
        starts = pack_starts[first : first + CHUNK_PACKS + 1]
        values = per_row[rows[starts[0] : starts[-1]]]
        sums[first : first + len(starts) - 1] = np.add.reduceat(values, starts[:-1] - starts[0])
    return sums


def deal_steps(
    pack_patches: np.ndarray, pack_tokens: np.ndarray, world_size: int, packs_per_batch: int
) -> tuple[np.ndarray, np.ndarray]:
    """Step 3: deal packs (in the order given) to ranks, one step at a time, every pack.

    Returns (pack order, batch_starts): pack_order lists the packs batch after batch, batch
    (step, rank) being number step * world_size + rank, as in EpochPlan.

    Within a step the packs go heaviest first (most vision-encoder patches, then most tokens,
    then first in the step), each to the rank with the fewest patches so far (then fewest
    tokens, then lowest number) among those that still need packs: each rank's vision encoder
    and language model get about the same work. (Without patch counts, a row's patches are its
    images.) All steps are dealt at once: the loop runs over the positions within a step, not
    over the steps.

    The last step's packs are shared evenly, and the at most world_size - 1 left over go one
    each to the lightest ranks of that step (`deal_left_over`): some batches hold one pack more.
    When the last step has fewer packs than ranks, the ranks without one get a batch of no pack,
    which a rank's plan turns into a filler (EpochPlan.for_rank): every rank has the same number
    of batches, and no pack is left out.
    """
    per_step = world_size * packs_per_batch
    num_packs = len(pack_patches)
    last = num_packs % per_step
    left_over = last % world_size  # what the last step cannot share evenly
    # (first pack, end, packs per rank): the full steps, then the last one, shared evenly
    steps = [(0, num_packs - last, packs_per_batch)]
    if last - left_over:
        steps.append((num_packs - last, num_packs - left_over, (last - left_over) // world_size))
    order = np.empty(num_packs, dtype=index_dtype(num_packs))
    batch_sizes = [np.zeros(0, dtype=np.int64)]
    for first, end, per_rank in steps:
        # whole steps at a time: each step is dealt on its own, its packs stay in its slice
        chunk = max(1, CHUNK_PACKS // (world_size * per_rank)) * world_size * per_rank
        for a in range(first, end, chunk):
            z = min(a + chunk, end)
            part, sizes = deal_equal_steps(
                pack_patches[a:z], pack_tokens[a:z], world_size, per_rank
            )
            order[a:z] = part + a
            batch_sizes.append(sizes)
    batch_sizes = np.concatenate(batch_sizes)
    if left_over:
        shared = last - left_over  # the last step's packs dealt evenly above (maybe none)
        if not shared:
            batch_sizes = np.r_[batch_sizes, np.zeros(world_size, dtype=np.int64)]
        step_start = num_packs - last
        order[step_start:], batch_sizes[-world_size:] = deal_left_over(
            order[step_start : step_start + shared],
            batch_sizes[-world_size:],
            np.arange(num_packs - left_over, num_packs),
            pack_patches,
            pack_tokens,
        )
    return order, starts_of(batch_sizes, np.int64)


def deal_left_over(step_order, sizes, left_over, pack_patches, pack_tokens):
    """The last step with its left-over packs (fewer than ranks): the heaviest to the rank of
    the step with the fewest patches (then tokens, then the lowest number), and so on, one each.
    Returns the step's pack order (batch after batch) and its batch sizes."""
    world_size = len(sizes)
    held = np.split(step_order, np.cumsum(sizes)[:-1])  # each rank's packs of the step
    patches = np.array([pack_patches[p].sum() for p in held], dtype=np.int64)
    tokens = np.array([pack_tokens[p].sum() for p in held], dtype=np.int64)
    lightest = np.lexsort((np.arange(world_size), tokens, patches))
    position = np.arange(len(left_over))
    heaviest = left_over[np.lexsort((position, -pack_tokens[left_over], -pack_patches[left_over]))]
    for rank, pack in zip(lightest.tolist(), heaviest.tolist()):
        held[rank] = np.r_[held[rank], pack]
    return np.concatenate(held), np.array([len(p) for p in held], dtype=np.int64)


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
    config: PackingConfig,
    *,
    world_size: int = 1,
    epoch: int = 0,
    mixture=None,
    split: np.ndarray | None = None,
) -> EpochPlan:
    """Steps 1-3: the epoch's plan for every rank, the same wherever it is computed, packed and
    batched as `config` says.

    `mixture` (a mmdp.planning.source_shares.MixturePlan): the rows come from several
    sources, each with its share; after step 1 it chooses the epoch's rows (some left out, some
    repeated), and after step 3 each step's batches go to the ranks so that every rank's share of
    every source holds.

    `split` (bool per row, `eval_split`): the epoch takes only the rows it marks (a training or
    an evaluation split); the others are neither planned nor counted.
    """
    rows, dropped = filter_rows(weights, config.budgets, split)
    if mixture is not None:
        usable = rows
        rows = mixture.choose(usable, weights.lengths, epoch)
        left_out = len(usable) - len(np.intersect1d(usable, rows))
        if left_out:
            dropped[LEFT_OUT_BY_MIXTURE] += left_out
    rng = np.random.default_rng([config.seed, epoch])
    packed_rows, pack_starts, shuffled = shuffle_and_pack(rows, weights, rng, config)
    del rows  # packed_rows, reordered in place
    pack_tokens = pack_sums(weights.lengths, packed_rows, pack_starts)[shuffled]
    pack_patches = pack_sums(weights.patch_counts, packed_rows, pack_starts)[shuffled]
    order, batch_starts = deal_steps(pack_patches, pack_tokens, world_size, config.packs_per_batch)
    del pack_tokens, pack_patches
    packs = shuffled[order]
    del shuffled, order
    rows, pack_starts = gather_packs(packed_rows, pack_starts, packs)
    plan = EpochPlan(rows, pack_starts, batch_starts, world_size, dict(dropped))
    if mixture is not None and world_size > 1:
        plan = balance_sources(plan, mixture.source_of_row, weights.lengths)
    return plan


def balance_sources(plan: EpochPlan, source_of_row: np.ndarray, lengths: np.ndarray) -> EpochPlan:
    """Step 3b (mixtures): the same batches, given to the ranks of each step so that every
    rank's tokens of every source of the mixture stay even over the epoch.

    Steps in order; within a step, the batch with the most tokens first, each to the rank whose
    tokens per source then come closest (squared distance) to an even share of the epoch so far.
    The batches of a step do not change, so neither does the balance the dealer gave them.
    """
    world_size, num_sources = plan.world_size, int(source_of_row.max(initial=0)) + 1
    num_batches = len(plan.batch_starts) - 1
    pack_of_row = np.repeat(np.arange(len(plan.pack_starts) - 1), np.diff(plan.pack_starts))
    batch_of_pack = np.repeat(np.arange(num_batches), np.diff(plan.batch_starts))
    loads = np.zeros((num_batches, num_sources))
    np.add.at(loads, (batch_of_pack[pack_of_row], source_of_row[plan.rows]), lengths[plan.rows])
    loads = loads.reshape(-1, world_size, num_sources)  # [step, batch of the step, source]
    held = np.zeros((world_size, num_sources))
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
    rows: np.ndarray, weights: Weights, rng: np.random.Generator, config: PackingConfig
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Step 2: shuffle the rows, pack them buffer by buffer, and shuffle the packs.

    Returns (rows in pack order, pack_starts, a shuffled order of the packs). `rows` itself is
    shuffled and packed in place (rng.shuffle draws as rng.permutation does: the same order,
    without a copy). The planned loader packs a whole epoch this way, the streaming one each
    buffer it reads (buffer_size: all). config.seed is not read here: `rng` is seeded already.
    """
    rng.shuffle(rows)
    packed_rows, pack_starts = pack_buffers(
        rows, weights, config.budgets, strategy=config.strategy, buffer_size=config.buffer_size
    )
    pack_order = np.arange(len(pack_starts) - 1, dtype=pack_starts.dtype)
    rng.shuffle(pack_order)
    return packed_rows, pack_starts, pack_order


def pack_buffer(
    weights: Weights, rng: np.random.Generator, config: PackingConfig
) -> tuple[list[np.ndarray], Counter]:
    """Steps 1-2 for one buffer of a stream (mmdp.loading.streaming): its packs (positions in the
    buffer) and its drops, by reason.

    filter_rows and shuffle_and_pack on the buffer's weights. Same buffer,
    same rng state: same packs. Example: lengths [3, 9, 6, 2, 5], no images, max_length 8,
    "binpack": row 1 is too long; FFD takes 6, 5, 3, 2 and makes the packs [2, 3] (6 + 2) and
    [4, 0] (5 + 3), in a shuffled order; dropped {"too_long": 1}.
    """
    rows, dropped = filter_rows(weights, config.budgets)
    whole_buffer = replace(config, buffer_size=max(len(weights), 1))
    packed_rows, pack_starts, order = shuffle_and_pack(rows, weights, rng, whole_buffer)
    starts = pack_starts.tolist()
    return [packed_rows[starts[p] : starts[p + 1]] for p in order.tolist()], dropped


def gather_packs(rows, pack_starts, packs) -> tuple[np.ndarray, np.ndarray]:
    """The rows of the given packs, in that order: (rows, pack_starts) again, in the same
    dtypes, a slice of packs at a time."""
    sizes = (pack_starts[1:] - pack_starts[:-1])[packs]
    new_starts = starts_of(sizes, pack_starts.dtype)
    del sizes
    out = np.empty(int(new_starts[-1]), dtype=rows.dtype)
    for first in range(0, len(packs), CHUNK_PACKS):
        chosen = packs[first : first + CHUNK_PACKS]
        a, z = new_starts[first], new_starts[first + len(chosen)]
        out[a:z] = rows[ranges(pack_starts[chosen], pack_starts[chosen + 1])]
    return out, new_starts


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
    world_size] (for mmdp.report.pack_report.rank_balance)."""
    pack_of_row = np.repeat(np.arange(len(plan.pack_starts) - 1), np.diff(plan.pack_starts))
    batch_of_pack = np.repeat(np.arange(len(plan.batch_starts) - 1), np.diff(plan.batch_starts))
    batch_of_row = batch_of_pack[pack_of_row]
    num_batches = len(plan.batch_starts) - 1
    loads = dict(zip(("tokens", "images", "patches"), weights.columns()))
    return {
        name: np.bincount(batch_of_row, per_row[plan.rows], minlength=num_batches)
        .astype(np.int64)
        .reshape(-1, plan.world_size)
        for name, per_row in loads.items()
    }
