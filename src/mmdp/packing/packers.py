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
the same three units (mmdp.packing.weights). Every strategy honours every budget given. An item that cannot fit even alone raises ValueError
naming it: callers filter (and count) such items first.

Example: lengths [3, 6, 2, 5], max_length 8

    >>> pack([3, 6, 2, 5], 8, "greedy")  # next fit, the blog's greedy: loads 3, 8, 5
    [[0], [1, 2], [3]]
    >>> pack([3, 6, 2, 5], 8, "binpack")  # first-fit decreasing (FFD): loads 8, 8
    [[1, 2], [3, 0]]
    >>> pack([3, 6, 2, 5], 8, "bfd")  # best-fit decreasing: loads 8, 8
    [[1, 2], [3, 0]]

And with a patch budget: three samples of 3 tokens and one image each, of 400, 300 and 500
patches, at most 800 patches a pack. binpack places the most patches first: 500 opens pack A;
400 does not fit A (900 > 800), it opens B; 300 fits A (800):

    >>> pack([3, 3, 3], 10, "binpack", [1, 1, 1], 3, patch_counts=[400, 300, 500], max_patches=800)
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
  (nanoVLM's `_balanced_greedy_knapsack`); see `reference_balanced_greedy`.

This file holds the readable part: `pack`, `pack_flat`, the checks, and the item-by-item loops in
the blog's words (`pack_greedy`, `reference_fit_decreasing`, `reference_balanced_greedy`). The
fast engines, which give identical packs (the tests compare them on thousands of random inputs),
are in the private mmdp.packing._engines: with tokens and images, a buffer of 4,096
cauldron-like items packs in a few ms and a million items of 1 to 32,768 tokens in about a
second; with a patch budget, a vectorised scan of the open packs takes tens of ms per buffer.
"""

from typing import Literal

import numpy as np

from mmdp.packing import _engines, _scan
from mmdp.packing.weights import Budgets, Weights

Strategy = Literal["greedy", "binpack", "bfd", "images_first_bfd", "balanced_greedy"]
STRATEGIES = ("greedy", "binpack", "bfd", "images_first_bfd", "balanced_greedy")
FIT_DECREASING = ("binpack", "bfd", "images_first_bfd")  # sort the items, then first/best fit

# The blog's `delta`: how many packs balanced_greedy opens beyond the lower bound.
BALANCED_GREEDY_EXTRA_PACKS = 5


def pack(
    lengths,
    max_length: int,
    strategy: Strategy = "binpack",
    image_counts=None,
    max_images: int | None = None,
    patch_counts=None,
    max_patches: int | None = None,
) -> list[list[int]]:
    """Pack items into packs; returns a list of packs, each a list of indices into `lengths`.

    `lengths`: positive integer weights (tokens per sample). `image_counts` (optional): images
    per sample, at most `max_images` per pack; `patch_counts` (optional): vision-encoder patches
    per sample, under the patch budget. A budget left out (None) never binds. Packs come
    in the order they were opened; within a pack, items come in the order they were placed. Same
    input, same output. Without patch counts the fast engines run (a few ms per 4,096 items);
    with them, an engine that scans the open packs in every budget (tens of ms).
    """
    items, starts = pack_flat(
        lengths, max_length, strategy, image_counts, max_images, patch_counts, max_patches
    )
    return [items[a:b].tolist() for a, b in zip(starts[:-1].tolist(), starts[1:].tolist())]


def pack_flat(
    lengths,
    max_length: int,
    strategy: Strategy = "binpack",
    image_counts=None,
    max_images: int | None = None,
    patch_counts=None,
    max_patches: int | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """`pack` as two flat arrays, for callers that plan millions of items
    (mmdp.planning.planner).

    Returns (items, starts): pack p holds items[starts[p] : starts[p + 1]], and
    len(starts) == packs + 1.

    >>> items, starts = pack_flat([3, 6, 2, 5], 8, "binpack")
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
    """Check the strategy and the items, then call the engine that fits the budgets."""
    if strategy not in STRATEGIES:
        raise ValueError(
            f"unknown packing strategy {strategy!r}; choose one of {', '.join(STRATEGIES)}"
        )
    items, budgets = check_items(lengths, budgets, image_counts, patch_counts)
    if len(items) == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(1, dtype=np.int64)
    if strategy == "greedy":
        return _engines.next_fit(
            items.lengths, items.image_counts, items.patch_counts, budgets.per_unit()
        )
    if patch_counts is None:
        return pack_tokens_and_images(items, budgets, strategy)
    return pack_every_budget(items, budgets, strategy)


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


# The readable loops, item by item, as the blog writes them -------------------------------------


def fits(load, size, budgets: Budgets) -> bool:
    """Whether an item of `size` fits beside a pack's `load`, in every budget (each a tuple in
    Weights.sizes()'s order: tokens, images, patches).

    >>> fits((5, 1, 0), (3, 1, 0), Budgets(8, 2, 0)), fits((5, 1, 0), (3, 2, 0), Budgets(8, 2, 0))
    (True, False)
    """
    return all(held + more <= most for held, more, most in zip(load, size, budgets.per_unit()))


def add(load, size) -> tuple:
    """A pack's load with one more item, in every unit."""
    return tuple(held + more for held, more in zip(load, size))


EMPTY = (0, 0, 0)  # an empty pack's load: no tokens, no images, no patches


def pack_greedy(lengths, budgets: Budgets, image_counts=None, patch_counts=None) -> list[list[int]]:
    """Next fit, the blog's greedy: walk in order, start a new pack when an item does not fit.

    `pack` gives the same packs a pack at a time rather than an item at a time
    (mmdp.packing._engines.next_fit).

    >>> pack_greedy([3, 6, 2, 5], Budgets(8))
    [[0], [1, 2], [3]]
    """
    items, budgets = check_items(lengths, budgets, image_counts, patch_counts)
    packs, current, load = [], [], EMPTY  # load: what the current pack holds
    for i, size in enumerate(items.sizes()):
        if current and not fits(load, size, budgets):
            packs.append(current)
            current, load = [], EMPTY
        current.append(i)
        load = add(load, size)
    if current:
        packs.append(current)
    return packs


def reference_fit_decreasing(
    lengths,
    budgets: Budgets,
    image_counts=None,
    patch_counts=None,
    *,
    strategy: Strategy = "binpack",
) -> list[list[int]]:
    """binpack, bfd or images_first_bfd one item at a time (the blog's binpack loop).

    1. Sort the items (`decreasing_order`). 2. For each item, list the packs with room for it in
    every budget; binpack takes the first, bfd the one with the least token room left,
    images_first_bfd for a sample with images the least token room then the most image slots,
    for a text-only one the fewest image slots then the least token room (ties: the lowest
    number). 3. Open a new pack when none has room.
    O(n * packs): fine for a toy, far too slow for an epoch (see bench/bench_packing.py); `pack`
    gives the same packs fast (mmdp.packing._engines).
    """
    if strategy not in FIT_DECREASING:
        raise ValueError(f"{strategy!r} is not a fit-decreasing strategy: {FIT_DECREASING}")
    items, budgets = check_items(lengths, budgets, image_counts, patch_counts)
    sizes = list(items.sizes())
    packs, room = [], []  # what each pack has left: (tokens, images, patches)
    for i in decreasing_order(items, budgets, strategy).tolist():
        size = sizes[i]
        fitting = [p for p in range(len(packs)) if all(r >= s for r, s in zip(room[p], size))]
        if strategy == "bfd":  # the least token room
            fitting.sort(key=lambda p: room[p][0])
        elif strategy == "images_first_bfd" and size[1]:  # then the most image slots
            fitting.sort(key=lambda p: (room[p][0], -room[p][1]))
        elif strategy == "images_first_bfd":  # text-only: the fewest image slots, then tokens
            fitting.sort(key=lambda p: (room[p][1], room[p][0]))
        if fitting:
            chosen = fitting[0]
        else:
            packs.append([])
            room.append(budgets.per_unit())
            chosen = len(packs) - 1
        packs[chosen].append(i)
        room[chosen] = tuple(r - s for r, s in zip(room[chosen], size))
    return packs


def reference_balanced_greedy(
    lengths, budgets: Budgets, image_counts=None, patch_counts=None
) -> list[list[int]]:
    """The blog's balanced greedy knapsack (after Eagle 2), item by item as the blog's code does.

    1. Open ceil(total length / max_length) + BALANCED_GREEDY_EXTRA_PACKS empty packs.
    2. Take the items longest first (ties: lowest index); sort the packs by load (fewest tokens
       first, ties: lowest number) and put the item into the first that fits every budget.
    3. Open a new pack when none fits. At the end, drop the packs left empty.
    Spreading the items keeps the packs' loads even (the "balanced"), at the price of more packs
    than binpack or bfd (bench/bench_packing.py). O(n * P log P); `pack` gives the same packs
    in O(n log P) (mmdp.packing._engines.pack_balanced_greedy).
    """
    items, budgets = check_items(lengths, budgets, image_counts, patch_counts)
    if len(items) == 0:
        return []
    sizes, count = list(items.sizes()), balanced_greedy_packs(items, budgets)
    packs, load = [[] for _ in range(count)], [EMPTY] * count  # load: (tokens, images, patches)
    for i in np.lexsort((np.arange(len(items.lengths)), -items.lengths)).tolist():
        size = sizes[i]
        for chosen in sorted(range(len(packs)), key=lambda p: load[p][0]):  # fewest tokens first
            if fits(load[chosen], size, budgets):
                break
        else:
            packs.append([])
            load.append(EMPTY)
            chosen = len(packs) - 1
        packs[chosen].append(i)
        load[chosen] = add(load[chosen], size)
    return [p for p in packs if p]


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


def balanced_greedy_packs(items: Weights, budgets: Budgets) -> int:
    """How many empty packs balanced_greedy opens: the lower bound, plus the blog's delta."""
    return lower_bound(items.lengths, budgets.max_length) + BALANCED_GREEDY_EXTRA_PACKS


def pack_loads(packs, lengths) -> np.ndarray:
    """Total length of each pack."""
    lengths = np.asarray(lengths)
    return np.array([int(lengths[p].sum()) for p in packs], dtype=np.int64)


def flatten(packs: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    """Lists of item indices -> (items, starts), as pack_flat returns them."""
    sizes = np.array([len(p) for p in packs], dtype=np.int64)
    items = np.fromiter((i for p in packs for i in p), dtype=np.int64, count=int(sizes.sum()))
    return items, np.r_[0, np.cumsum(sizes)]


def pack_tokens_and_images(
    items: Weights, budgets: Budgets, strategy: Strategy
) -> tuple[np.ndarray, np.ndarray]:
    """Tokens and images: the fast engines (mmdp.packing._engines)."""
    lengths, images = items.lengths, items.image_counts
    if strategy == "balanced_greedy":
        opened = balanced_greedy_packs(items, budgets)
        return _engines.pack_balanced_greedy(
            lengths, images, budgets.max_length, budgets.max_images, opened
        )
    order = decreasing_order(items, budgets, strategy)
    return _engines.pack_fit_decreasing(
        lengths, images, order, budgets.max_length, budgets.max_images, strategy
    )


def pack_every_budget(
    items: Weights, budgets: Budgets, strategy: Strategy
) -> tuple[np.ndarray, np.ndarray]:
    """A patch budget too: the engine that scans the open packs in every budget."""
    sizes = np.stack([items.lengths, items.image_counts, items.patch_counts])
    if strategy == "balanced_greedy":
        opened = balanced_greedy_packs(items, budgets)
        return _scan.scan_balanced_greedy(sizes, budgets.per_unit(), opened)
    order = decreasing_order(items, budgets, strategy)
    return _scan.scan_fit_decreasing(sizes, budgets.per_unit(), order, strategy)
