"""Every batching strategy of the tutorial on one epoch, from lengths alone: the numbers behind
assets/strategies.png.

Naive and constrained padding batch `batch_size` samples in the order of a seeded shuffle (as
stages 2 and 3 do, so the figures match); the packers plan the epoch as stage 5 does, with
`PackedDataset`, and differ only in the strategy.
"""

from collections import Counter

import numpy as np
import torch
from torch.utils.data import DataLoader

from mmdp.drop_reasons import TOO_LONG
from mmdp.metrics import spread
from mmdp.packed_dataset import PackedDataset
from mmdp.packing import STRATEGIES as PACKING_STRATEGIES

PADDING_STRATEGIES = ("naive", "constrained")


def padding_epoch(dataset: PackedDataset, strategy: str, batch_size: int, seed: int) -> dict:
    """Stage 2 (naive) or stage 3 (constrained) on lengths: one row per sample."""
    # The very batches of stages 2 and 3: a DataLoader shuffled with the same seeded generator.
    order = DataLoader(
        range(len(dataset.lengths)), batch_size=batch_size, shuffle=True,
        generator=torch.Generator().manual_seed(seed),
    )  # fmt: skip
    usable = np.array([reason is None for reason in dataset.text_problems])
    dropped = Counter(reason for reason in dataset.text_problems if reason is not None)
    rows, useful, computed, batches = [], 0, 0, 0
    for indices in order:
        batch = [int(i) for i in indices if usable[int(i)]]
        if strategy == "constrained":
            too_long = [i for i in batch if dataset.lengths[i] > dataset.max_length]
            dropped[TOO_LONG] += len(too_long)
            batch = [i for i in batch if dataset.lengths[i] <= dataset.max_length]
            width = dataset.max_length
        else:
            width = max((int(dataset.lengths[i]) for i in batch), default=0)
        batches += 1
        rows += batch
        useful += int(dataset.lengths[batch].sum())
        computed += width * len(batch)
    return summarize(
        useful, computed, batches, dict(dropped),
        tokens=dataset.lengths[rows], images=dataset.image_counts[rows], samples=np.ones(len(rows)),
    )  # fmt: skip


def packing_epoch(dataset: PackedDataset) -> dict:
    """Stage 5's plan with the dataset's strategy: one row per pack."""
    plan = dataset.plan(dataset.epoch)
    packs = [p for batches in plan.rank_batches for batch in batches for p in batch]
    batches = sum(len(b) for b in plan.rank_batches)
    tokens = np.array([dataset.lengths[p].sum() for p in packs])
    return summarize(
        int(tokens.sum()), len(packs) * dataset.max_length, batches, dict(plan.dropped),
        tokens=tokens, images=np.array([dataset.image_counts[p].sum() for p in packs]),
        samples=np.array([len(p) for p in packs]),
    )  # fmt: skip


def summarize(useful, computed, batches, dropped, *, tokens, images, samples) -> dict:
    return {
        "utilization": round(useful / computed, 6) if computed else 0.0,
        "batches": batches,
        "useful_tokens": useful,
        "computed_tokens": computed,
        "dropped": dropped,
        "tokens_per_row": spread(tokens),
        "images_per_row": spread(images),
        "samples_per_row": spread(samples),
        "per_row": {"tokens": np.asarray(tokens).tolist(), "images": np.asarray(images).tolist()},
    }


def compare_strategies(dataset: PackedDataset) -> dict:
    """{strategy: epoch summary} for naive, constrained and every packing strategy.

    `dataset` gives the weighed rows and the settings (max_length, packs_per_batch as the batch
    size, max_images, seed); the rows are weighed once for every strategy.
    """
    results = {}
    for strategy in PACKING_STRATEGIES:
        results[strategy] = packing_epoch(dataset.with_strategy(strategy))
    for strategy in PADDING_STRATEGIES:
        results[strategy] = padding_epoch(dataset, strategy, dataset.packs_per_batch, dataset.seed)
    return {name: results[name] for name in PADDING_STRATEGIES + PACKING_STRATEGIES}
