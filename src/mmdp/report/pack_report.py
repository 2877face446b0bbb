"""Stage 5's epoch report: PackReport (an EpochReport of packed batches: packs, samples and images
per pack, each source of a mixture), merged over ranks, how evenly the ranks share each step
(rank_balance; the grouped padded batches report it too), and the JSON of --metrics-json."""

import math
from collections import Counter

import numpy as np

from mmdp.batch import real_token_mask
from mmdp.drop_reasons import TOO_LONG
from mmdp.packing.weights import Budgets
from mmdp.report.metrics import EpochReport, row_of_image


class PackReport(EpochReport):
    """EpochReport for packed batches: also tokens, images and samples per row (a row is a
    pack), and the dataset rows of every batch."""

    def __init__(self):
        super().__init__()
        self.tokens_per_row = []
        self.images_per_row = []
        self.patches_per_row = []  # the vision encoder's
        self.samples_per_row = []
        self.batch_samples = []  # the dataset rows of each batch, in order
        self.batch_loads = []  # (real tokens, images, patches) of each batch, in order
        self.dropped_rows = []  # (row, reason) of the rows dropped while batches were built
        # a mixture's sources (add_loader): names, each row's source, the plan's drops of each
        self.sources, self.source_of_row, self.planned_by_source = [], None, []
        # when the plan dropped rows too_long: the token budgets that would keep 99% and 100%
        # of the usable rows whole, and the overflow they were planned with (add_loader)
        self.budgets_to_keep = None

    def add_batch(self, batch: dict) -> None:
        super().add_batch(batch)
        self.dropped_rows += batch.get("dropped_rows", [])
        samples_per_row = batch["samples_per_pack"]
        images = np.bincount(row_of_image(batch), minlength=len(samples_per_row))
        tokens = real_token_mask(batch).sum(dim=1).tolist()
        self.tokens_per_row += tokens
        self.images_per_row += images.tolist()
        self.patches_per_row += batch["patches_per_pack"].tolist()
        self.samples_per_row += samples_per_row.tolist()
        self.batch_samples.append(batch["sample_index"].tolist())
        self.batch_loads.append(
            (sum(tokens), int(images.sum()), int(batch["patches_per_pack"].sum()))
        )

    @property
    def sample_index(self) -> list[int]:
        return [row for rows in self.batch_samples for row in rows]

    def add_loader(self, loader) -> None:
        """EpochReport.add_loader, and for a mixture its sources: the plan's drops of each."""
        super().add_loader(loader)
        packed = getattr(loader, "dataset", None)
        if self.planned.get(TOO_LONG):
            usable = packed.weights.reasons == 0
            if packed.split is not None:
                usable &= packed.split
            lengths = packed.weights.lengths[usable]
            keep = (budget_to_keep(lengths, 0.99), budget_to_keep(lengths, 1.0))
            self.budgets_to_keep = (*keep, packed.config.overflow)
        if getattr(packed, "mixture", None) is None:
            return
        from mmdp.report.sources import planned_drops_by_source

        self.sources = [source.name for source in packed.dataset.sources]
        self.source_of_row = packed.mixture.source_of_row
        self.planned_by_source = planned_drops_by_source(
            packed.weights, packed.plan(packed.epoch), packed.mixture, packed.config, packed.epoch
        )

    def by_source(self) -> dict[str, dict]:
        """Per source of a mixture (after add_loader): rows read, samples and drops by reason,
        the plan's and the batches' added up; {} without a mixture (the report is its source)."""
        if self.source_of_row is None:
            return {}
        count = len(self.sources)
        rows = np.asarray(self.sample_index, dtype=np.int64)
        samples = np.bincount(self.source_of_row[rows], minlength=count)
        dropped = [Counter(planned) for planned in self.planned_by_source]
        for row, reason in self.dropped_rows:
            dropped[self.source_of_row[row]][reason] += 1
        return {
            name: {
                "rows_read": int(samples[s]) + sum(dropped[s].values()),
                "samples": int(samples[s]),
                "dropped": dict(sorted((+dropped[s]).items())),
            }
            for s, name in enumerate(self.sources)
        }

    @classmethod
    def merged(cls, reports: list["PackReport"]) -> "PackReport":
        """One report for all ranks; rows in step order (step 0 of rank 0, of rank 1, ...)."""
        total = super().merged(reports)
        if reports:
            first = reports[0]
            total.sources, total.source_of_row = first.sources, first.source_of_row
            total.planned_by_source = first.planned_by_source
            total.budgets_to_keep = first.budgets_to_keep
        for report in reports:
            total.dropped_rows += report.dropped_rows
            for name in ("tokens_per_row", "images_per_row", "patches_per_row", "samples_per_row"):
                getattr(total, name).extend(getattr(report, name))
        steps = max((len(r.batch_samples) for r in reports), default=0)
        total.batch_samples = [
            r.batch_samples[step]
            for step in range(steps)
            for r in reports
            if step < len(r.batch_samples)
        ]
        return total

    def budget_hint(self) -> list[str]:
        """What stage 5 says when the plan dropped rows too_long (after add_loader): the
        --max-length that would keep 99% and 100% of the rows whole, and what else would.

        >>> report = PackReport()
        >>> report.budgets_to_keep = (491, 649, "drop")
        >>> print(*report.budget_hint())
        --max-length that keeps 99% / 100% of the rows whole: 491 / 649 (or --overflow truncate: cut at --max-length)
        """
        if self.budgets_to_keep is None:
            return []
        most, every, overflow = self.budgets_to_keep
        line = f"--max-length that keeps 99% / 100% of the rows whole: {most:,} / {every:,}"
        if overflow == "drop":
            return [line + " (or --overflow truncate: cut at --max-length)"]
        return [
            line,
            "(the rows still too_long cannot be cut: their images or videos end past "
            "--max-length, or no reply starts before it; a processor's lower max_pixels, fps or "
            "frames shortens them)",
        ]

    def as_dict(self) -> dict:
        return {
            **super().as_dict(),
            "packs": len(self.tokens_per_row),
            "tokens_per_row": spread(self.tokens_per_row),
            "images_per_row": spread(self.images_per_row),
            "patches_per_row": spread(self.patches_per_row),
            "samples_per_row": spread(self.samples_per_row),
            "sample_index": self.sample_index,
            **({"by_source": self.by_source()} if self.source_of_row is not None else {}),
        }

    def summary(self, budgets: Budgets | None = None) -> str:
        """The epoch's figures; with a patch budget, the patches per row and how full it is."""
        lines = [super().summary(), f"{'packs (rows):':<18}{len(self.tokens_per_row):,}"]
        patch_budget = budgets.max_patches if budgets else None
        for name in ("tokens", "images", *(["patches"] if patch_budget else []), "samples"):
            s = spread(getattr(self, f"{name}_per_row"))
            lines.append(
                f"{name + ' per row:':<18}min {s['min']}, max {s['max']}, "
                f"mean {s['mean']:.1f}, std {s['std']:.1f}"
            )
        if patch_budget:
            used = sum(self.patches_per_row) / (len(self.patches_per_row) * patch_budget or 1)
            lines.append(f"{'patch budget:':<18}{used:.1%} used ({patch_budget:,} patches a row)")
        return "\n".join(lines)


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


