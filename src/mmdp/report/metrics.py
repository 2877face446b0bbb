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


class EpochReport:
    def __init__(self):
        self.samples = 0  # rows that made it into a batch
        self.truncated = 0  # of them, rows cut to max_length (the plan's: overflow="truncate")
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
            plan = dataset.plan(dataset.epoch)
            self.planned = Counter(plan.dropped)
            self.dropped.update(self.planned)
            self.truncated = plan.truncated
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
        total.truncated = reports[0].truncated if reports else 0  # the plan's: the same on all
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
            **({"truncated": self.truncated} if self.truncated else {}),
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
            f"{'samples used:':<18}{self.samples:,}"
            + (f" ({self.truncated:,} truncated to max_length)" if self.truncated else ""),
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
