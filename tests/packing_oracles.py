"""The packers' oracles: each strategy of mmdp.packing.packers, one item at a time, in plain Python.

Each loop places the items as the strategy's rule says (the packers' module docstring), looking
at every open pack for every item: O(n * packs), fine for a test, far too slow for an epoch. The
fast engines must give the very same packs (tests/test_packing.py, tests/test_packing_engines.py;
bench/bench_packing.py times them side by side). Nothing here calls the code under test but its
one constant, BALANCED_GREEDY_EXTRA_PACKS (read at each call: a test may change it).

Sizes are per item (tokens, images, patches); a budget left out (None) is the items' total in
that unit, so it never binds, as the packers take it.
"""

from fractions import Fraction

from mmdp.packing import packers
from mmdp.packing.weights import Budgets

FIT_DECREASING = ("binpack", "bfd", "images_first_bfd")


def sizes_and_room(lengths, budgets: Budgets, image_counts=None, patch_counts=None):
    """Each item's (tokens, images, patches), and what an empty pack holds in each unit."""
    columns = [[int(n) for n in lengths]]
    for counts in (image_counts, patch_counts):
        columns.append([0] * len(lengths) if counts is None else [int(n) for n in counts])
    empty = tuple(sum(c) if b is None else b for c, b in zip(columns, budgets.per_unit()))
    return list(zip(*columns)), empty


def fits(room, size) -> bool:
    return all(left >= needed for left, needed in zip(room, size))


def less(room, size) -> tuple:
    return tuple(left - needed for left, needed in zip(room, size))


def greedy(lengths, budgets: Budgets, image_counts=None, patch_counts=None) -> list[list[int]]:
    """Next fit: walk the items in order, start a new pack when one does not fit.

    >>> greedy([3, 6, 2, 5], Budgets(8))
    [[0], [1, 2], [3]]
    """
    sizes, empty = sizes_and_room(lengths, budgets, image_counts, patch_counts)
    packs, room = [], empty
    for i, size in enumerate(sizes):
        if not packs or not fits(room, size):
            packs.append([])
            room = empty
        packs[-1].append(i)
        room = less(room, size)
    return packs


def decreasing_order(sizes, empty, strategy: str) -> list[int]:
    """binpack, bfd: longest first, then most images, then most patches. images_first_bfd: the
    samples with images first; within each group the largest share of the budgets first (the sum
    over the units of size / budget, a budget of 0 counting as 1), then the longest. Ties: the
    lowest index."""
    if strategy != "images_first_bfd":
        return sorted(range(len(sizes)), key=lambda i: (*(-n for n in sizes[i]), i))
    units = [max(budget, 1) for budget in empty]

    def share(i):
        return sum(Fraction(n, unit) for n, unit in zip(sizes[i], units))

    return sorted(range(len(sizes)), key=lambda i: (sizes[i][1] == 0, -share(i), -sizes[i][0], i))


def fit_decreasing(
    lengths, budgets: Budgets, image_counts=None, patch_counts=None, *, strategy: str = "binpack"
) -> list[list[int]]:
    """binpack, bfd or images_first_bfd. 1. Sort the items (`decreasing_order`). 2. For each,
    list the packs with room for it in every budget; binpack takes the first, bfd the one with the
    least token room, images_first_bfd for a sample with images the least token room then the
    most image slots, for a text-only one the fewest image slots then the least token room (ties:
    the lowest number). 3. Open a new pack when none has room.

    >>> fit_decreasing([3, 6, 2, 5], Budgets(8))
    [[1, 2], [3, 0]]
    """
    assert strategy in FIT_DECREASING, strategy
    sizes, empty = sizes_and_room(lengths, budgets, image_counts, patch_counts)
    packs, room = [], []
    for i in decreasing_order(sizes, empty, strategy):
        size = sizes[i]
        fitting = [p for p in range(len(packs)) if fits(room[p], size)]
        if strategy == "bfd":
            fitting.sort(key=lambda p: room[p][0])
        elif strategy == "images_first_bfd" and size[1]:
            fitting.sort(key=lambda p: (room[p][0], -room[p][1]))
        elif strategy == "images_first_bfd":
            fitting.sort(key=lambda p: (room[p][1], room[p][0]))
        if fitting:
            chosen = fitting[0]
        else:
            packs.append([])
            room.append(empty)
            chosen = len(packs) - 1
        packs[chosen].append(i)
        room[chosen] = less(room[chosen], size)
    return packs


def balanced_greedy(
    lengths, budgets: Budgets, image_counts=None, patch_counts=None
) -> list[list[int]]:
    """The blog's balanced greedy knapsack. 1. Open ceil(total length / max_length) +
    BALANCED_GREEDY_EXTRA_PACKS empty packs. 2. Take the items longest first (ties: the lowest
    index); sort the packs by load (fewest tokens first, ties: the lowest number) and put the item
    into the first that fits every budget. 3. Open a new pack when none fits. At the end, drop
    the packs left empty.

    >>> balanced_greedy([3, 6, 2, 5], Budgets(8))  # 7 packs to start: each item alone
    [[1], [3], [0], [2]]
    """
    sizes, empty = sizes_and_room(lengths, budgets, image_counts, patch_counts)
    if not sizes:
        return []
    total = sum(size[0] for size in sizes)
    count = -(-total // empty[0]) + packers.BALANCED_GREEDY_EXTRA_PACKS
    packs, room = [[] for _ in range(count)], [empty] * count
    for i in sorted(range(len(sizes)), key=lambda i: (-sizes[i][0], i)):
        for chosen in sorted(range(len(packs)), key=lambda p: empty[0] - room[p][0]):
            if fits(room[chosen], sizes[i]):
                break
        else:
            packs.append([])
            room.append(empty)
            chosen = len(packs) - 1
        packs[chosen].append(i)
        room[chosen] = less(room[chosen], sizes[i])
    return [p for p in packs if p]
