"""A DataLoader worker that fails: one sentence naming the worker and the batch, at once.

torch reports a failed worker in two ways, neither of which says which batch was lost:
- the worker raised: "Caught ValueError in DataLoader worker process 1. Original Traceback
  (most recent call last): ..." (the worker's whole traceback, in the main process);
- the worker died (a segfault in native code, the OOM killer, kill -9): "DataLoader worker (pid
  4242) is killed by signal: Killed." or "DataLoader worker (pid(s) 4242) exited unexpectedly",
  which name a process id, not a worker. (A worker builds ahead: the batch named is the first
  one the main process did not receive, which the dead worker owed.)

Both loaders (PackedDataLoader, StreamingDataLoader) pass their DataLoader's batches through
`name_failed_worker`, which turns either into a WorkerFailed: "DataLoader worker 1 of rank 0
failed building batch 7: ValueError: boom". The worker's own traceback stays on the error
(`error.worker_traceback`) for whoever debugs it. The stage scripts print it as one line and exit
with status 1 (mmdp.errors.exit_on_user_error); under torchrun the rank exits with that error and
torchrun stops the other ranks.
"""

import os
import re
import sys
import tempfile
from collections.abc import Callable, Iterable, Iterator

import torch.multiprocessing

from mmdp.errors import UserError, WorkerFailed

# The longest path of a Unix socket: sun_path holds 108 bytes on Linux, 104 on macOS and the BSDs
SOCKET_PATH_LIMIT = 108 if sys.platform.startswith("linux") else 104
# what Python's multiprocessing adds to the temp folder for a worker's socket (util.get_temp_dir,
# connection.arbitrary_address): /pymp-XXXXXXXX/listener-XXXXXXXX
SOCKET_PATH_ADDED = len("/pymp-12345678/listener-12345678")
RAISED = re.compile(r"Caught (\w+) in DataLoader worker process (\d+)")
DIED = re.compile(r"DataLoader worker \(pid(?:\(s\))? (\d+)")


def name_failed_worker(batches: Iterable, where: Callable[[], tuple[int, int]]) -> Iterator:
    """The batches of a DataLoader's iterator, with a worker's failure raised as one
    WorkerFailed. `where()`: (rank, number of the batch about to be yielded)."""
    pids = [worker.pid for worker in getattr(batches, "_workers", [])]  # to name one that died
    iterator = iter(batches)
    while True:
        try:
            batch = next(iterator)
        except StopIteration:
            return
        except Exception as error:
            failed = worker_failure(str(error), *where(), pids)
            if failed is None:
                raise
            stop_workers(iterator)
            raise failed from None
        yield batch


def check_temp_folder(num_workers: int) -> None:
    """Refuse to start DataLoader workers that could never hand a batch over.

    A worker sends a batch's tensors to the main process as file descriptors (torch's default
    sharing strategy, file_descriptor: torch/multiprocessing/reductions.py, reduce_storage), through
    a Unix socket that Python's multiprocessing opens in the temp folder (resource_sharer). When the
    folder's path is too long for a socket, the bind fails in the worker's queue-feeding thread,
    which only prints the error: the batch never arrives and the main process waits forever.
    """
    if num_workers == 0 or torch.multiprocessing.get_sharing_strategy() != "file_descriptor":
        return
    folder = tempfile.gettempdir()
    most = SOCKET_PATH_LIMIT - SOCKET_PATH_ADDED
    if len(os.fsencode(folder)) > most:
        raise UserError(
            f"the temp folder {folder} is too long a path for DataLoader workers "
            f"({len(os.fsencode(folder))} bytes, at most {most}): they hand each batch over "
            "through a Unix socket in it, which cannot open there, and the loader would wait "
            "forever. Set TMPDIR to a shorter folder (TMPDIR=/tmp), or use num_workers=0"
        )


def stop_workers(iterator) -> None:
    """Stop the DataLoader's other workers now. The error's traceback keeps the iterator alive
    (its frame is on it), and torch would stop them only when the iterator is collected, waiting
    up to 5 s for each (torch/utils/data/dataloader.py, _shutdown_workers)."""
    shutdown = getattr(iterator, "_shutdown_workers", None)  # what torch's own __del__ calls
    if shutdown is not None:
        shutdown()


def worker_failure(text: str, rank: int, batch: int, pids: list[int]) -> Exception | None:
    """The WorkerFailed that torch's message `text` describes (a UserError when the worker
    raised one: its sentence, and where), or None if `text` is not about a worker.

    >>> text = "Caught ValueError in DataLoader worker process 1.\\nOriginal Traceback (most "
    >>> text += "recent call last):\\n  File ...\\nValueError: boom"
    >>> print(worker_failure(text, rank=0, batch=7, pids=[11, 12]))
    DataLoader worker 1 of rank 0 failed building batch 7: ValueError: boom
    >>> text = "DataLoader worker (pid 12) is killed by signal: Segmentation fault. "
    >>> print(worker_failure(text, rank=1, batch=3, pids=[11, 12]))
    DataLoader worker 1 of rank 1 died before delivering batch 3 (killed by signal: Segmentation fault)
    """
    raised = RAISED.search(text)
    if raised:
        name, worker = raised.groups()
        # the traceback's last line: "ValueError: boom", "mmdp.errors.UserError: ..."
        said = re.findall(rf"^(?:[\w.]*\.)?{name}: (.*)$", text, re.MULTILINE)
        cause = f"{name}: {said[-1]}" if said else name
        if name == UserError.__name__:  # a sentence for the user (a damaged data file...)
            where = f"rank {rank}, DataLoader worker {worker}, batch {batch}"
            return UserError(f"{said[-1] if said else text} ({where})")
        message = (
            f"DataLoader worker {worker} of rank {rank} failed building batch {batch}: {cause}"
        )
        return WorkerFailed(message, text)
    died = DIED.search(text)
    if died:
        pid = int(died[1])
        worker = pids.index(pid) if pid in pids else f"(pid {pid})"
        how = "exited unexpectedly" if "exited unexpectedly" in text else text[died.end() :]
        how = how.strip(" )").removeprefix("is ").rstrip(". ")
        return WorkerFailed(
            f"DataLoader worker {worker} of rank {rank} died before delivering batch {batch} ({how})",
            text,
        )
    if "DataLoader timed out" in text:
        return WorkerFailed(f"rank {rank}: no DataLoader worker delivered batch {batch}: {text}")
    return None
