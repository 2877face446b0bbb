import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from packing_oracles import balanced_greedy, fit_decreasing

from mmdp.packing import packers as packing
from mmdp.packing.packers import FIT_DECREASING, STRATEGIES, lower_bound, pack, pack_flat
from mmdp.packing.weights import Budgets

BLOG_ITEMS = list(range(1, 25))  # the blog's toy: start=1, end=25, max_length 100


def values(packs, items):
    return [[items[i] for i in p] for p in packs]


def test_greedy_reproduces_the_blog():
    assert values(pack(BLOG_ITEMS, max_length=100, strategy="greedy"), BLOG_ITEMS) == [
        list(range(1, 14)),
        list(range(14, 20)),
        list(range(20, 24)),
        [24],
    ]


@pytest.mark.parametrize("strategy", ["binpack", "bfd", "images_first_bfd"])
def test_binpack_reproduces_the_blog(strategy):
    # images_first_bfd and bfd coincide with binpack here: no images, and 24 items that fill 3
    # packs exactly
    assert values(pack(BLOG_ITEMS, max_length=100, strategy=strategy), BLOG_ITEMS) == [
        [24, 23, 22, 21, 10],
        [20, 19, 18, 17, 16, 9, 1],
        [15, 14, 13, 12, 11, 8, 7, 6, 5, 4, 3, 2],
    ]


def test_docstring_example():
    # lengths [3, 6, 2, 5], max_length 8
    # greedy: 3 | 6+2 (3 does not fit with 6) | 5
    assert pack([3, 6, 2, 5], max_length=8, strategy="greedy") == [[0], [1, 2], [3]]
    # binpack: 6 opens pack 1; 5 does not fit (11) -> pack 2; 3 fits pack 1? 9 > 8 no -> pack 2 (8);
    #      2 fits pack 1 (8)
    assert pack([3, 6, 2, 5], max_length=8, strategy="binpack") == [[1, 2], [3, 0]]
    assert pack([3, 6, 2, 5], max_length=8, strategy="bfd") == [[1, 2], [3, 0]]


def test_balanced_greedy_spreads_items_over_the_lightest_packs(monkeypatch):
    # lengths [3, 6, 2, 5], max_length 8: lower bound 2 packs, plus the blog's 5 extra = 7 empty
    # packs; longest first, each item to the lightest pack that fits (ties: lowest number):
    # 6 -> A; 5 -> B (empty, lighter than A); 3 -> C; 2 -> D. Four half-empty packs.
    assert pack([3, 6, 2, 5], max_length=8, strategy="balanced_greedy") == [[1], [3], [0], [2]]
    # Without the extra packs: lengths 5, 4, 3, 3, 1, max_length 8, lower bound 2 packs A, B:
    # 5 -> A; 4 -> B (4 < 5); 3 -> B (7); 3 -> A (A=5 < B=7: 8); 1 -> B (7 < 8: 8).
    monkeypatch.setattr(packing, "BALANCED_GREEDY_EXTRA_PACKS", 0)
    assert pack([5, 4, 3, 3, 1], max_length=8, strategy="balanced_greedy") == [[0, 3], [1, 2, 4]]
    # The image budget binds: 2, 2, 2 tokens with one image each, 2 images a pack, 1 pack to start
    assert pack(
        [2, 2, 2], max_length=10, strategy="balanced_greedy", image_counts=[1, 1, 1], max_images=2
    ) == [[0, 1], [2]]


def test_best_fit_picks_the_tightest_pack_first_fit_the_first():
    # max_length 7, lengths 5, 3, 3, 1 (already decreasing):
    # 5 -> pack A (2 left); 3 -> A? no -> pack B (4 left); 3 -> B (1 left);
    # 1 -> binpack: A, the first pack with room; bfd: B, whose room (1) is tighter than A's (2)
    assert pack([5, 3, 3, 1], max_length=7, strategy="binpack") == [[0, 3], [1, 2]]
    assert pack([5, 3, 3, 1], max_length=7, strategy="bfd") == [[0], [1, 2, 3]]


