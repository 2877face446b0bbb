"""What the fast engines share (mmdp.packing._engines, _best_fit): where each item went
(Placements), the items grouped by pack, the sorted items cut into runs of identical ones."""

import numpy as np

FIT_DECREASING = ("binpack", "bfd", "images_first_bfd")


def group_by_pack(order, pack_of) -> tuple[np.ndarray, np.ndarray]:
    """Item order[k] went into pack pack_of[k], k in placement order -> (items, starts).

    Packs come by number, items within a pack in the order they were placed; numbers that got
    no item (balanced_greedy's unused packs) are dropped.

    >>> items, starts = group_by_pack(np.array([1, 3, 0, 2]), np.array([0, 1, 1, 0]))
    >>> items.tolist(), starts.tolist()
    ([1, 2, 3, 0], [0, 2, 4])
    """
    by_pack = np.argsort(pack_of, kind="stable")
    sizes = np.bincount(pack_of)
    return order[by_pack], np.r_[0, np.cumsum(sizes[sizes > 0])]


def cut_into_runs(columns, max_length: int):
    """Runs of identical items in placement order: (starts, counts, shortest_after) arrays.

    `columns`: the items' sizes in placement order, one array per budget, lengths first. Run r
    holds the items at starts[r] : starts[r] + counts[r]; shortest_after[r] is the shortest length
    in the runs after it (max_length + 1 after the last): a pack with less room is full for good.

    >>> lengths, images = np.array([5, 5, 3, 3, 3]), np.array([1, 1, 0, 0, 1])
    >>> [a.tolist() for a in cut_into_runs((lengths, images), 8)]
    [[0, 2, 4], [2, 2, 1], [3, 3, 9]]
    """
    n = len(columns[0])
    change = np.zeros(max(n - 1, 0), dtype=bool)
    for column in columns:
        change |= np.diff(column) != 0
    starts = np.flatnonzero(np.r_[True, change])
    run_lengths = columns[0][starts]
    shortest_after = np.r_[np.minimum.accumulate(run_lengths[::-1])[::-1][1:], max_length + 1]
    return starts, np.diff(np.r_[starts, n]), shortest_after


class Placements:
    """Where the runs went, in placement order: pack packs[k] took takes[k] items."""

    def __init__(self):
        self.packs, self.takes = [], []
        self.opened = 0  # packs opened so far: the next new pack's number

    def add(self, pack: int, take: int) -> None:
        """Pack `pack` took `take` items (the hot loops append to the two lists directly)."""
        self.packs.append(pack)
        self.takes.append(take)

    def open_one(self, take: int) -> int:
        """A new pack that takes `take` items; returns its number."""
        pack = self.opened
        self.opened += 1
        self.packs.append(pack)
        self.takes.append(take)
        return pack

    def open_new(self, todo: int, sizes, budgets) -> list[tuple[range, int]]:
        """New packs for the rest of a run: each takes as many items as fit, the last the rest.

        `sizes`: one item's size in each budget (tokens first, never 0); `budgets`: a pack's.
        Returns [(numbers, items each of them took)], the full packs first. Five items of 4
        tokens, max_length 10: two packs take two each, a third the last one:

        >>> placed = Placements()
        >>> placed.open_new(5, (4,), (10,))
        [(range(0, 2), 2), (range(2, 3), 1)]
        >>> placed.packs, placed.takes
        ([0, 1, 2], [2, 2, 1])
        """
        per_pack = budgets[0] // sizes[0]  # tokens: never 0
        for size, budget in zip(sizes, budgets):
            if size and budget // size < per_pack:
                per_pack = budget // size
        first = self.opened
        if todo <= per_pack:  # one new pack takes them all: most runs are one or two items
            self.open_one(todo)
            return [(range(first, first + 1), todo)]
        full, rest = divmod(todo, per_pack)
        self.opened += full + (rest > 0)
        self.packs.extend(range(first, self.opened))
        self.takes += [per_pack] * full
        if not rest:
            return [(range(first, self.opened), per_pack)]
        self.takes.append(rest)
        if not full:
            return [(range(first, self.opened), rest)]
        return [(range(first, first + full), per_pack), (range(first + full, self.opened), rest)]

    def open_each(self, count: int) -> None:
        """`count` new packs, one item each."""
        self.packs.extend(range(self.opened, self.opened + count))
        self.takes.extend([1] * count)
        self.opened += count

    def pack_of(self) -> np.ndarray:
        """The pack of every item, in placement order."""
        return np.repeat(np.array(self.packs, dtype=np.int64), self.takes)
