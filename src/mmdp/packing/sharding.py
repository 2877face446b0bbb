"""Ranks: which rank this is, and whether every rank still has a batch. Both loaders (planned and
streaming) use these, and stage 3's grouped batches.
"""

import os

import torch
import torch.distributed as dist


def rank_and_world_size(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """The rank and world size given, else torch.distributed's when it is initialised, else
    (0, 1): a dataset works unchanged under torchrun."""
    distributed = dist.is_available() and dist.is_initialized()
    if rank is None:
        rank = dist.get_rank() if distributed else 0
    if world_size is None:
        world_size = dist.get_world_size() if distributed else 1
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not in [0, world_size={world_size})")
    return rank, world_size


def all_ranks_have_a_batch(have_one: bool, group=None) -> bool:
    """True when every rank has a batch for this step: one all-reduce (MIN) of a 0/1 flag."""
    on_gpu = dist.get_backend(group) == "nccl"
    device = torch.device("cuda", torch.cuda.current_device()) if on_gpu else torch.device("cpu")
    flag = torch.tensor([int(have_one)], device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=group)
    return bool(flag.item())


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
