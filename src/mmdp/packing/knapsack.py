"""Stage 4's knapsacks as the blog writes them: integers (sequence lengths) in, packs of at most
`max_length` tokens out, one item at a time. Pure Python, no numpy, no torch.

    >>> list(greedy_packing([3, 6, 2, 5], max_length=8))  # in order: loads 3, 8, 5
    [[3], [6, 2], [5]]
    >>> bin_packing([3, 6, 2, 5], max_length=8)  # longest first, first fit: loads 8, 8
    [[6, 2], [5, 3]]

Both skip an item longer than `max_length`, as the blog does. `packs_in_background` is the blog's
producer-consumer: a thread packs while the caller consumes. These loops look at every open pack
for every item; `mmdp.pack` gives the same packs fast (numpy engines, as indices into the items),
under image and patch budgets too (stage 5). tests/test_knapsack.py holds them equal.
"""

import itertools
import queue
import threading
from collections.abc import Iterable, Iterator

TOY_STRATEGIES = ("greedy", "binpack")  # the blog's two loops, stage 4's --strategy
STOP = object()  # the blog's stop_signal: the producer has put its last pack


def greedy_packing(items: Iterable[int], max_length: int) -> Iterator[list[int]]:
    """The blog's `_greedy_packing`: walk the items in order, adding each to the pack until it
    does not fit, then start a new pack. Fast and streaming, but the last packs of a run of long
    items are left sparse."""
    pack, pack_sum = [], 0
    for item in items:
        if item > max_length:
            continue
        if pack_sum + item <= max_length:
            pack.append(item)
            pack_sum += item
        else:
            yield pack
            pack = [item]
            pack_sum = item
    if pack:
        yield pack


def bin_packing(buffer: list[int], max_length: int) -> list[list[int]]:
    """The blog's `_bin_packing`, first-fit decreasing: 1. sort the items longest first; 2. put
    each into the FIRST pack it fits in; 3. open a new pack when none has room. It must see the
    whole buffer before it can sort, so a stream is packed a buffer at a time."""
    knapsacks = []
    for item in sorted(buffer, reverse=True):
        if item > max_length:
            continue
        for pack in knapsacks:
            if sum(pack) + item <= max_length:
                pack.append(item)
                break
        else:
            knapsacks.append([item])
    return knapsacks


def producer(
    items: Iterable[int], max_length: int, strategy: str, packs: queue.Queue, buffer_size: int
) -> None:
    """The blog's `_producer`: pack the items, put each pack in the queue, then STOP."""
    items = iter(items)
    if strategy == "greedy":
        for pack in greedy_packing(items, max_length):
            packs.put(pack)
    elif strategy == "binpack":
        while buffer := list(itertools.islice(items, buffer_size)):
            for pack in bin_packing(buffer, max_length):
                packs.put(pack)
    packs.put(STOP)


def packs_in_background(
    items: Iterable[int], max_length: int, strategy: str = "greedy", buffer_size: int = 1000
) -> Iterator[list[int]]:
    """The consumer: start the producer thread, yield its packs from the queue until STOP, so
    that packing overlaps with whatever uses the packs.

    >>> list(packs_in_background(range(1, 7), 7, "binpack", buffer_size=3))  # 1 2 3 | 4 5 6
    [[3, 2, 1], [6], [5], [4]]

    The pattern at its simplest, for integers that cannot fail: were the producer to raise, this
    would wait forever. The library's loaders use mmdp.loading.background, which cannot hang.
    """
    if strategy not in TOY_STRATEGIES:
        raise ValueError(f"unknown strategy {strategy!r}; choose one of {TOY_STRATEGIES}")
    packs = queue.Queue(maxsize=16)  # bounded: the producer waits when it is far ahead
    args = (items, max_length, strategy, packs, buffer_size)
    threading.Thread(target=producer, args=args, daemon=True).start()
    while (pack := packs.get()) is not STOP:
        yield pack
