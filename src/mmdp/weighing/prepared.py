"""A prepared dataset: weigh once, train many times, on many machines.

`uv run -m mmdp.prepare --out URL` weighs every row of a dataset (mmdp.weighing.weigh; with
--pretokenize it keeps each sample's input_ids and labels too) and writes the result to a local
folder or any fsspec URL (s3://, gs://, hf://, ...), with a manifest of everything the weights
depend on. Training reads it from there on every rank and node and weighs nothing (`weigh_dataset`,
which PackedDataset calls: without a URL, it weighs the rows). What lies under URL:

    manifest.json              written last: until it exists, URL holds no prepared dataset
    parts-<id>/weights.npz     each row's tokens, images, patches and drop reason
    parts-<id>/tokens.arrow    (--pretokenize) each row's input_ids and labels, Arrow IPC stream

Writing is atomic on a disk and on an object store alike (which cannot rename a folder):

1. Write the parts under a new prefix, parts-<id>/: no manifest names it yet, so no reader sees it.
2. Write manifest.json beside its final name, then move it there (a rename on a disk, one copy of
   one object on S3): it names the parts and their sha256. This is the commit.
3. Remove the parts an earlier prepare to the same URL left (its manifest is now replaced).

Reading checks the manifest against the run (`describe`): the model family, its tokenizer,
processor, chat template and image rule, the budgets the rows were checked against, the rows
themselves. Any difference is refused in one sentence naming both values (a UserError: exit 2),
never reused silently.
"""

import dataclasses
import hashlib
import io
import json
import os
import tempfile
import time
import uuid
from importlib.metadata import version
from pathlib import Path

import fsspec
import numpy as np
import pyarrow as pa
import torch.distributed as dist
import transformers
from datasets import Dataset

from mmdp.data.families.base import tokenizer_fingerprint
from mmdp.data.families.tiny import TinyFamily
from mmdp.data.reading.sources import cache_dir
from mmdp.errors import UserError
from mmdp.packing.packing_config import PackingConfig
from mmdp.packing.weights import Weights
from mmdp.weighing.cache import ARRAYS, checksum, weights_of
from mmdp.weighing.weigh import WEIGHING_VERSION, Weighing, weigh_rows

# Bump when the layout under URL or the manifest's meaning changes.
PREPARED_VERSION = 2  # 2: the rows' digest hashes each row's own digest (what Ray's workers send)
MANIFEST = "manifest.json"
# Rows read to tell one dataset from another (spread over the dataset, texts and image bytes).
ROWS_IN_DIGEST = 64
# The image processor settings that change how many tokens or patches an image costs.
IMAGE_RULE_SETTINGS = (
    "patch_size",
    "temporal_patch_size",
    "merge_size",
    "size",
    "min_pixels",
    "max_pixels",
)
# ...and the video processor's settings that change a video's count besides (a family that
# takes video: mmdp.data.families.qwen_vl.VIDEO_SETTINGS)
VIDEO_RULE_SETTINGS = (
    "do_sample_frames",
    "fps",
    "num_frames",
    "min_frames",
    "max_frames",
    "cap_pixels_per_frame",
    "max_video_tokens",
)
# What the manifest must match, in the order they are checked, and how a sentence names each.
CHECKED = {
    "format": "the prepared format",
    "weighing_version": "the weighing version",
    "family": "the model family",
    "tokenizer": "the tokenizer (sha256)",
    "chat_template": "the chat template (sha256)",
    "image_rule": "the image rule",
    "processor": "the processor (sha256 of everything that changes a weight)",
    "max_length": "max_length",
    "max_images": "max_images",
    "max_patches": "max_patches",
    "rows": "rows",
    "rows_digest": "the rows (sha256 of 64 of them)",
}


# What the weights depend on --------------------------------------------------------------------


def describe(family, config: PackingConfig, rows: int, rows_digest: str) -> dict:
    """Everything a prepared dataset must share with a run to be reused by it (see CHECKED): of
    the config, the budgets; of the rows, how many and their digest (rows_digest)."""
    return {
        "format": PREPARED_VERSION,
        "weighing_version": WEIGHING_VERSION,
        "family": family.name,
        "tokenizer": digest(tokenizer_fingerprint(family.tokenizer)),
        "chat_template": digest(getattr(family.processor, "chat_template", None)),
        "image_rule": image_rule(family),
        "processor": digest(family.fingerprint()),
        **dataclasses.asdict(config.budgets),  # max_length, max_images, max_patches
        "rows": rows,
        "rows_digest": rows_digest,
    }


