"""Every batching strategy of the tutorial on one epoch, from weights alone: the numbers behind
assets/strategies.png, and stage 3's comparison of padded batches (compare_padding).

Naive and constrained padding batch `batch_size` samples in the order of a seeded shuffle (as
stages 2 and 3 do, so the figures match); the packers plan the epoch as stage 5 does
(mmdp.planning.planner), and differ only in the strategy; grouped padded batches are planned
as examples/group_by_length.py does (mmdp.planning.grouping).
"""

import numpy as np
import torch
from torch.utils.data import DataLoader

from mmdp.drop_reasons import REASONS, TOO_LONG
from mmdp.packing.packers import STRATEGIES as PACKING_STRATEGIES
from mmdp.packing.packing_config import PackingConfig
from mmdp.planning.grouping import plan_batches, plan_grouped_epoch
from mmdp.planning.planner import Weights, plan_epoch
from mmdp.report.pack_report import rank_balance, spread

PADDING_STRATEGIES = ("naive", "constrained")


def padding_batches(
    weights: Weights, strategy: str, *, max_length: int, batch_size: int, seed: int
) -> tuple[list[np.ndarray], list[int], dict]:
    """The very batches of stage 2 (naive) or stage 3 (constrained) on weights: each batch's
    rows, the length it is padded to, and the rows dropped by reason."""
    # A DataLoader shuffled with the same seeded generator as stages 2 and 3.
    order = DataLoader(
        range(len(weights)),
        batch_size=batch_size,
        shuffle=True,
        generator=torch.Generator().manual_seed(seed),
    )
    usable = weights.reasons == 0
    codes = np.bincount(weights.reasons, minlength=len(REASONS))
    dropped = {REASONS[code]: int(n) for code, n in enumerate(codes) if code and n}
    lengths = weights.lengths.astype(np.int64)
    batches, widths = [], []
    for indices in order:
        batch = indices.numpy()[usable[indices.numpy()]]
        if strategy == "constrained":
            too_long = lengths[batch] > max_length
            if too_long.any():
                dropped[TOO_LONG] = dropped.get(TOO_LONG, 0) + int(too_long.sum())
            batch = batch[~too_long]
            width = max_length
        else:
            width = int(lengths[batch].max(initial=0))
        batches.append(batch)
        widths.append(width)
    return batches, widths, dropped


def padding_epoch(
    weights: Weights, strategy: str, *, max_length: int, batch_size: int, seed: int
) -> dict:
    """Stage 2 (naive) or stage 3 (constrained) on weights: one row per sample."""
    batches, widths, dropped = padding_batches(
        weights, strategy, max_length=max_length, batch_size=batch_size, seed=seed
    )
    lengths = weights.lengths.astype(np.int64)
    rows = np.concatenate(batches) if batches else np.zeros(0, dtype=np.int64)
    return summarize(
        int(lengths[rows].sum()),
        sum(width * len(batch) for batch, width in zip(batches, widths)),
        len(batches),
        dropped,
        tokens=lengths[rows],
        images=weights.image_counts[rows],
        samples=np.ones(len(rows)),
    )


def packing_epoch(weights: Weights, config: PackingConfig) -> dict:
    """Stage 5's plan with one strategy: one row per pack."""
    plan = plan_epoch(weights, config)
    pack_of_row = np.repeat(np.arange(len(plan.pack_starts) - 1), np.diff(plan.pack_starts))
    tokens = np.bincount(pack_of_row, weights.lengths[plan.rows]).astype(np.int64)
    images = np.bincount(pack_of_row, weights.image_counts[plan.rows]).astype(np.int64)
    return summarize(
        int(tokens.sum()),
        len(tokens) * config.max_length,
        len(plan.batch_starts) - 1,
        plan.dropped,
        tokens=tokens,
        images=images,
        samples=np.diff(plan.pack_starts),
    )


