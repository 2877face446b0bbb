"""Stage 4's loops as the blog writes them (mmdp.packing.knapsack): the blog's packs, the
producer-consumer, and the library's fast packer giving the same packs."""

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mmdp.packing.knapsack import bin_packing, greedy_packing, packs_in_background
from mmdp.packing.packers import pack

BLOG_ITEMS = list(range(1, 25))  # the blog's toy: start=1, end=25, max_length 100
BLOG_PACKS = {  # what the blog prints
    "greedy": [list(range(1, 14)), list(range(14, 20)), list(range(20, 24)), [24]],
    "binpack": [[24, 23, 22, 21, 10], [20, 19, 18, 17, 16, 9, 1], [15, 14, 13, 12, 11, *range(8, 1, -1)]],
}  # fmt: skip
LOOPS = {
    "greedy": lambda items, budget: list(greedy_packing(items, budget)),
    "binpack": bin_packing,
}


@pytest.mark.parametrize("strategy", ["greedy", "binpack"])
def test_the_loops_and_the_producer_print_the_blogs_packs(strategy):
    assert LOOPS[strategy](BLOG_ITEMS, 100) == BLOG_PACKS[strategy]
    assert list(packs_in_background(BLOG_ITEMS, 100, strategy)) == BLOG_PACKS[strategy]


def test_hand_worked_packs():
    # max_length 7, items 5, 3, 3, 1:
    # greedy: 5 | 3+3 (5+3 > 7) | then 1 fits (7)
    assert list(greedy_packing([5, 3, 3, 1], 7)) == [[5], [3, 3, 1]]
    # binpack: 5 -> A (5); 3 -> A? 8 > 7 -> B (3); 3 -> B (6); 1 -> A, the first with room (6)
    assert bin_packing([5, 3, 3, 1], 7) == [[5, 1], [3, 3]]


def test_items_longer_than_a_pack_are_skipped_as_the_blog_does():
    assert list(greedy_packing([2, 9, 3], 5)) == [[2, 3]]
    assert bin_packing([2, 9, 3], 5) == [[3, 2]]


def test_the_producer_packs_a_stream_a_buffer_at_a_time():
    # binpack sorts each buffer of 3 alone: 1 2 3 | 4 5 6, max_length 7
    assert list(packs_in_background(range(1, 7), 7, "binpack", buffer_size=3)) == [
        [3, 2, 1],
        [6],
        [5],
        [4],
    ]
    with pytest.raises(ValueError, match="unknown strategy"):
        next(packs_in_background([1], 7, "bfd"))


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.integers(1, 60), max_size=80),
    st.integers(1, 60),
    st.sampled_from(["greedy", "binpack"]),
)
def test_the_fast_packer_gives_the_loops_packs(items, max_length, strategy):
    items = [item for item in items if item <= max_length]  # the loops skip them, pack refuses
    fast = [[items[i] for i in p] for p in pack(items, max_length=max_length, strategy=strategy)]
    assert fast == LOOPS[strategy](items, max_length)


@pytest.mark.parametrize("strategy", ["greedy", "binpack"])
def test_the_fast_packer_gives_the_loops_packs_on_a_long_run(strategy):
    rng = random.Random(0)
    items = [rng.randint(1, 4096) for _ in range(3000)]
    fast = [[items[i] for i in p] for p in pack(items, max_length=4096, strategy=strategy)]
    assert fast == LOOPS[strategy](items, 4096)
