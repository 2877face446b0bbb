"""Load a VQA dataset in the_cauldron's schema: the embedded synthetic default, a user's files
(the_cauldron's, ms-swift / LLaMA-Factory messages, LLaVA: mmdp.data.reading.formats), or the Hub.

Schema (one row = one training sample):
    images: list of images          (a `datasets` Image feature per element)
    texts:  list of {"user": str, "assistant": str, "source": str}   (one dict per turn; rows
            read from another format add "system", the system prompt, on the first turn, and
            keep <image>/<video> tags where the text put the files)
    videos: list of {"bytes", "path"} video files (optional; the families that take video)

Every loader returns a `datasets.Dataset` whose images are NOT decoded (`Image(decode=False)`):
rows carry the encoded bytes, or a file's path (local or remote: mmdp.data.files), so counting
images costs nothing, and decoding happens in one place (`mmdp.data.images.load_image`) where a
broken file becomes a counted skip instead of a crash.
"""

import contextlib
import hashlib
import os
import shutil
from pathlib import Path
from typing import NamedTuple

import datasets
import pyarrow.compute as pc
from datasets import Dataset, Features, List, Value, load_dataset, load_from_disk
from tqdm.auto import tqdm

from mmdp import config
from mmdp.data.files import is_remote, protocol, require_protocol
from mmdp.data.hub import looks_like_a_path, require_hub
from mmdp.data.images import undecoded
from mmdp.data.reading import column_maps, formats
from mmdp.errors import UserError

SYNTHETIC_VERSION = 3  # bump when generate_row changes, so old caches are not reused

# Images stay encoded (decode=False): see the module docstring.
UNDECODED_IMAGES = List(datasets.Image(decode=False))
TURN = {"user": Value("string"), "assistant": Value("string"), "source": Value("string")}
FEATURES = Features({"images": UNDECODED_IMAGES, "texts": List(TURN)})
# A row's videos (mmdp.data.videos): the encoded files, as images are stored, never decoded here.
VIDEOS = List({"bytes": Value("binary"), "path": Value("string")})
VIDEO_FEATURES = Features({**FEATURES, "videos": VIDEOS})
# Rows read from a user's files (mmdp.data.reading.formats): the same, with each row's system
# prompt.
CONVERSATION_FEATURES = Features(
    {
        "images": UNDECODED_IMAGES,
        "videos": VIDEOS,
        "texts": List({**TURN, "system": Value("string")}),
    }
)
# The files a dataset of rows may be, beside a save_to_disk folder and parquet files.
JSON_SUFFIXES = (".json", ".jsonl")
SYNTHETIC_VIDEOS_VERSION = 1  # bump when generate_video_row changes


@contextlib.contextmanager
def no_progress_bars():
    """datasets' progress bars off for a while, then as they were."""
    were_on = datasets.is_progress_bar_enabled()
    datasets.disable_progress_bars()
    try:
        yield
    finally:
        if were_on:
            datasets.enable_progress_bars()


def cache_dir() -> Path:
    return Path(os.environ.get("MMDP_CACHE", config.DEFAULT_CACHE_DIR))


