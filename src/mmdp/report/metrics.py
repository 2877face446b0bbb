"""Epoch-level accounting: how much of what the GPU computes is real data, and what was dropped.

One EpochReport adds up the batches of an epoch. Its invariant, which tests check:
    samples + sum(dropped.values()) == rows read
"""

import json
from collections import Counter
from pathlib import Path

import numpy as np

from mmdp.packing.batch import real_token_mask


class EpochReport:
    def __init__(self):
        self.samples = 0  # rows that made it into a batch
        self.dropped = Counter()  # rows left out, by reason
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

    @classmethod
    def merged(cls, reports: list["EpochReport"]) -> "EpochReport":
        """One report for all ranks: their counts added up."""
        total = cls()
        for report in reports:
            for name in ("samples", "batches", "real_tokens", "computed_tokens"):
                setattr(total, name, getattr(total, name) + getattr(report, name))
            total.dropped.update(report.dropped)
            total.converted.update(report.converted)
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
    row_of_sample = np.repeat(np.arange(len(batch["samples_per_row"])), batch["samples_per_row"])
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

    def add_batch(self, batch: dict) -> None:
        super().add_batch(batch)
        samples_per_row = batch["samples_per_row"]
        images = np.bincount(row_of_image(batch), minlength=len(samples_per_row))
        self.tokens_per_row += real_token_mask(batch).sum(dim=1).tolist()
        self.images_per_row += images.tolist()
        self.patches_per_row += batch["patches_per_row"].tolist()
        self.samples_per_row += samples_per_row.tolist()
        self.batch_samples.append(batch["sample_index"].tolist())

    @property
    def sample_index(self) -> list[int]:
        return [row for rows in self.batch_samples for row in rows]

    @classmethod
    def merged(cls, reports: list["PackReport"]) -> "PackReport":
        """One report for all ranks; rows in step order (step 0 of rank 0, of rank 1, ...)."""
        total = super().merged(reports)
        for report in reports:
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
        }

    def summary(self, max_patches: int | None = None) -> str:
        """The epoch's figures; with a patch budget, the patches per row and how full it is."""
        lines = [super().summary(), f"{'packs (rows):':<18}{len(self.tokens_per_row):,}"]
        names = (
            ("tokens", "images", "patches", "samples")
            if max_patches
            else ("tokens", "images", "samples")
        )
        for name in names:
            s = spread(getattr(self, f"{name}_per_row"))
            lines.append(
                f"{name + ' per row:':<18}min {s['min']}, max {s['max']}, "
                f"mean {s['mean']:.1f}, std {s['std']:.1f}"
            )
        if max_patches:
            used = sum(self.patches_per_row) / (len(self.patches_per_row) * max_patches or 1)
            lines.append(f"{'patch budget:':<18}{used:.1%} used ({max_patches:,} patches a row)")
        return "\n".join(lines)
