"""Every batching strategy of the tutorial on one epoch, from weights alone: the numbers behind
assets/strategies.png.

Naive and constrained padding batch `batch_size` samples in the order of a seeded shuffle (as
stages 2 and 3 do, so the figures match); the packers plan the epoch as stage 5 does
(mmdp.packing.planner), and differ only in the strategy.
"""

import numpy as np
import torch
from torch.utils.data import DataLoader

from mmdp.drop_reasons import REASONS, TOO_LONG
from mmdp.packing.packers import STRATEGIES as PACKING_STRATEGIES
from mmdp.packing.planner import Weights, plan_epoch
from mmdp.report.metrics import spread

PADDING_STRATEGIES = ("naive", "constrained")


def padding_epoch(
    weights: Weights, strategy: str, *, max_length: int, batch_size: int, seed: int
) -> dict:
    """Stage 2 (naive) or stage 3 (constrained) on weights: one row per sample."""
    # The very batches of stages 2 and 3: a DataLoader shuffled with the same seeded generator.
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
    rows, real, computed, batches = [], 0, 0, 0
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
        batches += 1
        rows.append(batch)
        real += int(lengths[batch].sum())
        computed += width * len(batch)
    rows = np.concatenate(rows) if rows else np.zeros(0, dtype=np.int64)
    return summarize(
        real,
        computed,
        batches,
        dropped,
        tokens=lengths[rows],
        images=weights.image_counts[rows],
        samples=np.ones(len(rows)),
    )


def packing_epoch(
    weights: Weights, strategy: str, *, max_length: int, max_images: int, batch_size: int, seed: int
) -> dict:
    """Stage 5's plan with one strategy: one row per pack."""
    plan = plan_epoch(
        weights,
        max_length=max_length,
        max_images=max_images,
        packs_per_batch=batch_size,
        strategy=strategy,
        seed=seed,
    )
    pack_of_row = np.repeat(np.arange(len(plan.pack_starts) - 1), np.diff(plan.pack_starts))
    tokens = np.bincount(pack_of_row, weights.lengths[plan.rows]).astype(np.int64)
    images = np.bincount(pack_of_row, weights.image_counts[plan.rows]).astype(np.int64)
    return summarize(
        int(tokens.sum()),
        len(tokens) * max_length,
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
    weights: Weights, *, max_length: int, max_images: int, batch_size: int, seed: int = 0
) -> dict:
    """{strategy: epoch summary} for naive, constrained and every packing strategy, from the
    same weights (mmdp.packing.weighing); batch_size is samples per padded batch, packs per packed one."""
    budgets = {"max_length": max_length, "batch_size": batch_size, "seed": seed}
    results = {name: padding_epoch(weights, name, **budgets) for name in PADDING_STRATEGIES}
    for name in PACKING_STRATEGIES:
        results[name] = packing_epoch(weights, name, max_images=max_images, **budgets)
    return results
