"""What planning knows of each row of a dataset, and what a pack may hold, in the same units.

Weights: each row's weight (tokens, images, vision patches) and why it is unusable, if it is:
flat arrays, one entry per row (mmdp.weighing.weigh makes them, mmdp.planning
plans from them, the packers pack them). Budgets: a pack's limit in each unit, one frozen value
that PackingConfig holds (`config.budgets`) and the planner passes whole to the packers.
"""

from dataclasses import dataclass

import numpy as np

from mmdp.drop_reasons import CODE


@dataclass(frozen=True)
class Budgets:
    """What one pack may hold, in each unit of a row's weight (None: that budget never binds).

    >>> Budgets(max_length=8, max_images=3)
    Budgets(max_length=8, max_images=3, max_patches=None)
    """

    max_length: int  # tokens per pack (and the pack's padded length)
    max_images: int | None = None  # images per pack
    max_patches: int | None = None  # vision-encoder patches per pack

    def per_unit(self) -> tuple:
        """(tokens, images, patches): the budgets in Weights.columns()'s order."""
        return (self.max_length, self.max_images, self.max_patches)

    def over(self, columns) -> list[np.ndarray]:
        """Per unit, which rows are over that budget alone (`columns`: Weights.columns(); a
        budget of None: none is).

        >>> Budgets(8, max_images=1).over(Weights.from_lists([3, 9], [2, 0]).columns())
        [array([False,  True]), array([ True, False]), array([False, False])]
        """
        return [
            np.zeros(len(column), dtype=bool) if budget is None else column > budget
            for column, budget in zip(columns, self.per_unit())
        ]


@dataclass(frozen=True)
class Weights:
    """What planning knows of each row of a dataset: one entry per row."""

    lengths: np.ndarray  # int32: tokens of the sample (text + image tokens); 0 if unusable
    image_counts: np.ndarray  # int32: images of the sample
    reasons: np.ndarray | None = None  # uint8: 0, or why the row is unusable (None: all usable)
    # int32: the vision encoder's patches for the sample's images (None: one per image)
    patch_counts: np.ndarray | None = None

    def __post_init__(self):
        if self.reasons is None:
            object.__setattr__(self, "reasons", np.zeros(len(self.lengths), dtype=np.uint8))
        if self.patch_counts is None:
            object.__setattr__(self, "patch_counts", self.image_counts)

    def __len__(self) -> int:
        return len(self.lengths)

    def columns(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Every row's size per unit, one array a unit: (lengths, image counts, patch counts)."""
        return (self.lengths, self.image_counts, self.patch_counts)

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
