"""Step 1 of mmdp.loading.streaming.loader: one reader's share of a stream (ReaderStream),
the data files behind a datasets stream (to name the one at fault), and where a reader is
(ReaderState: what a resume starts from)."""

import copy
import dataclasses
from collections.abc import Iterable
from itertools import islice

import datasets

from mmdp.data.reading.sources import first_line, first_unreadable
from mmdp.errors import UserError

END = object()  # the end of a plain iterable


class ReaderStream:
    """One reader's rows, as (row id, row) pairs, and where it is in the stream.

    `state` is what `state_dict()` returned earlier, to continue from (None: the start of the
    epoch). Row ids are unique in an epoch: for a plain iterable, the row's place in it; for a
    datasets.IterableDataset, (rows this reader took before it) * readers + reader.
    """

    def __init__(self, rows: Iterable[dict], reader: int, readers: int, state: dict | None):
        self.reader, self.readers = reader, readers
        self.rows_taken = state["rows"] if state else 0  # rows read from the stream so far
        if isinstance(rows, datasets.IterableDataset):
            # A copy, so that the resume point stays with this reader (copy.copy of a
            # datasets.IterableDataset shares its attributes: give it its own). Iterated inside
            # a DataLoader worker, datasets gives the worker its own shards.
            self.stream = copy.copy(rows)
            self.stream.__dict__ = dict(rows.__dict__)
            if state is not None:
                self.stream.load_state_dict(state["stream"])
            self.iterator = iter(self.stream)
        else:
            self.stream = None
            self.iterator = iter(rows)
            for _ in islice(self.iterator, self.rows_taken):  # read again up to where we were
                pass

    def take(self, n: int) -> list[tuple[int, dict]]:
        """The next n rows of this reader (fewer at the end), without reading one row further."""
        taken = []
        if self.stream is not None:
            try:
                for row in islice(self.iterator, n):
                    taken.append((self.rows_taken * self.readers + self.reader, row))
                    self.rows_taken += 1
            except Exception as error:  # a damaged or vanished file: say which, in one sentence
                raise UserError(self.unreadable(error)) from error
            return taken
        while len(taken) < n:  # a plain iterable: keep 1 row in `readers`
            row = next(self.iterator, END)
            if row is END:
                break
            if self.rows_taken % self.readers == self.reader:
                taken.append((self.rows_taken, row))
            self.rows_taken += 1
        return taken

    def unreadable(self, error: Exception) -> str:
        """Why the stream stopped: the data file at fault when one is, else the error itself."""
        named = first_unreadable(stream_files(self.stream))
        if named is not None:
            return named
        return (
            f"the stream failed after {self.rows_taken:,} rows of reader {self.reader} "
            f"({error.__class__.__name__}: {first_line(error)})"
        )

    def state_dict(self) -> dict:
        """Where this reader is: rows taken, and the datasets stream's own state."""
        stream = self.stream.state_dict() if self.stream is not None else None
        return {"rows": self.rows_taken, "stream": stream}

    def close(self) -> None:
        """Close the underlying generator now (a parquet reader, say), not at interpreter exit."""
        if hasattr(self.iterator, "close"):
            self.iterator.close()


def stream_files(stream: datasets.IterableDataset) -> list[str]:
    """The data files behind a datasets stream of files (parquet, arrow...), [] for others.

    datasets keeps them in the `files` argument of the innermost examples iterable (not public
    API: anything else gives [], and the error then names the reader instead of a file)."""
    files, iterable = [], getattr(stream, "_ex_iterable", None)
    while iterable is not None:
        for group in (getattr(iterable, "kwargs", None) or {}).get("files", []):
            files += [group] if isinstance(group, str) else [str(f) for f in group]
        iterable = getattr(iterable, "ex_iterable", None)
    return [f for f in files if "://" not in f]  # local files only: remote ones cannot be checked


@dataclasses.dataclass(frozen=True)
class ReaderState:
    """A reader's state as of producing a batch: what a resume starts from.

    buffer_start     the reader's state_dict() where the batch's last buffer starts (None: at the
                     start)
    buffer           that buffer's number in the reader's epoch (it seeds the buffer's shuffle)
    packs_done       how many of that buffer's packs are yielded with this batch
    rows_held        rows of that buffer's packs still to come (counted if the ranks stop now)
    ended            the reader has nothing more (its end of stream was seen)
    """

    worker: int
    buffer_start: dict | None = None
    buffer: int = 0
    packs_done: int = 0
    rows_held: int = 0
    ended: bool = False