def image_rule(family) -> str:
    """How the family's images become tokens, in words: TinyVLM's fixed count, or the image
    processor's settings that change a count."""
    if isinstance(family, TinyFamily):
        return f"{family.image_token_length} tokens per image"
    settings = family.processor.image_processor.to_dict()
    rule = ", ".join(f"{key}={settings[key]}" for key in IMAGE_RULE_SETTINGS if key in settings)
    if family.video_token:  # a family that takes video: its video processor's too
        settings = family.processor.video_processor.to_dict()
        names = (*IMAGE_RULE_SETTINGS, *VIDEO_RULE_SETTINGS)
        rule += "; videos: " + ", ".join(f"{k}={settings[k]}" for k in names if k in settings)
    return rule


def rows_digest(rows: Dataset) -> str:
    """A digest of ROWS_IN_DIGEST rows spread over the dataset: another dataset of the same length
    differs here, at the cost of reading a few rows."""
    return digest_of_rows([row_digest(row) for row in rows.select(picked_rows(len(rows)))])


def picked_rows(count: int) -> list[int]:
    """The rows, of `count`, whose digests make the rows' digest.

    >>> picked_rows(3), len(picked_rows(2_000))
    ([0, 1, 2], 64)
    """
    if count == 0:
        return []
    return np.unique(np.linspace(0, count - 1, ROWS_IN_DIGEST).astype(int)).tolist()


def row_digest(row: dict) -> bytes:
    """8 bytes of a row's sha256: its texts, image and video bytes (or paths)."""
    sha = hashlib.sha256(json.dumps(row["texts"], sort_keys=True).encode())
    for media in (row["images"] or []) + (row.get("videos") or []):
        media = media or {}  # a null cell (undecodable: counted when weighed)
        sha.update(media.get("bytes") or str(media.get("path")).encode())
    return sha.digest()[:8]


def digest_of_rows(row_digests) -> str:
    """The rows' digest: of the picked rows' own digests, in order."""
    return hashlib.sha256(b"".join(row_digests)).hexdigest()[:16]


def digest(value) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:16]


def check_matches(manifest: dict, run: dict, url: str) -> None:
    """Refuse, in one sentence naming both values, a prepared dataset made for another run."""
    for key, name in CHECKED.items():
        if manifest.get(key) != run[key]:
            raise UserError(
                f"the prepared dataset at {url} was made with {name} {manifest.get(key)!r}, but "
                f"this run has {run[key]!r}; run with its settings or prepare it again with yours"
            )
    ours = versions()
    if manifest.get("versions") != ours:
        print(f"note: {url} was prepared with {manifest.get('versions')}, this run has {ours}")


def versions() -> dict:
    return {"mmdp": version("mmdp"), "transformers": transformers.__version__}


# Writing ----------------------------------------------------------------------------------------


def write_prepared(url: str, weights: Weights, tokens: Dataset | None, manifest: dict) -> dict:
    """Steps 1-3 of the module docstring; returns the manifest written."""
    fs, root = open_url(url)
    fs.makedirs(root, exist_ok=True)  # a folder, or on S3 the bucket if it is new
    previous = read_manifest_or_none(fs, root)
    parts = f"parts-{uuid.uuid4().hex[:12]}"
    with tempfile.TemporaryDirectory() as staging:
        files = stage_parts(Path(staging), weights, tokens)
        fs.put(f"{staging}/", f"{root}/{parts}/", recursive=True)
    manifest = {**manifest, "versions": versions(), "parts": parts, "files": files}
    commit(fs, root, manifest)
    if previous is not None and previous.get("parts") not in (None, parts):
        fs.rm(f"{root}/{previous['parts']}", recursive=True)
    return manifest


def commit(fs, root: str, manifest: dict) -> None:
    """Step 2: the manifest appears whole under its name, or not at all."""
    partial = f"{root}/{MANIFEST}.partial-{uuid.uuid4().hex[:12]}"
    with fs.open(partial, "w") as f:
        json.dump(manifest, f, indent=1)
    fs.mv(partial, f"{root}/{MANIFEST}")


