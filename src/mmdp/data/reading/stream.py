"""Load a VQA dataset in the_cauldron's schema as a stream: mmdp.data.reading.sources's sources,
read row by row.

Nothing is downloaded or loaded ahead: a Hub dataset is read with `streaming=True`, parquet files
one after the other. The stream's shards are what ranks and DataLoader workers share out
(mmdp.loading.streaming): a Hub dataset or a folder of parquet files has one shard
per file; the embedded dataset (and a `save_to_disk` folder) is cut into `num_shards`.
"""

from datasets import IterableDataset, load_dataset

from mmdp.data.files import is_remote
from mmdp.data.hub import looks_like_a_path
from mmdp.data.reading import column_maps, formats
from mmdp.data.reading.sources import (
    absolute_root,
    as_cauldron,
    check_schema,
    data_files,
    load_hub,
    load_vqa_dataset,
    read_table,
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
) -> IterableDataset:
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
    entry = name_or_path is not None and column_maps.entry_spec(name_or_path, name) is not None
    found = None if name_or_path is None or entry else data_files(name_or_path, image_root)
    if name_or_path is None or entry or is_remote(name_or_path) or (found and found.kind == "json"):
        rows = load_vqa_dataset(
            name_or_path,
            num_rows=num_rows,
            image_root=image_root,
            format=format,
            name=name,
            columns=renames or None,
        )
        return rows.to_iterable_dataset(num_shards=min(num_shards, max(len(rows), 1)))
    if found is None and looks_like_a_path(name_or_path):
        raise UserError(f"dataset {name_or_path!r}: no such file or directory")
    if found is None:
        stream = load_hub(name_or_path, subset, split, streaming=True)
    elif found.kind == "parquet":
        stream = load_dataset("parquet", data_files=found.files, split="train", streaming=True)
    else:  # a save_to_disk folder
        rows = read_table(found, split)
        stream = rows.to_iterable_dataset(num_shards=min(num_shards, max(len(rows), 1)))
    base, source = (found.base, found.source) if found else (image_root, name_or_path)
    stream = as_cauldron(stream, format, base, source, renames)
    if stream.features is not None:
        check_schema(stream, name_or_path)
    stream = with_undecoded_images(stream)
    return stream if num_rows is None else stream.take(num_rows)