def load_vqa_dataset(
    name_or_path: str | None = None,
    subset: str | None = None,
    split: str = "train",
    num_rows: int | None = None,
    seed: int = 0,
    *,
    image_root: str | None = None,
    format: str | None = None,
    name: str | None = None,
    columns: dict[str, str] | str | None = None,
) -> Dataset:
    """Load the dataset a stage runs on, in the_cauldron's schema, its images undecoded.

    - `None`: the embedded synthetic dataset (`num_rows` rows, generated once and cached);
    - a local path: a .json or .jsonl file, a folder of them, a directory written by
      `Dataset.save_to_disk`, or parquet file(s) (a .parquet file, or a directory of them);
    - a remote .json, .jsonl or .parquet file (s3://, gs://, hf://, https://: fsspec);
    - LLaMA-Factory's dataset_info.json and the `name` of one of its entries (or
      "dataset_info.json:NAME"): the entry's rows, read as its formatting, columns and tags say
      (mmdp.data.reading.column_maps);
    - anything else: a Hub name for `datasets.load_dataset`, e.g. "HuggingFaceM4/the_cauldron"
      with subset "ai2d".
    The rows may be in any format of mmdp.data.reading.formats (the_cauldron, messages, llava), told
    from their columns unless `format` names it; `columns` ({"old": "new"}, ms-swift's --columns)
    renames columns first. Files named by a relative path are looked for under `image_root` (a
    folder or a remote prefix), else beside the file that names them. When `num_rows` is given,
    only the first `num_rows` rows are kept.
    """
    formats.check_format(format)
    image_root = absolute_root(image_root)
    renames = column_maps.renames_of(columns)
    entry = None if name_or_path is None else column_maps.entry_spec(name_or_path, name)
    if entry is not None:
        dataset = load_entry(*entry, image_root, format, renames)
    elif name_or_path is None:
        if renames:
            raise UserError("--columns renames a --dataset's columns; the embedded rows have none")
        dataset = load_synthetic(max(num_rows or 0, config.DEFAULT_NUM_ROWS), seed=seed)
    elif (found := data_files(name_or_path, image_root)) is not None:
        dataset = load_files(found, split, format, renames)
    elif looks_like_a_path(name_or_path):
        raise UserError(f"dataset {name_or_path!r}: no such file or directory")
    else:
        rows = load_hub(name_or_path, subset, split)
        dataset = as_cauldron(rows, format, image_root, name_or_path, renames)
    check_schema(dataset, name_or_path)
    dataset = with_undecoded_images(dataset)
    if name_or_path is not None:
        for name in remote_protocols(dataset):
            require_protocol(name)
    if num_rows is not None and num_rows < len(dataset):
        dataset = dataset.select(range(num_rows))
    return dataset


def absolute_root(image_root: str | None) -> str | None:
    """A local image root as an absolute path (the rows keep it: a DataLoader worker, a later run
    may start elsewhere); a remote one as it is."""
    if image_root is None or is_remote(image_root):
        return image_root
    return str(Path(image_root.removeprefix("file://")).expanduser().resolve())


class DataFiles(NamedTuple):
    """A dataset's data files, as load_vqa_dataset reads them (data_files)."""

    kind: str  # "json" (JSON and JSON Lines), "parquet" or "saved" (a save_to_disk folder)
    files: list[str]  # the files; a save_to_disk folder's path
    base: str | None  # where relative paths are (json: image_root; None: beside each file)
    source: str | None  # the texts' source (parquet, saved): the file's or folder's name


def data_files(name_or_path: str, image_root: str | None) -> DataFiles | None:
    """The data files a dataset named `name_or_path` is, or None for none (a Hub name, or a
    local path that does not exist): a remote .json, .jsonl or .parquet file; a local JSON or
    JSON Lines file or folder of them, a save_to_disk folder, or parquet file(s). Any other file
    or folder is one sentence. `image_root` as absolute_root gives it.

    Every reader decides by it: load_vqa_dataset, load_vqa_stream, and mmdp.weighing.on_ray,
    whose workers read JSON and parquet files themselves."""
    if is_remote(name_or_path):
        return remote_file(name_or_path, image_root)
    path = Path(name_or_path).expanduser()
    if not path.exists():
        return None
    path = path.resolve()
    saved = (path / "dataset_info.json").exists() or (path / "dataset_dict.json").exists()
    if path.is_file():
        json = [str(path)] if path.suffix in JSON_SUFFIXES else []
    else:  # a folder's, unless save_to_disk wrote it (its JSON files describe it)
        json = [] if saved else [str(f) for s in JSON_SUFFIXES for f in path.glob(f"**/*{s}")]
    if json:
        return DataFiles("json", sorted(json), image_root, None)
    info = path / column_maps.INFO_FILE
    if path.is_dir() and column_maps.looks_like_entries(info):  # LLaMA-Factory's data folder:
        column_maps.read_entry(str(info), None)  # one sentence naming how to read its datasets
    base = image_root or str(path if path.is_dir() else path.parent)
    if saved:
        return DataFiles("saved", [str(path)], base, path.name)
    parquet = [path] if path.suffix == ".parquet" else sorted(path.glob("**/*.parquet"))
    if not parquet:
        raise UserError(
            f"{path} is neither a directory written by save_to_disk nor parquet file(s)"
        )
    return DataFiles("parquet", [str(f) for f in parquet], base, path.name)


def remote_file(url: str, image_root: str | None) -> DataFiles:
    """A remote .json, .jsonl or .parquet file of rows (fsspec)."""
    require_protocol(protocol(url))
    folder, _, name = url.rpartition("/")
    if url.endswith(JSON_SUFFIXES):
        return DataFiles("json", [url], image_root, None)
    if url.endswith(".parquet"):
        return DataFiles("parquet", [url], image_root or folder, name)
    raise UserError(f"dataset {url!r}: a remote dataset is a .json, .jsonl or .parquet file")


