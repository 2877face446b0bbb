"""Ranks: which rank this is, and whether every rank still has a batch. Both loaders (planned and
streaming) use these.
"""

import torch
import torch.distributed as dist


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


def all_ranks_have_a_batch(have_one: bool, group=None) -> bool:
    """True when every rank has a batch for this step: one all-reduce (MIN) of a 0/1 flag."""
    on_gpu = dist.get_backend(group) == "nccl"
    device = torch.device("cuda", torch.cuda.current_device()) if on_gpu else torch.device("cpu")
    flag = torch.tensor([int(have_one)], device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=group)
    return bool(flag.item())
