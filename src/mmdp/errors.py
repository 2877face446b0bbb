"""Errors reported as one sentence: those a user can fix (a wrong --dataset, no network, a
package only an extra installs), a DataLoader worker that failed (mmdp.loading.workers names
it, its batch and why), and a rank that stopped answering the others (mmdp.ranks names
it)."""

import contextlib
import importlib
import re
import sys


class UserError(Exception):
    """A problem with the user's input or environment; the message says what to do."""


class MissingExtra(UserError, ImportError):
    """A package that only one of mmdp's extras installs is not installed (an ImportError too)."""


# What each extra of pyproject.toml installs, for the module mmdp imports from it
# (tests/test_errors.py holds this to pyproject.toml).
EXTRAS = {
    "accelerate": "accelerate>=1.10",  # MMDPTrainer (transformers' Trainer), the accelerate recipe
    "lora": "peft>=0.21.2",  # LoRA adapters (PEFT) on the models MMDPTrainer trains
    "ray": "ray[data]>=2.50",  # python -m mmdp.prepare --engine ray (Ray Data)
    "s3": "s3fs>=2026.9.0",  # prepared datasets on S3 (fsspec's s3://)
    "video": "av>=14",  # rows with videos (PyAV decodes them)
}


def require_extra(module: str, extra: str, needed_by: str):
    """Import `module` and return it; without it, a MissingExtra in one sentence naming the
    extra that installs it:

    >>> require_extra("no_such_module", "video", "a row with a video")
    Traceback (most recent call last):
    ...
    mmdp.errors.MissingExtra: a row with a video needs no_such_module, which mmdp's video extra installs: uv sync --extra video in a checkout of mmdp (or pip install 'av>=14')
    """
    try:
        return importlib.import_module(module)
    except ImportError as error:
        raise MissingExtra(
            f"{needed_by} needs {module}, which mmdp's {extra} extra installs: uv sync --extra "
            f"{extra} in a checkout of mmdp (or pip install '{EXTRAS[extra]}')"
        ) from error


def first_sentence(error: BaseException) -> str:
    r"""The first sentence of an error's message, for one of ours (a library's may run over
    several sentences and lines):

    >>> first_sentence(OSError("We couldn't connect.\nCheck your connection."))
    "We couldn't connect"
    """
    lines = str(error).strip().splitlines()
    return re.split(r"(?<=[.!?])\s", lines[0], maxsplit=1)[0].rstrip(".") if lines else ""


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
