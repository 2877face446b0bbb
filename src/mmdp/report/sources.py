"""The per-source part of the epoch report of a mixture (mmdp.data.mixture): each source's rows,
drops, samples, tokens and share, asked vs realised, overall and per rank."""

from collections import Counter

import numpy as np

from mmdp.data.mixture import MixedRows
from mmdp.drop_reasons import LEFT_OUT_BY_MIXTURE, LEFT_OUT_TO_EQUALISE_RANKS
from mmdp.packing.weights import Budgets, Weights
from mmdp.planning.planner import EpochPlan, filter_rows
from mmdp.planning.source_shares import MixturePlan


def planned_drops_by_source(
    weights, plan: EpochPlan, mixture: MixturePlan, config, epoch: int
) -> list[Counter]:
    """The rows the epoch's plan left out, by reason, for each source of the mixture: over a
    budget or unusable (filter_rows on the source's rows), not chosen by the mixture, chosen but
    in the packs left out to equalise ranks. Added over the sources, they are `plan.dropped`."""
    usable, _ = filter_rows(weights, config.budgets)
    chosen = mixture.choose(usable, weights.lengths, epoch)
    masks = (mixture.source_of_row == s for s in range(len(mixture.shares)))
    return [+source_drops(weights, config.budgets, m, usable, chosen, plan.rows) for m in masks]


def source_drops(weights, budgets: Budgets, mine, usable, chosen, kept) -> Counter:
    """The rows of one source (`mine`, a mask of rows) left out, by reason: over a budget or
    unusable, not `chosen` by the mixture among the `usable` rows, chosen but not `kept`."""
    part = Weights(
        *(a[mine] for a in (weights.lengths, weights.image_counts, weights.reasons)),
        patch_counts=weights.patch_counts[mine],
    )
    _, dropped = filter_rows(part, budgets)
    mine_usable = usable[mine[usable]]
    dropped[LEFT_OUT_BY_MIXTURE] += len(mine_usable) - len(np.intersect1d(mine_usable, chosen))
    dropped[LEFT_OUT_TO_EQUALISE_RANKS] += int(mine[chosen].sum() - mine[kept].sum())
    return dropped


def source_report(
    mixed: MixedRows,
    plan: MixturePlan,
    weights,
    sample_index_per_rank: list[list[int]],
    *,
    budgets: Budgets,
    epoch: int = 0,
    report_by_source: dict | None = None,
) -> list[dict]:
    """Per source, for the epoch report and its JSON: rows, dropped by reason (over a budget or
    unusable, left out by the mixture, left out to equalise ranks, dropped while built),
    samples yielded (a repeated row counts each time) and their tokens, and the share asked vs
    realised (in the mixture's unit), overall and per rank. `sample_index_per_rank`: the rows
    every rank yielded; `report_by_source`: the epoch report's drops per source (PackReport.by_source,
    which counts the rows dropped while their batches were built), else the plan's alone."""
    usable, _ = filter_rows(weights, budgets)
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
        if report_by_source is not None:  # the one epoch report's: the plan's and the batches'
            dropped = report_by_source[source.name]["dropped"]
        else:
            dropped = source_drops(weights, budgets, mine, usable, chosen, every)
        report.append(
            {
                "source": source.name,
                "dataset": source.data.dataset,
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
