"""What a run reads, as values a script's flags give (mmdp.flags): its rows (DataSettings:
--dataset, --num-rows...) and the model whose processor makes samples of them (ModelSettings:
--model, --processor)."""

import dataclasses

from mmdp.config import setting


# The modules that know the formats and the column renames, imported when the flags are made
# or read: a script that only imports its settings loads neither.
def format_names() -> tuple[str, ...]:
    from mmdp.data.reading.formats import FORMATS

    return FORMATS


def column_renames(text: str) -> dict[str, str]:
    """ms-swift's --columns: a JSON object of old: new column names."""
    from mmdp.data.reading.column_maps import renames_of

    return renames_of(text)


@dataclasses.dataclass(frozen=True)
class DataSettings:
    """The rows a run reads: `load()` reads them, `stream()` reads them as a stream. A script
    takes them as flags (mmdp.flags: --dataset, --subset, ..., --columns)."""

    dataset: str | None = setting(
        None,
        "a .json/.jsonl file or a folder of them, a save_to_disk folder, parquet file(s), a "
        "remote .json/.jsonl/.parquet URL (s3://...), LLaMA-Factory's dataset_info.json:NAME, or "
        "a Hub name (e.g. HuggingFaceM4/the_cauldron, needs a network); rows in the_cauldron's, "
        "messages' (ms-swift, LLaMA-Factory) or LLaVA's format",
        shown="the embedded synthetic dataset",
    )
    subset: str | None = setting(None, "Hub subset (config), e.g. ai2d")
    split: str = setting("train", "dataset split")
    num_rows: int | None = setting(None, "rows of the dataset to read", shown="every row", min=1)
    image_root: str | None = setting(
        None,
        "where the images and videos the rows name by a relative path are: a folder or a "
        "remote prefix such as s3://bucket/images",
        shown="beside the data file",
        metavar="DIR_OR_URL",
    )
    format: str | None = setting(
        None, "the rows' format", shown="told from their columns", choices=format_names
    )
    columns: dict[str, str] | None = setting(
        None,
        "rename the rows' columns before their format is told, as ms-swift's --columns: "
        'a JSON object of old: new names, e.g. \'{"conv": "conversations"}\'',
        parse=column_renames,
        metavar="JSON",
    )

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


def model_names() -> tuple[str, ...]:
    from mmdp.data.families import MODELS  # a real family's module imports torch

    return MODELS


@dataclasses.dataclass(frozen=True)
class ModelSettings:
    """The model a packing run packs for (stage 5, examples/pack_*.py, mmdp.prepare)."""

    model: str = setting(
        "tiny",
        "the model to pack for: mmdp's TinyVLM (the blog's 64 tokens per image) or a real "
        "family, whose processor is built offline",
        choices=model_names,
    )
    processor: str | None = setting(
        None,
        "a Hub name or local path of a real model's processor (needs a network for a Hub name)",
        shown="--model's processor built offline",
    )

    def load_processor(self, tokenizer: str | None = None):
        """--processor's processor when given, else --model's: TinyVLM's tokenizer (`tokenizer`,
        --tokenizer), or a real family's, built offline."""
        from mmdp.data.families import load_processor, offline_processor
        from mmdp.data.tokenizer import get_tokenizer

        if self.processor:
            return load_processor(self.processor)
        if self.model == "tiny":
            return get_tokenizer(tokenizer)
        return offline_processor(self.model)
