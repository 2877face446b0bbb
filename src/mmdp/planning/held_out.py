"""The rows held out for evaluation: the same on every rank and in every run, from the seed alone."""

import numpy as np

EVAL_SPLIT_STREAM = 11  # a seed word of the eval split's own: it never replays a shuffle


def eval_split(
    num_rows: int, eval_ratio: float, seed: int, source_of_row: np.ndarray | None = None
) -> np.ndarray:
    """The rows held out for evaluation, as a bool mask [num_rows]: round(eval_ratio x rows) of
    them (of each source's rows, in a mixture, so that every source is evaluated), drawn with
    (seed, EVAL_SPLIT_STREAM). Deterministic: the same on every rank and in every run with this
    seed, whatever the budgets, ranks and epochs (the training split is the rest).

    >>> eval_split(10, 0.3, seed=0).sum()
    np.int64(3)
    """
    if not 0 <= eval_ratio < 1:
        raise ValueError(f"eval_ratio must be in [0, 1), got {eval_ratio}")
    held_out = np.zeros(num_rows, dtype=bool)
    rng = np.random.default_rng([seed, EVAL_SPLIT_STREAM])
    sources = np.zeros(num_rows, np.int16) if source_of_row is None else source_of_row
    for source in np.unique(sources):
        rows = np.flatnonzero(sources == source)
        held_out[rng.choice(rows, size=round(eval_ratio * len(rows)), replace=False)] = True
    if eval_ratio and not held_out.any():
        raise ValueError(f"eval_ratio {eval_ratio} of {num_rows:,} rows holds out no row")
    return held_out
