"""PackingConfig: how rows become packs and batches, in one frozen dataclass that both loaders
(PackedDataset, StreamingPackedDataset), the planner (plan_epoch), the stage scripts' flags and
mmdp.prepare share; and the one check that a loader's saved state may resume under the settings
it runs with now.

    config = PackingConfig(max_length=1024, max_images=8, packs_per_batch=4)
    loader = PackedDataLoader(PackedDataset(samples, config=config))
    loader.state_dict()  # {**asdict(config), "rank": ..., "world_size": ..., "epoch": ...}

Without a config, a loader packs under its model family's budgets: `default_config(family)`, the
one place that resolves them (the stage scripts, the training examples and mmdp.prepare call it
with the flags given).
"""

import dataclasses
import typing
from typing import Literal

from mmdp import config as defaults
from mmdp.config import setting
from mmdp.packing.packers import Strategy
from mmdp.packing.weights import Budgets

# What becomes of a row over the token budget (PackingConfig.overflow, --overflow).
Overflow = Literal["drop", "truncate"]


@dataclasses.dataclass(frozen=True)
class PackingConfig:
    """What decides the packs and batches of an epoch (a resume needs the same)."""

    max_length: int = setting(
        defaults.MAX_LENGTH, "token budget of a pack, and its padded length", min=1
    )
    max_images: int = setting(defaults.MAX_IMAGES, "image budget of a pack", min=0)
    max_patches: int | None = setting(
        None, "vision-encoder patch budget of a pack", shown="none", min=1
    )
    packs_per_batch: int = setting(
        defaults.PACKS_PER_BATCH, "packs in a batch, one pack a row", min=1
    )
    strategy: Strategy = setting("images_first_bfd", "the packer (mmdp.packing.packers)")
    buffer_size: int = setting(4096, "rows packed together: the shuffle window", min=1)
    seed: int = setting(0, "seeds every shuffle, with the epoch", min=0)
    overflow: Overflow = setting(
        "drop",
        "a row over --max-length: drop it (too_long), or cut its text from the end, never "
        "through an image's or video's tokens (mmdp.weighing.overflow)",
    )

    def __post_init__(self):
        if self.buffer_size < 1:
            raise ValueError(f"buffer_size must be positive, got {self.buffer_size}")
        if self.overflow not in typing.get_args(Overflow):
            raise ValueError(
                f"overflow must be one of {typing.get_args(Overflow)}, got {self.overflow!r}"
            )

    @property
    def budgets(self) -> Budgets:
        """What one pack may hold (tokens, images, patches), as one value: what the planner
        passes whole to the packers.

        >>> PackingConfig(max_length=1024, max_images=8).budgets
        Budgets(max_length=1024, max_images=8, max_patches=None)
        """
        return Budgets(self.max_length, self.max_images, self.max_patches)

    def settings(self) -> dict:
        """The fields as a plain dict (what a loader's state_dict saves)."""
        return dataclasses.asdict(self)


def default_config(family, **settings) -> PackingConfig:
    """The PackingConfig of a model family (a mmdp.data.families ModelFamily) when its budgets
    are not given: its own token and patch budgets per pack (`default_max_length`,
    `default_max_patches`: a few of its images a pack, e.g. Qwen-VL 2,048 tokens and 8,192
    patches; TinyVLM's are PackingConfig's own, 512 tokens and no patch budget), PackingConfig's
    defaults for the rest. `settings` that are not None override them (a script passes its flags
    as they are: an unset flag is None).
    """
    budgets = {"max_length": family.default_max_length, "max_patches": family.default_max_patches}
    given = {name: value for name, value in settings.items() if value is not None}
    return PackingConfig(**{**budgets, **given})


def read_from_config(name: str) -> property:
    """A read-only attribute that reads self.config.<name>."""
    return property(lambda self: getattr(self.config, name))


class PackingSettings:
    """The config's fields as read-only attributes of a loader's dataset (`dataset.max_length`,
    `dataset.packs_per_batch`...)."""

    config: PackingConfig
    max_length = read_from_config("max_length")
    max_images = read_from_config("max_images")
    max_patches = read_from_config("max_patches")
    packs_per_batch = read_from_config("packs_per_batch")
    strategy = read_from_config("strategy")
    buffer_size = read_from_config("buffer_size")
    seed = read_from_config("seed")
    overflow = read_from_config("overflow")


def check_resume(saved: dict, now: dict, why: str) -> None:
    """Refuse, in one sentence naming each difference, a saved state whose settings differ from
    `now` (a key missing from `saved` is not a difference); `why` says what the settings decide.

    >>> check_resume({"seed": 0, "max_length": 512}, {"seed": 1, "max_length": 512}, "why")
    Traceback (most recent call last):
    ...
    ValueError: cannot resume: the state was saved with seed 0 (now 1); why
    """
    different = [f"{k} {saved[k]!r} (now {v!r})" for k, v in now.items() if saved.get(k, v) != v]
    if different:
        raise ValueError(
            "cannot resume: the state was saved with " + ", ".join(different) + f"; {why}"
        )
