"""Packing an epoch's buffers in several processes: the planner's step 2 at scale.

Buffers are independent (a pack never crosses one), so ranges of whole buffers can be packed in
forked processes and their results put back in order: the same plan as one process makes
(tests/test_packing_engines.py). mmdp.planning.planner.pack_buffers decides how many
processes (`planning_workers`) and calls `pack_in_processes`, or `PackingJob.pack` in its own
process.
"""

import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

import numpy as np

from mmdp.packing.packers import pack_weights
from mmdp.packing.weights import Budgets, Weights

RANGE_ROWS = 1 << 20  # at most this many rows go to a process at a time


@dataclass
class PackingJob:
    """What packing a range of buffers needs: the weights, the budgets, the strategy."""

    weights: Weights
    budgets: Budgets  # a PackingConfig's, whole
    strategy: str
    buffer_size: int

    def pack(self, rows: np.ndarray) -> np.ndarray:
        """Pack `rows` buffer_size at a time, reordering them in place; the rows per pack."""
        weights, budgets, sizes = self.weights, self.budgets, []
        for start in range(0, len(rows), self.buffer_size):
            buffer = rows[start : start + self.buffer_size]
            lengths, images, patches = (column[buffer] for column in weights.columns())
            of_buffer = Weights(lengths, images, patch_counts=patches)
            items, starts = pack_weights(of_buffer, budgets, self.strategy)
            buffer[:] = buffer[items]  # buffer[items] is a copy: safe to write back
            sizes.append(np.diff(starts).astype(np.int32))
        return np.concatenate(sizes) if sizes else np.zeros(0, dtype=np.int32)


# Processes pack buffers only from this many on: below, starting them costs more than it saves
# (a buffer of 4,096 rows packs in a few ms; a forked process starts in tens of ms).
PARALLEL_MIN_BUFFERS = 256


def planning_workers(num_buffers: int) -> int:
    """How many processes pack `num_buffers` buffers: the cores this process may use, shared
    between the ranks of this machine (torchrun's LOCAL_WORLD_SIZE); 1 below
    PARALLEL_MIN_BUFFERS buffers, in a daemon process (a DataLoader worker may not start
    processes), and where processes cannot be forked (Windows)."""
    if (
        num_buffers < PARALLEL_MIN_BUFFERS
        or multiprocessing.current_process().daemon
        or "fork" not in multiprocessing.get_all_start_methods()
    ):
        return 1
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, (cores or 1) // int(os.environ.get("LOCAL_WORLD_SIZE", "1")))


_job: PackingJob | None = None  # a packing process's job, set once as it starts


def start_packing_process(job: PackingJob) -> None:
    global _job
    _job = job


def pack_range(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """In a packing process: a range of buffers' rows -> (rows in pack order, rows per pack)."""
    sizes = _job.pack(rows)
    return rows, sizes


def pack_in_processes(rows: np.ndarray, job: PackingJob, workers: int) -> list[np.ndarray]:
    """`job.pack` over ranges of whole buffers in `workers` processes, reordering `rows` in
    place; the rows per pack of each range, in order.

    The processes are forked, so they share the weights (copy on write, read only) instead of
    receiving them; each range's rows go and come back through a pipe (4 bytes a row each way).
    About four ranges per process, at most RANGE_ROWS rows each, so that a slow process holds
    the others up little.
    """
    num_buffers = -(-len(rows) // job.buffer_size)
    per_range = max(1, min(RANGE_ROWS // job.buffer_size, num_buffers // (4 * workers)))
    step = per_range * job.buffer_size
    bounds = [(a, min(a + step, len(rows))) for a in range(0, len(rows), step)]
    sizes = []
    with ProcessPoolExecutor(
        workers,
        mp_context=multiprocessing.get_context("fork"),
        initializer=start_packing_process,
        initargs=(job,),
    ) as pool:
        for (a, z), (packed, part_sizes) in zip(
            bounds, pool.map(pack_range, (rows[a:z] for a, z in bounds))
        ):
            rows[a:z] = packed
            sizes.append(part_sizes)
    return sizes
