"""Packing as a knapsack problem: put items (samples) into packs under a token budget.

Everything here is pure: lengths (and image and patch counts) in, packs out, as lists of indices
into `lengths`. The thread/queue plumbing that streams packs lives elsewhere
(mmdp.loading.background, mmdp.loading.packed_dataset) and calls `pack`; stage 4's toy loops, as
the blog writes them, are mmdp.packing.knapsack.

The budgets, per pack:
- tokens: at most `max_length` (the blog's `max_length` in stage 4, its `seq_length` in stage 5);
- images: when image counts are given, at most `max_images` (the blog's "image limit");
- patches: when patch counts are given, at most that many vision-encoder patches (real
  vision-language models give each image its own number of patches: a sample's patch count is
  the sum over its images).
Past `pack` and `pack_flat`, the three are one value, a `Budgets`, against each item's size in
the same three units (mmdp.packing.weights). Every strategy honours every budget given. An item
that cannot fit even alone raises ValueError naming it: callers filter (and count) such items
first.

Example: lengths [3, 6, 2, 5], max_length 8

    >>> pack([3, 6, 2, 5], max_length=8, strategy="greedy")  # next fit: loads 3, 8, 5
    [[0], [1, 2], [3]]
    >>> pack([3, 6, 2, 5], max_length=8, strategy="binpack")  # first-fit decreasing: loads 8, 8
    [[1, 2], [3, 0]]
    >>> pack([3, 6, 2, 5], max_length=8, strategy="bfd")  # best-fit decreasing: loads 8, 8
    [[1, 2], [3, 0]]

And with a patch budget: three samples of 3 tokens and one image each, of 400, 300 and 500
patches, at most 800 patches a pack. binpack places the most patches first: 500 opens pack A;
400 does not fit A (900 > 800), it opens B; 300 fits A (800):

    >>> pack([3, 3, 3], max_length=10, image_counts=[1, 1, 1], max_images=3,
    ...      patch_counts=[400, 300, 500], max_patches=800)
    [[2, 1], [0]]

Strategies:
- "greedy": walk the items in order; start a new pack when the next item does not fit.
- "binpack": first-fit decreasing. 1. sort items longest first; 2. put each into the FIRST pack
  it fits in; 3. open a new pack when none fits.
- "bfd": best-fit decreasing: as binpack, but put each item into the pack it fits TIGHTEST
  (least token room left).
- "images_first_bfd": mmdp's multimodal knapsack (stage 5's default), a best-fit decreasing that
  weighs the budgets together.
  1. Place the samples with images first, largest share of the budgets first
     (length/max_length + images/max_images, + patches over the patch budget if any); each
     goes to the pack it fits tightest in tokens, ties to the pack with the most image slots.
  2. Then the text-only samples, longest first; each goes to the pack with the fewest image slots
     left, ties to the tightest: text-only samples fill the token room of packs whose images are
     used up, the one room no image sample can use.
  Why: sorted by length alone (binpack, bfd), the long image-heavy samples land together, and
  those packs hit the image budget with token room left; on a cauldron-like mix that costs ~5%
  more packs (bench/bench_packing.py). images_first_bfd needs about as few packs as bfd with no
  image budget.
- "balanced_greedy": the blog's own stage-5 packer, the balanced greedy knapsack of Eagle 2
  (nanoVLM's `_balanced_greedy_knapsack`). 1. Open ceil(total length / max_length) +
  BALANCED_GREEDY_EXTRA_PACKS empty packs. 2. Take the items longest first; put each into the
  least loaded pack (fewest tokens) that fits every budget. 3. Open a new pack when none fits; at
  the end, drop the packs left empty. The loads stay even (the "balanced"), at the price of more
  packs than binpack or bfd.
Ties go to the lowest index, or the lowest-numbered pack: the same input gives the same packs.

This file holds the strategies' rules, the checks and the order items are placed in; the engines
that place them, at scale, are private (mmdp.packing._engines, _best_fit, _placements; their
docstring gives their speed). tests/packing_oracles.py places the items one at a time, as the
rules above say, and the tests hold the engines to it on thousands of random inputs.
"""

from typing import Literal, get_args

import numpy as np

from mmdp.packing import _engines
from mmdp.packing._placements import FIT_DECREASING  # noqa: F401 (public: the strategies that sort)
from mmdp.packing.weights import Budgets, Weights

Strategy = Literal["greedy", "binpack", "bfd", "images_first_bfd", "balanced_greedy"]
STRATEGIES = get_args(Strategy)

# The blog's `delta`: how many packs balanced_greedy opens beyond the lower bound.
BALANCED_GREEDY_EXTRA_PACKS = 5


