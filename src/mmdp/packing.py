"""Packing as a knapsack problem: put items (samples) into packs under a token budget.

Everything here is pure: lengths (and image counts) in, packs out, as lists of indices into
`lengths`. The thread/queue plumbing that streams packs lives elsewhere (mmdp.background,
mmdp.toy, mmdp.packed_dataset) and calls `pack`.

The budgets: a pack holds at most `max_length` tokens (the token budget: the blog's `max_length`
in stage 4, its `seq_length` in stage 5) and, when image counts are given, at most `max_images`
images (the image budget: the blog's "image limit").

Example: lengths [3, 6, 2, 5], max_length 8

    greedy  (next fit, the blog's greedy)                 [[0], [1, 2], [3]]   loads 3, 8, 5
    binpack (first-fit decreasing, FFD: the blog's binpack) [[1, 2], [3, 0]]   loads 8, 8
    bfd     (best-fit decreasing)                         [[1, 2], [3, 0]]     loads 8, 8

Strategies:
- "greedy": walk the items in order; start a new pack when the next item does not fit.
- "binpack": first-fit decreasing. 1. sort items longest first; 2. put each into the FIRST pack
  it fits in; 3. open a new pack when none fits.
- "bfd": best-fit decreasing: as binpack, but put each item into the pack it fits TIGHTEST
  (least room left).
- "images_first_bfd": mmdp's multimodal knapsack (stage 5's default), a best-fit decreasing that
  weighs both budgets.
  1. Place the samples with images first, largest share of both budgets first
     (length/max_length + images/max_images); each goes to the pack it fits tightest in tokens,
     ties to the pack with the fewest images.
  2. Then the text-only samples, longest first; each goes to the pack with the fewest image slots
     left, ties to the tightest: text-only samples fill the token room of packs whose images are
     used up, the one room no image sample can use.
  Why: sorted by length alone (binpack, bfd), the long image-heavy samples land together, and
  those packs hit the image budget with token room left; on a cauldron-like mix that costs ~5%
  more packs (bench/bench_packing.py). images_first_bfd needs about as few packs as bfd with no
  image budget.
- "balanced_greedy": the blog's own stage-5 packer, the balanced greedy knapsack of Eagle 2
  (nanoVLM's `_balanced_greedy_knapsack`); see `pack_balanced_greedy`.

Every pack respects `max_length` (sum of lengths) and, when `image_counts` and `max_images` are
given, `max_images` (sum of image counts); every strategy honours both. An item that cannot fit
even alone raises ValueError naming it: callers filter (and count) such items first.

binpack, bfd and images_first_bfd run in O(n log n + G * P) with numpy, where G is the number of
distinct (length, image count) pairs and P the number of packs still open: instead of placing
items one by one, a run of identical items is placed at once, since first fit (and best fit)
keeps filling the same pack with identical items until it is full. `reference_fit_decreasing` is
the readable, item-by-item version (the blog's loop); tests check that both give identical packs.
"""

from typing import Literal

import numpy as np

Strategy = Literal["greedy", "binpack", "bfd", "images_first_bfd", "balanced_greedy"]
STRATEGIES = ("greedy", "binpack", "bfd", "images_first_bfd", "balanced_greedy")

# The blog's `delta`: how many packs balanced_greedy opens beyond the lower bound.
BALANCED_GREEDY_EXTRA_PACKS = 5


def pack(
    lengths,
    max_length: int,
    strategy: Strategy = "binpack",
    image_counts=None,
    max_images: int | None = None,
) -> list[list[int]]:
    """Pack items into packs; returns a list of packs, each a list of indices into `lengths`.

    `lengths`: positive integer weights (tokens per sample). `image_counts` (optional): images per
    sample, bounded per pack by `max_images`. Packs come in the order they were opened; within a
    pack, items come in the order they were placed. Same input, same output.
    """
    items, starts = pack_flat(lengths, max_length, strategy, image_counts, max_images)
    return [items[a:b].tolist() for a, b in zip(starts[:-1].tolist(), starts[1:].tolist())]