def summarize(real, computed, batches, dropped, *, tokens, images, samples) -> dict:
    return {
        "utilization": round(real / computed, 6) if computed else 0.0,
        "batches": batches,
        "real_tokens": real,
        "computed_tokens": computed,
        "dropped": dict(sorted(dropped.items())),
        "tokens_per_row": spread(tokens),
        "images_per_row": spread(images),
        "samples_per_row": spread(samples),
        "per_row": {"tokens": np.asarray(tokens).tolist(), "images": np.asarray(images).tolist()},
    }


def compare_strategies(
    weights: Weights,
    *,
    max_length: int,
    max_images: int,
    batch_size: int,
    packs_per_batch: int,
    seed: int = 0,
) -> dict:
    """{strategy: epoch summary} for naive, constrained and every packing strategy, from the
    same weights (mmdp.weighing.weigh): `batch_size` samples per padded batch,
    `packs_per_batch` packs per packed one."""
    results = {
        name: padding_epoch(weights, name, max_length=max_length, batch_size=batch_size, seed=seed)
        for name in PADDING_STRATEGIES
    }
    for name in PACKING_STRATEGIES:
        config = PackingConfig(
            max_length=max_length,
            max_images=max_images,
            packs_per_batch=packs_per_batch,
            strategy=name,
            seed=seed,
        )
        results[name] = packing_epoch(weights, config)
    return results


def compare_padding(
    weights: Weights,
    *,
    max_length: int,
    batch_size: int,
    seed: int = 0,
    epoch: int = 0,
    world_size: int = 1,
) -> dict:
    """examples/group_by_length.py's comparison, from the weights: {naive, constrained,
    modality_length: utilization, tokens, batches per rank, dropped, rank balance, padded tokens
    [step][rank]}.

    On world_size ranks, naive and constrained batches go to the ranks in turn (batch b to rank
    b % world_size), as a DistributedSampler would share them; a step's padded tokens are those
    of its heaviest batch (rows x padded length), what decides whether it fits in memory.
    """
    budgets = {"max_length": max_length, "batch_size": batch_size, "seed": seed}
    batches = {name: padding_batches(weights, name, **budgets) for name in PADDING_STRATEGIES}
    plan = plan_grouped_epoch(weights, world_size=world_size, epoch=epoch, **budgets)
    grouped = plan_batches(plan)
    widths = [int(weights.lengths[batch].max()) for batch in grouped]
    batches["modality_length"] = (grouped, widths, plan.dropped)
    return {
        name: padded_summary(*value, weights=weights, world_size=world_size)
        for name, value in batches.items()
    }


def padded_summary(batches, widths, dropped, *, weights: Weights, world_size: int) -> dict:
    """The summary of padded batches, and the real tokens, images and padded tokens of each
    step's batches, [steps, world_size]: batch b is rank b % world_size's at step
    b // world_size. A last step that not every rank has is left out (DDP could not run it)."""
    lengths = weights.lengths.astype(np.int64)
    real = sum(int(lengths[batch].sum()) for batch in batches)
    computed = sum(width * len(batch) for batch, width in zip(batches, widths))
    steps = len(batches) // world_size
    ran = list(zip(batches, widths))[: steps * world_size]
    per_batch = {
        "tokens": [int(lengths[batch].sum()) for batch, _ in ran],
        "images": [int(weights.image_counts[batch].sum()) for batch, _ in ran],
        "padded_tokens": [width * len(batch) for batch, width in ran],
    }
    loads = {
        k: np.asarray(v, dtype=np.int64).reshape(steps, world_size) for k, v in per_batch.items()
    }
    return {
        "utilization": round(real / computed, 6) if computed else 0.0,
        "real_tokens": real,
        "computed_tokens": computed,
        "batches_per_rank": len(loads["padded_tokens"]),
        "dropped": dict(sorted(dropped.items())),
        "rank_balance": rank_balance(loads, world_size),
        "padded_tokens": loads["padded_tokens"].tolist(),  # [step][rank]
    }