def test_image_budget_is_a_second_knapsack_constraint():
    # max_length 10, at most 2 images a pack; lengths 4, 4, 4 with 1 image each:
    # binpack: 4 -> A; 4 -> A (8 tokens, 2 images); 4 -> A? 12 tokens > 10 -> B
    assert pack(
        [4, 4, 4], max_length=10, strategy="binpack", image_counts=[1, 1, 1], max_images=2
    ) == [[0, 1], [2]]
    # lengths 2, 2, 2 with 1 image each fit in tokens (6) but not in images (3 > 2)
    assert pack(
        [2, 2, 2], max_length=10, strategy="binpack", image_counts=[1, 1, 1], max_images=2
    ) == [[0, 1], [2]]
    assert pack(
        [2, 2, 2], max_length=10, strategy="greedy", image_counts=[1, 1, 1], max_images=2
    ) == [[0, 1], [2]]


def test_fast_binpack_and_bfd_match_the_readable_loop_with_images():
    rng = np.random.default_rng(0)
    differ = 0
    for _ in range(200):
        lengths = rng.integers(1, 20, 30)
        images = rng.integers(0, 3, 30)
        a = pack(lengths, max_length=20, strategy="binpack", image_counts=images, max_images=3)
        b = pack(lengths, max_length=20, strategy="bfd", image_counts=images, max_images=3)
        differ += a != b
        assert a == fit_decreasing(lengths, Budgets(20, 3), images, strategy="binpack")
        assert b == fit_decreasing(lengths, Budgets(20, 3), images, strategy="bfd")
    assert differ > 0  # the two strategies are really different


def test_images_first_bfd_is_not_binpack():
    # max_length 10, 2 images a pack; lengths 6, 4, 4 with 0, 2, 2 images.
    # binpack, longest first: 6 -> A (4 tokens, 2 images left); 4 -> A (0, 0); 4 -> B
    assert pack(
        [6, 4, 4], max_length=10, strategy="binpack", image_counts=[0, 2, 2], max_images=2
    ) == [[0, 1], [2]]
    # images_first_bfd, image samples first: 4 -> A (6 tokens, 0 images left); 4 -> A? no images
    # left -> B (6, 0); then the text sample 6: A and B both have 0 image slots and 6 tokens
    # left, tie -> the lowest number, A
    assert pack(
        [6, 4, 4], max_length=10, strategy="images_first_bfd", image_counts=[0, 2, 2], max_images=2
    ) == [[1, 0], [2]]


def test_items_that_cannot_fit_alone_are_named_not_dropped():
    with pytest.raises(ValueError, match="item 1 .*longer than the token budget"):
        pack([3, 12, 4], max_length=10)
    with pytest.raises(ValueError, match="item 2 .*more images than the image budget"):
        pack(
            [3, 2, 4],
            max_length=10,
            strategy="images_first_bfd",
            image_counts=[0, 1, 5],
            max_images=4,
        )
    with pytest.raises(ValueError, match="non-positive"):
        pack([3, 0], max_length=10, strategy="greedy")
    with pytest.raises(ValueError, match="unknown packing strategy"):
        pack([3], max_length=10, strategy="knapsack")


def test_no_items_no_packs():
    for strategy in STRATEGIES:
        assert pack([], max_length=10, strategy=strategy) == []


items = st.integers(min_value=1, max_value=64).flatmap(
    lambda max_length: st.tuples(
        st.just(max_length),
        st.lists(st.tuples(st.integers(1, max_length), st.integers(0, 3)), max_size=150),
        st.integers(3, 8),
    )
)


@settings(max_examples=150, deadline=None)
@given(items, st.sampled_from(STRATEGIES))
def test_packs_are_valid_whatever_the_input(case, strategy):
    max_length, pairs, max_images = case
    lengths = [length for length, _ in pairs]
    images = [count for _, count in pairs]
    packs = pack(
        lengths,
        max_length=max_length,
        strategy=strategy,
        image_counts=images,
        max_images=max_images,
    )
    # every index exactly once
    assert sorted(i for p in packs for i in p) == list(range(len(lengths)))
    assert all(p for p in packs)
    # no pack over either budget
    assert all(sum(lengths[i] for i in p) <= max_length for p in packs)
    assert all(sum(images[i] for i in p) <= max_images for p in packs)
    # deterministic
    assert (
        pack(
            lengths,
            max_length=max_length,
            strategy=strategy,
            image_counts=images,
            max_images=max_images,
        )
        == packs
    )
    if strategy in ("binpack", "bfd"):
        # first/best fit never leaves two packs both at most half full (token-only packing)
        token_packs = pack(lengths, max_length=max_length, strategy=strategy)
        loads = np.array([sum(lengths[i] for i in p) for p in token_packs])
        assert (loads * 2 <= max_length).sum() <= 1
        assert len(token_packs) < 2 * sum(lengths) / max_length + 1
        assert len(token_packs) >= lower_bound(lengths, max_length)