def pack_flat(
    lengths,
    max_length: int,
    strategy: Strategy = "binpack",
    image_counts=None,
    max_images: int | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """`pack` as two flat arrays, for callers that plan millions of items (mmdp.planner).

    Returns (items, starts): pack p holds items[starts[p] : starts[p + 1]], and
    len(starts) == packs + 1. Example: lengths [3, 6, 2, 5], max_length 8, binpack ->
    items [1, 2, 3, 0], starts [0, 2, 4].
    """
    lengths, images, max_images = check_items(lengths, max_length, image_counts, max_images)
    if strategy == "greedy":
        return flatten(pack_greedy(lengths, max_length, images, max_images))
    if strategy == "binpack":
        return pack_fit_decreasing(lengths, max_length, images, max_images, fit="first")
    if strategy == "bfd":
        return pack_fit_decreasing(lengths, max_length, images, max_images, fit="best")
    if strategy == "images_first_bfd":
        return pack_fit_decreasing(lengths, max_length, images, max_images, fit="images_first")
    if strategy == "balanced_greedy":
        return flatten(pack_balanced_greedy(lengths, max_length, images, max_images))
    raise ValueError(
        f"unknown packing strategy {strategy!r}; choose one of {', '.join(STRATEGIES)}"
    )


def flatten(packs: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    """Lists of item indices -> (items, starts), as pack_flat returns them."""
    sizes = np.array([len(p) for p in packs], dtype=np.int64)
    items = np.fromiter((i for p in packs for i in p), dtype=np.int64, count=int(sizes.sum()))
    return items, np.r_[0, np.cumsum(sizes)]


def check_items(lengths, max_length, image_counts, max_images):
    """Validate the items; returns (lengths, images, max_images) as int64 arrays / int."""
    lengths = np.asarray(lengths, dtype=np.int64).reshape(-1)
    if max_length < 1:
        raise ValueError(f"max_length (the token budget) must be positive, got {max_length}")
    images = (
        np.zeros_like(lengths)
        if image_counts is None
        else np.asarray(image_counts, dtype=np.int64).reshape(-1)
    )
    if len(images) != len(lengths):
        raise ValueError(f"{len(lengths)} lengths but {len(images)} image counts")
    if max_images is None:
        max_images = int(images.sum())  # no image budget: never binding
    problems = [
        (lengths < 1, "has a non-positive length"),
        (lengths > max_length, f"is longer than the token budget (max_length {max_length})"),
        (images < 0, "has a negative image count"),
        (images > max_images, f"has more images than the image budget (max_images {max_images})"),
    ]
    for bad, what in problems:
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise ValueError(
                f"item {i} (length {lengths[i]}, {images[i]} images) {what}; "
                f"{int(bad.sum())} item(s) like it: filter them out (and count them) before packing"
            )
    return lengths, images, int(max_images)


FITS = ("first", "best", "images_first")  # the rules of binpack, bfd and images_first_bfd


def check_fit(fit: str) -> None:
    """An unknown rule must fail loudly, not fall back to first fit."""
    if fit not in FITS:
        raise ValueError(f"unknown fit rule {fit!r}; choose one of {', '.join(FITS)}")


def pack_greedy(lengths, max_length, images, max_images) -> list[list[int]]:
    """Next fit, the blog's greedy: walk in order, start a new pack when an item does not fit."""
    packs, current, load, load_images = [], [], 0, 0
    for i, (length, count) in enumerate(zip(lengths.tolist(), images.tolist())):
        if current and (load + length > max_length or load_images + count > max_images):
            packs.append(current)
            current, load, load_images = [], 0, 0
        current.append(i)
        load += length
        load_images += count
    if current:
        packs.append(current)
    return packs


def pack_balanced_greedy(lengths, max_length, images, max_images) -> list[list[int]]:
    """The blog's balanced greedy knapsack (after Eagle 2), item by item as the blog's code does it.

    1. Open ceil(total length / max_length) + BALANCED_GREEDY_EXTRA_PACKS empty packs.
    2. Take the items longest first (ties: lowest index); put each into the LEAST loaded pack
       (fewest tokens, ties: lowest number) that fits it under both budgets.
    3. Open a new pack when none fits. At the end, drop the packs left empty.
    Spreading the items keeps the packs' loads even (the "balanced"), at the price of more packs
    than binpack or bfd (bench/bench_packing.py). O(n * P log P): fine for a buffer of a few
    thousand items.
    """
    if len(lengths) == 0:
        return []
    count = lower_bound(lengths, max_length) + BALANCED_GREEDY_EXTRA_PACKS
    packs = [[] for _ in range(count)]
    load, load_images = [0] * count, [0] * count
    for i in np.lexsort((np.arange(len(lengths)), -lengths)).tolist():
        length, count = int(lengths[i]), int(images[i])
        for chosen in sorted(range(len(packs)), key=load.__getitem__):
            if load[chosen] + length <= max_length and load_images[chosen] + count <= max_images:
                break
        else:
            packs.append([])
            load.append(0)
            load_images.append(0)
            chosen = len(packs) - 1
        packs[chosen].append(i)
        load[chosen] += length
        load_images[chosen] += count
    return [items for items in packs if items]


def decreasing_order(lengths, images, max_length=1, max_images=0, by="length") -> np.ndarray:
    """The order fit-decreasing packers place items in; ties by index, so it is deterministic.

    by="length": longest first (then most images first): the classic binpack (FFD) / bfd order.
    by="size": samples with images before text-only ones; within each, the largest share of BOTH
    budgets first, length/max_length + images/max_images (computed in integers as
    length * max_images + images * max_length): the images_first_bfd order.
    """
    index = np.arange(len(lengths))
    if by == "length":
        return np.lexsort((index, -images, -lengths))
    size = lengths * max_images + images * max_length
    return np.lexsort((index, -images, -lengths, -size, images == 0))


def pack_fit_decreasing(lengths, max_length, images, max_images, fit: str):
    """First fit / best fit decreasing, placing each run of identical items at once.

    fit="first": the lowest-numbered pack with room; fit="best": the pack with the least token
    room left that still fits (ties: lowest number); fit="images_first": for a sample with
    images as best, ties to the most image room left; for a text-only sample the least image
    room left, ties to the least token room (see the module docstring). Returns (items, starts)
    as pack_flat does.
    Whatever the rule, a pack that takes one of a run of identical items stays the pack the rule
    picks for the next one until it is full (its room only shrinks), which is what lets a whole
    run be placed at once.
    """
    check_fit(fit)
    n = len(lengths)
    if n == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(1, dtype=np.int64)
    by = "size" if fit == "images_first" else "length"
    order = decreasing_order(lengths, images, max_length, max_images, by)
    sorted_lengths, sorted_images = lengths[order], images[order]
    # the shortest item still to come, after each position (to close packs that can take none)
    shortest_after = np.minimum.accumulate(sorted_lengths[::-1])[::-1]
    pack_of = np.empty(n, dtype=np.int64)  # pack number of each item, in sorted order

    # The packs that may still take an item: their number and room left (tokens, images).
    open_ids = np.empty(0, dtype=np.int64)
    open_room = np.empty(0, dtype=np.int64)
    open_image_room = np.empty(0, dtype=np.int64)
    num_packs = 0

    # Runs of identical (length, image count) items.
    run_starts = np.flatnonzero(
        np.r_[True, (np.diff(sorted_lengths) != 0) | (np.diff(sorted_images) != 0)]
    )
    run_ends = np.r_[run_starts[1:], n]
    for start, end in zip(run_starts.tolist(), run_ends.tolist()):
        length, count, todo = int(sorted_lengths[start]), int(sorted_images[start]), end - start

        # 1. Which open packs fit one more item, in the order the strategy tries them.
        fits = open_room >= length
        if count:
            fits &= open_image_room >= count
        candidates = np.flatnonzero(fits)  # lowest pack number first: first fit
        if fit == "best":
            candidates = candidates[np.argsort(open_room[candidates], kind="stable")]
        elif fit == "images_first":  # np.lexsort sorts by its LAST key first
            if count:
                keys = (candidates, -open_image_room[candidates], open_room[candidates])
            else:
                keys = (candidates, open_room[candidates], open_image_room[candidates])
            candidates = candidates[np.lexsort(keys)]

        # 2. Each of them takes as many of the identical items as fit, in that order: after one
        #    item it is still the first (or the tightest) pack that fits, until it is full.
        takes = open_room[candidates] // length
        if count:
            takes = np.minimum(takes, open_image_room[candidates] // count)
        taken_before = np.cumsum(takes) - takes
        takes = np.clip(todo - taken_before, 0, takes)
        used = takes > 0
        candidates, takes = candidates[used], takes[used]
        placed = int(takes.sum())
        pack_of[start : start + placed] = np.repeat(open_ids[candidates], takes)
        open_room[candidates] -= takes * length
        open_image_room[candidates] -= takes * count

        # 3. The rest open new packs, each filled with as many identical items as fit.
        left = todo - placed
        if left:
            per_pack = max_length // length
            if count:
                per_pack = min(per_pack, max_images // count)
            new = -(-left // per_pack)
            new_takes = np.full(new, per_pack, dtype=np.int64)
            new_takes[-1] = left - per_pack * (new - 1)
            new_ids = np.arange(num_packs, num_packs + new)
            pack_of[start + placed : end] = np.repeat(new_ids, new_takes)
            open_ids = np.r_[open_ids, new_ids]
            open_room = np.r_[open_room, max_length - new_takes * length]
            open_image_room = np.r_[open_image_room, max_images - new_takes * count]
            num_packs += new

        # Forget packs that no remaining item can fit into.
        if end < n:
            still_open = open_room >= shortest_after[end]
            if not still_open.all():
                open_ids = open_ids[still_open]
                open_room = open_room[still_open]
                open_image_room = open_image_room[still_open]

    # Group the items by pack, keeping the order they were placed in: (items, starts).
    by_pack = np.argsort(pack_of, kind="stable")
    return order[by_pack], np.r_[0, np.cumsum(np.bincount(pack_of, minlength=num_packs))]


def reference_fit_decreasing(lengths, max_length, image_counts=None, max_images=None, fit="first"):
    """The readable version, one item at a time (the blog's binpack loop), for reading and tests.

    O(n * packs): fine for a toy, far too slow for an epoch (see bench/bench_packing.py).
    """
    check_fit(fit)
    lengths, images, max_images = check_items(lengths, max_length, image_counts, max_images)
    by = "size" if fit == "images_first" else "length"
    packs, room, image_room = [], [], []
    for i in decreasing_order(lengths, images, max_length, max_images, by).tolist():
        length, count = int(lengths[i]), int(images[i])
        fitting = [p for p in range(len(packs)) if room[p] >= length and image_room[p] >= count]
        if fit == "best":
            fitting.sort(key=lambda p: room[p])
        elif fit == "images_first" and count:
            fitting.sort(key=lambda p: (room[p], -image_room[p]))
        elif fit == "images_first":
            fitting.sort(key=lambda p: (image_room[p], room[p]))
        if fitting:
            chosen = fitting[0]
        else:
            packs.append([])
            room.append(max_length)
            image_room.append(max_images)
            chosen = len(packs) - 1
        packs[chosen].append(i)
        room[chosen] -= length
        image_room[chosen] -= count
    return packs


def pack_loads(packs, lengths) -> np.ndarray:
    """Total length of each pack."""
    lengths = np.asarray(lengths)
    return np.array([int(lengths[p].sum()) for p in packs], dtype=np.int64)


def lower_bound(lengths, max_length: int) -> int:
    """No packing can use fewer packs than ceil(total length / max_length)."""
    return -(-int(np.sum(lengths)) // max_length)
