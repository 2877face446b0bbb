"""Open the files a row names: local paths, `file://` URLs, and remote ones through fsspec
(`s3://`, `gs://`, `hf://`, `https://`...), read the way a data engineer reads a bucket.

A row's image or video is a {"bytes", "path"} cell (mmdp.data.reading.sources); a cell without bytes
is read from its path. A remote file is read in one of three ways:

    read_range(path, start, end)  one ranged GET: what weighing reads of an image (its header,
                                  mmdp.data.images.open_image: the first HEADER_BYTES, more only
                                  when the header runs past them)
    read_whole(path)              the whole file in one GET: what building a sample decodes
    open_remote(path)             a file object that fetches BLOCK_BYTES blocks as it is read:
                                  for PyAV, which seeks in a video to read its header

Each read is tried READ_ATTEMPTS times, with a growing pause, when the store does not answer (a
connection refused or reset, a timeout, a 5xx); a file that still fails raises UnreachableFile,
which the images' and videos' readers turn into the drop reason `unreachable_file`, counted like
any other. A missing file (404) or a refused one (403) is not retried: it is the file, not the
network, and it is undecodable as a missing local file is.

`in_flight(read, cells)` reads many cells' headers at once: REQUESTS_IN_FLIGHT requests wait on
the network together when any cell is remote (weighing a batch of rows: mmdp.data.families.base).

The store's address and credentials come from the environment, as fsspec and each store's own
library read them: for S3, AWS_ENDPOINT_URL, AWS_PROFILE or AWS_ACCESS_KEY_ID... (s3fs needs the
`s3` extra: pip install 'mmdp[s3]'); gs:// needs gcsfs; hf:// and https:// work with what
`datasets` installs.

`STATS` counts, in this process, the requests made, the bytes they brought, the retries and the
files given up on: bench/bench_remote.py reads them.
"""

import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from mmdp.errors import UserError

# What a first read of an image fetches: the header of nearly every PNG and JPEG (a camera's
# EXIF with its thumbnail can run past it: then 4x more, and so on). A few KB more cost nothing
# next to a request's latency (tens of ms on S3), a request more costs that latency again.
HEADER_BYTES = 16 * 1024
# The blocks a video's file object fetches as PyAV reads and seeks in it (its header may sit
# at the end of the file: an MP4's moov box when it was not written first).
BLOCK_BYTES = 256 * 1024
# Requests waiting on the network together when a batch of remote headers is read.
REQUESTS_IN_FLIGHT = 32
# Tries of one read before the file is given up as unreachable, and the pause before the
# second try (doubled before each next one: 0.2, 0.4 s).
READ_ATTEMPTS = 3
FIRST_PAUSE_SECONDS = 0.2

# Not retried: the file is missing or refused, trying again changes nothing.
PERMANENT = (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError)

STATS = Counter()  # requests, bytes, retries, unreachable: in this process
_stats_lock = threading.Lock()


class UnreachableFile(Exception):
    """A remote file that did not answer after READ_ATTEMPTS tries."""

    def __init__(self, path: str, error: BaseException):
        super().__init__(
            f"{path}: no answer after {READ_ATTEMPTS} tries ({error.__class__.__name__}: {error})"
        )
        self.path = path


def is_remote(path: str) -> bool:
    """Whether `path` names a file through a protocol other than the local disk.

    >>> [is_remote(p) for p in ("s3://b/a.png", "https://x/a.png", "file:///a.png", "/a.png")]
    [True, True, False, False]
    """
    return "://" in path and not path.startswith("file://")


def local_path(path: str) -> str:
    """A local path as the operating system names it: file:// removed, ~ expanded.

    >>> local_path("file:///data/a.png")
    '/data/a.png'
    """
    return str(Path(path.removeprefix("file://")).expanduser())


def protocol(path: str) -> str:
    """The protocol of a remote path ("s3", "https"...)."""
    return path.split("://", 1)[0]


def require_protocol(name: str) -> None:
    """One sentence, before any file is read, when a protocol's fsspec package is missing."""
    import fsspec

    try:
        fsspec.get_filesystem_class(name)
    except (ImportError, ValueError) as error:
        extra = " (pip install 'mmdp[s3]')" if name in ("s3", "s3a") else ""
        raise UserError(
            f"the dataset names {name}:// files, which need a package fsspec does not find: "
            f"{error}{extra}"
        ) from None


