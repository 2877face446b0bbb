"""Epoch-level accounting: how much of what the GPU computes is real data, and what was dropped.

One EpochReport adds up the batches of an epoch, and with `add_loader(loader)` the rows the
loader dropped that no batch carries (a planned loader's plan: over a budget, unusable text or
headers, left out by a mixture or to equalise ranks; a stream's rows dropped after its last
batch). Its invariant, which tests check, holds from the report alone, per reason and (for a
mixture) per source:
    samples + sum(dropped.values()) == rows read

    report = PackReport()
    for batch in loader:
        report.add_batch(batch)
        ...  # train
    report.add_loader(loader)      # or, to only count: report = PackReport.of_epoch(loader)
"""

import json
from collections import Counter
from pathlib import Path

import numpy as np

from mmdp.batch import real_token_mask
from mmdp.packing.weights import Budgets


class EpochReport:
    def __init__(self):
        self.samples = 0  # rows that made it into a batch
        self.dropped = Counter()  # rows left out, by reason (the plan's included, once)
        self.planned = Counter()  # the part of `dropped` the plan left out, the same on every rank
        self.converted = Counter()  # images converted to RGB, by original mode
        self.batches = 0
        self.real_tokens = 0  # real tokens (padding excluded)
        self.computed_tokens = 0  # every position of every batch, padding included

    def add_batch(self, batch: dict) -> None:
        """Count one collated batch, padded or packed."""
        mask = real_token_mask(batch)
        self.batches += 1
        self.samples += len(batch["sample_index"])
        self.real_tokens += int(mask.sum())
        self.computed_tokens += mask.numel()
        self.dropped.update(batch["dropped"])
        self.converted.update(batch["converted"])

    def add_loader(self, loader) -> None:
        """After an epoch: the rows `loader` dropped that no batch carries. A PackedDataLoader's
        plan (`planned`: every rank plans the whole epoch, so merged() counts it once), a
        StreamingDataLoader's `dropped_at_end`, a padded loader's batch sampler's `dropped`."""
        dataset = getattr(loader, "dataset", None)
        if hasattr(dataset, "plan") and hasattr(dataset, "weights"):  # PackedDataset
            self.planned = Counter(dataset.plan(dataset.epoch).dropped)
            self.dropped.update(self.planned)
        elif hasattr(loader, "dropped_at_end"):  # StreamingDataLoader
            self.dropped.update(loader.dropped_at_end)
        elif hasattr(getattr(loader, "batch_sampler", None), "dropped"):
            self.planned = Counter(loader.batch_sampler.dropped)
            self.dropped.update(self.planned)

    @classmethod
    def of_epoch(cls, loader) -> "EpochReport":
        """The report of one epoch of `loader`, every batch read (and thrown away)."""
        report = cls()
        for batch in loader:
            report.add_batch(batch)
        report.add_loader(loader)
        return report

    @classmethod
    def merged(cls, reports: list["EpochReport"]) -> "EpochReport":
        """One report for all ranks: their counts added up, the plan's drops once."""
        total = cls()
        for report in reports:
            for name in ("samples", "batches", "real_tokens", "computed_tokens"):
                setattr(total, name, getattr(total, name) + getattr(report, name))
            total.dropped.update(report.dropped)
            total.dropped.subtract(report.planned)
            total.converted.update(report.converted)
        total.planned = Counter(reports[0].planned) if reports else Counter()
        if any(report.planned != total.planned for report in reports):
            raise ValueError("the ranks' reports come from different plans: merge one epoch's")
        total.dropped = +(total.dropped + total.planned)
        return total

    @property
    def rows_read(self) -> int:
        return self.samples + sum(self.dropped.values())

    @property
    def utilization(self) -> float:
        return self.real_tokens / self.computed_tokens if self.computed_tokens else 0.0

    def as_dict(self) -> dict:
        return {
            "rows_read": self.rows_read,
            "samples": self.samples,
            "dropped": dict(sorted(self.dropped.items())),
            "converted": dict(sorted(self.converted.items())),
            "batches": self.batches,
            "real_tokens": self.real_tokens,
            "computed_tokens": self.computed_tokens,
            "utilization": round(self.utilization, 6),
        }

    def summary(self) -> str:
        dropped = ", ".join(f"{n} {reason}" for reason, n in sorted(self.dropped.items()))
        converted = ", ".join(f"{n} from {mode}" for mode, n in sorted(self.converted.items()))
        lines = [
            f"{'rows read:':<18}{self.rows_read:,}",
            f"{'samples used:':<18}{self.samples:,}",
            f"{'samples dropped:':<18}{sum(self.dropped.values()):,}"
            + (f" ({dropped})" if dropped else ""),
            f"{'batches:':<18}{self.batches:,}",
            f"{'real tokens:':<18}{self.real_tokens:,}",
            f"{'computed tokens:':<18}{self.computed_tokens:,} (padding included)",
            f"{'utilization:':<18}{self.utilization:.1%} (waste {1 - self.utilization:.1%})",
        ]
        if converted:
            lines.append(f"images converted to RGB: {converted}")
        return "\n".join(lines)


def write_json(data: dict, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2) + "\n")
    return path


def row_of_image(batch: dict) -> np.ndarray:
    """The row (pack) of a packed batch each of its images belongs to."""
    row_of_sample = np.repeat(np.arange(len(batch["samples_per_pack"])), batch["samples_per_pack"])
    return row_of_sample[batch["sample_of_image"].numpy()]


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
        names = (
            ("tokens", "images", "patches", "samples")
            if patch_budget
            else ("tokens", "images", "samples")
        )
        for name in names:
            s = spread(getattr(self, f"{name}_per_row"))
            lines.append(
                f"{name + ' per row:':<18}min {s['min']}, max {s['max']}, "
                f"mean {s['mean']:.1f}, std {s['std']:.1f}"
            )
        if patch_budget:
            used = sum(self.patches_per_row) / (len(self.patches_per_row) * patch_budget or 1)
            lines.append(f"{'patch budget:':<18}{used:.1%} used ({patch_budget:,} patches a row)")
        return "\n".join(lines)


LOADS = ("tokens", "images", "patches")  # what rank_balance compares between ranks, per step


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
