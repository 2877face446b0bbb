"""Stage 4's toy: integers as sequence lengths, packed by a producer thread in an IterableDataset."""

import itertools
import math

from torch.utils.data import IterableDataset, get_worker_info

from mmdp.loading.background import iterate_in_background
from mmdp.packing.packers import STRATEGIES, pack

# The blog's two strategies for the toy: next fit in order, and first-fit decreasing.
BLOG_TOY_STRATEGIES = ("greedy", "binpack")


class ToyPackingDataset(IterableDataset):
    """Yields packs (lists of ints) of the items start, start + 1, ..., end - 1.

    Each item is a sequence length; a pack holds items summing to at most `max_length`.
    The producer thread reads `buffer_size` items at a time, packs them and fills a bounded
    queue while the consumer yields. With DataLoader workers, each worker packs its own
    contiguous share of the range (the blog's sharding), so every item is yielded exactly once.
    """

    def __init__(self, start=1, end=25, max_length=100, strategy="greedy", buffer_size=1000):
        if strategy not in STRATEGIES:
            raise ValueError(
                f"unknown strategy {strategy!r}; choose one of {', '.join(STRATEGIES)}"
            )
        self.start, self.end = start, end
        self.max_length = max_length
        self.strategy = strategy
        self.buffer_size = buffer_size

    def data_range(self) -> tuple[int, int]:
        """This worker's share of [start, end): all of it without workers."""
        worker = get_worker_info()
        if worker is None:
            return self.start, self.end
        per_worker = math.ceil((self.end - self.start) / worker.num_workers)
        worker_start = self.start + worker.id * per_worker
        return worker_start, min(worker_start + per_worker, self.end)

    def produce_packs(self, items):
        items = iter(items)
        while buffer := list(itertools.islice(items, self.buffer_size)):
            for indices in pack(buffer, self.max_length, self.strategy):
                yield [buffer[i] for i in indices]

    def __iter__(self):
        start, end = self.data_range()
        return iterate_in_background(lambda: self.produce_packs(range(start, end)))
