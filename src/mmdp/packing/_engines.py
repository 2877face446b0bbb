"""The fast engines behind mmdp.packing.packers: its strategies' packs, at scale.

Private: call `pack` or `pack_flat` (mmdp.packing.packers). They check the items, choose the order
the items go in, and call an engine here; every engine returns (items, starts) as `pack_flat`
does. A Python call costs about as much as a step of these loops, so each engine's hot loop is
one method over all the items (or runs), its steps written out.

Any budgets: greedy (`next_fit`), a pack at a time: a bisection of the running totals finds
where each pack ends.

Tokens and images (stage 5's two budgets): binpack, bfd and images_first_bfd
(`pack_fit_decreasing`)
0. The items longer than half the token budget at the head of the order each open a pack: no
   two fit together, and the packs they open have room for none of them.
1. Cut the other sorted items into runs of identical (length, image count) items
   (`cut_into_runs`).
2. Place a run at once: the pack the rule picks for one item stays its pick for the next one
   until it is full (its room only shrinks), so it takes as many as fit, then the next pick does;
   the rest of the run opens new packs, each with as many as fit (`Placements.open_new`).
3. Find the pick without scanning all open packs. First fit (`first_fit_runs`): the packs with
   room for the current length wait in heaps of pack numbers, the others by room until the
   length comes down to it (`FirstFitIndex`). Best fit (`best_fit_runs`): packs wait grouped by
   state (room, image slots left); a bytearray over rooms finds the tightest room that fits in
   one C scan (`RoomIndex`), and images_first's text-only samples search by image slots first
   (`SlotLevels`).
4. Forget the packs with less room than the shortest item still to come.
About O(n log n) in all: a million items of 1 to 32,768 tokens pack in about a second at
max_length 32,768, a buffer of 4,096 cauldron-like items in a few ms (bench/bench_packing.py).
balanced_greedy likewise: `pack_balanced_greedy` keeps the packs in heaps by load.

Three budgets (tokens, images, vision-encoder patches): `scan_fit_decreasing` and
`scan_balanced_greedy` keep the room the open packs have left in every budget in numpy arrays
(`OpenPacks`) and scan them all for every pick, under the same rules (`pick`); runs of identical
items still go at once. O(n * open packs), vectorised: tens of ms for a buffer of 4,096
cauldron-like items (bench/bench_packing.py, table 4).
"""

from bisect import bisect_right
from heapq import heappop, heappush

import numpy as np

from mmdp.packing._best_fit import best_fit_runs
from mmdp.packing._placements import FIT_DECREASING, Placements, cut_into_runs, group_by_pack

# Any budgets: greedy (next fit) -----------------------------------------------------------------


def next_fit(lengths, images, patches, budgets) -> tuple[np.ndarray, np.ndarray]:
    """greedy (next fit) a pack at a time: a pack ends where a running total passes its budget.

    With running totals before each item (total[k]: the first k items' sum), the pack that
    starts at item a holds the items up to the first whose running total of tokens passes
    total[a] + max_length (a bisection), fewer if that passes the image or patch budget (then a
    bisection there too). A Python step per pack instead of per item. Budgets no pack can reach are skipped.

    >>> items, starts = next_fit(np.array([3, 6, 2, 5]), np.zeros(4, int), np.zeros(4, int), (8, 0, 0))
    >>> items.tolist(), starts.tolist()
    ([0, 1, 2, 3], [0, 1, 3, 4])
    """
    n = len(lengths)
    tokens = np.r_[0, np.cumsum(lengths)].tolist()
    others = [
        (np.r_[0, np.cumsum(column)].tolist(), budget)
        for column, budget in zip((images, patches), budgets[1:])
        if column.sum() > budget  # else no pack can reach it
    ]
    max_length = budgets[0]
    starts, start = [0], 0
    while start < n:
        end = bisect_right(tokens, tokens[start] + max_length, start) - 1
        for total, budget in others:
            if total[end] - total[start] > budget:
                end = bisect_right(total, total[start] + budget, start, end) - 1
        starts.append(end)
        start = end
    return np.arange(n, dtype=np.int64), np.array(starts, dtype=np.int64)


# Tokens and images: binpack, bfd, images_first_bfd ---------------------------------------------


