"""The epoch planner, traced by hand on tiny integer inputs (as tests/test_packing.py does)."""

import tracemalloc
from dataclasses import replace

import numpy as np
import pytest

from mmdp.drop_reasons import NO_TEXTS, TOO_LONG, TOO_MANY_IMAGES
from mmdp.packing.packing_config import PackingConfig
from mmdp.packing.weights import Budgets, Weights
from mmdp.planning import planner
from mmdp.planning.planner import (
    batch_loads,
    deal_steps,
    filter_rows,
    pack_buffers,
    plan_epoch,
    ranges,
)
from mmdp.report.pack_report import rank_balance


def test_filter_counts_every_row_it_leaves_out():
    # lengths [3, 9, 0, 5]: row 2 has no texts; max_length 8, max_images 3
    # row 0 fits; row 1 is too long; row 2 no_texts; row 3 has 4 images
    weights = Weights.from_lists([3, 9, 0, 5], [1, 0, 0, 4], [None, None, NO_TEXTS, None])
    rows, dropped = filter_rows(weights, Budgets(max_length=8, max_images=3))
    assert rows.tolist() == [0]
    assert dropped == {TOO_LONG: 1, NO_TEXTS: 1, TOO_MANY_IMAGES: 1}


def test_packing_buffer_by_buffer():
    weights = Weights.from_lists([3, 6, 2, 5], [0, 0, 0, 0])
    budgets, binpack = Budgets(max_length=8, max_images=0), "binpack"
    # one buffer of 4: binpack -> [6, 2] and [5, 3], i.e. rows [1, 2] and [3, 0]
    rows, starts = pack_buffers(np.arange(4), weights, budgets, strategy=binpack, buffer_size=4)
    assert (rows.tolist(), starts.tolist()) == ([1, 2, 3, 0], [0, 2, 4])
    # buffers of 2: rows 0, 1 (3 and 6 do not fit together) -> [1], [0];
    # rows 2, 3 -> [5, 2], i.e. rows [3, 2]. Packs never cross a buffer.
    rows, starts = pack_buffers(np.arange(4), weights, budgets, strategy=binpack, buffer_size=2)
    assert (rows.tolist(), starts.tolist()) == ([1, 0, 3, 2], [0, 1, 2, 4])
    # rows are packed in the order given (after the epoch's shuffle)
    rows, starts = pack_buffers(
        np.array([3, 2, 1, 0]), weights, budgets, strategy=binpack, buffer_size=2
    )
    assert (rows.tolist(), starts.tolist()) == ([3, 2, 1, 0], [0, 2, 3, 4])


def test_dealing_evens_out_images_between_ranks():
    # 4 packs of 8 tokens with 3, 0, 2, 1 images; 2 ranks, 2 packs per batch: one step.
    # Heaviest first: pack 0 (3 images) -> rank 0 (both empty: lowest rank);
    # pack 2 (2) -> rank 1 (0 < 3 images); pack 3 (1) -> rank 1 (2 < 3); rank 1 is full,
    # pack 1 (0) -> rank 0. Each rank ends with 3 images.
    order, batch_starts = deal_steps(np.array([3, 0, 2, 1]), np.full(4, 8), 2, 2)
    assert order.tolist() == [0, 1, 2, 3]  # batch (step 0, rank 0): packs 0, 1; rank 1: 2, 3
    assert batch_starts.tolist() == [0, 2, 4]


def test_dealing_breaks_image_ties_by_tokens_then_rank():
    # no images; tokens 5, 8, 8, 2 (2 ranks, 2 packs each): heaviest first by tokens, ties by
    # position in the step: pack 1 -> rank 0; pack 2 -> rank 1 (0 < 8 tokens); pack 0 -> both
    # ranks hold 8 tokens: the lower, rank 0 (now full); pack 3 -> rank 1. Within a batch, packs
    # stay in the order they were dealt: rank 0 holds packs 1, 0.
    order, _ = deal_steps(np.zeros(4, int), np.array([5, 8, 8, 2]), 2, 2)
    assert order.tolist() == [1, 0, 2, 3]


