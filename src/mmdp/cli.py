"""Command-line pieces the stage scripts share: flags checked where they are parsed, the epoch
loop, and printing a batch or a table."""

import argparse
import dataclasses
import os
import time
from collections.abc import Sequence

import torch

from mmdp import config
from mmdp.errors import UserError
from mmdp.packing.weights import Budgets


def description(doc: str) -> str:
    """A script's --help description: the first paragraph of its docstring, on one line."""
    return " ".join(doc.strip().split("\n\n")[0].split())


def positive_int(text: str) -> int:
    """An argparse type: an impossible value ends in one sentence and exit status 2."""
    value = int_value(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive whole number, got {text}")
    return value


def non_negative_int(text: str) -> int:
    value = int_value(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {text}")
    return value


def ratio(text: str) -> float:
    """An argparse type: a share in [0, 1), e.g. the rows held out for evaluation."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 0 and below 1, got {text}")
    return value


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be above 0, got {text}")
    return value


def int_value(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number, got {text!r}") from None


def add_data_args(parser: argparse.ArgumentParser, num_rows: int = config.DEFAULT_NUM_ROWS):
    add_dataset_args(parser)
    parser.add_argument("--subset", default=None, help="Hub subset (config), e.g. ai2d")
    parser.add_argument("--split", default="train", help="dataset split (default: train)")
    parser.add_argument(
        "--num-rows",
        type=positive_int,
        default=num_rows,
        help=f"rows of the dataset to read (default: {num_rows:,})",
    )
    parser.add_argument("--seed", type=non_negative_int, default=0, help="random seed (default: 0)")
    parser.add_argument(
        "--out-dir",
        default=display_path(config.ASSETS_DIR),
        help="where figures go (default: assets/)",
    )


def add_dataset_args(parser: argparse.ArgumentParser) -> None:
    """--dataset, --image-root, --format: a user's rows, where their files are, their format
    (mmdp.data.reading.sources.load_vqa_dataset)."""
    from mmdp.data.reading.formats import FORMATS

    parser.add_argument(
        "--dataset",
        default=None,
        help="a .json/.jsonl file or a folder of them, a save_to_disk folder, parquet file(s), a "
        "remote .json/.jsonl/.parquet URL (s3://...), or a Hub name (e.g. "
        "HuggingFaceM4/the_cauldron, needs a network); rows in the_cauldron's, messages' "
        "(ms-swift, LLaMA-Factory) or LLaVA's format; default: the embedded synthetic dataset",
    )
    parser.add_argument(
        "--image-root",
        default=None,
        metavar="DIR_OR_URL",
        help="where the images and videos the rows name by a relative path are: a folder or a "
        "remote prefix such as s3://bucket/images (default: beside the data file)",
    )
    parser.add_argument(
        "--format",
        choices=FORMATS,
        default=None,
        help="the rows' format (default: told from their columns)",
    )


@dataclasses.dataclass(frozen=True)
class DataSettings:
    """The rows a run reads, named as the data flags are (add_data_args): a script's own are
    `settings_of(DataSettings, args)`; `load()` reads them, `stream()` reads them as a stream."""

    dataset: str | None = None  # None: the embedded synthetic dataset
    subset: str | None = None
    split: str = "train"
    num_rows: int | None = None  # None: every row
    image_root: str | None = None
    format: str | None = None  # None: told from the columns

    def load(self):
        """The rows, in the_cauldron's schema (mmdp.data.reading.sources.load_vqa_dataset)."""
        from mmdp.data.reading.sources import load_vqa_dataset

        return load_vqa_dataset(**self.reader_arguments())

    def stream(self):
        """The same rows as a datasets.IterableDataset (mmdp.data.reading.stream.load_vqa_stream)."""
        from mmdp.data.reading.stream import load_vqa_stream

        return load_vqa_stream(**self.reader_arguments())

    def reader_arguments(self) -> dict:
        """The keywords both readers take: the fields, the dataset's under its reader's name."""
        fields = dataclasses.asdict(self)
        return {"name_or_path": fields.pop("dataset"), **fields}


def add_loader_args(parser: argparse.ArgumentParser):
    """--tokenizer, --num-workers, --metrics-json; each stage adds how big a batch is (samples
    per padded batch: --batch-size; packs per packed batch: --packs-per-batch)."""
    parser.add_argument(
        "--tokenizer",
        default=None,
        help="tokenizer name or path (default: the SmolLM2 tokenizer shipped in the repo)",
    )
    parser.add_argument(
        "--num-workers",
        type=non_negative_int,
        default=min(2, os.cpu_count() or 1),
        help="DataLoader worker processes (default: 2)",
    )
    parser.add_argument(
        "--metrics-json", default=None, help="write the epoch report as JSON to this path"
    )


def add_model_and_budget_args(parser: argparse.ArgumentParser, models: Sequence[str]):
    """--model (one of `models`), and a pack's budgets: --max-length, --max-images, --max-patches
    (stage 5 and python -m mmdp.prepare)."""
    parser.add_argument(
        "--model",
        choices=models,
        default="tiny",
        help="the model to pack for: mmdp's TinyVLM (the blog's 64 tokens per image) or a real "
        "family, whose processor is built offline (default: tiny)",
    )
    add_budget_args(
        parser,
        max_length=None,
        max_length_help="token budget of a pack, and its padded length (default: 512 for tiny, "
        "the family's otherwise)",
    )
    parser.add_argument(
        "--max-patches",
        type=positive_int,
        default=None,
        help="vision-encoder patch budget of a pack (default: none for tiny, the family's "
        "otherwise)",
    )


def add_budget_args(
    parser: argparse.ArgumentParser, max_length: int | None, max_length_help: str
) -> None:
    """A pack's token and image budgets: --max-length (default `max_length`), --max-images."""
    parser.add_argument("--max-length", type=positive_int, default=max_length, help=max_length_help)
    parser.add_argument(
        "--max-images",
        type=non_negative_int,
        default=config.MAX_IMAGES,
        help=f"image budget of a pack (default: {config.MAX_IMAGES})",
    )


def add_strategy_arg(parser: argparse.ArgumentParser, help: str = "packer") -> None:
    """--strategy: one of mmdp.packing.packers.STRATEGIES (default: images_first_bfd)."""
    from mmdp.packing.packers import STRATEGIES

    parser.add_argument(
        "--strategy",
        choices=STRATEGIES,
        default="images_first_bfd",
        help=f"{help} (default: images_first_bfd)",
    )


def add_packing_args(parser: argparse.ArgumentParser) -> None:
    """How rows become batches in a packing run (stage 5, examples/pack_*.py): --packs-per-batch,
    --strategy, --buffer-size, --epoch; and --save-batch to keep the first batch."""
    parser.add_argument(
        "--packs-per-batch",
        type=positive_int,
        default=config.PACKS_PER_BATCH,
        help=f"packs per batch, one pack a row (default: {config.PACKS_PER_BATCH})",
    )
    add_strategy_arg(parser)
    parser.add_argument(
        "--buffer-size",
        type=positive_int,
        default=4096,
        help="rows packed together, the shuffle window (default: 4096)",
    )
    parser.add_argument(
        "--epoch", type=non_negative_int, default=0, help="which epoch's shuffle (default: 0)"
    )
    parser.add_argument(
        "--save-batch", default=None, help="torch.save the first collated batch to this path"
    )


def model_processor(args: argparse.Namespace):
    """The processor of a packing run: --processor's (a Hub name or a local path) when given,
    else --model's: TinyVLM's tokenizer (--tokenizer), or a real family's, built offline."""
    from mmdp.data.families import load_processor, offline_processor
    from mmdp.data.tokenizer import get_tokenizer

    if getattr(args, "processor", None):
        return load_processor(args.processor)
    if args.model == "tiny":
        return get_tokenizer(args.tokenizer)
    return offline_processor(args.model)


def settings_of(cls, args):
    """The frozen dataclass `cls` of the parsed flags (or another settings value) named as its
    fields: a flag it does not name is left out, a field no flag names keeps its default. What
    a script hands the package instead of its Namespace."""
    fields = dataclasses.fields(cls)
    return cls(**{f.name: getattr(args, f.name) for f in fields if hasattr(args, f.name)})


def add_batch_size_arg(
    parser: argparse.ArgumentParser,
    default: int = config.BATCH_SIZE,
    help: str = "samples per padded batch",
):
    parser.add_argument(
        "--batch-size", type=positive_int, default=default, help=f"{help} (default: {default})"
    )


def print_settings(args: argparse.Namespace, config=None) -> None:
    """The flags as parsed; with a PackingConfig, its values for the flags that name its fields
    (a budget left unset shows the one resolved)."""
    resolved = {} if config is None else config.settings()
    settings = ", ".join(f"{key}={resolved.get(key, value)}" for key, value in vars(args).items())
    print(f"settings: {settings}")


def config_for(family, args: argparse.Namespace, **budgets):
    """The PackingConfig of a run: each flag that names one of its fields (--max-length,
    --max-images, --max-patches, --packs-per-batch, --strategy, --buffer-size, --seed) as given;
    a flag not given (None) takes its value from `budgets` (e.g. a prepared dataset's), else from
    the model family (mmdp.packing.packing_config.default_config)."""
    from mmdp.packing.packing_config import FIELDS, default_config

    given = {name: getattr(args, name) for name in FIELDS if hasattr(args, name)}
    return default_config(
        family, **{**budgets, **{k: v for k, v in given.items() if v is not None}}
    )


def print_run_settings(args: argparse.Namespace, config, model: str) -> None:
    """The `settings:` line of a packing run: the flags as parsed, but the model's name and the
    PackingConfig's fields as resolved (the budgets a family or a prepared dataset set)."""
    print_settings(argparse.Namespace(**{**vars(args), "model": model, **config.settings()}))


def run_epoch(loader, report, keep_batch=None, hint="raise --num-rows") -> tuple[dict, float]:
    """Go through one epoch, adding every batch to `report` (an EpochReport).

    Returns the batch to show (the first one, or the first for which keep_batch(batch) is true,
    else the first) and the seconds the epoch took. Raises a UserError ending in `hint` when no
    batch held a sample: the settings left nothing to do.
    """
    shown = None
    start = time.perf_counter()
    for batch in loader:
        if shown is None or (keep_batch and not keep_batch(shown) and keep_batch(batch)):
            shown = batch
        report.add_batch(batch)
    seconds = time.perf_counter() - start
    if report.samples == 0:
        raise nothing_to_do(report.rows_read, report.dropped, hint)
    return shown, seconds


def nothing_to_do(rows_read: int, dropped: dict, hint: str) -> UserError:
    """The one sentence for settings that leave no sample to use."""
    reasons = ", ".join(f"{n:,} {reason}" for reason, n in sorted(dropped.items()))
    return UserError(
        f"nothing to do: none of the {rows_read:,} rows read made it into a batch"
        + (f" (dropped: {reasons})" if reasons else "")
        + f"; {hint}"
    )


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
            print(f"  {key:<{width}} {getattr(value, 'name', value)}")  # a family: its name


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


def display_path(path) -> str:
    """A path as a user would type it: relative to the working directory when inside it."""
    relative = os.path.relpath(path)
    return str(path) if relative.startswith("..") else relative


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
    print(f"{how} in {weighing.seconds:.2f} s (cached in {display_path(weighing.path)})")


PACKING_HINT = "raise --max-length or --max-images, or use more --num-rows"


def run_packed_epoch(packed, num_workers: int) -> dict:
    """One epoch of a PackedDataset through its loader, on this rank; the report merged over
    ranks (mmdp.report.metrics.merge_over_ranks: rows dropped while planning counted once), the
    first batch, the seconds, and how many rows each rank weighed."""
    from mmdp.packing.loading.packed_dataset import PackedDataLoader
    from mmdp.packing.planning.planner import batch_loads
    from mmdp.ranks import gather_from_ranks
    from mmdp.report.metrics import PackReport, merge_over_ranks

    if packed.num_batches() == 0:
        raise nothing_to_do(len(packed.weights), packed.plan().dropped, PACKING_HINT)
    loader = PackedDataLoader(packed, num_workers=num_workers)
    report = PackReport()
    first_batch, seconds = run_epoch(loader, report, hint=PACKING_HINT)
    report.add_loader(loader)  # the plan's drops (and, for a mixture, of each source)
    epoch = merge_over_ranks(report, batch_loads(packed.plan(), packed.weights))
    weighed = gather_from_ranks(packed.weighing.rows_weighed_here)
    weighing = {"seconds": round(packed.weighing.seconds, 3), "rows_weighed_per_rank": weighed}
    return {**epoch, "first_batch": first_batch, "seconds": seconds, "weighing": weighing}


def print_epoch_report(epoch: dict, budgets: Budgets) -> None:
    """The epoch merged over ranks (merge_over_ranks, with its first batch and seconds): one
    batch's shapes, the report, and under torchrun how evenly the ranks shared each step."""
    print("\nOne batch:")
    print_batch(epoch["first_batch"])
    report, seconds = epoch["report"], epoch["seconds"]
    print(f"\nOver the epoch ({seconds:.1f} s, {report.samples / seconds:,.0f} samples/s):")
    print(report.summary(budgets))


def print_rank_balance(balance: dict) -> None:
    """Under torchrun: batches per rank, and the spread of images between ranks per step."""
    if balance["world_size"] > 1:
        print(
            f"ranks: {balance['world_size']}, batches per rank {balance['batches_per_rank']}, "
            f"image spread between ranks per step: max {balance['image_spread_per_step']['max']}, "
            f"mean {balance['image_spread_per_step']['mean']}"
        )


def write_outputs(metrics: dict, first_batch: dict, args: argparse.Namespace) -> None:
    """--metrics-json (the epoch's `metrics`) and --save-batch (the first batch, as it is)."""
    from mmdp.report.metrics import write_json

    if args.metrics_json:
        print(f"Wrote the epoch report to {display_path(write_json(metrics, args.metrics_json))}")
    if args.save_batch:
        torch.save(first_batch, args.save_batch)
        print(f"Saved the first batch to {display_path(args.save_batch)}")
