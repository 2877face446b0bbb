"""Pack one buffer of a stream (steps 2-3 of mmdp.loading.streaming.loader): pure, weights
in, packs out. The planner's own steps (filter_rows, shuffle_and_pack), applied to one buffer."""

import dataclasses
from collections import Counter

import numpy as np

from mmdp.packing.packing_config import PackingConfig
from mmdp.packing.weights import Weights
from mmdp.planning.planner import filter_rows, shuffle_and_pack


def pack_buffer(
    weights: Weights,
    rng: np.random.Generator,
    config: PackingConfig | None = None,
) -> tuple[list[np.ndarray], Counter]:
    """Steps 2-3 for one buffer: its packs (positions in the buffer) and its drops, by reason.

    The planner's own steps (filter_rows, shuffle_and_pack) on the buffer's weights. Same buffer,
    same rng state: same packs. Example: lengths [3, 9, 6, 2, 5], no images, max_length 8,
    "binpack": row 1 is too long; FFD takes 6, 5, 3, 2 and makes the packs [2, 3] (6 + 2) and
    [4, 0] (5 + 3), in a shuffled order; dropped {"too_long": 1}.
    """
    config = PackingConfig() if config is None else config
    rows, dropped = filter_rows(weights, config.budgets)
    whole_buffer = dataclasses.replace(config, buffer_size=max(len(weights), 1))
    packed_rows, pack_starts, order = shuffle_and_pack(rows, weights, rng, whole_buffer)
    starts = pack_starts.tolist()
    return [packed_rows[starts[p] : starts[p + 1]] for p in order.tolist()], dropped
