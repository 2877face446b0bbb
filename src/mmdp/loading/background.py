"""The blog's producer-consumer pattern, done so that it cannot hang.

A producer thread runs a generator (packing is the slow part) and fills a bounded queue; the
consumer yields from the queue, so packing overlaps with whatever consumes the packs.

The naive version (a thread that `queue.put`s, a loop that `queue.get`s until a stop signal) has
three failure modes that cost users days, and this one has none of them:
- the producer raises: the naive consumer waits on `queue.get()` forever. Here the exception
  travels through the queue and is raised again in the consumer, with its original traceback.
- the consumer stops early (break, an exception, garbage collection): the naive producer blocks on
  a full queue forever, a leaked thread. Here it notices within `poll_seconds` and exits.
- the producer thread dies without a word: the consumer checks that it is alive while waiting.
"""

import queue
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import TypeVar

T = TypeVar("T")

_DONE = object()  # end-of-stream marker put by the producer


class _ProducerError:
    """Wraps an exception raised in the producer, to be raised again in the consumer."""

    def __init__(self, error: BaseException):
        self.error = error


def iterate_in_background(
    produce: Callable[[], Iterable[T]], max_queued: int = 16, poll_seconds: float = 0.05
) -> Iterator[T]:
    """Yield the items of `produce()`, computed in a producer thread, through a bounded queue."""
    items: queue.Queue = queue.Queue(maxsize=max_queued)
    stop = threading.Event()

    def put(item) -> bool:
        """Put unless asked to stop; returns False when the consumer is gone."""
        while not stop.is_set():
            try:
                items.put(item, timeout=poll_seconds)
                return True
            except queue.Full:
                continue
        return False

    def producer():
        try:
            for item in produce():
                if not put(item):
                    return
            put(_DONE)
        except BaseException as error:  # noqa: BLE001 - handed over to the consumer, not lost
            put(_ProducerError(error))

    thread = threading.Thread(target=producer, name="mmdp-producer", daemon=True)
    thread.start()
    try:
        while True:
            try:
                item = items.get(timeout=poll_seconds)
            except queue.Empty:
                if not thread.is_alive() and items.empty():
                    raise RuntimeError("the producer thread ended without finishing") from None
                continue
            if item is _DONE:
                return
            if isinstance(item, _ProducerError):
                raise item.error
            yield item
    finally:
        # Runs on normal end, on an exception, on break and on garbage collection (close()).
        stop.set()
        thread.join(timeout=10 * poll_seconds + 1)
