"""Epoch-level accounting: how much of what the GPU computes is real data, and what was dropped.

One EpochReport adds up the batches of an epoch. Its invariant, which tests check:
    samples + sum(dropped.values()) == rows read
"""

import json
from collections import Counter
from pathlib import Path


class EpochReport:
    def __init__(self):
        self.samples = 0  # rows that made it into a batch
        self.dropped = Counter()  # rows left out, by reason
        self.converted = Counter()  # images converted to RGB, by original mode
        self.batches = 0
        self.useful_tokens = 0  # real tokens (padding excluded)
        self.computed_tokens = 0  # every position of every batch, padding included

    def add_batch(self, batch: dict, padding_key: str = "attention_mask") -> None:
        """Count one collated batch; `padding_key` names its 1 = real token / 0 = padding mask."""
        mask = batch[padding_key]
        self.batches += 1
        self.samples += len(batch["sample_index"])
        self.useful_tokens += int(mask.sum())
        self.computed_tokens += mask.numel()
        self.dropped.update(batch["dropped"])
        self.converted.update(batch["converted"])

    @property
    def rows_read(self) -> int:
        return self.samples + sum(self.dropped.values())

    @property
    def utilization(self) -> float:
        return self.useful_tokens / self.computed_tokens if self.computed_tokens else 0.0

    def as_dict(self) -> dict:
        return {
            "rows_read": self.rows_read,
            "samples": self.samples,
            "dropped": dict(sorted(self.dropped.items())),
            "converted": dict(sorted(self.converted.items())),
            "batches": self.batches,
            "useful_tokens": self.useful_tokens,
            "computed_tokens": self.computed_tokens,
            "utilization": round(self.utilization, 6),
        }

    def summary(self) -> str:
        dropped = ", ".join(f"{n} {reason}" for reason, n in sorted(self.dropped.items()))
        converted = ", ".join(f"{n} from {mode}" for mode, n in sorted(self.converted.items()))
        lines = [
            f"rows read:       {self.rows_read:,}",
            f"samples used:    {self.samples:,}",
            f"samples dropped: {sum(self.dropped.values()):,}"
            + (f" ({dropped})" if dropped else ""),
            f"batches:         {self.batches:,}",
            f"useful tokens:   {self.useful_tokens:,}",
            f"computed tokens: {self.computed_tokens:,} (padding included)",
            f"utilization:     {self.utilization:.1%} (waste {1 - self.utilization:.1%})",
        ]
        if converted:
            lines.append(f"images converted to RGB: {converted}")
        return "\n".join(lines)


def write_json(data: dict, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2) + "\n")
    return path
