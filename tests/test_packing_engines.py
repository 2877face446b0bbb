"""The packers' fast paths (issue 29) held to the oracles' loops (tests/packing_oracles.py), and the planner's processes
held to one process: same packs, same plan."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from packing_oracles import fit_decreasing, greedy

from mmdp.packing.packers import FIT_DECREASING, pack
from mmdp.packing.packing_config import PackingConfig
from mmdp.packing.weights import Budgets, Weights
from mmdp.planning import planner
from mmdp.planning.planner import PARALLEL_MIN_BUFFERS, plan_epoch

# Items in up to three budgets; a budget of None is left out (never binds).
items_in_budgets = st.integers(min_value=1, max_value=64).flatmap(
    lambda max_length: st.tuples(
        st.just(max_length),
        st.lists(
            st.tuples(st.integers(1, max_length), st.integers(0, 3), st.integers(0, 40)),
            max_size=150,
        ),
        st.one_of(st.none(), st.integers(3, 8)),
        st.one_of(st.none(), st.integers(40, 120)),
    )
)


def columns(case):
    """(lengths, budgets, images, patches): patches None without a patch budget."""
    max_length, triples, max_images, max_patches = case
    lengths, images, patches = (list(c) for c in zip(*triples)) if triples else ([], [], [])
    patches = None if max_patches is None else patches
    return lengths, Budgets(max_length, max_images, max_patches), images, patches


@settings(max_examples=100, deadline=None)
@given(items_in_budgets)
def test_greedy_a_pack_at_a_time_matches_the_item_by_item_loop(case):
    lengths, budgets, images, patches = columns(case)
    assert pack(
        lengths,
        max_length=budgets.max_length,
        strategy="greedy",
        image_counts=images,
        max_images=budgets.max_images,
        patch_counts=patches,
        max_patches=budgets.max_patches,
    ) == greedy(lengths, budgets, images, patches)


def test_greedy_ends_a_pack_where_either_budget_would_pass():
    # max_length 8, 2 images a pack: 3 (1 image) + 4 (1 image) = 7 tokens, 2 images; the next,
    # 1 token with 1 image, fits the tokens (8) but not the images (3): a new pack
    assert pack(
        [3, 4, 1, 6, 2], max_length=8, strategy="greedy", image_counts=[1, 1, 1, 0, 0], max_images=2
    ) == [[0, 1], [2, 3], [4]]


@settings(max_examples=100, deadline=None)
@given(items_in_budgets)
def test_items_over_half_the_budget_open_their_own_packs_as_the_loop_does(case):
    # lengths from 1 to max_length: often a head of items longer than half of it, which the
    # engines place before the runs, each alone
    lengths, budgets, images, _ = columns(case)
    max_length, max_images = budgets.max_length, budgets.max_images
    for strategy in FIT_DECREASING:
        assert pack(
            lengths,
            max_length=max_length,
            strategy=strategy,
            image_counts=images,
            max_images=max_images,
        ) == fit_decreasing(lengths, Budgets(max_length, max_images), images, strategy=strategy)


def test_the_long_items_each_open_a_pack_then_the_runs_fill_them():
    # max_length 8: 6 and 5 are longer than 4, each opens a pack (rooms 2 and 3); binpack puts 3
    # into the first pack with room (pack 1), 2 into pack 0; bfd the same, by tightest room
    for strategy in FIT_DECREASING:
        assert pack([6, 5, 3, 2], max_length=8, strategy=strategy) == [[0, 3], [1, 2]]


def random_weights(rows: int, seed: int = 0) -> Weights:
    """Cauldron-like rows: 20-600 tokens, 0-4 images (some too long for 512)."""
    rng = np.random.default_rng(seed)
    return Weights.from_lists(rng.integers(20, 600, rows), rng.integers(0, 5, rows))


def test_packing_in_processes_gives_the_same_plan(monkeypatch):
    # Buffers are independent: processes pack ranges of them, and the ranges come back in order.
    # 3,500 or so usable rows in buffers of 100 (below PARALLEL_MIN_BUFFERS: processes forced)
    weights = random_weights(4_000)
    config = PackingConfig(max_length=512, max_images=3, packs_per_batch=3, buffer_size=100)
    one_process = plan_epoch(weights, config, world_size=2)
    monkeypatch.setattr(planner, "planning_workers", lambda num_buffers: 2)
    ranges_packed = []
    pack_in_processes = planner.pack_in_processes

    def counted(rows, job, workers):
        sizes = pack_in_processes(rows, job, workers)
        ranges_packed.append(len(sizes))
        return sizes

    monkeypatch.setattr(planner, "pack_in_processes", counted)
    two_processes = plan_epoch(weights, config, world_size=2)
    assert len(ranges_packed) == 1 and ranges_packed[0] > 2  # several ranges, in processes
    for name in ("rows", "pack_starts", "batch_starts"):
        assert getattr(one_process, name).tolist() == getattr(two_processes, name).tolist(), name
    # ranges taken out of order give another plan: the comparison can tell
    monkeypatch.setattr(
        planner,
        "pack_in_processes",
        lambda rows, job, workers: pack_in_processes(rows, job, workers)[::-1],
    )
    out_of_order = plan_epoch(weights, config, world_size=2)
    assert out_of_order.pack_starts.tolist() != one_process.pack_starts.tolist()


def test_few_buffers_are_packed_in_this_process():
    assert planner.planning_workers(PARALLEL_MIN_BUFFERS - 1) == 1
