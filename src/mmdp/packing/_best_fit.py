"""Best fit for the fast engines (mmdp.packing._engines): bfd and images_first_bfd over runs of
identical items, the tightest pack found without scanning the open packs."""

from bisect import bisect_left, insort

from mmdp.packing._placements import Placements


class RoomIndex:
    """bfd's search, and images_first's for samples with images: the tightest room that fits.

    `rooms_with[c]` is a bytearray over rooms, 1 where some state (room, slots) has >= c image
    slots (c: an image count some item has), so the tightest room >= length with enough slots is
    rooms_with[c].find(1, length), a C scan. `slots_at[room]` lists the image slots of the states
    at that room, in increasing order. Memory: max_length + 1 bytes per image count.
    """

    def __init__(self, states: dict, max_length: int, counts, most_slots_first: bool):
        self.states = states  # (room, slots) -> pack numbers, shared with BestFit
        self.rooms_with = {c: bytearray(max_length + 1) for c in counts}
        self.slots_at = {}
        self.most_slots_first = most_slots_first  # images_first's tie rule

    def add(self, room: int, slots: int) -> None:
        """A new state; if it has the most image slots at its room, mark them."""
        here = self.slots_at.setdefault(room, [])
        insort(here, slots)
        if here[-1] == slots:
            for c, line in self.rooms_with.items():
                line[room] = slots >= c

    def remove(self, room: int, slots: int) -> None:
        """A state left with no pack; if it had the most image slots at its room, mark the
        next most (none: -1, no pack left there)."""
        here = self.slots_at[room]
        here.remove(slots)
        if not here:
            del self.slots_at[room]
        if not here or here[-1] < slots:
            most = here[-1] if here else -1
            for c, line in self.rooms_with.items():
                line[room] = most >= c

    def find(self, length: int, count: int, start: int) -> tuple | None:
        """(room, slots, numbers, first): the state to take packs from, its pack numbers, and
        how many of them come first; None if no pack fits. The tightest room from `start` on
        with `count` image slots; there images_first takes the state with the most slots, bfd
        the lowest-numbered pack."""
        room = self.rooms_with[count].find(1, start)
        if room < 0:
            return None
        here = self.slots_at[room]
        if self.most_slots_first:
            state = self.states[room, here[-1]]
            return room, here[-1], state, len(state)
        i = bisect_left(here, count)
        if i == len(here) - 1:
            state = self.states[room, here[i]]
            return room, here[i], state, len(state)
        # several states with enough slots: merge them by number
        heads = sorted((self.states[room, s][0], s) for s in here[i:])
        slots = heads[0][1]
        state = self.states[room, slots]
        return room, slots, state, bisect_left(state, heads[1][0])


class SlotLevels:
    """images_first's search for text-only samples: the fewest image slots left, then the
    tightest room.

    `levels[slots]` is a bytearray over the rooms of the states with that many image slots left
    (None until a pack has had that many); `slot_counts` lists the numbers of slots with a
    bytearray, in increasing order; `most_room[slots]` is at least the largest room there (an
    upper bound: the largest room once a search there finds nothing, raised when a pack
    arrives), to skip levels without scanning them. Memory: max_length + 1 bytes per number of
    image slots some pack has had.
    """

    def __init__(self, states: dict, max_length: int, max_images: int):
        self.states = states
        self.max_length = max_length
        self.levels = [None] * (max_images + 1)
        self.most_room = [-1] * (max_images + 1)
        self.slot_counts = []
        for room, slots in states:
            self.add(room, slots)

    def add(self, room: int, slots: int) -> None:
        line = self.levels[slots]
        if line is None:
            line = self.levels[slots] = bytearray(self.max_length + 1)
            insort(self.slot_counts, slots)
        line[room] = 1
        if room > self.most_room[slots]:
            self.most_room[slots] = room

    def remove(self, room: int, slots: int) -> None:
        self.levels[slots][room] = 0

    def find(self, length: int, count: int, start: int) -> tuple | None:
        """As RoomIndex.find, for a text-only run (`count` and `start` play no part)."""
        levels, most_room = self.levels, self.most_room
        for slots in self.slot_counts:
            if most_room[slots] >= length:
                line = levels[slots]
                room = line.find(1, length)
                if room >= 0:
                    state = self.states[room, slots]
                    return room, slots, state, len(state)
                most_room[slots] = line.rfind(1, 0, length)  # none >= length: the largest room
        return None