def assert_fast_packers_match_the_readable_ones(lengths, max_length, images, max_images):
    budgets = Budgets(max_length, max_images)
    for strategy in FIT_DECREASING:
        assert pack(
            lengths,
            max_length=max_length,
            strategy=strategy,
            image_counts=images,
            max_images=max_images,
        ) == fit_decreasing(lengths, budgets, images, strategy=strategy)
    assert pack(
        lengths,
        max_length=max_length,
        strategy="balanced_greedy",
        image_counts=images,
        max_images=max_images,
    ) == balanced_greedy(lengths, budgets, images)


@settings(max_examples=100, deadline=None)
@given(items)
def test_fast_packers_match_the_readable_reference(case):
    max_length, pairs, max_images = case
    lengths = [length for length, _ in pairs]
    images = [count for _, count in pairs]
    assert_fast_packers_match_the_readable_ones(lengths, max_length, images, max_images)


# A few kinds of items, many of each: long runs of identical items and many packs in the same
# state (room, image slots), which the fast packers place in bulk; sometimes no image budget.
few_kinds = st.tuples(
    st.integers(12, 40),
    st.lists(st.tuples(st.integers(1, 12), st.integers(0, 3)), min_size=1, max_size=4),
    st.lists(st.integers(0, 3), max_size=300),
    st.one_of(st.none(), st.integers(3, 8)),
)


@settings(max_examples=100, deadline=None)
@given(few_kinds)
def test_fast_packers_match_the_readable_reference_on_long_runs(case):
    max_length, kinds, picks, max_images = case
    lengths = [kinds[k % len(kinds)][0] for k in picks]
    images = [kinds[k % len(kinds)][1] for k in picks]
    assert_fast_packers_match_the_readable_ones(lengths, max_length, images, max_images)
    assert_fast_packers_match_the_readable_ones(lengths, max_length, None, None)


def test_fast_packers_place_a_run_of_identical_items_in_bulk():
    # max_length 10, five items of 4 tokens: 2 per pack, the last pack half full
    for strategy in ("binpack", "bfd", "images_first_bfd"):
        assert pack([4] * 5, max_length=10, strategy=strategy) == [[0, 1], [2, 3], [4]]
    # With 1 image each and 1 image a pack, the image budget caps a pack at one item: 6 tokens of
    # room stay in each pack, and the next run (3 tokens, no images) fills them two by two
    items, starts = pack_flat(
        [4, 4, 3, 3, 3, 3],
        max_length=10,
        strategy="binpack",
        image_counts=[1, 1, 0, 0, 0, 0],
        max_images=1,
    )
    assert items.tolist() == [0, 2, 3, 1, 4, 5]
    assert starts.tolist() == [0, 3, 6]


def test_same_room_bfd_takes_the_lower_number_images_first_the_more_image_slots():
    # max_length 10, 3 images a pack; lengths 6, 6, 3 with 2, 1, 1 images (already in both
    # orders): 6 -> A (4 tokens, 1 image slot left); 6 -> B (4 tokens, 2 slots); then 3 with one
    # image fits both, same room 4: binpack and bfd take A (lower number), images_first_bfd B
    # (more image slots left)
    lengths, images = [6, 6, 3], [2, 1, 1]
    assert pack(lengths, max_length=10, strategy="binpack", image_counts=images, max_images=3) == [
        [0, 2],
        [1],
    ]
    assert pack(lengths, max_length=10, strategy="bfd", image_counts=images, max_images=3) == [
        [0, 2],
        [1],
    ]
    assert pack(
        lengths, max_length=10, strategy="images_first_bfd", image_counts=images, max_images=3
    ) == [[0], [1, 2]]


def test_images_first_bfd_mixes_images_where_length_order_cannot():
    # Four image-heavy short samples and four text-only long ones, max_length 10, 2 images a pack.
    # By length (binpack) the four long text samples pair up first and the image samples are left to
    # packs of their own; images_first_bfd pairs each long text sample with an image sample.
    lengths = [7, 7, 7, 7, 3, 3, 3, 3]
    images = [0, 0, 0, 0, 2, 2, 2, 2]
    assert (
        len(
            pack(
                lengths,
                max_length=10,
                strategy="images_first_bfd",
                image_counts=images,
                max_images=2,
            )
        )
        == 4
    )  # the lower bound: 40 / 10
    assert all(
        sorted(images[i] for i in p) == [0, 2]
        for p in pack(
            lengths, max_length=10, strategy="images_first_bfd", image_counts=images, max_images=2
        )
    )


