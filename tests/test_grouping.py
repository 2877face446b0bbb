"""Stage 3 grouped by modality and length (mmdp.planning.grouping): hand-worked plans,
invariants, the sampler under a DataLoader with the naive collator, and the comparison with naive
and constrained padding."""

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from mmdp.data.padding import NaivePadCollator
from mmdp.drop_reasons import LEFT_OUT_TO_EQUALISE_RANKS, TOO_LONG
from mmdp.packing.weights import Weights
from mmdp.planning.grouping import (
    ModalityLengthBatchSampler,
    plan_batches,
    plan_grouped_epoch,
)
from mmdp.training.strategies import compare_padding

# The module docstring's example.
LENGTHS = [30, 200, 25, 120, 90, 40, 150, 100, 35, 600, 20, 80]
IMAGES = [0, 2, 0, 1, 1, 0, 1, 1, 0, 1, 0, 1]


def batches_by_step(plan) -> list[list[list[int]]]:
    """[step][rank] -> the rows of that batch."""
    return [
        [np.concatenate(plan.batch(step, rank)).tolist() for rank in range(plan.world_size)]
        for step in range(plan.num_steps())
    ]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_docstring_example_by_hand(seed):
    # batch_size 2, 2 ranks: a step is 4 rows.
    # 1. Row 9 (600 tokens) is over max_length 512: too_long.
    # 2. Text-only: rows 0, 2, 5, 8, 10; with images: rows 1, 3, 4, 6, 7, 11.
    # 3. Each sorted longest first (one window holds them all, so the shuffle only decides ties,
    #    and there are none): text 5 (40), 8 (35), 0 (30), 2 (25), 10 (20);
    #    images 1 (200), 6 (150), 3 (120), 7 (100), 4 (90), 11 (80).
    # 4. Text step [5, 8, 0, 2]: 5 -> rank 0 (40), 8 -> rank 1 (35), 0 -> rank 1 (65 vs 40),
    #    rank 1 is full, 2 -> rank 0: [5, 2] | [8, 0], 65 tokens each.
    #    Image step [1, 6, 3, 7]: 1 -> rank 0 (200), 6 -> rank 1 (150), 3 -> rank 1 (270 vs
    #    200), 7 -> rank 0: [1, 7] | [6, 3].
    # 5. Left over: text row 10 alone, which two ranks cannot share: left out; image rows 4 and 11:
    #    a last step of one row per rank, [4] | [11].
    # 6. Padded tokens of each step's heaviest batch: images 2 x 200 = 400, text 2 x 40 = 80,
    #    last 1 x 90 = 90. The image step comes first whatever the seed; the other two in the
    #    seed's order.
    weights = Weights.from_lists(LENGTHS, IMAGES)
    plan = plan_grouped_epoch(weights, batch_size=2, max_length=512, world_size=2, seed=seed)
    steps = batches_by_step(plan)
    assert steps[0] == [[1, 7], [6, 3]]
    assert sorted(steps[1:]) == [[[4], [11]], [[5, 2], [8, 0]]]
    assert plan.dropped == {TOO_LONG: 1, LEFT_OUT_TO_EQUALISE_RANKS: 1}


def test_one_rank_keeps_every_row_that_fits_and_sorts_within_a_window():
    # One rank, batch_size 2, a window of 1 step (2 rows): rows are shuffled, then each
    # consecutive pair is one batch, longest first; with one rank nothing is left out, and the
    # last row alone makes a batch of one.
    lengths = [5, 9, 7, 2, 8]
    weights = Weights.from_lists(lengths, [1, 1, 1, 1, 1])
    plan = plan_grouped_epoch(weights, batch_size=2, window_steps=1, seed=3)
    batches = [batch.tolist() for batch in plan_batches(plan)]
    assert sorted(row for batch in batches for row in batch) == [0, 1, 2, 3, 4]
    assert sorted(len(batch) for batch in batches) == [1, 2, 2]
    for batch in batches:
        in_batch = [lengths[row] for row in batch]
        assert in_batch == sorted(in_batch, reverse=True)
    assert plan.dropped == {}


