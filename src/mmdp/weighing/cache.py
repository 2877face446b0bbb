"""The weights cache on disk (steps 3 of mmdp.weighing.weigh): one folder per cache key,
saved atomically (written beside, then renamed) and checked when loaded (a manifest, written last,
holds the rows and a checksum), so that a truncated or edited cache is weighed again, never
planned from. mmdp.weighing.prepared reads and writes the same arrays."""

import errno
import hashlib
import json
import os
import shutil
from pathlib import Path

import numpy as np
from datasets import Dataset, load_from_disk

from mmdp.errors import UserError
from mmdp.packing.weights import Weights

# The arrays of a weights file, named as Weights' fields, in the order ranks send them.
ARRAYS = ("lengths", "image_counts", "patch_counts", "reasons")


class BadCache(Exception):
    """A weights cache that does not match its manifest (truncated, edited, half written)."""


def save(path: Path, arrays: dict, tokens: Dataset | None = None) -> None:
    """Step 3: write next to the final place, then rename: an interrupted run, a full disk or a
    second job writing at the same time never leaves a half cache under `path`."""
    partial = path.with_name(f"{path.name}.partial-{os.getpid()}")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    try:
        np.savez(partial / "weights.npz", **{name: arrays[name] for name in ARRAYS})
        if tokens is not None:
            tokens.save_to_disk(str(partial / "tokens"))
        manifest = {"rows": len(arrays["lengths"]), "sha256": checksum(partial / "weights.npz")}
        (partial / "manifest.json").write_text(json.dumps(manifest))
        partial.rename(path)
    except OSError as error:  # another process got there first (the same weights), or no room
        shutil.rmtree(partial, ignore_errors=True)
        if is_complete(path):
            return
        if error.errno in (errno.ENOSPC, errno.EDQUOT):
            raise UserError(
                f"the disk is full: the weights could not be saved under {path.parent}; free "
                "some space there or set MMDP_CACHE to a folder on another disk"
            ) from error
        raise
    finally:
        shutil.rmtree(scratch_path(path), ignore_errors=True)
        remove_abandoned_partials(path)


def scratch_path(path: Path) -> Path:
    """Where this process's pre-computed tokens are written before they are saved: its own, as
    two jobs weighing the same rows at once would otherwise delete each other's."""
    return path.with_name(f"{path.name}.map-{os.getpid()}")


def remove_abandoned_partials(path: Path) -> None:
    """Remove the half-written copies and scratch folders that killed processes of this machine
    left beside `path`."""
    for kind in ("partial", "map"):
        for left in path.parent.glob(f"{path.name}.{kind}-*"):
            pid = left.name.rsplit("-", 1)[1]
            if pid.isdigit() and int(pid) != os.getpid() and not process_exists(int(pid)):
                shutil.rmtree(left, ignore_errors=True)


def process_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # signal 0: only asks whether the process exists
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def is_complete(path: Path) -> bool:
    """The cache under `path` was saved whole (its manifest is written last)."""
    return (path / "manifest.json").exists()


def load_if_sound(path: Path, pretokenize: bool):
    """(weights, tokens) from a sound cache; None without one. A cache that does not match its
    manifest is removed, with one line saying so, so that the rows are weighed again."""
    if not is_complete(path):
        return None
    try:
        return load(path, pretokenize)
    except BadCache as error:
        print(f"{error}; weighing the rows again", flush=True)
        shutil.rmtree(path, ignore_errors=True)
        return None


def load(path: Path, pretokenize: bool) -> tuple[Weights, Dataset | None]:
    """The cached weights (and tokens), checked against the manifest."""
    try:
        manifest = json.loads((path / "manifest.json").read_text())
        if checksum(path / "weights.npz") != manifest["sha256"]:
            raise BadCache(f"the weights in {path} do not match their checksum")
        with np.load(path / "weights.npz") as saved:
            arrays = {name: saved[name] for name in ARRAYS}
        tokens = load_from_disk(str(path / "tokens")) if pretokenize else None
    except (OSError, ValueError, KeyError) as error:
        message = f"the weights in {path} cannot be read ({error.__class__.__name__})"
        raise BadCache(message) from error
    if len(arrays["lengths"]) != manifest["rows"] or (
        tokens is not None and len(tokens) != manifest["rows"]
    ):
        raise BadCache(f"the weights in {path} do not hold {manifest['rows']:,} rows")
    return weights_of(arrays), tokens


def weights_of(arrays: dict) -> Weights:
    return Weights(
        arrays["lengths"].astype(np.int32, copy=False),
        arrays["image_counts"].astype(np.int32, copy=False),
        arrays["reasons"].astype(np.uint8, copy=False),
        arrays["patch_counts"].astype(np.int32, copy=False),
    )


def checksum(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()
