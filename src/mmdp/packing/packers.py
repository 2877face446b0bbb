"""Packing as a knapsack problem: put items (samples) into packs under a token budget.

Everything here is pure: lengths (and image counts) in, packs out, as lists of indices into
`lengths`. The thread/queue plumbing that streams packs lives elsewhere (mmdp.packing.background,
mmdp.packing.toy, mmdp.packing.packed_dataset) and calls `pack`.

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

How binpack, bfd and images_first_bfd run fast (`pack_fit_decreasing`), with packs identical to
those of `reference_fit_decreasing`, the readable item-by-item loop (the blog's), which the tests
compare them to:
1. Sort the items (`decreasing_order`) and cut them into runs of identical (length, image count)
   items.
2. Place a run at once: the pack the rule picks for one item stays its pick for the next one
   until it is full (its room only shrinks), so it takes as many as fit, then the next pick does.
3. Find the pick without scanning all open packs. First fit: the packs with room for the current
   length wait in heaps of pack numbers, the others by room until the length comes down to it
   (`first_fit_runs`). Best fit: packs wait grouped by state (room, image slots left), and a
   bytearray over rooms finds the tightest room that fits in one C scan (`best_fit_runs`).
4. Forget the packs with less room than the shortest item still to come.
About O(n log n) in all: a million items of 1 to 32,768 tokens pack in about a second at
max_length 32,768, a buffer of 4,096 cauldron-like items in a few ms (bench/bench_packing.py).
balanced_greedy likewise: `pack_balanced_greedy` keeps the packs in heaps by load,
`reference_balanced_greedy` is the blog's loop.
"""