def load_files(
    found: DataFiles,
    split: str,
    format: str | None,
    renames: dict,
    entry: column_maps.Entry | None = None,
) -> Dataset:
    """The rows of `found` in the_cauldron's schema (`split`: a save_to_disk DatasetDict's)."""
    if found.kind == "json":
        return load_json(found.files, found.base, format, renames, entry)
    return as_cauldron(read_table(found, split), format, found.base, found.source, renames, entry)


def read_table(found: DataFiles, split: str) -> Dataset:
    """The rows of parquet files or a save_to_disk folder, as they are stored."""
    if found.kind == "parquet":
        # datasets keys its own cache of a remote file by the file's name alone: a parquet file
        # replaced on S3 would be read as it was (tests/test_remote.py). Ours, beside the JSON
        # files', is keyed by the files' stamps too.
        stamps = hashlib.sha256(repr([file_stamp(name) for name in found.files]).encode())
        with unreadable_files_named(found.files):
            return load_dataset(
                "parquet",
                data_files=found.files,
                split="train",
                cache_dir=str(cache_dir() / "rows" / f"parquet-{stamps.hexdigest()[:16]}"),
            )
    with unreadable_files_named(sorted(Path(found.files[0]).glob("**/*.arrow"))):
        loaded = load_from_disk(found.files[0])
    if isinstance(loaded, datasets.DatasetDict):
        if split not in loaded:
            raise UserError(f"{found.files[0]} has no split {split!r} (it has {', '.join(loaded)})")
        loaded = loaded[split]
    return loaded


def load_entry(
    path: str, name: str | None, image_root: str | None, format: str | None, renames: dict
) -> Dataset:
    """LLaMA-Factory's entry `name` of the dataset_info.json at `path`, its rows read as its
    formatting, columns and tags say (mmdp.data.reading.column_maps); files named by a relative
    path are under `image_root`, else beside dataset_info.json (LLaMA-Factory's media_dir)."""
    if format is not None:
        raise UserError(
            f"--format {format}: a dataset_info.json entry's formatting tells its rows' format"
        )
    entry, where = column_maps.read_entry(path, name)
    if where.hub is not None:
        rows = load_hub(where.hub, where.subset, where.split, data_dir=where.folder)
        return as_cauldron(rows, "messages", image_root, where.hub, renames, entry)
    if where.url is not None:
        found = remote_file(where.url, image_root)
    else:  # local files (column_maps.location_of): their folder is dataset_info.json's
        base = image_root or absolute_root(path.rpartition("/")[0] or ".")
        kind = "parquet" if where.files[0].endswith(".parquet") else "json"
        found = DataFiles(kind, list(where.files), base, Path(where.files[0]).name)
    return load_files(found, "train", "messages", renames, entry)


def load_json(
    files: list[str],
    image_root: str | None,
    format: str | None,
    renames: dict | None = None,
    entry: column_maps.Entry | None = None,
) -> Dataset:
    """Rows of JSON / JSON Lines files, in the_cauldron's schema
    (mmdp.data.reading.formats.json_rows).

    Read by Python's json, not pyarrow's: real files mix types in a column (LLaVA-665k's "id" is a
    string in most rows and a number in others; "image" one path or a list) that a table cannot
    hold, and only the converted rows become one. Cached by `datasets` under MMDP_CACHE, keyed by
    the files with their sizes and times of change, the format, the image root and the column
    map (`renames`, `entry`: mmdp.data.reading.column_maps): a second run reads the table."""
    stamps = [file_stamp(name) for name in files]
    try:
        with no_progress_bars():
            return Dataset.from_generator(
                formats.json_rows,
                features=CONVERSATION_FEATURES,
                # tuples, not lists (which datasets would cut into a generator per file): one
                # generator reads every file, so that a column map's check sees all their rows
                gen_kwargs={
                    "files": tuple(files),
                    "format": format,
                    "image_root": image_root,
                    "stamps": tuple(stamps),
                    "renames": renames or {},
                    "entry": entry,
                },
                cache_dir=str(cache_dir() / "rows"),
            )
    except datasets.exceptions.DatasetGenerationError as error:
        # datasets wraps what the rows' reader raised: the sentence it raised, not a traceback
        cause = error.__cause__
        while cause is not None and not isinstance(cause, UserError):
            cause = cause.__cause__
        if cause is None:
            raise
        raise cause from None


