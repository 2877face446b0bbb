import gc
import threading
import time

import pytest
from torch.utils.data import DataLoader

from mmdp.loading.background import iterate_in_background
from mmdp.loading.toy import ToyPackingDataset


def producer_threads():
    return [t for t in threading.enumerate() if t.name == "mmdp-producer"]


def wait_for_no_producer(seconds=2.0):
    deadline = time.monotonic() + seconds
    while producer_threads() and time.monotonic() < deadline:
        time.sleep(0.01)
    return producer_threads()


def test_items_arrive_in_order():
    assert list(iterate_in_background(lambda: iter(range(100)), max_queued=3)) == list(range(100))


class PackingFailed(Exception):
    pass


def test_a_producer_error_reaches_the_consumer_promptly():
    def produce():
        yield 1
        yield 2
        raise PackingFailed("item 7 is longer than the token budget")

    start = time.monotonic()
    received = []
    with pytest.raises(PackingFailed, match="item 7") as error:
        for item in iterate_in_background(produce):
            received.append(item)
    assert received == [1, 2]
    assert time.monotonic() - start < 1.0
    # the original traceback points into the producer
    assert "produce" in [frame.name for frame in error.traceback]
    assert not wait_for_no_producer()


def test_an_error_before_the_first_item_does_not_hang():
    def produce():
        raise PackingFailed("at once")
        yield  # pragma: no cover

    with pytest.raises(PackingFailed):
        next(iter(iterate_in_background(produce)))


def endless():
    n = 0
    while True:
        yield n
        n += 1


def test_breaking_out_stops_the_producer():
    for item in iterate_in_background(endless, max_queued=2):
        if item == 5:
            break
    assert not wait_for_no_producer()


def test_garbage_collection_stops_the_producer():
    stream = iterate_in_background(endless, max_queued=2)
    assert next(stream) == 0
    del stream
    gc.collect()
    assert not wait_for_no_producer()


def test_toy_dataset_with_two_workers_yields_every_item_once():
    for strategy in ("greedy", "binpack"):
        dataset = ToyPackingDataset(1, 101, max_length=100, strategy=strategy, buffer_size=7)
        packs = list(DataLoader(dataset, batch_size=None, num_workers=2))
        items = sorted(int(i) for p in packs for i in p)
        assert items == list(range(1, 101))
        assert all(sum(int(i) for i in p) <= 100 for p in packs)


def test_toy_dataset_reproduces_the_blog_without_workers():
    greedy = [list(p) for p in DataLoader(ToyPackingDataset(strategy="greedy"), batch_size=None)]
    binpack = [list(p) for p in DataLoader(ToyPackingDataset(strategy="binpack"), batch_size=None)]
    assert greedy == [list(range(1, 14)), list(range(14, 20)), list(range(20, 24)), [24]]
    assert binpack == [
        [24, 23, 22, 21, 10],
        [20, 19, 18, 17, 16, 9, 1],
        [15, 14, 13, 12, 11, 8, 7, 6, 5, 4, 3, 2],
    ]


def test_an_item_over_the_token_budget_fails_the_epoch_with_its_name():
    dataset = ToyPackingDataset(1, 30, max_length=25, strategy="binpack")
    with pytest.raises(ValueError, match="longer than the token budget"):
        list(DataLoader(dataset, batch_size=None))