def stage_parts(folder: Path, weights: Weights, tokens: Dataset | None) -> dict:
    """Write the parts into a local folder; their names and sha256, for the manifest."""
    np.savez(folder / "weights.npz", **{name: getattr(weights, name) for name in ARRAYS})
    if tokens is not None:
        table = tokens.flatten_indices().with_format("arrow")[:]
        with pa.OSFile(str(folder / "tokens.arrow"), "wb") as sink:
            with pa.ipc.new_stream(sink, table.schema) as writer:
                writer.write_table(table)
    return {path.name: checksum(path) for path in sorted(folder.iterdir())}


def read_manifest_or_none(fs, root: str) -> dict | None:
    try:
        return json.loads(fs.cat_file(f"{root}/{MANIFEST}"))
    except FileNotFoundError:
        return None


# Reading ----------------------------------------------------------------------------------------


def read_manifest(url: str) -> dict:
    """The manifest at `url`; one sentence when there is none (nothing prepared there, or a
    prepare that did not finish: its parts are never read)."""
    fs, root = open_url(url)
    try:
        manifest = read_manifest_or_none(fs, root)
    except (OSError, ValueError) as error:
        raise UserError(
            f"cannot read {url}/{MANIFEST} ({error.__class__.__name__}: {error})"
        ) from error
    if manifest is None:
        raise UserError(
            f"{url} holds no prepared dataset (no {MANIFEST}: nothing was prepared there, or a "
            f"prepare did not finish); run uv run -m mmdp.prepare --out {url}"
        )
    return manifest


def open_url(url: str):
    """(filesystem, path) of a path or fsspec URL; one sentence when its protocol's package is
    missing (s3:// needs s3fs: the extra s3)."""
    try:
        return fsspec.core.url_to_fs(str(url))
    except ImportError as error:
        raise UserError(f"reading {url} needs a package: {error} (uv sync --extra s3)") from error


def weigh_dataset(
    dataset, config: PackingConfig, *, prepared: str | None, pretokenize: bool, **weighing
) -> Weighing:
    """The weights (and, with `pretokenize`, the tokens) of a VQADataset's rows: weighed now or
    read from the cache (weigh_rows, which takes `weighing`: num_proc, across_ranks), or read
    from the URL `prepared` after checking that it was prepared for this run and `config`'s
    budgets: nothing is weighed."""
    rows = dataset.dataset
    if prepared is None:
        return weigh_rows(rows, dataset.family, pretokenize=pretokenize, **weighing)
    start, url = time.perf_counter(), prepared
    manifest = read_manifest(url)
    run = describe(dataset.family, config, len(rows), rows_digest(rows))
    check_matches(manifest, run, url)
    if pretokenize and "tokens.arrow" not in manifest["files"]:
        raise UserError(
            f"{url} was prepared without tokens; prepare it again with --pretokenize, or train without"
        )
    fs, root = open_url(url)
    weights = read_weights(fs, root, manifest, url)
    tokens = read_tokens(fs, root, manifest, url) if "tokens.arrow" in manifest["files"] else None
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        print(
            f"rank {dist.get_rank()}: weighed nothing: read the prepared weights of {len(weights):,} rows from {url}",
            flush=True,
        )
    return Weighing(weights, tokens, 0, time.perf_counter() - start, url)


def read_weights(fs, root: str, manifest: dict, url: str) -> Weights:
    data = fs.cat_file(f"{root}/{manifest['parts']}/weights.npz")
    if hashlib.sha256(data).hexdigest() != manifest["files"]["weights.npz"]:
        raise UserError(
            f"the weights at {url} do not match their manifest's sha256 (changed after it was written); prepare it again"
        )
    with np.load(io.BytesIO(data)) as saved:
        return weights_of({name: saved[name] for name in ARRAYS})


def read_tokens(fs, root: str, manifest: dict, url: str) -> Dataset:
    """The tokens, copied once per machine into the cache (named by their sha256), then
    memory-mapped: each rank reads only the rows of its packs."""
    sha = manifest["files"]["tokens.arrow"]
    local = cache_dir() / "prepared" / sha[:20] / "tokens.arrow"
    if not local.exists():
        local.parent.mkdir(parents=True, exist_ok=True)
        partial = local.with_name(f"tokens.arrow.partial-{os.getpid()}")
        fs.get_file(f"{root}/{manifest['parts']}/tokens.arrow", str(partial))
        if checksum(partial) != sha:
            partial.unlink()
            raise UserError(
                f"the tokens at {url} do not match their manifest's sha256 (changed after it was written); prepare it again"
            )
        os.replace(partial, local)  # ranks copying at once: the last rename wins, same bytes
    return Dataset.from_file(str(local))