LOADS = ("tokens", "images", "patches")  # what rank_balance compares between ranks, per step


def budget_to_keep(lengths: np.ndarray, share: float) -> int:
    """The smallest token budget under which `share` of the rows of `lengths` fit (0: none).

    >>> budget_to_keep(np.array([3, 9, 5, 7]), 0.5), budget_to_keep(np.array([3, 9, 5, 7]), 1.0)
    (5, 9)
    """
    ordered = np.sort(lengths)
    return int(ordered[max(0, math.ceil(share * len(ordered)) - 1)]) if len(ordered) else 0


def merge_over_ranks(report: PackReport, loads: dict | None = None) -> dict:
    """This rank's epoch report and every other rank's (one all_gather_object under torchrun;
    outside it, this rank's alone), merged: what rank 0 reports for all of them.

    Returns {"report": the merged PackReport, "reports": one per rank, "rank_balance": ...}.
    The balance is of `loads` when given (a planned epoch's, from its plan:
    mmdp.planning.planner.batch_loads), else of what each rank's batches held, step by
    step (a stream's ranks stop at the same step).
    """
    from mmdp.ranks import gather_from_ranks  # a packed epoch's only (stages 2-3 need none)

    reports = gather_from_ranks(report)
    if loads is None:
        steps = list(zip(*(r.batch_loads for r in reports)))  # [step][rank] (tokens, ...)
        per_step = np.array(steps, dtype=np.int64).reshape(-1, len(reports), len(LOADS))
        loads = {name: per_step[..., k] for k, name in enumerate(LOADS)}
    return {
        "report": PackReport.merged(reports),
        "reports": reports,
        "rank_balance": rank_balance(loads, len(reports)),
    }


def epoch_metrics(epoch: dict, **more) -> dict:
    """What --metrics-json holds: the merged report (merge_over_ranks), the batches each rank
    yielded, the rank balance, the seconds of the epoch, then `more` (a mixture's sources, the
    weighing of a planned epoch)."""
    return {
        **epoch["report"].as_dict(),
        "batches_per_rank_yielded": [r.batches for r in epoch["reports"]],
        "rank_balance": epoch["rank_balance"],
        "seconds": round(epoch["seconds"], 3),
        **more,
    }