def random_weights(num_rows: int, seed: int) -> Weights:
    """Long-tailed lengths, a fifth of the rows text only, a few unusable."""
    rng = np.random.default_rng(seed)
    images = rng.choice([0, 1, 2, 3], size=num_rows, p=[0.2, 0.6, 0.15, 0.05])
    lengths = images * 64 + rng.geometric(1 / 80, size=num_rows) + 10
    reasons = [None] * num_rows
    for row in rng.choice(num_rows, size=num_rows // 50, replace=False):
        reasons[row] = "empty_reply"
    return Weights.from_lists(lengths, images, reasons)


@pytest.mark.parametrize(("world_size", "batch_size"), [(1, 8), (2, 4), (3, 5), (8, 2)])
@pytest.mark.parametrize("seed", [0, 1])
def test_invariants(world_size, batch_size, seed):
    weights = random_weights(997, seed)
    plan = plan_grouped_epoch(
        weights, batch_size=batch_size, max_length=400, world_size=world_size, seed=seed
    )
    steps = batches_by_step(plan)
    rows = [row for step in steps for batch in step for row in batch]
    # every row once, or counted as dropped by reason
    assert len(rows) == len(set(rows))
    assert len(rows) + sum(plan.dropped.values()) == len(weights)
    assert plan.dropped[TOO_LONG] == int(((weights.lengths > 400) & (weights.reasons == 0)).sum())
    assert plan.dropped.get(LEFT_OUT_TO_EQUALISE_RANKS, 0) <= 2 * (world_size - 1)
    # every rank has a batch at every step, the same number of rows within a step
    for step in steps:
        assert len(step) == world_size
        assert len({len(batch) for batch in step}) == 1 and 1 <= len(step[0]) <= batch_size
        # one modality per step
        assert len({bool(weights.image_counts[row]) for batch in step for row in batch}) == 1
    # the heaviest step first: rows x longest row of its heaviest batch
    padded = [max(len(b) * int(weights.lengths[b].max()) for b in step) for step in steps]
    assert padded[0] == max(padded)


def test_same_seed_and_epoch_same_plan_another_epoch_another_order():
    weights = random_weights(500, 0)

    def plan(seed, epoch):
        return batches_by_step(
            plan_grouped_epoch(weights, batch_size=4, world_size=2, seed=seed, epoch=epoch)
        )

    assert plan(0, 0) == plan(0, 0)
    assert plan(0, 1) != plan(0, 0) and plan(1, 0) != plan(0, 0)


def test_grouping_pads_far_less_than_constrained_and_balances_ranks():
    weights = random_weights(2000, 1)
    result = compare_padding(weights, max_length=400, batch_size=8, world_size=2)
    grouped, constrained = result["modality_length"], result["constrained"]
    assert 1 - grouped["utilization"] < 0.1 < 0.5 < 1 - constrained["utilization"]
    spread = grouped["rank_balance"]["token_spread_per_step"]
    assert spread["mean"] < 0.05 * constrained["rank_balance"]["token_spread_per_step"]["mean"]
    assert grouped["rank_balance"]["batches_per_rank"] == [grouped["batches_per_rank"]] * 2
    first, *rest = (max(step) for step in grouped["padded_tokens"])
    assert first >= max(rest)


class FakeSamples(torch.utils.data.Dataset):
    """What VQADataset returns, from lengths and image counts alone."""

    def __init__(self, weights: Weights):
        self.weights = weights

    def __len__(self):
        return len(self.weights)

    def __getitem__(self, row):
        n, images = int(self.weights.lengths[row]), int(self.weights.image_counts[row])
        return {
            "row": row,
            "input_ids": torch.full((n,), 7),
            "labels": torch.full((n,), 7),
            "pixel_values": torch.zeros(images, 3, 2, 2),
            "converted": {},
            "drop_reason": None,
        }


def test_sampler_shares_the_plan_between_ranks_and_the_naive_collator_pads_each_batch_to_its_longest():
    weights = random_weights(300, 2)
    samplers = [
        ModalityLengthBatchSampler(weights, batch_size=4, max_length=400, rank=r, world_size=2)
        for r in range(2)
    ]
    loaders = [
        DataLoader(FakeSamples(weights), batch_sampler=s, collate_fn=NaivePadCollator(0))
        for s in samplers
    ]
    per_rank = [list(loader) for loader in loaders]
    assert len(per_rank[0]) == len(per_rank[1]) == len(samplers[0]) == len(samplers[1]) > 0
    rows = [row for batches in per_rank for b in batches for row in b["sample_index"].tolist()]
    assert len(rows) == len(set(rows))
    assert len(rows) + sum(samplers[0].dropped.values()) == len(weights)
    for batches in per_rank:
        for batch in batches:
            longest = int(batch["attention_mask"].sum(dim=1).max())
            assert batch["input_ids"].shape[1] == longest
    padded = [max(b.numel() for b in (a["input_ids"], z["input_ids"])) for a, z in zip(*per_rank)]
    assert padded[0] == max(padded)
    # a new epoch: another order (the heaviest batch still first), the same plan on every rank
    epoch_0 = [list(s) for s in samplers]
    for s in samplers:
        s.set_epoch(1)
    epoch_1 = [list(s) for s in samplers]
    assert epoch_1 != epoch_0 and epoch_1[0][0] == epoch_0[0][0]
    assert samplers[0].plan.rows.tolist() == samplers[1].plan.rows.tolist()


def test_plot_grouped_names_its_parts():
    from test_plots import example

    plot_grouped = example("group_by_length").plot_grouped

    result = compare_padding(random_weights(200, 0), max_length=400, batch_size=4, world_size=2)
    first = {"lengths": [30, 20], "width": 30, "limit": 400, "title": "first"}
    fig = plot_grouped(first, result, "grouped")
    heaviest = {
        name: 1 + int(np.argmax([max(step) for step in value["padded_tokens"]]))
        for name, value in result.items()
    }
    assert heaviest["modality_length"] == 1
    assert fig._suptitle.get_text() == "grouped"
    labels = [{t.get_text() for t in ax.get_legend().get_texts()} for ax in fig.axes]
    assert labels == [
        {"real tokens", "padding", "max length (400)"},
        {"real tokens", "padding"},
        {"naive", "constrained", "modality_length"}
        | {f"{name}'s heaviest: step {step}" for name, step in heaviest.items()},
    ]
