"""Load a VQA dataset in the_cauldron's schema: the embedded synthetic default, a local copy, or the Hub.

Schema (one row = one training sample):
    images: list of images          (a `datasets` Image feature per element)
    texts:  list of {"user": str, "assistant": str, "source": str}   (one dict per turn)
    videos: list of {"bytes", "path"} video files (optional; the families that take video)

Every loader returns a `datasets.Dataset` whose images are NOT decoded (`Image(decode=False)`):
rows carry the encoded bytes, so counting images costs nothing, and decoding happens in one
place (`mmdp.data.images.load_image`) where a broken file becomes a counted skip instead of a crash.
"""

import contextlib
import dataclasses
import os
import shutil
from pathlib import Path

import datasets
from datasets import Dataset, Features, List, Value, load_dataset, load_from_disk
from tqdm.auto import tqdm

from mmdp import config
from mmdp.data.hub import looks_like_a_path, require_hub
from mmdp.data.synthetic import encode_png, generate_row
from mmdp.errors import UserError

SYNTHETIC_VERSION = 3  # bump when generate_row changes, so old caches are not reused

# Images stay encoded (decode=False): see the module docstring.
UNDECODED_IMAGES = List(datasets.Image(decode=False))
FEATURES = Features(
    {
        "images": UNDECODED_IMAGES,
        "texts": List(
            {"user": Value("string"), "assistant": Value("string"), "source": Value("string")}
        ),
    }
)
# A row's videos (mmdp.data.videos): the encoded files, as images are stored, never decoded here.
VIDEOS = List({"bytes": Value("binary"), "path": Value("string")})
VIDEO_FEATURES = Features({**FEATURES, "videos": VIDEOS})
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
) -> Dataset:
    """Load the dataset a stage runs on.

    - `None`: the embedded synthetic dataset (`num_rows` rows, generated once and cached);
    - an existing local path: a directory written by `Dataset.save_to_disk`, or parquet file(s)
      (a .parquet file, or a directory of them);
    - anything else: a Hub name for `datasets.load_dataset`, e.g. "HuggingFaceM4/the_cauldron"
      with subset "ai2d".
    When `num_rows` is given, only the first `num_rows` rows are kept.
    """
    if name_or_path is None:
        dataset = load_synthetic(max(num_rows or 0, config.DEFAULT_NUM_ROWS), seed=seed)
    elif Path(name_or_path).exists():
        dataset = load_local(Path(name_or_path), split)
    elif looks_like_a_path(name_or_path):
        raise UserError(f"dataset {name_or_path!r}: no such file or directory")
    else:
        dataset = load_hub(name_or_path, subset, split)
    check_schema(dataset, name_or_path)
    if dataset.features["images"] != UNDECODED_IMAGES:
        dataset = dataset.cast_column("images", UNDECODED_IMAGES)
    if num_rows is not None and num_rows < len(dataset):
        dataset = dataset.select(range(num_rows))
    return dataset


def load_synthetic(num_rows: int, seed: int = 0) -> Dataset:
    """The embedded default: generated on first use (with a progress bar), then loaded from disk."""
    path = cache_dir() / f"synthetic-v{SYNTHETIC_VERSION}-seed{seed}-rows{num_rows}"
    if not path.exists():
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
    """The synthetic video task (mmdp.data.synthetic_videos), generated once and cached like
    the images' rows: kept apart from them, for the families that take video."""
    from mmdp.data.synthetic_videos import generate_video_row  # PyAV: the video extra

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


def load_local(path: Path, split: str) -> Dataset:
    parquet_files = [path] if path.suffix == ".parquet" else sorted(path.glob("**/*.parquet"))
    if (path / "dataset_info.json").exists() or (path / "dataset_dict.json").exists():
        with unreadable_files_named(sorted(path.glob("**/*.arrow"))):
            loaded = load_from_disk(str(path))
    elif parquet_files:
        with unreadable_files_named(parquet_files):
            data_files = [str(f) for f in parquet_files]
            loaded = load_dataset("parquet", data_files=data_files, split="train")
    else:
        raise UserError(
            f"{path} is neither a directory written by save_to_disk nor parquet file(s)"
        )
    if isinstance(loaded, datasets.DatasetDict):
        if split not in loaded:
            raise UserError(f"{path} has no split {split!r} (it has {', '.join(loaded)})")
        loaded = loaded[split]
    return loaded


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
    read whole, else None. Reads each file's footer (parquet) or every record batch (Arrow)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    for file in map(str, files):
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


def load_hub(name: str, subset: str | None, split: str) -> Dataset:
    default_hint = "run without --dataset to use the embedded synthetic dataset"
    require_hub(f"dataset {name!r}", default_hint)
    try:
        return load_dataset(name, subset, split=split)
    except (ConnectionError, OSError, FileNotFoundError, ValueError) as error:
        raise UserError(
            f"could not load dataset {name!r}"
            + (f" (subset {subset!r})" if subset else "")
            + f" from the Hugging Face Hub ({error.__class__.__name__}); {default_hint}"
        ) from error


def with_undecoded_images(stream: datasets.IterableDataset) -> datasets.IterableDataset:
    """A stream whose images stay encoded bytes, as the loaders above give them."""
    features = stream.features
    if features is not None and features.get("images") not in (None, UNDECODED_IMAGES):
        stream = stream.cast_column("images", UNDECODED_IMAGES)
    return stream


def check_schema(dataset: Dataset, source: str | None) -> None:
    missing = {"images", "texts"} - set(dataset.column_names)
    if missing:
        raise UserError(
            f"dataset {source!r} lacks the column(s) {', '.join(sorted(missing))}: mmdp expects "
            "the_cauldron's schema, images (list of images) and texts (list of {user, assistant})"
        )


def undecoded(rows):
    """`rows` (a datasets.Dataset or IterableDataset) with its images and videos kept encoded:
    every Image or Video feature of its `images` and `videos` columns cast to decode=False
    (datasets' default Image() decodes each image as the row is read, where a truncated file
    raises inside a DataLoader worker, outside mmdp's one decoding place). Anything else, and a
    dataset already undecoded, comes back as it is (the same object, the same fingerprint)."""
    features = getattr(rows, "features", None)
    if features is None:
        return rows
    for name in ("images", "videos"):
        if name in features and (encoded := kept_encoded(features[name])) != features[name]:
            rows = rows.cast_column(name, encoded)
    return rows


def kept_encoded(feature):
    """A feature with its Image and Video parts set to decode=False (nested in lists too)."""
    if isinstance(feature, (datasets.Image, datasets.Video)):
        return dataclasses.replace(feature, decode=False)
    if isinstance(feature, (List, datasets.LargeList)):
        return dataclasses.replace(feature, feature=kept_encoded(feature.feature))
    return feature