def file_stamp(name: str) -> str:
    """What changes when a data file does: its size and time of change (a remote one: its ETag;
    an http(s) server without one: its Last-Modified)."""
    import fsspec

    fs, inner = fsspec.core.url_to_fs(name)
    info = fs.info(inner)
    changed = info.get("mtime") or info.get("LastModified") or info.get("Last-Modified")
    return str(info.get("ETag") or (info.get("size"), changed))


def as_cauldron(
    rows,
    format: str | None,
    base: str | None,
    source: str,
    renames: dict | None = None,
    entry: column_maps.Entry | None = None,
):
    """`rows` (a Dataset, or a stream) in the_cauldron's schema (mmdp.data.reading.formats),
    converted by `datasets.map` unless they are in it already, their images never decoded: a
    Dataset by one cached map, a stream as it is read. Their columns renamed first (`renames`),
    an `entry`'s rows turned into messages rows (mmdp.data.reading.column_maps). A stream whose
    columns are unknown is converted only when `format` names another format."""
    rows = renamed_columns(rows, renames, source)
    columns = rows.column_names
    if entry is not None:
        column_maps.check_named(entry.named_columns(), columns, source, "the entry")
    if columns is None and format in (None, "the_cauldron"):
        return rows
    format = format or formats.detect_format(columns)
    rows = undecoded(rows)  # the features only: no row is rewritten
    if format == "the_cauldron" and not (columns and names_files(rows.features)) and entry is None:
        return rows
    progress = {"desc": f"Reading the {format} rows"} if isinstance(rows, Dataset) else {}
    return rows.map(
        formats.convert_batch,
        batched=True,
        fn_kwargs={"format": format, "base": base, "source": source, "entry": entry},
        features=CONVERSATION_FEATURES,
        remove_columns=columns,
        **progress,
    )


def renamed_columns(rows, renames: dict | None, source: str):
    """A Dataset's (or a stream's with known features) columns renamed (ms-swift's --columns):
    only the schema changes. A column it names that the rows lack, or a new name they have, is
    one sentence."""
    if not renames:
        return rows
    columns = rows.column_names
    if columns is not None:
        column_maps.check_named(renames, columns, source)
        for old, new in renames.items():
            if new in columns and new not in renames:
                raise UserError(
                    f"--columns renames {old!r} to {new!r}, a column {source} has already"
                )
    return rows.rename_columns(renames)


def names_files(features) -> bool:
    """Whether the_cauldron rows name their images or videos as strings (paths to resolve)."""
    return any(
        isinstance(features.get(column), List) and features[column].feature == Value("string")
        for column in ("images", "videos")
    )


def remote_protocols(dataset: Dataset) -> set[str]:
    """The protocols of the remote files the rows name (s3, https...), read from the path column."""
    found = set()
    for column in ("images", "videos"):
        if column not in dataset.column_names:
            continue
        cells = pc.list_flatten(dataset.data.column(column))
        if len(cells) == 0:
            continue
        scheme = pc.extract_regex(pc.struct_field(cells, "path"), r"^(?P<name>[a-zA-Z0-9+.-]+)://")
        found |= {name for name in pc.unique(pc.struct_field(scheme, "name")).to_pylist() if name}
    return found - {"file"}


def load_synthetic(num_rows: int, seed: int = 0) -> Dataset:
    """The embedded default: generated on first use (with a progress bar), then loaded from disk."""
    path = cache_dir() / f"synthetic-v{SYNTHETIC_VERSION}-seed{seed}-rows{num_rows}"
    if not path.exists():
        from mmdp.data.synthetic.rows import encode_png, generate_row  # once per machine

        print(f"Generating the synthetic VQA dataset ({num_rows:,} rows) into {path} (once)")
        rows = (
            {
                "images": [{"bytes": encode_png(image), "path": None} for image in row["images"]],
                "texts": row["texts"],
            }
            for row in map(generate_row, range(num_rows), [seed] * num_rows)
        )
        rows = tqdm(rows, total=num_rows, desc="generating", unit="row")
        save_once(Dataset.from_list(list(rows), features=FEATURES), path)
    return load_from_disk(str(path))