def count(**amounts: int) -> None:
    with _stats_lock:
        STATS.update(amounts)


def with_retries(read: Callable[[], bytes], path: str) -> bytes:
    """read(), tried READ_ATTEMPTS times while the store does not answer."""
    pause = FIRST_PAUSE_SECONDS
    for attempt in range(1, READ_ATTEMPTS + 1):
        try:
            data = read()
        except PERMANENT:
            raise
        except Exception as error:  # each store's library has its own kinds (aiohttp, botocore)
            if attempt == READ_ATTEMPTS:
                count(unreachable=1)
                raise UnreachableFile(path, error) from error
            count(retries=1)
            time.sleep(pause)
            pause *= 2
        else:
            count(requests=1, bytes=len(data))
            return data
    raise AssertionError("unreachable")


def filesystem(path: str):
    """(the fsspec filesystem of `path`, the path inside it), configured as the user configured
    fsspec (its FSSPEC_* variables), except that S3's client may hold REQUESTS_IN_FLIGHT
    connections (botocore's default, 10, would cap the requests in flight)."""
    import fsspec

    options = {}
    if protocol(path) in ("s3", "s3a"):
        config = dict(fsspec.config.conf.get("s3", {}).get("config_kwargs", {}))
        connections = max(config.get("max_pool_connections", 0), REQUESTS_IN_FLIGHT)
        options["config_kwargs"] = {**config, "max_pool_connections": connections}
    return fsspec.core.url_to_fs(path, **options)


def read_range(path: str, start: int, end: int) -> bytes:
    """Bytes [start, end) of a remote file (fewer at its end), in one ranged request."""
    fs, inner = filesystem(path)
    return with_retries(lambda: fs.cat_file(inner, start=start, end=end), path)


def read_whole(path: str) -> bytes:
    """A remote file's bytes, in one request."""
    fs, inner = filesystem(path)
    return with_retries(lambda: fs.cat_file(inner), path)


def read_header(path: str, parses: Callable[[bytes], object]):
    """parses(the file's first bytes): HEADER_BYTES first, then 4x as many while `parses` raises
    and the file has more, each time one ranged request for the bytes not yet read."""
    data, end = read_range(path, 0, HEADER_BYTES), HEADER_BYTES
    while True:
        try:
            return parses(data)
        except Exception:
            if len(data) < end:  # the whole file is read: its header is broken
                raise
        end *= 4
        # from the last byte read, so that the range starts inside the file even when it ends
        # exactly there (a range past the end is an error, not an empty answer, on S3)
        more = read_range(path, len(data) - 1, end)
        if len(more) <= 1:
            return parses(data)
        data += more[1:]


def open_remote(path: str):
    """A file object on a remote file, fetching BLOCK_BYTES blocks as it is read (opening it asks
    the store for its size: one request, retried)."""
    fs, inner = filesystem(path)
    opened = []

    def open_file() -> bytes:
        opened.append(fs.open(inner, "rb", block_size=BLOCK_BYTES, cache_type="readahead"))
        return b""

    with_retries(open_file, path)
    return opened[-1]


def in_flight(read: Callable, cells: Sequence) -> list:
    """[read(cell) for cell in cells], a result or the exception it raised for each: with up to
    REQUESTS_IN_FLIGHT cells read at once when any is a remote path (each remote path once: rows
    often share an image, as LLaVA's questions on one COCO photo do), one by one otherwise."""

    def outcome(cell):
        try:
            return read(cell)
        except Exception as error:  # handed back: the caller decides what each one means
            return error

    def remote_path(cell) -> str | None:
        if isinstance(cell, dict) and cell.get("bytes") is None:
            path = cell.get("path") or ""
            return path if is_remote(path) else None
        return None

    paths = {remote_path(cell) for cell in cells} - {None}
    if not paths:
        return [outcome(cell) for cell in cells]
    with ThreadPoolExecutor(min(REQUESTS_IN_FLIGHT, len(paths))) as pool:
        read_once = dict(zip(paths, pool.map(outcome, [{"bytes": None, "path": p} for p in paths])))
    return [read_once[remote_path(cell)] if remote_path(cell) else outcome(cell) for cell in cells]
