"""Which rows make an epoch of a mixture (mmdp.data.mixture): each source's usable rows, shuffled
with (seed, epoch, source), taken until the source's share of the epoch (in tokens or rows) is
met. mmdp.planning.planner calls MixturePlan.choose after filtering the rows (step 1), and
balances every source across ranks (step 3b) with its source_of_row."""

from dataclasses import dataclass

import numpy as np

MIX_STREAM = 7  # a third seed word: the mixture's draws never replay the packer's shuffle


def choose_rows(
    rows: np.ndarray,
    source_of_row: np.ndarray,
    amounts: np.ndarray,
    shares: np.ndarray,
    *,
    epoch_size: float | None,
    rng: np.random.Generator,
) -> np.ndarray:
    """The rows of one epoch (a row may repeat), from the usable `rows`: each source s gets
    shares[s] of the epoch, measured in `amounts` (each row's tokens, or ones for rows).

    1. Each source's usable amount A[s]; the epoch's total is `epoch_size`, or by default the
       largest with no row repeated: min over s of A[s] / shares[s].
    2. Source s's target T[s] = shares[s] * total: whole shuffled passes over its rows while
       T[s] >= A[s], then a shuffled prefix whose amount comes closest to what remains.

    Example: rows 0-3 of source 0 (10 tokens each), rows 4-5 of source 1 (20 each). Asked
    50/50: 80 tokens, every row. Asked 75/25: source 0 runs out first, the epoch is
    40 / 0.75 = 53.3 tokens; source 1's 13.3 are closer to one row (20) than to none.

    >>> lengths = np.array([10, 10, 10, 10, 20, 20])
    >>> source_of_row = np.array([0, 0, 0, 0, 1, 1])
    >>> rows = choose_rows(np.arange(6), source_of_row, lengths, np.array([0.75, 0.25]),
    ...                    epoch_size=None, rng=np.random.default_rng(0))
    >>> np.bincount(source_of_row[rows]).tolist()
    [4, 1]
    """
    chosen = []
    per_source = [rows[source_of_row[rows] == s] for s in range(len(shares))]
    available = np.array([amounts[r].sum() for r in per_source], dtype=np.float64)
    if epoch_size is None:
        epoch_size = (available / shares).min()
    for s, source_rows in enumerate(per_source):
        target = shares[s] * epoch_size
        if len(source_rows) == 0 or available[s] == 0:
            continue
        passes = int(target // available[s])
        chosen += [rng.permutation(source_rows) for _ in range(passes)]
        chosen.append(
            closest_prefix(rng.permutation(source_rows), amounts, target - passes * available[s])
        )
    return np.concatenate(chosen) if chosen else np.zeros(0, dtype=np.int64)


def closest_prefix(rows: np.ndarray, amounts: np.ndarray, target: float) -> np.ndarray:
    """The prefix of `rows` whose amount is closest to `target` (ties: the shorter).

    >>> closest_prefix(np.array([3, 1, 2]), np.array([0, 10, 20, 30]), 42).tolist()
    [3, 1]
    """
    totals = np.r_[0, np.cumsum(amounts[rows])]
    return rows[: int(np.argmin(np.abs(totals - target)))]


@dataclass(frozen=True)
class MixturePlan:
    """What mmdp.planning.planner needs of a mixture: which rows make an epoch (`choose`),
    and each row's source (to balance every source across ranks)."""

    source_of_row: np.ndarray
    shares: np.ndarray
    share_by: str
    epoch_size: int | None
    seed: int

    @classmethod
    def of(cls, mixed, seed: int = 0) -> "MixturePlan":
        """The plan of a mmdp.data.mixture.MixedRows (read for its sources' rows and shares:
        planning imports no data loading)."""
        m = mixed.mixture
        return cls(mixed.source_of_row, m.shares(), m.share_by, m.epoch_size, seed)

    def choose(self, rows: np.ndarray, lengths: np.ndarray, epoch: int) -> np.ndarray:
        amounts = lengths if self.share_by == "tokens" else np.ones_like(lengths)
        rng = np.random.default_rng([self.seed, epoch, MIX_STREAM])
        return choose_rows(
            rows, self.source_of_row, amounts, self.shares, epoch_size=self.epoch_size, rng=rng
        )
