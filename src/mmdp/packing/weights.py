"""What planning knows of each row of a dataset: its weight (tokens, images, vision patches) and
why it is unusable, if it is: flat arrays, one entry per row (mmdp.packing.weighing.weigh makes them,
mmdp.packing.planning.planner plans from them)."""

from dataclasses import dataclass

import numpy as np

from mmdp.drop_reasons import CODE


@dataclass(frozen=True)
class Weights:
    """What planning knows of each row of a dataset: one entry per row."""

    lengths: np.ndarray  # int32: tokens of the sample (text + image tokens); 0 if unusable
    image_counts: np.ndarray  # int32: images of the sample
    reasons: np.ndarray  # uint8: 0, or why the row is unusable (its position in REASONS)
    # int32: the vision encoder's patches for the sample's images (None: one per image)
    patch_counts: np.ndarray | None = None

    def __post_init__(self):
        if self.patch_counts is None:
            object.__setattr__(self, "patch_counts", self.image_counts)

    def __len__(self) -> int:
        return len(self.lengths)

    @classmethod
    def from_lists(cls, lengths, image_counts, reasons=None, patch_counts=None) -> "Weights":
        """Weights from plain lists; reasons are None or names from mmdp.drop_reasons."""
        reasons = [None] * len(lengths) if reasons is None else reasons
        return cls(
            np.asarray(lengths, dtype=np.int32),
            np.asarray(image_counts, dtype=np.int32),
            np.array([CODE[reason] for reason in reasons], dtype=np.uint8),
            None if patch_counts is None else np.asarray(patch_counts, dtype=np.int32),
        )