from bisect import bisect_left, insort
from heapq import heappop, heappush
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
    """`pack` as two flat arrays, for callers that plan millions of items (mmdp.packing.planner).

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
        return pack_balanced_greedy(lengths, max_length, images, max_images)
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


def pack_balanced_greedy(lengths, max_length, images, max_images) -> tuple[np.ndarray, np.ndarray]:
    """The blog's balanced greedy knapsack (after Eagle 2), fast; returns (items, starts).

    1. Open ceil(total length / max_length) + BALANCED_GREEDY_EXTRA_PACKS empty packs.
    2. Take the items longest first (ties: lowest index); put each into the LEAST loaded pack
       (fewest tokens, ties: lowest number) that fits it under both budgets.
    3. Open a new pack when none fits. At the end, drop the packs left empty.
    Spreading the items keeps the packs' loads even (the "balanced"), at the price of more packs
    than binpack or bfd (bench/bench_packing.py).
    Step 2 without sorting the packs for every item (the blog's loop, `reference_balanced_greedy`):
    a less loaded pack has more room, so if the least loaded pack with enough image slots cannot
    take the item, no pack can. The packs wait in heaps of (load, number), one heap per number
    of image slots left: the least loaded candidate is the lowest top among the heaps with enough
    slots for the item's images. Slots beyond the most images any item has make no difference, so
    they count as that many: at most that many + 1 heaps to look at. O(n log P).
    """
    n = len(lengths)
    if n == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(1, dtype=np.int64)
    opened = lower_bound(lengths, max_length) + BALANCED_GREEDY_EXTRA_PACKS
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
        slots[pack] -= count
        heappush(heaps.setdefault(min(slots[pack], most), []), (load + length, pack))
        pack_of.append(pack)
    return group_by_pack(order, np.array(pack_of, dtype=np.int64))


def reference_balanced_greedy(
    lengths, max_length: int, image_counts=None, max_images: int | None = None
) -> list[list[int]]:
    """`pack_balanced_greedy` as the blog's code does it, item by item, for reading and tests.

    For every item, sort the packs by load (fewest tokens first, ties: lowest number) and take
    the first that fits: O(n * P log P).
    """
    lengths, images, max_images = check_items(lengths, max_length, image_counts, max_images)
    if len(lengths) == 0:
        return []
    count = lower_bound(lengths, max_length) + BALANCED_GREEDY_EXTRA_PACKS
    packs = [[] for _ in range(count)]
    load, load_images = [0] * count, [0] * count
    for i in np.lexsort((np.arange(len(lengths)), -lengths)).tolist():
        length, image_count = int(lengths[i]), int(images[i])
        for chosen in sorted(range(len(packs)), key=load.__getitem__):
            if (
                load[chosen] + length <= max_length
                and load_images[chosen] + image_count <= max_images
            ):
                break
        else:
            packs.append([])
            load.append(0)
            load_images.append(0)
            chosen = len(packs) - 1
        packs[chosen].append(i)
        load[chosen] += length
        load_images[chosen] += image_count
    return [items for items in packs if items]


def decreasing_order(lengths, images, max_length=1, max_images=0, by="length") -> np.ndarray:
    """The order fit-decreasing packers place items in; ties by index, so it is deterministic.

    by="length": longest first (then most images first): the classic binpack (FFD) / bfd order.
    by="size": samples with images before text-only ones; within each, the largest share of BOTH
    budgets first, length/max_length + images/max_images (computed in integers as
    length * max_images + images * max_length): the images_first_bfd order.
    """
    # np.lexsort sorts by its LAST key first, and is stable: full ties stay in index order
    if by == "length":
        return np.lexsort((-images, -lengths))
    size = lengths * max_images + images * max_length
    # (equal size and length imply equal images: no key needed for them)
    return np.lexsort((-lengths, -size, images == 0))


def pack_fit_decreasing(
    lengths, max_length, images, max_images, fit: str
) -> tuple[np.ndarray, np.ndarray]:
    """First fit / best fit / images_first decreasing, a run of identical items at a time.

    fit="first": the lowest-numbered pack with room; fit="best": the pack with the least token
    room left that still fits (ties: lowest number); fit="images_first": for a sample with
    images as best, ties to the most image room left; for a text-only sample the least image
    room left, ties to the least token room (see the module docstring). Returns (items, starts)
    as pack_flat does, identical to `reference_fit_decreasing`.
    """
    check_fit(fit)
    n = len(lengths)
    if n == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(1, dtype=np.int64)
    by = "size" if fit == "images_first" else "length"
    order = decreasing_order(lengths, images, max_length, max_images, by)
    sorted_lengths, sorted_images = lengths[order], images[order]

    # Runs of identical (length, image count) items, each with the shortest length still to come
    # after it: a pack with less room than that is full for good and can be forgotten.
    starts = np.flatnonzero(
        np.r_[True, (np.diff(sorted_lengths) != 0) | (np.diff(sorted_images) != 0)]
    )
    run_lengths = sorted_lengths[starts]
    shortest_after = np.r_[np.minimum.accumulate(run_lengths[::-1])[::-1][1:], max_length + 1]
    runs = list(
        zip(
            run_lengths.tolist(),
            sorted_images[starts].tolist(),
            np.diff(np.r_[starts, n]).tolist(),
            shortest_after.tolist(),
        )
    )
    if fit == "first":
        packs, takes = first_fit_runs(runs, max_length, max_images)
    else:
        packs, takes = best_fit_runs(runs, max_length, max_images, fit)
    # packs[k] took takes[k] items, in sorted order: repeat to get the pack of every item
    pack_of = np.repeat(np.array(packs, dtype=np.int64), takes)
    return group_by_pack(order, pack_of)


def group_by_pack(order, pack_of) -> tuple[np.ndarray, np.ndarray]:
    """Item order[k] went into pack pack_of[k], k in placement order -> (items, starts).

    Packs come by number, items within a pack in the order they were placed; numbers that got
    no item (balanced_greedy's unused packs) are dropped.
    """
    by_pack = np.argsort(pack_of, kind="stable")
    sizes = np.bincount(pack_of)
    return order[by_pack], np.r_[0, np.cumsum(sizes[sizes > 0])]


def first_fit_runs(runs, max_length, max_images) -> tuple[list[int], list[int]]:
    """First fit, a run of identical items at a time: (packs, takes), pack packs[k] took takes[k].

    The lowest-numbered pack that fits takes as many of the run as fit, then the next one, and so
    on; the rest open new packs. To find that pack without scanning all open packs:
    1. The packs with room for the current length wait in heaps of pack numbers (lowest on top),
       one heap per number of image slots left (counted up to the most images an item has: more
       make no difference): the first fit is the lowest top among the heaps with enough slots.
    2. The others wait by room until the length, which only decreases (binpack's order), comes
       down to their room; then they join the heaps.
    A pack joins the heaps at most once per item it takes: O(n log n) in all (times the number of
    heaps looked at per pick: at most the most images an item has + 1).
    """
    room, image_room = [], []  # left in each pack
    most = max(run[1] for run in runs)  # the most images an item has
    heaps = {}  # image slots left (up to `most`) -> heap of numbers of packs with room >= length
    waiting = {}  # room -> numbers of the packs with that room, less than the current length
    waiting_rooms = []  # the rooms in `waiting`, negated: a max-heap
    packs, takes = [], []

    def wait(pack, left):
        numbers = waiting.get(left)
        if numbers is None:
            waiting[left] = [pack]
            heappush(waiting_rooms, -left)
        else:
            numbers.append(pack)

    for length, count, todo, shortest in runs:
        # 2. the packs with room for this length join the heaps
        while waiting_rooms and -waiting_rooms[0] >= length:
            for pack in waiting.pop(-heappop(waiting_rooms)):
                heappush(heaps.setdefault(min(image_room[pack], most), []), pack)

        while todo:
            # 1. the lowest-numbered pack among the heaps with enough image slots
            best = None
            for slots, heap in heaps.items():
                if heap and slots >= count and (best is None or heap[0] < best[0]):
                    best = heap
            if best is None:
                break
            pack = heappop(best)
            take = room[pack] // length
            if count and image_room[pack] // count < take:
                take = image_room[pack] // count
            if take > todo:
                take = todo
            left = room[pack] = room[pack] - take * length
            image_room[pack] -= take * count
            packs.append(pack)
            takes.append(take)
            todo -= take
            if left >= length:  # out of image slots, or the run is placed: still a candidate
                heappush(heaps.setdefault(min(image_room[pack], most), []), pack)
            elif left >= shortest:
                wait(pack, left)

        if todo:  # new packs, each with as many of the run as fit
            per_pack = max_length // length
            if count:
                per_pack = min(per_pack, max_images // count)
            full, rest = divmod(todo, per_pack)
            new = range(len(room), len(room) + full)
            packs.extend(new)
            takes.extend([per_pack] * full)
            left, left_images = max_length - per_pack * length, max_images - per_pack * count
            room.extend([left] * full)
            image_room.extend([left_images] * full)
            if left >= length:
                # numbers above all others, appended in increasing order: still a heap
                heaps.setdefault(min(left_images, most), []).extend(new)
            elif left >= shortest:
                for pack in new:
                    wait(pack, left)
            if rest:
                pack = len(room)
                packs.append(pack)
                takes.append(rest)
                room.append(max_length - rest * length)
                image_room.append(max_images - rest * count)
                heappush(heaps.setdefault(min(image_room[pack], most), []), pack)
    return packs, takes


def best_fit_runs(runs, max_length, max_images, fit) -> tuple[list[int], list[int]]:
    """Best fit (fit="best") and images_first, a run at a time: (packs, takes) as first fit's.

    Packs in the same state (room, image slots left) differ only by their number, so they wait
    together: `group[room, slots]` lists their numbers, lowest first. The rule picks a state;
    its lowest-numbered packs take as many of the run as fit (each as many: same state) and leave
    it with less room than the run's length, or too few image slots, so the search for the next
    state goes on from the same room. To find the state without scanning all open packs:
    1. bfd, and images_first for samples with images, want the tightest room >= length among the
       packs with enough image slots. `rooms_with[c]` is a bytearray over rooms, 1 where a pack
       has that room and >= c image slots (c: an image count some item has), so the tightest room
       is rooms_with[c].find(1, length), a C scan. In that room images_first takes the state with the
       most image slots; bfd the lowest-numbered pack over the states with enough slots.
    2. images_first, for the text-only samples (they come last): the fewest image slots first,
       then the tightest room. `levels[slots]` is a bytearray over the rooms of the packs with
       that many image slots left; `slot_counts` lists those numbers in increasing order.
    Memory: max_length + 1 bytes per image count (1.) or per number of image slots (2.).
    """
    group = {}  # (room, image slots left) -> numbers of the packs in that state, lowest first
    packs, takes = [], []
    opened = 0  # packs opened so far

    def join(state, numbers):  # keep the state's numbers in increasing order
        in_order = numbers[0] > state[-1]
        state.extend(numbers)
        if not in_order:
            state.sort()

    # 1. rooms_with[c][room]
    rooms_with = {c: bytearray(max_length + 1) for c in {0, *(run[1] for run in runs)}}
    slots_at = {}  # room -> image slots of the states with that room, in increasing order

    def mark_room(room, most):  # the most image slots at this room changed (-1: no pack left)
        for c, line in rooms_with.items():
            line[room] = most >= c

    def add_by_room(room, slots, numbers):
        state = group.get((room, slots))
        if state is not None:
            return join(state, numbers)
        group[room, slots] = numbers
        here = slots_at.setdefault(room, [])
        insort(here, slots)
        if here[-1] == slots:
            mark_room(room, slots)

    # 2. levels[slots][room]; most_room[slots] is at least the largest room there (an upper
    #    bound: lowered when a search finds nothing, raised when a pack arrives), to skip levels
    levels, most_room, slot_counts = {}, {}, []

    def add_by_slots(room, slots, numbers):
        state = group.get((room, slots))
        if state is not None:
            return join(state, numbers)
        group[room, slots] = numbers
        mark_level(room, slots)

    def mark_level(room, slots):
        if slots not in levels:
            levels[slots] = bytearray(max_length + 1)
            most_room[slots] = room
            insort(slot_counts, slots)
        levels[slots][room] = 1
        most_room[slots] = max(most_room[slots], room)

    most_slots_first = fit == "images_first"
    by_room, add = True, add_by_room
    for length, count, todo, shortest in runs:
        if by_room and most_slots_first and count == 0:
            # 2. the text-only samples: from now on, search by image slots first
            by_room, add = False, add_by_slots
            for room, slots in group:
                mark_level(room, slots)

        room, rooms = length, rooms_with[count]
        while todo:
            # Find the state to take packs from, and how many of its packs come first.
            if by_room:
                room = rooms.find(1, room)
                if room < 0:
                    break
                here = slots_at[room]
                if most_slots_first:
                    slots = here[-1]
                    state = group[room, slots]
                    first = len(state)
                else:  # bfd: the lowest number among the states with enough image slots
                    i = bisect_left(here, count)
                    slots = here[i]
                    state = group[room, slots]
                    first = len(state)
                    if i < len(here) - 1:  # several states: merge them by number
                        heads = sorted((group[room, s][0], s) for s in here[i:])
                        slots = heads[0][1]
                        state = group[room, slots]
                        first = bisect_left(state, heads[1][0])
            else:
                for slots in slot_counts:
                    if most_room[slots] >= length:
                        room = levels[slots].find(1, length)
                        if room >= 0:
                            break
                        most_room[slots] = length - 1
                else:
                    break
                state = group[room, slots]
                first = len(state)

            # Its first packs each take as many items as fit: full ones move to their new state.
            per_pack = room // length
            if count and slots // count < per_pack:
                per_pack = slots // count
            use = min(first, -(-todo // per_pack))
            numbers = state[:use]
            del state[:use]
            if not state:
                del group[room, slots]
                if by_room:
                    here.remove(slots)
                    if not here:
                        del slots_at[room]
                    if not here or here[-1] < slots:
                        mark_room(room, here[-1] if here else -1)
                else:
                    levels[slots][room] = 0
            full = min(use, todo // per_pack)
            packs.extend(numbers)
            takes.extend([per_pack] * full)
            todo -= full * per_pack
            left = room - per_pack * length
            if full and left >= shortest:
                add(left, slots - per_pack * count, numbers[:full])
            if full < use:  # the last pack takes the rest of the run
                takes.append(todo)
                add(room - todo * length, slots - todo * count, numbers[-1:])
                todo = 0

        if todo:  # new packs, each with as many of the run as fit
            per_pack = max_length // length
            if count:
                per_pack = min(per_pack, max_images // count)
            full, rest = divmod(todo, per_pack)
            packs.extend(range(opened, opened + full))
            takes.extend([per_pack] * full)
            left = max_length - per_pack * length
            if full and left >= shortest:
                add(left, max_images - per_pack * count, list(range(opened, opened + full)))
            opened += full
            if rest:
                packs.append(opened)
                takes.append(rest)
                add(max_length - rest * length, max_images - rest * count, [opened])
                opened += 1
    return packs, takes


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
