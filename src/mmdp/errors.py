"""Errors reported as one sentence: those a user can fix (a wrong --dataset, no network), a
DataLoader worker that failed (mmdp.packing.workers names it, its batch and why), and a rank that
stopped answering the others (mmdp.packing.sharding names it)."""

import contextlib
import sys


class UserError(Exception):
    """A problem with the user's input or environment; the message says what to do."""


class WorkerFailed(RuntimeError):
    """A DataLoader worker raised or died; the message names the worker, the batch and why, and
    `worker_traceback` keeps the worker's own traceback for whoever debugs it."""

    def __init__(self, message: str, worker_traceback: str = ""):
        super().__init__(message)
        self.worker_traceback = worker_traceback


class RanksStoppedAnswering(RuntimeError):
    """Another rank did not take part in a collective in time; the message says which."""


@contextlib.contextmanager
def exit_on_user_error():
    """Print a UserError (exit status 2), a WorkerFailed or a RanksStoppedAnswering (status 1) as
    one line and exit, instead of a traceback."""
    try:
        yield
    except UserError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    except (WorkerFailed, RanksStoppedAnswering) as error:
        print(f"{type(error).__name__}: {error}", file=sys.stderr)
        sys.exit(1)
