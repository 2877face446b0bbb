"""What the scripts print: the settings line, a batch's entries, a table, how the weights were
found, an epoch's report, the ranks' balance."""

import argparse
from collections.abc import Sequence

import torch


def print_settings(args: argparse.Namespace, config=None) -> None:
    """The flags as parsed; with a PackingConfig, its values for the flags that name its fields
    (a budget left unset shows the one resolved)."""
    resolved = {} if config is None else config.settings()
    settings = ", ".join(f"{key}={resolved.get(key, value)}" for key, value in vars(args).items())
    print(f"settings: {settings}")


def print_run_settings(args: argparse.Namespace, config, model: str) -> None:
    """The `settings:` line of a packing run: the flags as parsed, but the model's name and the
    PackingConfig's fields as resolved (the budgets a family or a prepared dataset set)."""
    print_settings(argparse.Namespace(**{**vars(args), "model": model, **config.settings()}))


def print_batch(batch: dict) -> None:
    """One line per entry of a collated batch: tensors by shape, the rest by value (the rows of
    `dropped_rows` on the `dropped` line, when there are some)."""
    width = max(17, *(len(key) for key in batch))  # pixel_values_videos: 19
    for key, value in batch.items():
        if key == "dropped_rows":
            continue  # on the `dropped` line
        if key == "dropped" and batch.get("dropped_rows"):
            print(f"  {key:<{width}} {value} (rows {[row for row, _ in batch['dropped_rows']]})")
        elif isinstance(value, torch.Tensor):
            print(f"  {key:<{width}} {str(tuple(value.shape)):<20} {value.dtype}")
        else:
            print(f"  {key:<{width}} {value}")


def print_table(
    header: list[str], rows: list[list], formats: Sequence[str] = (), *, indent: int = 3
) -> None:
    """Print `rows` under `header` in columns, each as wide as its widest cell, two spaces apart:
    the first column (the names) aligned left, the others (the numbers) aligned right.

    `formats` holds a format spec per column (as in f"{value:,.1f}": ",.1f"; "" or none left:
    str(value)); a cell that is already a string is printed as it is, so a row can format one
    of its cells its own way. Every line starts with `indent` spaces, to sit under a heading.

    >>> print_table(
    ...     ["strategy", "utilization", "batches", "tokens/row"],
    ...     [["naive", 0.407431, 25, 135.365], ["images_first_bfd", 0.972994, 7, 498.173]],
    ...     ["", ".1%", "", ",.0f"],
    ... )
       strategy          utilization  batches  tokens/row
       naive                   40.7%       25         135
       images_first_bfd        97.3%        7         498
    """
    formats = [*formats, *[""] * (len(header) - len(formats))]
    cells = [
        [
            value if isinstance(value, str) else format(value, spec)
            for value, spec in zip(row, formats)
        ]
        for row in rows
    ]
    widths = [max(len(text) for text in column) for column in zip(header, *cells)]
    for line in (header, *cells):
        name, numbers = line[0].ljust(widths[0]), map(str.rjust, line[1:], widths[1:])
        print((" " * indent + "  ".join([name, *numbers])).rstrip())


def print_weighing(packed) -> None:
    """How a PackedDataset got its weights: read from a prepared dataset, weighed here, or loaded
    from the cache."""
    weighing = packed.weighing
    if packed.prepared:
        print(
            f"Read the prepared weights of {len(weighing.weights):,} rows from {packed.prepared} "
            f"in {weighing.seconds:.2f} s (weighed nothing)"
        )
        return
    if weighing.weighed_here:
        how = f"Weighed {weighing.rows_weighed_here:,} of {len(weighing.weights):,} rows here"
    else:
        how = f"Loaded the weights of {len(weighing.weights):,} rows"
    from mmdp.report.plots import display_path  # matplotlib's module: only when it prints

    print(f"{how} in {weighing.seconds:.2f} s (cached in {display_path(weighing.path)})")


def print_epoch_report(epoch: dict, budgets) -> None:
    """The epoch merged over ranks (merge_over_ranks, with its first batch and seconds): one
    batch's shapes, the report under `budgets` (a PackingConfig's), and under torchrun how
    evenly the ranks shared each step."""
    print("\nOne batch:")
    print_batch(epoch["first_batch"])
    report, seconds = epoch["report"], epoch["seconds"]
    print(f"\nOver the epoch ({seconds:.1f} s, {report.samples / seconds:,.0f} samples/s):")
    print(report.summary(budgets))
    for line in getattr(report, "budget_hint", list)():  # a PackReport's, when rows were too_long
        print(line)


def print_rank_balance(balance: dict) -> None:
    """Under torchrun: batches per rank, and the spread of images between ranks per step."""
    if balance["world_size"] > 1:
        print(
            f"ranks: {balance['world_size']}, batches per rank {balance['batches_per_rank']}, "
            f"image spread between ranks per step: max {balance['image_spread_per_step']['max']}, "
            f"mean {balance['image_spread_per_step']['mean']}"
        )
