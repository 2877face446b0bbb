"""Ranks: which rank this is, and whether every rank still has a batch. Both loaders (planned and
streaming) use these, and stage 3's grouped batches.
"""

import os
import time
from contextlib import contextmanager
from datetime import timedelta

import torch
import torch.distributed as dist

from mmdp.errors import RanksStoppedAnswering

# How long a rank waits for the others at the end-of-data check of a step (streaming); a rank
# that takes longer between two steps (a long evaluation, a checkpoint) needs more.
ANSWER_TIMEOUT = timedelta(minutes=10)


def rank_and_world_size(rank: int | None, world_size: int | None, group=None) -> tuple[int, int]:
    """The rank and world size given, else this process's rank and size in `group` (the
    data-parallel process group; None: the whole world) when torch.distributed is initialised,
    else (0, 1): a dataset works unchanged under torchrun.

    Data is sharded over data-parallel replicas, not over processes: with tensor parallelism the
    ranks that hold shards of one replica read the same batches, so pass that group
    (`mesh.get_group("dp")` of a DeviceMesh) or its rank and size.
    """
    distributed = dist.is_available() and dist.is_initialized()
    if group is not None and not distributed:
        raise ValueError("a process group was given, but torch.distributed is not initialised")
    if rank is None:
        rank = dist.get_rank(group) if distributed else 0
        if rank < 0:  # dist.get_rank's answer for a process outside the group
            raise ValueError("this process is not in the process group it was given")
    if world_size is None:
        world_size = dist.get_world_size(group) if distributed else 1
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not in [0, world_size={world_size})")
    return rank, world_size


def all_ranks_have_a_batch(
    have_one: bool, group=None, timeout: timedelta = ANSWER_TIMEOUT, step: int = 0
) -> bool:
    """True when every rank has a batch for this step: one all-reduce (MIN) of a 0/1 flag.

    A rank that does not take part within `timeout` (it died, hangs, or was stopped) raises
    RanksStoppedAnswering on the others, naming it, instead of a wait as long as the process
    group's (30 minutes by default, forever for NCCL without its watchdog)."""
    on_gpu = dist.get_backend(group) == "nccl"
    device = torch.device("cuda", torch.cuda.current_device()) if on_gpu else torch.device("cpu")
    flag = torch.tensor([int(have_one)], device=device)
    work = dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=group, async_op=True)
    with ranks_answering(group, f"step-{step}", f"at step {step}", "the end-of-data all-reduce"):
        work.wait(timeout)
    return bool(flag.item())


@contextmanager
def ranks_answering(group, tag: str, when: str, collective: str):
    """Run collectives of `group`; if one fails (a rank died, hangs past the timeout, or was
    stopped), raise RanksStoppedAnswering naming the ranks that stopped answering, e.g.
    "rank 0: rank 1 stopped answering at step 7 (the end-of-data all-reduce failed: ...)".
    `tag` names this place for silent_ranks (the same on every rank)."""
    try:
        yield
    except Exception as error:  # gloo and NCCL raise several kinds (timeout, closed connection)
        cause = (str(error).strip().splitlines() or [error.__class__.__name__])[0][:200]
        raise RanksStoppedAnswering(
            f"rank {dist.get_rank()}: {silent_ranks(group, tag)} stopped answering {when} "
            f"({collective} failed: {cause})"
        ) from None


def start_ranks() -> int:
    """Under torchrun, join the process group (one process per rank, gloo: CPU is enough for
    what a data pipeline exchanges); return this rank (0 outside torchrun)."""
    if "RANK" in os.environ and not dist.is_initialized():
        dist.init_process_group("gloo")
    return dist.get_rank() if dist.is_initialized() else 0


def gather_from_ranks(value) -> list:
    """[value of rank 0, value of rank 1, ...] on every rank; [value] outside torchrun."""
    if not (dist.is_available() and dist.is_initialized()):
        return [value]
    values = [None] * dist.get_world_size()
    dist.all_gather_object(values, value)
    return values


def silent_ranks(group, tag: str, wait_seconds: float = 5.0) -> str:
    """Which ranks stopped answering, asked through the process group's store: every rank still
    running leaves its name under `tag`; those that have not after `wait_seconds` are silent.
    Returns e.g. "rank 1", "ranks 1, 3", or "another rank" when the store cannot tell."""
    try:
        store = dist.distributed_c10d._get_default_store()  # torchrun's rendezvous store
        ranks = dist.get_process_group_ranks(group or dist.group.WORLD)
        store.set(f"mmdp/answering/{tag}/{dist.get_rank()}", "1")
        deadline = time.monotonic() + wait_seconds
        while True:
            silent = [r for r in ranks if not store.check([f"mmdp/answering/{tag}/{r}"])]
            if not silent or time.monotonic() > deadline:
                break
            time.sleep(0.1)
    except Exception:  # the store went with the rank that hosted it: nothing more to learn
        return "another rank"
    if not silent:
        return "another rank"
    return ("rank " if len(silent) == 1 else "ranks ") + ", ".join(map(str, silent))
