import gc
import threading
import time

import pytest

from mmdp.loading.background import iterate_in_background


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