# A third budget: vision-encoder patches per pack ------------------------------------------------

# The module docstring's example: three samples of 3 tokens and 1 image, of 400, 300 and 500
# patches; max_length 10, 3 images and 800 patches a pack.
PATCH_EXAMPLE = {
    "max_length": 10,
    "image_counts": [1, 1, 1],
    "max_images": 3,
    "patch_counts": [400, 300, 500],
    "max_patches": 800,
}


@pytest.mark.parametrize(
    "strategy, expected",
    [
        # in order: 400 -> A; 300 -> A (700); 500 -> A? 1,200 > 800 -> B
        ("greedy", [[0, 1], [2]]),
        # most patches first: 500 -> A; 400 -> A? 900 > 800 -> B; 300 -> A (800), the first
        ("binpack", [[2, 1], [0]]),
        # as binpack; 300 fits A and B, both with 7 tokens of room: tie -> the lower number, A
        ("bfd", [[2, 1], [0]]),
        # the same order (largest share first: the most patches), the same tie
        ("images_first_bfd", [[2, 1], [0]]),
    ],
)
def test_patch_budget_binds_for_every_strategy(strategy, expected):
    assert pack([3, 3, 3], strategy=strategy, **PATCH_EXAMPLE) == expected
    # without it, the tokens (9) and images (3) fit in one pack
    without = {**PATCH_EXAMPLE, "patch_counts": None, "max_patches": None}
    assert len(pack([3, 3, 3], strategy=strategy, **without)) == 1


def test_balanced_greedy_honours_the_patch_budget(monkeypatch):
    # With no extra packs: lower bound 1 pack, A. Longest first, ties by index: 400 -> A;
    # 300 -> A (700); 500 -> A? 1,200 > 800 -> a new pack B
    monkeypatch.setattr(packing, "BALANCED_GREEDY_EXTRA_PACKS", 0)
    assert pack([3, 3, 3], strategy="balanced_greedy", **PATCH_EXAMPLE) == [[0, 1], [2]]


def test_images_first_bfd_weighs_the_patches_share_too():
    # max_length 10, 2 images, 1,000 patches a pack; lengths 6, 2, one image each, 100 and 900
    # patches. Shares without patches: 6/10 + 1/2 = 1.1 before 2/10 + 1/2 = 0.7; with them
    # 1.1 + 0.1 = 1.2 after 0.7 + 0.9 = 1.6: the patch-heavy sample goes first
    assert pack(
        [6, 2], max_length=10, strategy="images_first_bfd", image_counts=[1, 1], max_images=2
    ) == [[0, 1]]
    assert pack(
        [6, 2],
        max_length=10,
        strategy="images_first_bfd",
        image_counts=[1, 1],
        max_images=2,
        patch_counts=[100, 900],
        max_patches=1000,
    ) == [[1, 0]]
    # max_length 10, 4 images, 1,000 patches; (5 tokens, 900 patches) -> A (100 patches left);
    # (3, 600) -> A? no patches -> B; (2, 100) fits A (5 tokens of room) and B (7): tightest, A
    assert pack(
        [2, 5, 3],
        max_length=10,
        strategy="images_first_bfd",
        image_counts=[1, 1, 1],
        max_images=4,
        patch_counts=[100, 900, 600],
        max_patches=1000,
    ) == [
        [1, 0],
        [2],
    ]


def test_budget_shares_rank_exactly_when_the_products_would_overflow():
    # budgets of 2**31 images and patches: length * I * P is about 2**65, past int64. Shares:
    # 2/10 + 1/2**31 + 1/2 ~ 0.7; 3/10 + ... ~ 0.3; 1/10 + ... + 1 ~ 1.1 -> items 2, 0, 1
    budgets = Budgets(10, max_images=2**31, max_patches=2**31)
    items, budgets = packing.check_items([2, 3, 1], budgets, [1, 1, 1], [2**30, 0, 2**31])
    assert packing.decreasing_order(items, budgets, "images_first_bfd").tolist() == [2, 0, 1]


