"""When every rank weighs a share of the rows (mmdp.weighing.weigh, across_ranks=True): the
shares cross as CPU tensors over a gloo group, whatever the training backend, and every rank
gets every row's weights."""

from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist

from mmdp.ranks import ranks_answering
from mmdp.weighing.cache import ARRAYS


def gloo_group(timeout: timedelta):
    """A gloo group of every rank, with its own timeout: the shares cross as CPU tensors,
    whatever the training backend, and a rank that stops answering fails the others after
    `timeout` (gloo fails them at once when its process is gone)."""
    return dist.new_group(backend="gloo", timeout=timeout)


def gather_shares(mine: dict, cold: list[int], num_rows: int, group, during: str) -> dict:
    """Every row's weights, from the shares: cold rank k weighed rows k, k + C, k + 2C, ...
    (C cold ranks); the other ranks send nothing. `during`: what the ranks were doing, for the
    error when one stops answering."""
    longest = -(-num_rows // len(cold))
    sent = torch.zeros(longest, len(ARRAYS), dtype=torch.int32)
    for column, name in enumerate(ARRAYS):
        sent[: len(mine[name]), column] = torch.from_numpy(mine[name].astype(np.int32))
    received = [torch.zeros_like(sent) for _ in range(dist.get_world_size(group))]
    with ranks_answering(group, "weighing-shares", during, "the gather of the weights"):
        dist.all_gather(received, sent, group=group)
    whole = torch.zeros(num_rows, len(ARRAYS), dtype=torch.int32)
    for k, rank in enumerate(cold):
        count = len(range(k, num_rows, len(cold)))
        whole[k :: len(cold)] = received[rank][:count]
    return {name: whole[:, column].numpy() for column, name in enumerate(ARRAYS)}
