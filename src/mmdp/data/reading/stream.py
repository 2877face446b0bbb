"""Load a VQA dataset in the_cauldron's schema as a stream: mmdp.data.reading.sources's sources,
read row by row.

Nothing is downloaded or loaded ahead: a Hub dataset is read with `streaming=True`, parquet files
one after the other. The stream's shards are what ranks and DataLoader workers share out
(mmdp.loading.streaming): a Hub dataset or a folder of parquet files has one shard
per file; the embedded dataset (and a `save_to_disk` folder) is cut into `num_shards`.
"""

from pathlib import Path

import datasets
from datasets import load_dataset

from mmdp.data.files import is_remote
from mmdp.data.hub import looks_like_a_path, require_hub
from mmdp.data.images import undecoded
from mmdp.data.reading import column_maps, formats
from mmdp.data.reading.sources import (
    CONVERSATION_FEATURES,
    absolute_root,
    check_schema,
    json_files,
    load_local,
    load_vqa_dataset,
    names_files,
    refuse_entries_folder,
    renamed_columns,
    with_undecoded_images,
)
from mmdp.errors import UserError

# Shards the embedded dataset is cut into when read as a stream: enough for 2 ranks x 4 workers.
EMBEDDED_SHARDS = 8


def load_vqa_stream(
    name_or_path: str | None = None,
    subset: str | None = None,
    split: str = "train",
    num_rows: int | None = None,
    num_shards: int = EMBEDDED_SHARDS,
    *,
    image_root: str | None = None,
    format: str | None = None,
    name: str | None = None,
    columns: dict[str, str] | str | None = None,
) -> datasets.IterableDataset:
    """The dataset a stage runs on (see mmdp.data.reading.sources.load_vqa_dataset), as a
    datasets.IterableDataset.

    - `None`: the embedded synthetic dataset (`num_rows` rows), in `num_shards` shards;
    - a local path: parquet file(s), streamed from disk, one shard per file; or a folder written
      by `Dataset.save_to_disk`, in `num_shards` shards;
    - a user's JSON / JSON Lines file(s), a remote file, or a LLaMA-Factory dataset_info.json
      entry: read as load_vqa_dataset reads them (converted and cached once), in `num_shards`
      shards;
    - anything else: a Hub name, read with `load_dataset(..., streaming=True)`, its rows
      converted to the_cauldron's schema as they come when they are in another format.
    With `num_rows`, at most that many rows are read (`IterableDataset.take`: with several shards,
    not necessarily the first ones).
    """
    formats.check_format(format)
    image_root = absolute_root(image_root)
    renames = column_maps.renames_of(columns)
    path = Path(name_or_path).expanduser() if name_or_path is not None else None
    if (
        path is None
        or is_remote(name_or_path)
        or (path.exists() and json_files(path))
        or column_maps.entry_spec(name_or_path, name) is not None
    ):
        rows = load_vqa_dataset(
            name_or_path,
            num_rows=num_rows,
            image_root=image_root,
            format=format,
            name=name,
            columns=renames or None,
        )
        return rows.to_iterable_dataset(num_shards=min(num_shards, max(len(rows), 1)))
    if path.exists():
        parquet_files = [path] if path.suffix == ".parquet" else sorted(path.glob("**/*.parquet"))
        if parquet_files and not (path / "dataset_info.json").exists():
            files = [str(f) for f in parquet_files]
            stream = load_dataset("parquet", data_files=files, split="train", streaming=True)
        else:
            refuse_entries_folder(path)
            rows = load_local(path, split)
            stream = rows.to_iterable_dataset(num_shards=min(num_shards, max(len(rows), 1)))
    elif looks_like_a_path(name_or_path):
        raise UserError(f"dataset {name_or_path!r}: no such file or directory")
    else:
        stream = load_hub_stream(name_or_path, subset, split)
    if path.exists():
        base = image_root or str(path.resolve() if path.is_dir() else path.resolve().parent)
        stream = as_cauldron_stream(stream, format, base, path.name, renames)
    else:
        stream = as_cauldron_stream(stream, format, image_root, name_or_path, renames)
    if stream.features is not None:
        check_schema(stream, name_or_path)
    stream = with_undecoded_images(stream)
    return stream if num_rows is None else stream.take(num_rows)


def as_cauldron_stream(
    stream: datasets.IterableDataset,
    format: str | None,
    base: str | None,
    source: str,
    renames: dict | None = None,
) -> datasets.IterableDataset:
    """A stream's rows in the_cauldron's schema, converted as they are read
    (mmdp.data.reading.formats) when their columns say another format (or `format` does);
    their columns renamed first (`renames`, ms-swift's --columns)."""
    stream = renamed_columns(stream, renames, source)
    if stream.features is None:
        if format in (None, "the_cauldron"):
            return stream
        columns = None
    else:
        columns = list(stream.features)
        stream = undecoded(stream)
    format = format or formats.detect_format(columns)
    if format == "the_cauldron" and not (columns and names_files(stream.features)):
        return stream
    return stream.map(
        formats.convert_batch,
        batched=True,
        fn_kwargs={"format": format, "base": base, "source": source},
        features=CONVERSATION_FEATURES,
        remove_columns=columns,
    )


def load_hub_stream(name: str, subset: str | None, split: str) -> datasets.IterableDataset:
    default_hint = "run without --dataset to use the embedded synthetic dataset"
    require_hub(f"dataset {name!r}", default_hint)
    try:
        return load_dataset(name, subset, split=split, streaming=True)
    except (ConnectionError, OSError, FileNotFoundError, ValueError) as error:
        raise UserError(
            f"could not stream dataset {name!r}"
            + (f" (subset {subset!r})" if subset else "")
            + f" from the Hugging Face Hub ({error.__class__.__name__}); {default_hint}"
        ) from error