@pytest.mark.parametrize(
    ("packs", "world_size", "per_batch", "order", "batch_sizes"),
    [
        # 5 packs, 2 ranks x 2: one full step (4), then 1 pack for 2 ranks: rank 0 trains it,
        # rank 1 gets a batch of no pack (its filler)
        (5, 2, 2, [0, 2, 1, 3, 4], [2, 2, 1, 0]),
        # 7 packs, 2 ranks x 2: one full step, then 3 packs: 1 each (4 to rank 0, 5 to rank 1),
        # and the one left over (6) to the lighter rank: equal loads, the lower number, rank 0
        (7, 2, 2, [0, 2, 1, 3, 4, 6, 5], [2, 2, 2, 1]),
        # 8 packs, 3 ranks x 2: one full step of 6, then 2 packs for 3 ranks: ranks 0 and 1
        # train one each, rank 2 gets its filler
        (8, 3, 2, [0, 3, 1, 4, 2, 5, 6, 7], [2, 2, 2, 1, 1, 0]),
        # one rank: the last batch is just shorter
        (5, 1, 2, [0, 1, 2, 3, 4], [2, 2, 1]),
        # fewer packs than ranks in the whole epoch: one step, one pack
        (1, 3, 2, [0], [1, 0, 0]),
    ],
)
def test_every_rank_gets_the_same_number_of_batches_and_no_pack_is_left_out(
    packs, world_size, per_batch, order, batch_sizes
):
    # equal weights: within a step, packs go to ranks in turn, the lowest rank first
    dealt, batch_starts = deal_steps(np.zeros(packs, int), np.ones(packs), world_size, per_batch)
    assert dealt.tolist() == order
    assert np.diff(batch_starts).tolist() == batch_sizes
    assert len(batch_sizes) % world_size == 0  # whole steps: the same batches on every rank


def test_the_packs_left_over_go_to_the_lightest_ranks_of_the_last_step():
    # 2 ranks x 2 packs; 7 packs: a full step (0-3), then packs 4, 5, 6 of 3, 1, 2 patches.
    # The last step's even share is its first 2 packs, one each, heaviest first: pack 4 (3
    # patches) -> rank 0, pack 5 (1) -> rank 1. The pack left over, 6, goes to the lighter
    # rank of the step: rank 1 (1 patch against 3).
    patches = np.array([0, 0, 0, 0, 3, 1, 2])
    order, batch_starts = deal_steps(patches, np.ones(7), 2, 2)
    assert order[4:].tolist() == [4, 5, 6]  # rank 0: [4]; rank 1: [5, 6]
    assert np.diff(batch_starts).tolist() == [2, 2, 1, 2]


def test_plan_accounts_for_every_row_and_ranks_get_equal_batches():
    # 11 rows: 9 of 4 tokens (packs of 2), one too long, one with no texts; max_length 8,
    # 2 ranks, 1 pack per batch: 5 packs (4 of 2 rows, 1 of 1 row) -> 3 steps of 2 batches, the
    # last one a pack on one rank and a filler on the other: no row left out
    lengths = [4] * 9 + [9, 0]
    weights = Weights.from_lists(lengths, [0] * 11, [None] * 10 + [NO_TEXTS])
    plan = plan_epoch(
        weights, PackingConfig(max_length=8, max_images=1, packs_per_batch=1), world_size=2
    )
    assert plan.num_steps() == 3
    used = [
        row
        for step in range(3)
        for rank in range(2)
        for p in plan.batch(step, rank)
        for row in p.tolist()
    ]
    assert sorted(used) == list(range(9))  # every usable row once
    assert plan.dropped == {TOO_LONG: 1, NO_TEXTS: 1}
    # each rank's plan: 3 batches; the rank without a pack in step 2 gets a copy of the other's,
    # marked as its filler
    ranks = [plan.for_rank(rank) for rank in range(2)]
    assert [mine.num_steps() for mine in ranks] == [3, 3]
    fillers = [[mine.is_filler(step) for step in range(3)] for mine in ranks]
    assert sorted(fillers) == [[False, False, False], [False, False, True]]
    rank_with_filler = fillers.index([False, False, True])
    copied = ranks[rank_with_filler].batch(2)[0].tolist()
    assert copied == ranks[1 - rank_with_filler].batch(2)[0].tolist()


def test_same_seed_same_plan_another_epoch_another_order():
    weights = Weights.from_lists(np.arange(1, 60) % 7 + 1, np.arange(59) % 3)
    config = PackingConfig(max_length=12, max_images=4, packs_per_batch=2, seed=1)
    a = plan_epoch(weights, config, world_size=2, epoch=0)
    b = plan_epoch(weights, config, world_size=2, epoch=0)
    c = plan_epoch(weights, config, world_size=2, epoch=1)
    assert a.rows.tolist() == b.rows.tolist() and a.pack_starts.tolist() == b.pack_starts.tolist()
    assert a.rows.tolist() != c.rows.tolist()
    assert sorted(a.rows.tolist()) == sorted(c.rows.tolist())