class BestFit:
    """bfd and images_first_bfd, a run at a time.

    Packs in the same state (room, image slots left) differ only by their number, so they wait
    together: states[room, slots] lists their numbers, lowest first. The search (`RoomIndex`, or
    `SlotLevels` once images_first reaches its text-only samples) picks a state; its first packs
    take as many of the run as fit (each as many: same state) and move to their new state, with
    less room than the run's length or too few image slots, so the search for the next state
    goes on from the same room.
    """

    def __init__(self, runs, max_length: int, max_images: int, strategy: str, placed: Placements):
        self.states = {}  # (room, image slots left) -> numbers of the packs there, lowest first
        # images_first searches by image slots once its text-only samples come (they come last)
        self.text_only_to_come = strategy == "images_first_bfd"
        counts = {0, *(count for _, count, _, _ in runs)}
        self.search = RoomIndex(self.states, max_length, counts, self.text_only_to_come)
        self.budgets = (max_length, max_images)
        self.placed = placed

    def place(self, runs) -> None:
        """Place the runs (length, image count, items, shortest length after), in order.

        The hot loop of bfd (a thousand runs or so a buffer), in one method: a call costs about
        as much as a step, so the steps are written out here rather than called.
        """
        states, placed, file = self.states, self.placed, self.file
        packs, takes = placed.packs, placed.takes
        max_length, max_images = self.budgets
        find, remove = self.search.find, self.search.remove
        text_only_to_come = self.text_only_to_come
        for length, count, todo, shortest in runs:
            if text_only_to_come and count == 0:
                # the text-only samples: from now on, fewest image slots first
                self.search = SlotLevels(states, max_length, max_images)
                self.text_only_to_come = text_only_to_come = False
                find, remove = self.search.find, self.search.remove
            start = length
            while todo:
                # 1. the state to take packs from, and how many of its packs come first
                found = find(length, count, start)
                if found is None:
                    break
                room, slots, state, first = found
                start = room
                # 2. its first packs each take as many items as fit
                per_pack = room // length
                if count and slots // count < per_pack:
                    per_pack = slots // count
                if todo <= per_pack:  # the first pack takes the whole run: most runs are one item
                    numbers = [state.pop(0)]
                    full, rest = 0, todo
                else:
                    use = -(-todo // per_pack)  # the packs the run needs (no min(): a call)
                    if use > first:
                        use = first
                    numbers = state[:use]
                    del state[:use]
                    full = todo // per_pack
                    if full > use:
                        full = use
                    rest = todo - full * per_pack  # what the last pack takes, if not full
                if not state:
                    del states[room, slots]
                    remove(room, slots)
                # 3. they move to their new state (less room, or fewer image slots), unless
                #    they have less room than the shortest item to come: then they are full
                packs += numbers
                if full:
                    takes += [per_pack] * full
                    left = room - per_pack * length
                    if left >= shortest:
                        file(left, slots - per_pack * count, numbers[:full])
                    todo -= full * per_pack
                if full < len(numbers):  # the last pack takes the rest of the run
                    takes.append(rest)
                    left = room - rest * length
                    if left >= shortest:
                        file(left, slots - rest * count, numbers[full:])
                    todo = 0
            if not todo:
                continue
            # 4. new packs for the rest of the run
            if todo * length <= max_length and todo * count <= max_images:
                # one new pack takes the rest (most runs): Placements.open_new's first case
                pack = placed.open_one(todo)
                left = max_length - todo * length
                if left >= shortest:
                    file(left, max_images - todo * count, [pack])
                continue
            self.open_new(length, count, todo, shortest)

    def open_new(self, length: int, count: int, todo: int, shortest: int) -> None:
        """New packs for the rest of a run (`Placements.open_new`), filed by their state."""
        max_length, max_images = self.budgets
        for numbers, take in self.placed.open_new(todo, (length, count), self.budgets):
            left = max_length - take * length
            if left >= shortest:
                self.file(left, max_images - take * count, list(numbers))

    def file(self, room: int, slots: int, numbers: list[int]) -> None:
        """Packs now in state (room, slots) wait there (the callers leave out the packs with
        less room than the shortest item to come: they are full for good)."""
        state = self.states.get((room, slots))
        if state is None:
            self.states[room, slots] = numbers
            self.search.add(room, slots)
            return
        in_order = numbers[0] > state[-1]  # keep the state's numbers in increasing order
        state.extend(numbers)
        if not in_order:
            state.sort()


def best_fit_runs(
    runs, max_length: int, max_images: int, strategy: str, placed: Placements, opened
) -> None:
    """bfd or images_first_bfd over the runs (length, image count, items, shortest after).

    bfd: the pack with the least token room left that fits (ties: lowest number). images_first:
    for a sample with images as bfd, ties to the most image slots left; for a text-only sample
    the fewest image slots left, ties to the least token room (see packers' docstring).
    `opened`: (room, image slots) of the packs `placed` opened already, by number.
    """
    fit = BestFit(runs, max_length, max_images, strategy, placed)
    shortest = min(length for length, _, _, _ in runs)
    states = {}  # the packs opened already, by state: filed once a state
    for pack, state in enumerate(zip(*opened)):
        states.setdefault(state, []).append(pack)
    for (room, slots), numbers in states.items():
        if room >= shortest:
            fit.file(room, slots, numbers)
    fit.place(runs)
