"""While local rank 0 of a machine weighs the rows, the other local ranks of the machine wait
for its cache (mmdp.weighing.weigh, without a collective call): they raise at once if it
stopped while weighing, or after a timeout."""

import json
import socket
import time
from datetime import timedelta
from pathlib import Path

from mmdp.weighing.cache import is_complete, process_exists


def wait_for(path: Path, local_rank: int, timeout: timedelta, poll_seconds: float) -> None:
    """Wait until local rank 0 of this machine has saved the weights under `path`; raise at
    once if it stopped while weighing (its process is gone), or after `timeout`, looking every
    `poll_seconds`."""
    deadline = time.monotonic() + timeout.total_seconds()
    if not is_complete(path):
        print(f"local rank {local_rank}: waiting for local rank 0 to weigh the rows", flush=True)
    while not is_complete(path):
        gone = weigher_gone(path.with_name(f"{path.name}.weigher"))
        if gone is not None:
            raise RuntimeError(
                f"local rank {local_rank}: local rank 0 (pid {gone}) stopped while weighing the "
                f"rows into {path}; its own error says why"
            )
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"local rank {local_rank} waited {timeout} for local rank 0 to weigh "
                f"the rows into {path}; did local rank 0 build the same dataset?"
            )
        time.sleep(poll_seconds)


def weigher_gone(weigher: Path) -> int | None:
    """The pid of the process of this machine that was weighing, if it no longer runs."""
    try:
        who = json.loads(weigher.read_text())
    except (OSError, ValueError):  # nobody is weighing yet, or the file is being written
        return None
    if who.get("host") != socket.gethostname():
        return None  # a cache shared with another machine: its processes cannot be seen
    return None if process_exists(who["pid"]) else who["pid"]