def pack(
    lengths,
    *,
    max_length: int,
    strategy: Strategy = "binpack",
    image_counts=None,
    max_images: int | None = None,
    patch_counts=None,
    max_patches: int | None = None,
) -> list[list[int]]:
    """Pack items into packs; returns a list of packs, each a list of indices into `lengths`.

    Args:
        lengths: positive integer weights (tokens per sample).
        max_length: the token budget of a pack.
        strategy: one of STRATEGIES (the module docstring tells each).
        image_counts, max_images: images per sample, and at most that many per pack.
        patch_counts, max_patches: vision-encoder patches per sample, and at most that many per
            pack.

    A budget left out (None) never binds. Packs come in the order they were opened; within a
    pack, items come in the order they were placed.
    """
    items, starts = pack_checked(
        lengths, Budgets(max_length, max_images, max_patches), strategy, image_counts, patch_counts
    )
    return [items[a:b].tolist() for a, b in zip(starts[:-1].tolist(), starts[1:].tolist())]


def pack_flat(
    lengths,
    *,
    max_length: int,
    strategy: Strategy = "binpack",
    image_counts=None,
    max_images: int | None = None,
    patch_counts=None,
    max_patches: int | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """`pack` as two flat arrays, for callers that pack millions of items.

    Returns (items, starts): pack p holds items[starts[p] : starts[p + 1]], and
    len(starts) == packs + 1.

    >>> items, starts = pack_flat([3, 6, 2, 5], max_length=8, strategy="binpack")
    >>> items.tolist(), starts.tolist()
    ([1, 2, 3, 0], [0, 2, 4])
    """
    budgets = Budgets(max_length, max_images, max_patches)
    return pack_checked(lengths, budgets, strategy, image_counts, patch_counts)


def pack_weights(
    weights: Weights, budgets: Budgets, strategy: Strategy = "binpack"
) -> tuple[np.ndarray, np.ndarray]:
    """`pack_flat` of rows' weights under a config's budgets, each passed whole (the planner
    packs each buffer this way); the rows' patches count only under a patch budget.

    >>> items, starts = pack_weights(Weights.from_lists([3, 6, 2, 5], [0, 0, 0, 0]), Budgets(8))
    >>> items.tolist(), starts.tolist()
    ([1, 2, 3, 0], [0, 2, 4])
    """
    patches = weights.patch_counts if budgets.max_patches is not None else None
    return pack_checked(weights.lengths, budgets, strategy, weights.image_counts, patches)


def pack_checked(
    lengths, budgets: Budgets, strategy: Strategy, image_counts=None, patch_counts=None
) -> tuple[np.ndarray, np.ndarray]:
    """Check the strategy and the items, then call the engine for the strategy and the budgets:
    tokens and images, or a patch budget too (mmdp.packing._engines)."""
    if strategy not in STRATEGIES:
        raise ValueError(
            f"unknown packing strategy {strategy!r}; choose one of {', '.join(STRATEGIES)}"
        )
    items, budgets = check_items(lengths, budgets, image_counts, patch_counts)
    if len(items) == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(1, dtype=np.int64)
    lengths, images, per_unit = items.lengths, items.image_counts, budgets.per_unit()
    if strategy == "greedy":
        return _engines.next_fit(lengths, images, items.patch_counts, per_unit)
    if strategy == "balanced_greedy":
        opened = lower_bound(lengths, budgets.max_length) + BALANCED_GREEDY_EXTRA_PACKS
        if patch_counts is None:
            return _engines.pack_balanced_greedy(
                lengths, images, budgets.max_length, budgets.max_images, opened
            )
        return _engines.scan_balanced_greedy(np.stack(items.columns()), per_unit, opened)
    order = decreasing_order(items, budgets, strategy)
    if patch_counts is None:
        return _engines.pack_fit_decreasing(
            lengths, images, order, budgets.max_length, budgets.max_images, strategy
        )
    return _engines.scan_fit_decreasing(np.stack(items.columns()), per_unit, order, strategy)


def check_items(
    lengths, budgets: Budgets, image_counts=None, patch_counts=None
) -> tuple[Weights, Budgets]:
    """Validate the items against every budget; an item over one, alone, is a ValueError.
    Returns the items' Weights (int64 arrays, zeros for counts not given) and the Budgets with
    every budget an int (a budget left out is the items' total: it never binds).

    >>> check_items([3, 9], Budgets(8))  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: item 1 (length 9, 0 images) is longer than the token budget (max_length 8); ...
    """
    lengths = np.asarray(lengths, dtype=np.int64).reshape(-1)
    if budgets.max_length < 1:
        raise ValueError(
            f"max_length (the token budget) must be positive, got {budgets.max_length}"
        )
    sizes = (
        lengths,
        per_item(image_counts, lengths, "image counts"),
        per_item(patch_counts, lengths, "patch counts"),
    )
    budgets = Budgets(
        *(int(size.sum()) if b is None else int(b) for size, b in zip(sizes, budgets.per_unit()))
    )
    lengths, images, patches = sizes
    max_length, max_images, max_patches = budgets.per_unit()
    problems = [
        (lengths < 1, "has a non-positive length"),
        (lengths > max_length, f"is longer than the token budget (max_length {max_length})"),
        (images < 0, "has a negative image count"),
        (images > max_images, f"has more images than the image budget (max_images {max_images})"),
        (patches < 0, "has a negative patch count"),
        (
            patches > max_patches,
            f"has more patches than the patch budget (max_patches {max_patches})",
        ),
    ]
    for bad, what in problems:
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            item = f"item {i} (length {lengths[i]}, {images[i]} images"
            item += ")" if patch_counts is None else f", {patches[i]} patches)"
            raise ValueError(
                f"{item} {what}; {int(bad.sum())} item(s) like it: filter them out (and count "
                "them) before packing"
            )
    return Weights(lengths, images, patch_counts=patches), budgets


def per_item(counts, lengths, what: str) -> np.ndarray:
    """Image or patch counts as an int64 array, one per item (zeros when not given)."""
    if counts is None:
        return np.zeros_like(lengths)
    counts = np.asarray(counts, dtype=np.int64).reshape(-1)
    if len(counts) != len(lengths):
        raise ValueError(f"{len(lengths)} lengths but {len(counts)} {what}")
    return counts


def decreasing_order(
    items: Weights, budgets: Budgets, strategy: Strategy = "binpack"
) -> np.ndarray:
    """The order a fit-decreasing strategy places items in; ties by index, so it is deterministic.

    binpack, bfd: longest first (then most images, then most patches): the classic FFD / BFD
    order. images_first_bfd: samples with images before text-only ones; within each, the largest
    share of the budgets first, the sum over the units of size / budget (`budget_shares`), then
    the longest.

    >>> items, budgets = check_items([4, 6, 4], Budgets(10, max_images=2), [2, 0, 1])
    >>> decreasing_order(items, budgets, "binpack").tolist()
    [1, 0, 2]
    >>> decreasing_order(items, budgets, "images_first_bfd").tolist()
    [0, 2, 1]
    """
    if strategy != "images_first_bfd":
        return largest_first(items.lengths, items.image_counts, items.patch_counts)
    has_images = (items.image_counts > 0).astype(np.int64)
    return largest_first(has_images, budget_shares(items, budgets), items.lengths)


def largest_first(*columns: np.ndarray) -> np.ndarray:
    """Indices that sort non-negative columns largest first: by the first column, ties by the
    next, ..., full ties by index (a stable sort), so the order is deterministic.

    One stable argsort of a key that combines the columns, when it fits in int64: half the time
    of np.lexsort on a planner's buffer (the planner sorts thousands of them); else np.lexsort.

    >>> largest_first(np.array([4, 6, 4, 4]), np.array([1, 0, 2, 1])).tolist()
    [1, 2, 0, 3]
    """
    key, span = np.zeros_like(columns[0]), 1
    for column in columns:
        top = int(column.max(initial=0)) + 1
        span *= top
        if span >= 2**62:  # too large to combine
            # np.lexsort sorts by its LAST key first, and is stable
            return np.lexsort([-column for column in reversed(columns)])
        key = key * top + column
    return np.argsort(-key, kind="stable")


def budget_shares(items: Weights, budgets: Budgets) -> np.ndarray:
    """Each item's share of the budgets, length/L + images/I + patches/P, times L * I * P.

    In integers, so that equal shares tie exactly; a budget of 0 counts as 1 (every item has 0
    there). When the products could overflow int64 (huge budgets: a budget left out is the
    items' total), Python integers rank the shares instead.
    """
    columns = (items.lengths, items.image_counts, items.patch_counts)
    L, I, P = (max(b, 1) for b in budgets.per_unit())  # noqa: E741
    weights = (I * P, L * P, L * I)  # share * L * I * P = length * I * P + ...
    largest = sum(int(column.max(initial=0)) * w for column, w in zip(columns, weights))
    if largest < 2**63:
        return sum(column * w for column, w in zip(columns, weights))
    exact = [
        sum(n * w for n, w in zip(item, weights)) for item in zip(*(c.tolist() for c in columns))
    ]
    rank = {share: r for r, share in enumerate(sorted(set(exact)))}
    return np.array([rank[share] for share in exact], dtype=np.int64)


def lower_bound(lengths, max_length: int) -> int:
    """No packing can use fewer packs than ceil(total length / max_length)."""
    return -(-int(np.sum(lengths)) // max_length)