def save_once(dataset: Dataset, path: Path) -> None:
    """Write next to the final path, then rename: an interrupted run leaves no half cache, and
    ranks generating at the same time (torchrun, first run) never write into each other."""
    partial = path.with_name(f"{path.name}.partial-{os.getpid()}")
    shutil.rmtree(partial, ignore_errors=True)
    dataset.save_to_disk(str(partial))
    try:
        partial.rename(path)
    except OSError:  # another process got there first, with the same rows
        shutil.rmtree(partial, ignore_errors=True)


def load_synthetic_videos(num_rows: int, seed: int = 0) -> Dataset:
    """The synthetic video task (mmdp.data.synthetic.videos), generated once and cached like
    the images' rows: kept apart from them, for the families that take video."""
    from mmdp.data.synthetic.videos import generate_video_row  # PyAV: the video extra

    path = cache_dir() / f"synthetic-videos-v{SYNTHETIC_VIDEOS_VERSION}-seed{seed}-rows{num_rows}"
    if not path.exists():
        print(f"Generating the synthetic video task ({num_rows:,} clips) into {path} (once)")
        rows = (generate_video_row(i, seed) for i in range(num_rows))
        rows = tqdm(rows, total=num_rows, desc="generating", unit="clip")
        save_once(Dataset.from_list(list(rows), features=VIDEO_FEATURES), path)
    return load_from_disk(str(path))


def with_videos(dataset: Dataset, videos: Dataset) -> Dataset:
    """`dataset`'s rows, then the video rows: every row with a `videos` column (empty for
    rows without)."""
    if "videos" not in dataset.column_names:
        dataset = dataset.add_column("videos", [[]] * len(dataset), feature=VIDEOS)
    return datasets.concatenate_datasets([dataset, videos])


@contextlib.contextmanager
def unreadable_files_named(files: list[Path]):
    """Turn a failure to read local data files into one sentence naming the file at fault."""
    try:
        yield
    except Exception as error:  # datasets and pyarrow raise many kinds, without the file's name
        bad = first_unreadable(files)
        if bad is None:
            raise
        raise UserError(bad) from error


def first_unreadable(files) -> str | None:
    """A sentence naming the first of `files` (parquet or Arrow) that is missing or does not
    read whole, else None. Reads each local file's footer (parquet) or every record batch (Arrow);
    a remote file's failure is the reader's own."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    for file in [f for f in map(str, files) if not is_remote(f)]:
        try:
            if file.endswith(".parquet"):
                pq.ParquetFile(file).metadata  # noqa: B018 - reading the footer is the check
            else:
                with pa.memory_map(file) as source:
                    pa.ipc.open_stream(source).read_all()
        except FileNotFoundError:
            return f"data file {file} has disappeared; restore it, or start again without it"
        except (OSError, pa.ArrowException) as error:
            return (
                f"data file {file} is damaged ({error.__class__.__name__}: {first_line(error)}); "
                "copy it again, or delete it to go on without its rows"
            )
    return None


def first_line(error: BaseException) -> str:
    return str(error).strip().splitlines()[0] if str(error).strip() else ""


def load_hub(
    name: str, subset: str | None, split: str, data_dir: str | None = None, streaming=False
):
    """A Hub dataset's rows (a stream, `streaming`), or one sentence when they cannot be had."""
    default_hint = "run without --dataset to use the embedded synthetic dataset"
    require_hub(f"dataset {name!r}", default_hint)
    try:
        return load_dataset(name, subset, split=split, data_dir=data_dir, streaming=streaming)
    except (ConnectionError, OSError, FileNotFoundError, ValueError) as error:
        raise UserError(
            f"could not {'stream' if streaming else 'load'} dataset {name!r}"
            + (f" (subset {subset!r})" if subset else "")
            + f" from the Hugging Face Hub ({error.__class__.__name__}); {default_hint}"
        ) from error


def with_undecoded_images(rows):
    """Rows (a Dataset, or a stream) whose images stay encoded bytes (`UNDECODED_IMAGES`)."""
    features = rows.features
    if features is not None and features.get("images") not in (None, UNDECODED_IMAGES):
        rows = rows.cast_column("images", UNDECODED_IMAGES)
    return rows


def check_schema(dataset: Dataset, source: str | None) -> None:
    missing = {"images", "texts"} - set(dataset.column_names)
    if missing:
        raise UserError(
            f"dataset {source!r} lacks the column(s) {', '.join(sorted(missing))}: mmdp expects "
            "the_cauldron's schema, images (list of images) and texts (list of {user, assistant})"
        )