def pack_fit_decreasing(
    lengths, images, order, max_length: int, max_images: int, strategy: str
) -> tuple[np.ndarray, np.ndarray]:
    """binpack (first fit), bfd or images_first_bfd (best fit), a run of identical items at a time.

    `order`: the order to place the items in (packers.decreasing_order). Returns (items, starts)
    as pack_flat does.
    """
    if strategy not in FIT_DECREASING:  # an unknown rule must fail, not fall back to first fit
        raise ValueError(f"{strategy!r} is not one of {', '.join(FIT_DECREASING)}")
    sorted_lengths, sorted_images = lengths[order], images[order]
    # 0. the items longer than half the budget at the head of the order each open a pack: the
    #    packs they open have less room than half the budget, less than any of them
    long = 2 * sorted_lengths > max_length
    alone = len(long) if long.all() else int(long.argmin())
    placed = Placements()
    placed.open_each(alone)
    if alone == len(order):
        return group_by_pack(order, placed.pack_of())
    opened = (
        (max_length - sorted_lengths[:alone]).tolist(),
        (max_images - sorted_images[:alone]).tolist(),
    )
    sorted_lengths, sorted_images = sorted_lengths[alone:], sorted_images[alone:]
    # 1. runs of identical items
    starts, counts, shortest_after = cut_into_runs((sorted_lengths, sorted_images), max_length)
    runs = list(
        zip(
            sorted_lengths[starts].tolist(),
            sorted_images[starts].tolist(),
            counts.tolist(),
            shortest_after.tolist(),
        )
    )
    if strategy == "binpack":
        first_fit_runs(runs, max_length, max_images, placed, opened)
    else:
        best_fit_runs(runs, max_length, max_images, strategy, placed, opened)
    return group_by_pack(order, placed.pack_of())


class FirstFitIndex:
    """The open packs first fit picks from, found without scanning them all.

    1. The packs with room for the current length wait in heaps of pack numbers (lowest on top),
       one heap per number of image slots left (counted up to `most`, the most images an item
       has: more make no difference): the first fit is the lowest top among the heaps with
       enough slots (`place`).
    2. The others wait by room until the length, which only decreases (binpack's order), comes
       down to their room; then they join the heaps.
    3. Packs with less room than the shortest item still to come are forgotten.
    """

    def __init__(self, most: int):
        self.room, self.slots = [], []  # tokens and image slots left, by pack number
        self.most = most
        self.heaps = {}  # image slots left (up to `most`) -> heap of pack numbers
        self.waiting = {}  # room -> numbers of the packs with that room, less than the length
        self.waiting_rooms = []  # the rooms in `waiting`, negated: a max-heap

    def heap(self, pack: int) -> list[int]:
        return self.heaps.setdefault(min(self.slots[pack], self.most), [])

    def place(self, runs, placed: Placements, budgets) -> None:
        """Place the runs (length, image count, items, shortest length after), in order: the
        lowest-numbered pack that fits takes as many of a run's items as fit, then the next
        one, and so on; the rest open new packs. One method for all the runs, the hot loop
        (a thousand runs or so a buffer): a call costs about as much as a step."""
        room, slots, heaps, waiting_rooms = self.room, self.slots, self.heaps, self.waiting_rooms
        packs, takes, most = placed.packs, placed.takes, self.most
        max_length, max_images = budgets
        for length, count, todo, shortest in runs:
            # 2. the waiting packs with room for this length join the heaps
            while waiting_rooms and -waiting_rooms[0] >= length:
                for pack in self.waiting.pop(-heappop(waiting_rooms)):
                    heappush(heaps.setdefault(min(slots[pack], most), []), pack)
            while todo:
                # 1. the lowest-numbered pack among the heaps with enough image slots
                best = None
                for free, heap in heaps.items():
                    if heap and free >= count and (best is None or heap[0] < best[0]):
                        best = heap
                if best is None:
                    break
                pack = heappop(best)
                take = room[pack] // length
                if count and slots[pack] // count < take:
                    take = slots[pack] // count
                if take > todo:
                    take = todo
                left = room[pack] = room[pack] - take * length
                slots[pack] -= take * count
                packs.append(pack)
                takes.append(take)
                todo -= take
                if left >= length:  # out of image slots, or the run is placed: still a candidate
                    heappush(heaps.setdefault(min(slots[pack], most), []), pack)
                elif left >= shortest:  # 2. waits for a shorter length; else forgotten
                    self.wait(pack, left)
            if not todo:
                continue
            # new packs for the rest of the run
            if todo * length <= max_length and todo * count <= max_images:
                # one new pack takes the rest (most runs): Placements.open_new's first case
                pack = placed.open_one(todo)
                left = max_length - todo * length
                room.append(left)  # room and slots are by pack number: this one is the next
                slots.append(max_images - todo * count)
                if left >= length:
                    heappush(heaps.setdefault(min(slots[pack], most), []), pack)
                elif left >= shortest:
                    self.wait(pack, left)
                continue
            for numbers, take in placed.open_new(todo, (length, count), budgets):
                left = max_length - take * length
                self.open(numbers, left, max_images - take * count, length, shortest)

    def open(self, numbers: range, left: int, slots: int, length: int, shortest: int) -> None:
        """New packs, numbered above all others, each with `left` room and `slots` slots."""
        self.room.extend([left] * len(numbers))
        self.slots.extend([slots] * len(numbers))
        if left >= length:
            # numbers above all others, appended in increasing order: still a heap
            self.heap(numbers[0]).extend(numbers)
        elif left >= shortest:
            for pack in numbers:
                self.wait(pack, left)

    def open_packs(self, rooms: list[int], slots: list[int], length: int, shortest: int) -> None:
        """Packs opened already, numbered from 0: rooms[k] and slots[k] left in pack k."""
        self.room.extend(rooms)
        self.slots.extend(slots)
        for pack, left in enumerate(rooms):
            if left >= length:
                self.heap(pack).append(pack)  # numbers in increasing order: still a heap
            elif left >= shortest:
                self.wait(pack, left)

    def wait(self, pack: int, left: int) -> None:
        numbers = self.waiting.get(left)
        if numbers is None:
            self.waiting[left] = [pack]
            heappush(self.waiting_rooms, -left)
        else:
            numbers.append(pack)