def test_items_over_the_patch_budget_are_named():
    with pytest.raises(ValueError, match=r"item 1 \(length 2, 0 images, 900 patches\) .*patch"):
        pack([3, 2], max_length=10, strategy="bfd", patch_counts=[100, 900], max_patches=800)
    with pytest.raises(ValueError, match="negative patch count"):
        pack([3, 2], max_length=10, strategy="bfd", patch_counts=[1, -1], max_patches=800)
    with pytest.raises(ValueError, match="2 lengths but 1 patch counts"):
        pack([3, 2], max_length=10, strategy="bfd", patch_counts=[1], max_patches=800)


def test_the_patch_engine_with_no_patches_gives_todays_packs():
    # the engine that scans every budget, fed zero patches, places as the fast engines do
    rng = np.random.default_rng(1)
    for _ in range(50):
        lengths, images = rng.integers(1, 40, 200), rng.integers(0, 3, 200)
        for strategy in STRATEGIES:
            today = pack(
                lengths, max_length=40, strategy=strategy, image_counts=images, max_images=4
            )
            assert (
                pack(
                    lengths,
                    max_length=40,
                    strategy=strategy,
                    image_counts=images,
                    max_images=4,
                    patch_counts=[0] * 200,
                    max_patches=100,
                )
                == today
            )


three_budgets = st.integers(min_value=1, max_value=64).flatmap(
    lambda max_length: st.tuples(
        st.just(max_length),
        st.lists(
            st.tuples(st.integers(1, max_length), st.integers(0, 3), st.integers(0, 40)),
            max_size=120,
        ),
        st.integers(3, 8),
        st.integers(40, 120),
    )
)


def unzip(triples):
    return tuple(list(column) for column in zip(*triples)) if triples else ([], [], [])


@settings(max_examples=150, deadline=None)
@given(three_budgets, st.sampled_from(STRATEGIES))
def test_packs_respect_every_budget_whatever_the_input(case, strategy):
    max_length, triples, max_images, max_patches = case
    lengths, images, patches = unzip(triples)
    packs = pack(
        lengths,
        max_length=max_length,
        strategy=strategy,
        image_counts=images,
        max_images=max_images,
        patch_counts=patches,
        max_patches=max_patches,
    )
    assert sorted(i for p in packs for i in p) == list(range(len(lengths)))  # every item once
    assert all(p for p in packs)
    for sizes, budget in ((lengths, max_length), (images, max_images), (patches, max_patches)):
        assert all(sum(sizes[i] for i in p) <= budget for p in packs)
    assert (
        pack(
            lengths,
            max_length=max_length,
            strategy=strategy,
            image_counts=images,
            max_images=max_images,
            patch_counts=patches,
            max_patches=max_patches,
        )
        == packs
    )


def assert_patch_engine_matches_the_readable_loops(
    lengths, max_length, images, max_images, patches, max_patches
):
    flags = {
        "max_length": max_length,
        "image_counts": images,
        "max_images": max_images,
        "patch_counts": patches,
        "max_patches": max_patches,
    }
    budgets = Budgets(max_length, max_images, max_patches)
    for strategy in FIT_DECREASING:
        assert pack(lengths, strategy=strategy, **flags) == fit_decreasing(
            lengths, budgets, images, patches, strategy=strategy
        )
    assert pack(lengths, strategy="balanced_greedy", **flags) == balanced_greedy(
        lengths, budgets, images, patches
    )


@settings(max_examples=100, deadline=None)
@given(three_budgets)
def test_patch_engine_matches_the_readable_reference(case):
    max_length, triples, max_images, max_patches = case
    lengths, images, patches = unzip(triples)
    assert_patch_engine_matches_the_readable_loops(
        lengths, max_length, images, max_images, patches, max_patches
    )


# A few kinds of items, many of each (runs placed at once); sometimes no image or patch budget.
few_kinds_with_patches = st.tuples(
    st.integers(12, 40),
    st.lists(
        st.tuples(st.integers(1, 12), st.integers(0, 3), st.integers(0, 30)), min_size=1, max_size=4
    ),
    st.lists(st.integers(0, 3), max_size=300),
    st.one_of(st.none(), st.integers(3, 8)),
    st.one_of(st.none(), st.integers(30, 90)),
)


@settings(max_examples=100, deadline=None)
@given(few_kinds_with_patches)
def test_patch_engine_matches_the_readable_reference_on_long_runs(case):
    max_length, kinds, picks, max_images, max_patches = case
    lengths, images, patches = unzip([kinds[k % len(kinds)] for k in picks])
    assert_patch_engine_matches_the_readable_loops(
        lengths, max_length, images, max_images, patches, max_patches
    )
