"""Command-line pieces the stage scripts share: common flags and printing a batch."""

import argparse
import os

import torch

from mmdp import config


def add_data_args(parser: argparse.ArgumentParser, num_samples: int = config.DEFAULT_NUM_ROWS):
    parser.add_argument(
        "--dataset",
        default=None,
        help="a Hub name (e.g. HuggingFaceM4/the_cauldron, needs a network) or a local path "
        "(save_to_disk directory or parquet files) in the_cauldron's schema; "
        "default: the embedded synthetic dataset",
    )
    parser.add_argument("--subset", default=None, help="Hub subset (config), e.g. ai2d")
    parser.add_argument("--split", default="train", help="dataset split (default: train)")
    parser.add_argument(
        "--num-samples", type=int, default=num_samples, help=f"rows to use (default: {num_samples})"
    )
    parser.add_argument("--seed", type=int, default=0, help="random seed (default: 0)")
    parser.add_argument(
        "--out-dir", default=str(config.ASSETS_DIR), help="where figures go (default: assets/)"
    )


def add_loader_args(parser: argparse.ArgumentParser, batch_size: int = config.BATCH_SIZE):
    parser.add_argument(
        "--tokenizer",
        default=None,
        help="tokenizer name or path (default: the SmolLM2 tokenizer shipped in the repo)",
    )
    parser.add_argument(
        "--batch-size", type=int, default=batch_size, help=f"batch size (default: {batch_size})"
    )
    parser.add_argument(
        "--num-workers",
        type=int,
        default=min(2, os.cpu_count() or 1),
        help="DataLoader worker processes (default: 2)",
    )
    parser.add_argument(
        "--metrics-json", default=None, help="write the epoch report as JSON to this path"
    )


def print_settings(args: argparse.Namespace) -> None:
    settings = ", ".join(f"{key}={value}" for key, value in vars(args).items())
    print(f"settings: {settings}")


def print_batch(batch: dict) -> None:
    """One line per entry of a collated batch: tensors by shape, the rest by value."""
    for key, value in batch.items():
        if isinstance(value, torch.Tensor):
            print(f"  {key:<17} {str(tuple(value.shape)):<20} {value.dtype}")
        else:
            print(f"  {key:<17} {value}")


def display_path(path) -> str:
    """A path as a user would type it: relative to the working directory when inside it."""
    relative = os.path.relpath(path)
    return path if relative.startswith("..") else relative