def first_fit_runs(runs, max_length: int, max_images: int, placed: Placements, opened) -> None:
    """First fit, a run (length, image count, items, shortest length after) at a time
    (`FirstFitIndex.place`). A pack joins the heaps at most once per item it takes: O(n log n)
    in all (times the number of heaps looked at per pick: at most the most images an item has +
    1). `opened`: (room, image slots) of the packs `placed` opened already, by number."""
    index = FirstFitIndex(most=max(count for _, count, _, _ in runs))
    length, _, _, _ = runs[0]
    index.open_packs(*opened, length, min(length for length, _, _, _ in runs))
    index.place(runs, placed, (max_length, max_images))


# Tokens and images: balanced_greedy ------------------------------------------------------------


def pack_balanced_greedy(
    lengths, images, max_length: int, max_images: int, opened: int
) -> tuple[np.ndarray, np.ndarray]:
    """The blog's balanced greedy knapsack, fast, starting from `opened` empty packs.

    Without sorting the packs for every item (as the blog's loop does): a less
    loaded pack has more room, so if the least loaded pack with enough image slots cannot take
    the item, no pack can. The packs wait in heaps of (load, number), one heap per number of
    image slots left: the least loaded candidate is the lowest top among the heaps with enough
    slots for the item's images. Slots beyond the most images any item has make no difference,
    so they count as that many: at most that many + 1 heaps to look at. O(n log P).
    """
    most = int(images.max())  # the most images an item has
    slots = [max_images] * opened  # image slots left in each pack
    # image slots left (counted up to `most`) -> heap of (load, number)
    heaps = {min(max_images, most): [(0, pack) for pack in range(opened)]}
    order = np.argsort(-lengths, kind="stable")  # longest first, ties by index
    pack_of = []
    for length, count in zip(lengths[order].tolist(), images[order].tolist()):
        best = None
        for free, heap in heaps.items():
            if heap and free >= count and (best is None or heap[0] < best[0]):
                best = heap
        if best is not None and best[0][0] + length <= max_length:
            load, pack = heappop(best)
        else:  # no pack fits: a new, empty one
            load, pack = 0, opened
            opened += 1
            slots.append(max_images)
        left = slots[pack] = slots[pack] - count
        if left > most:  # counted up to `most` (an if, not min(): a call per item costs)
            left = most
        heappush(heaps.setdefault(left, []), (load + length, pack))
        pack_of.append(pack)
    return group_by_pack(order, np.array(pack_of, dtype=np.int64))


# Three budgets (tokens, images, patches): every strategy but greedy, scanning the open packs ---


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
