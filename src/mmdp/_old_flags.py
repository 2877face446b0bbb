"""The flag adders mmdp.prepare and examples/pack_prepared.py still import from mmdp.flags,
until they take parse_flags (issue 60): each adds the flags of a settings dataclass. Delete this
module and mmdp.flags.__getattr__ then."""

import argparse
import dataclasses

from mmdp import config
from mmdp.data.reading.settings import DataSettings, ModelSettings
from mmdp.flags import (
    FAMILY_BUDGETS,
    EpochSettings,
    Figures,
    LoaderSettings,
    add_flags,
    non_negative_int,
)
from mmdp.packing.packing_config import PackingConfig, default_config


def add_dataset_args(parser: argparse.ArgumentParser) -> None:
    flags = ("dataset", "image_root", "format", "columns")
    add_flags(parser, DataSettings, outer={"flags": flags})


def add_data_args(parser: argparse.ArgumentParser, num_rows: int = config.DEFAULT_NUM_ROWS):
    add_flags(parser, DataSettings, DataSettings(num_rows=num_rows))
    parser.add_argument("--seed", type=non_negative_int, default=0, help="random seed")
    add_flags(parser, Figures)


def add_loader_args(parser: argparse.ArgumentParser) -> None:
    add_flags(parser, LoaderSettings)


def add_model_and_budget_args(parser: argparse.ArgumentParser, models=None) -> None:
    add_flags(parser, ModelSettings, outer={"flags": ("model",)})
    budgets = {"flags": ("max_length", "max_images", "max_patches"), "shown": FAMILY_BUDGETS}
    add_flags(parser, PackingConfig, PackingConfig(max_length=None), budgets)


def add_packing_args(parser: argparse.ArgumentParser) -> None:
    flags = ("packs_per_batch", "strategy", "buffer_size", "overflow")
    add_flags(parser, PackingConfig, outer={"flags": flags})
    add_flags(parser, EpochSettings)


def settings_of(cls, args):
    return cls(
        **{f.name: getattr(args, f.name) for f in dataclasses.fields(cls) if hasattr(args, f.name)}
    )


def model_processor(args: argparse.Namespace):
    model = ModelSettings(args.model, getattr(args, "processor", None))
    return model.load_processor(args.tokenizer)


def config_for(family, args: argparse.Namespace, **budgets):
    given = {f.name: getattr(args, f.name, None) for f in dataclasses.fields(PackingConfig)}
    return default_config(
        family, **{**budgets, **{k: v for k, v in given.items() if v is not None}}
    )
