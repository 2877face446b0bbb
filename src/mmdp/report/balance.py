"""How evenly the ranks share each step (rank_balance), and the min / max / mean / std of a list
(spread): the balance stage 5 and the grouped padded batches report."""

import numpy as np


def spread(values) -> dict:
    """min / max / mean / std of a list of numbers (zeros for an empty list)."""
    values = np.asarray(values, dtype=np.float64)
    if values.size == 0:
        return {"min": 0, "max": 0, "mean": 0.0, "std": 0.0}
    return {
        "min": int(values.min()) if float(values.min()).is_integer() else float(values.min()),
        "max": int(values.max()) if float(values.max()).is_integer() else float(values.max()),
        "mean": round(float(values.mean()), 3),
        "std": round(float(values.std()), 3),
    }


def rank_balance(loads: dict, world_size: int) -> dict:
    """How evenly each step's work is shared between ranks.

    `loads[name][step][rank]`: what each rank's batch holds at each step, for name in tokens,
    images and patches (the vision encoder's). Returns the batches per rank and, over the steps,
    the spread (max - min over ranks) of each.

    >>> loads = {"tokens": [[8, 8], [7, 6]], "images": [[2, 1], [0, 3]]}
    >>> rank_balance(loads, world_size=2)["image_spread_per_step"]
    {'min': 1, 'max': 3, 'mean': 2.0, 'std': 1.0}
    """
    balance = {"world_size": world_size}
    for name, per_step in loads.items():
        per_step = np.asarray(per_step, dtype=np.int64).reshape(-1, world_size)
        balance["batches_per_rank"] = [len(per_step)] * world_size
        spreads = per_step.max(axis=1) - per_step.min(axis=1)
        balance[f"{name.removesuffix('s')}_spread_per_step"] = spread(spreads)
    return balance