def test_a_rank_plan_holds_exactly_that_ranks_batches():
    weights = Weights.from_lists(np.arange(1, 80) % 9 + 1, np.arange(79) % 4)
    plan = plan_epoch(
        weights, PackingConfig(max_length=16, max_images=5, packs_per_batch=3), world_size=3
    )
    for rank in range(3):
        mine = plan.for_rank(rank)
        assert mine.world_size == 1 and mine.num_steps() == plan.num_steps()
        for step in range(plan.num_steps()):
            expected = [p.tolist() for p in plan.batch(step, rank)]
            assert [p.tolist() for p in mine.batch(step)] == expected


def test_batch_loads_give_each_ranks_tokens_and_images_per_step():
    # the plan of test_dealing_evens_out_images_between_ranks, through plan_epoch: 4 rows of 8
    # tokens with 3, 0, 2, 1 images, one row a pack, 2 ranks x 2 packs
    weights = Weights.from_lists([8, 8, 8, 8], [3, 0, 2, 1])
    plan = plan_epoch(
        weights, PackingConfig(max_length=8, max_images=3, packs_per_batch=2), world_size=2
    )
    loads = batch_loads(plan, weights)
    assert loads["tokens"].tolist() == [[16, 16]] and loads["images"].tolist() == [
        [3, 3]
    ]  # 3 + 0, 2 + 1
    balance = rank_balance(loads, world_size=2)
    assert balance["batches_per_rank"] == [1, 1]
    assert balance["image_spread_per_step"]["max"] == 0  # 3 images each
    assert balance["token_spread_per_step"]["max"] == 0


def test_ranges():
    assert ranges(np.array([3, 0]), np.array([5, 2])).tolist() == [3, 4, 0, 1]
    assert ranges(np.array([], int), np.array([], int)).tolist() == []


def random_weights(rows: int, seed: int = 0) -> Weights:
    """Cauldron-like rows: 20-600 tokens, 0-4 images, a few unusable."""
    rng = np.random.default_rng(seed)
    reasons = np.where(rng.random(rows) < 0.02, NO_TEXTS, None).tolist()
    return Weights.from_lists(rng.integers(20, 600, rows), rng.integers(0, 5, rows), reasons)


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_planning_slice_by_slice_gives_the_same_plan(monkeypatch, world_size):
    # the planner works on slices of CHUNK_ROWS rows and CHUNK_PACKS packs; tiny slices (and
    # steps cut across dealing slices) must give the plan that one slice gives
    weights = random_weights(3_001)
    config = PackingConfig(max_length=512, max_images=3, packs_per_batch=3, buffer_size=500)
    whole = plan_epoch(weights, config, world_size=world_size)
    monkeypatch.setattr(planner, "CHUNK_ROWS", 7)
    monkeypatch.setattr(planner, "CHUNK_PACKS", 5)
    sliced = plan_epoch(weights, config, world_size=world_size)
    for name in ("rows", "pack_starts", "batch_starts"):
        assert getattr(whole, name).tolist() == getattr(sliced, name).tolist(), name
    assert whole.dropped == sliced.dropped and whole.dropped[TOO_LONG] > 0
    other_seed = plan_epoch(weights, replace(config, seed=1), world_size=world_size)
    assert other_seed.rows.tolist() != whole.rows.tolist()  # the comparison can tell plans apart


def test_plan_arrays_are_narrow_and_one_rank_shares_them():
    plan = plan_epoch(
        random_weights(2_000), PackingConfig(max_length=512, max_images=3, packs_per_batch=4)
    )
    assert plan.rows.dtype == np.int32 and plan.pack_starts.dtype == np.int32
    assert plan.for_rank(0).rows is plan.rows  # one rank: the plan itself, not a copy


def packs_of_four(weights, *args, **kwargs):
    """A stand-in packer (its memory is one buffer's, whatever the epoch): 4 rows a pack."""
    n = len(weights)
    return np.arange(n), np.r_[np.arange(0, n, 4), n]


def traced_peak(rows: int) -> int:
    """Peak bytes numpy allocates while planning `rows` rows."""
    weights = random_weights(rows)
    tracemalloc.start()
    try:
        plan_epoch(weights, PackingConfig(max_length=512, max_images=3, packs_per_batch=8))
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_planning_peaks_under_16_bytes_a_row(monkeypatch):
    # What each row adds to the peak (two sizes, so that fixed costs cancel): the whole-epoch
    # arrays are int32 and temporaries come a slice at a time (slices shrunk here, as 100 M rows
    # make them small). The old planner (int64 copies of the epoch) added ~75 bytes a row.
    monkeypatch.setattr(planner, "pack_weights", packs_of_four)
    monkeypatch.setattr(planner, "CHUNK_ROWS", 1 << 12)
    monkeypatch.setattr(planner, "CHUNK_PACKS", 1 << 10)
    per_row = (traced_peak(400_000) - traced_peak(200_000)) / 200_000
    assert 4 <= per_row <= 16  # at least the plan itself (int32 rows), at most 16
