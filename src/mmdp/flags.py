"""The scripts' flags: argparse types that refuse an impossible value in one sentence, the
flags two scripts share (add_*_args), and the settings a script resolves from them (settings_of,
model_processor, config_for). No torch here: stage 4 parses its flags with these too."""

import argparse
import dataclasses
import os
from collections.abc import Sequence

from mmdp import config


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


def column_renames(text: str) -> dict[str, str]:
    """An argparse type: ms-swift's --columns, a JSON object of old: new column names."""
    from mmdp.data.reading.column_maps import renames_of
    from mmdp.errors import UserError

    try:
        return renames_of(text)
    except UserError as error:
        raise argparse.ArgumentTypeError(str(error).removeprefix(f"--columns {text!r}: ")) from None


def add_dataset_args(parser: argparse.ArgumentParser) -> None:
    """--dataset, --image-root, --format, --columns: a user's rows, where their files are, their
    format, their columns' names (mmdp.data.reading.sources.load_vqa_dataset)."""
    from mmdp.data.reading.formats import FORMATS

    parser.add_argument(
        "--dataset",
        default=None,
        help="a .json/.jsonl file or a folder of them, a save_to_disk folder, parquet file(s), a "
        "remote .json/.jsonl/.parquet URL (s3://...), LLaMA-Factory's dataset_info.json:NAME, or "
        "a Hub name (e.g. HuggingFaceM4/the_cauldron, needs a network); rows in the_cauldron's, "
        "messages' (ms-swift, LLaMA-Factory) or LLaVA's format; default: the embedded synthetic "
        "dataset",
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
    parser.add_argument(
        "--columns",
        type=column_renames,
        default=None,
        metavar="JSON",
        help="rename the rows' columns before their format is told, as ms-swift's --columns: "
        'a JSON object of old: new names, e.g. \'{"conv": "conversations"}\'',
    )


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
    --strategy, --buffer-size, --overflow, --epoch; and --save-batch to keep the first batch."""
    from mmdp.packing.packing_config import OVERFLOWS

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
        "--overflow",
        choices=OVERFLOWS,
        default="drop",
        help="a row over --max-length: drop it (too_long), or cut its text from the end, never "
        "through an image's or video's tokens (default: drop)",
    )
    parser.add_argument(
        "--epoch", type=non_negative_int, default=0, help="which epoch's shuffle (default: 0)"
    )
    parser.add_argument(
        "--save-batch", default=None, help="torch.save the first collated batch to this path"
    )


def add_batch_size_arg(
    parser: argparse.ArgumentParser,
    default: int = config.BATCH_SIZE,
    help: str = "samples per padded batch",
):
    parser.add_argument(
        "--batch-size", type=positive_int, default=default, help=f"{help} (default: {default})"
    )


def settings_of(cls, args):
    """The frozen dataclass `cls` of the parsed flags (or another settings value) named as its
    fields: a flag it does not name is left out, a field no flag names keeps its default. What
    a script hands the package instead of its Namespace."""
    fields = dataclasses.fields(cls)
    return cls(**{f.name: getattr(args, f.name) for f in fields if hasattr(args, f.name)})


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


def config_for(family, args: argparse.Namespace, **budgets):
    """The PackingConfig of a run: each flag that names one of its fields (--max-length,
    --max-images, --max-patches, --packs-per-batch, --strategy, --buffer-size, --seed,
    --overflow) as given;
    a flag not given (None) takes its value from `budgets` (e.g. a prepared dataset's), else from
    the model family (mmdp.packing.packing_config.default_config)."""
    from mmdp.packing.packing_config import FIELDS, default_config

    given = {name: getattr(args, name) for name in FIELDS if hasattr(args, name)}
    return default_config(
        family, **{**budgets, **{k: v for k, v in given.items() if v is not None}}
    )


def display_path(path) -> str:
    """A path as a user would type it: relative to the working directory when inside it."""
    relative = os.path.relpath(path)
    return str(path) if relative.startswith("..") else relative
