"""The fast engines with a patch budget (any budgets: tokens, images, patches): a vectorised scan
of the open packs for each pick (mmdp.packing._engines has the engines for tokens and images)."""

import numpy as np

from mmdp.packing._placements import FIT_DECREASING, Placements, cut_into_runs, group_by_pack


class OpenPacks:
    """The open packs' room left in every budget, in numpy arrays scanned whole for each pick.

    room[b][k]: room left in budget b (0: tokens, 1: images, 2: patches) of pack numbers[k], one
    array per budget. Numbers increase with k, so the first of equal candidates is the
    lowest-numbered pack.
    """

    def __init__(self, budgets, count: int = 0):
        self.budgets = [int(b) for b in budgets]
        self.storage = np.empty((len(self.budgets), max(count, 64)), dtype=np.int64)
        self.all_numbers = np.empty(self.storage.shape[1], dtype=np.int64)
        self.resize(0)
        if count:
            self.open(range(count), self.budgets)

    def resize(self, size: int) -> None:
        """Views of the first `size` packs: what the scans read."""
        self.size = size
        self.room = list(self.storage[:, :size])
        self.numbers = self.all_numbers[:size]

    def open(self, numbers: range, room) -> int:
        """Append packs `numbers`, each with `room`; returns the position of the last."""
        start, end = self.size, self.size + len(numbers)
        if end > self.storage.shape[1]:  # twice the space, as a list grows
            storage, all_numbers = self.storage, self.all_numbers
            self.storage = np.empty((len(self.budgets), max(2 * start, end)), dtype=np.int64)
            self.all_numbers = np.empty(self.storage.shape[1], dtype=np.int64)
            self.storage[:, :start] = storage[:, :start]
            self.all_numbers[:start] = all_numbers[:start]
        self.storage[:, start:end] = np.array(room, dtype=np.int64)[:, None]
        self.all_numbers[start:end] = numbers
        self.resize(end)
        return end - 1

    def fitting(self, sizes) -> np.ndarray:
        """Positions of the packs with room for an item of these sizes in every budget."""
        fits = self.room[0] >= sizes[0]
        for room, size in zip(self.room[1:], sizes[1:]):
            if size:
                fits &= room >= size
        return fits.nonzero()[0]

    def take(self, position: int, sizes, todo: int) -> int:
        """Put as many of a run's `todo` items into the pack as fit; returns how many."""
        for room, size in zip(self.room, sizes):
            if size:
                todo = min(todo, int(room[position]) // size)
        for room, size in zip(self.room, sizes):
            if size:
                room[position] -= todo * size
        return todo

    def forget(self, shortest: int) -> None:
        """Drop the packs with less token room than the shortest item still to come."""
        keep = (self.room[0] >= shortest).nonzero()[0]
        if len(keep) < self.size:
            self.storage[:, : len(keep)] = self.storage[:, keep]
            self.all_numbers[: len(keep)] = self.numbers[keep]
            self.resize(len(keep))


def pick(strategy: str, room: list[np.ndarray], fits: np.ndarray, with_images: bool) -> int:
    """The position, among `fits` (increasing), of the pack the strategy's rule picks.

    binpack: the first; bfd: the least token room; balanced_greedy: the least loaded (the most
    token room); images_first_bfd: with images as bfd, ties to the most image slots, text-only
    the fewest image slots, ties to the least token room. Further ties: the lowest number
    (argmin and argmax return the first).
    """
    if strategy == "binpack":
        return fits[0]
    tokens = room[0][fits]
    if strategy == "bfd":
        return fits[tokens.argmin()]
    if strategy == "balanced_greedy":
        return fits[tokens.argmax()]
    if with_images:
        tightest = fits[tokens == tokens.min()]
        return tightest[room[1][tightest].argmax()]
    slots = room[1][fits]
    fewest = fits[slots == slots.min()]
    return fewest[room[0][fewest].argmin()]


def scan_fit_decreasing(sizes, budgets, order, strategy: str) -> tuple[np.ndarray, np.ndarray]:
    """binpack, bfd or images_first_bfd under every budget given, a run at a time.

    `sizes`: one row per budget (tokens, images, patches), one column per item; `budgets`: a
    pack's; `order`: the order to place the items in. Each pick scans all open packs (`pick`);
    the picked pack takes as many of the run as fit, as in the fast engines.
    """
    if strategy not in FIT_DECREASING:
        raise ValueError(f"{strategy!r} is not one of {', '.join(FIT_DECREASING)}")
    sizes = sizes[:, order]
    starts, counts, shortest_after = cut_into_runs(sizes, int(budgets[0]))
    packs, placed, forgotten_below = OpenPacks(budgets), Placements(), 0
    for start, todo, shortest in zip(starts.tolist(), counts.tolist(), shortest_after.tolist()):
        need = sizes[:, start].tolist()
        while todo:
            fits = packs.fitting(need)
            if not len(fits):
                break
            k = pick(strategy, packs.room, fits, need[1] > 0)
            take = packs.take(k, need, todo)
            placed.add(int(packs.numbers[k]), take)
            todo -= take
        if todo:
            for numbers, take in placed.open_new(todo, need, packs.budgets):
                packs.open(numbers, [b - take * size for size, b in zip(need, packs.budgets)])
        if shortest > forgotten_below:  # shortest only grows: forget when it does
            packs.forget(shortest)
            forgotten_below = shortest
    return group_by_pack(order, placed.pack_of())


def scan_balanced_greedy(sizes, budgets, opened: int) -> tuple[np.ndarray, np.ndarray]:
    """balanced_greedy under every budget given: `opened` empty packs to start, then each item,
    longest first (ties: lowest index), to the least loaded pack that fits, or a new one."""
    order = np.argsort(-sizes[0], kind="stable")
    packs = OpenPacks(budgets, opened)
    pack_of = []
    for need in sizes[:, order].T.tolist():
        fits = packs.fitting(need)
        if len(fits):
            k = pick("balanced_greedy", packs.room, fits, need[1] > 0)
        else:  # no pack fits: a new, empty one
            k = packs.open(range(opened, opened + 1), packs.budgets)
            opened += 1
        packs.take(k, need, 1)
        pack_of.append(int(packs.numbers[k]))
    return group_by_pack(order, np.array(pack_of, dtype=np.int64))
