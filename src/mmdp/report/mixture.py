"""The per-source part of the epoch report of a mixture (mmdp.data.mixture): each source's rows,
drops, samples, tokens and share, asked vs realised, overall and per rank."""

import numpy as np

from mmdp.data.mixture import MixedRows
from mmdp.packing.mixture_plan import MixturePlan
from mmdp.packing.planner import Weights, filter_rows


def source_report(
    mixed: MixedRows,
    plan: MixturePlan,
    weights,
    sample_index_per_rank: list[list[int]],
    *,
    budgets: dict,
    epoch: int = 0,
) -> list[dict]:
    """Per source, for the epoch report and its JSON: rows, dropped by reason (over a budget or
    unusable, left out by the mixture, left out to equalise ranks), samples yielded (a repeated
    row counts each time) and their tokens, and the share asked vs realised (in the mixture's
    unit), overall and per rank. `sample_index_per_rank`: the rows every rank yielded."""
    usable, _ = filter_rows(weights, **budgets)
    chosen = plan.choose(usable, weights.lengths, epoch)
    amounts = weights.lengths if plan.share_by == "tokens" else np.ones_like(weights.lengths)
    yielded = [np.asarray(rows, dtype=np.int64) for rows in sample_index_per_rank]
    every = np.concatenate(yielded)
    count = len(plan.shares)

    def by_source(rows, per_row):
        return np.bincount(plan.source_of_row[rows], per_row[rows], minlength=count)

    shares_per_rank = [by_source(r, amounts) / max(by_source(r, amounts).sum(), 1) for r in yielded]
    share = by_source(every, amounts) / max(by_source(every, amounts).sum(), 1)
    report = []
    for s, source in enumerate(mixed.mixture.sources):
        mine = plan.source_of_row == s
        part = Weights(
            *(a[mine] for a in (weights.lengths, weights.image_counts, weights.reasons)),
            patch_counts=weights.patch_counts[mine],
        )
        _, dropped = filter_rows(part, **budgets)
        left_out = int(mine[usable].sum()) - len(np.intersect1d(usable[mine[usable]], chosen))
        unequal = int(mine[chosen].sum()) - int(mine[every].sum())
        dropped.update({"left_out_by_mixture": left_out, "left_out_to_equalise_ranks": unequal})
        report.append(
            {
                "source": source.name,
                "dataset": source.dataset,
                "rows": int(mine.sum()),
                "dropped": {k: v for k, v in sorted(dropped.items()) if v},
                "samples": int(mine[every].sum()),
                "rows_repeated": int(mine[every].sum()) - len(np.unique(every[mine[every]])),
                "tokens": int(by_source(every, weights.lengths)[s]),
                "asked_share": round(float(plan.shares[s]), 4),
                "realised_share": round(float(share[s]), 4),
                "realised_share_per_rank": [round(float(r[s]), 4) for r in shares_per_rank],
                "loss_weight": source.loss_weight,
                "labels": source.labels,
            }
        )
    return report


def format_source_report(report: list[dict], share_by: str) -> str:
    """The per-source table of the epoch report."""
    lines = [
        f"{'source':<14}{'rows':>7}{'samples':>9}{'tokens':>10}{'asked':>8}{'realised':>10}"
        f"  per rank ({share_by})  dropped"
    ]
    for r in report:
        per_rank = ", ".join(f"{x:.1%}" for x in r["realised_share_per_rank"])
        dropped = ", ".join(f"{n:,} {reason}" for reason, n in r["dropped"].items()) or "-"
        lines.append(
            f"{r['source']:<14}{r['rows']:>7,}{r['samples']:>9,}{r['tokens']:>10,}"
            f"{r['asked_share']:>8.1%}{r['realised_share']:>10.1%}  {per_rank}  {dropped}"
        )
    return "\n".join(lines)
