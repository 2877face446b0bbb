"""Weigh a dataset on Ray Data, on this machine's CPUs or a cluster's: the weights of
`uv run -m mmdp.prepare --engine ray`, the same as the local engine's (mmdp.weighing.weigh).

1. Read. A user's data files (JSON, JSON Lines, parquet; local on a disk every worker sees, or
   remote: s3://...) are read on the workers, a task per file, by mmdp's own readers
   (formats.json_rows, sources.as_cauldron): the same format detection, column maps and paths.
   A column map is checked against each file's columns (on one machine: all the files').
   The other rows (the embedded dataset, a save_to_disk folder, a Hub dataset, a LLaMA-Factory
   entry) are loaded here by load_vqa_dataset, then handed to Ray in blocks.
2. Weigh blocks of BLOCK_ROWS rows, a Ray task each, with weigh_batch: the function datasets.map
   calls on one machine, on batches of the same size. Each row's digest comes back with its
   weights (mmdp.weighing.prepared.row_digest).
3. Gather them here in the rows' order (Ray Data's preserve_order): each row keeps the index
   load_vqa_dataset gives it.

A task whose worker dies (killed, out of memory, a node lost), reading or weighing, is run again,
up to TASK_RETRIES times, then the run ends in one sentence; until every row is weighed nothing
is written.
"""

import contextlib
import hashlib
import os
import pickle
import socket
import time
import warnings
from pathlib import Path

import numpy as np
import pyarrow as pa
from datasets import Dataset, Features

from mmdp.data.reading import column_maps, formats, sources
from mmdp.errors import UserError, require_extra
from mmdp.weighing import prepared, weigh
from mmdp.weighing.cache import ARRAYS, weights_of

# Rows a task weighs: about 0.3 s of tiny's weighing, so that a few thousand rows already spread
# over a machine's CPUs.
BLOCK_ROWS = 1024
# Runs of a task whose worker died, after the first (Ray Data's own default retries forever: a
# row that kills its worker every time would never end).
TASK_RETRIES = 3
ROW_COLUMNS = ("images", "videos", "texts")
# A family pickled is about 1.5 MB (its tokenizer); unpickling it takes 80 ms, a quarter of a
# block's weighing: each worker process unpickles it once (by its sha256).
FAMILIES = {}


def weigh_on_ray(
    settings, family, *, num_proc: int | None, address: str | None
) -> tuple[weigh.Weighing, str]:
    """(the weighing, the rows' digest) of the rows `settings` (a DataSettings) names, weighed on
    Ray: a local instance on `num_proc` CPUs (default: all), or the cluster at `address` (or
    RAY_ADDRESS's, which `ray job submit` sets)."""
    ray = start_ray(address, num_proc)
    start = time.perf_counter()
    with warnings.catch_warnings():  # max_retries is ray_remote_args, deprecated in Ray 2.60
        warnings.simplefilter("ignore", DeprecationWarning)  # (reading's, in rows_on_ray, too)
        weighed = rows_on_ray(ray, settings).map_batches(
            weigh_block,
            batch_size=weigh.BATCH_ROWS,
            batch_format="pyarrow",
            fn_kwargs={"pickled_family": pickle.dumps(family)},
            max_retries=TASK_RETRIES,
        )
    print(f"Weighing on Ray ({cpus(ray)} CPUs): blocks of {BLOCK_ROWS:,} rows", flush=True)
    with one_sentence():
        blocks = list(weighed.iter_batches(batch_size=None, batch_format="pyarrow"))
    if not blocks:
        raise UserError(f"no rows to weigh in {settings.dataset or 'the embedded dataset'}")
    table = pa.concat_tables(blocks)
    arrays = {name: table[column].to_numpy() for name, column in zip(ARRAYS, weigh.WEIGHT_FEATURES)}
    weigh.unreachable(arrays)
    picked = table["digest"].take(prepared.picked_rows(len(table))).to_pylist()
    seconds = time.perf_counter() - start
    rate = f"{len(table) / seconds:,.0f} rows/s"
    if now := cpus(ray):  # an autoscaling cluster's head may have none, its workers gone already
        rate += f", {len(table) / seconds / now:,.0f} a CPU"
    print(f"Weighed {len(table):,} rows on Ray in {seconds:.1f} s ({rate})")
    weighing = weigh.Weighing(weights_of(arrays), None, len(table), seconds, Path("ray"))
    return weighing, prepared.digest_of_rows(picked)


def cpus(ray) -> int:
    """The CPUs of the cluster (or local instance) at this moment: an autoscaling cluster's grow
    and shrink as it runs."""
    return int(ray.cluster_resources().get("CPU", 0))


def start_ray(address: str | None, num_proc: int | None):
    """The ray module, connected: to the cluster at `address` (or RAY_ADDRESS's), else to a new
    local instance on `num_proc` CPUs; to the one this process has started already, if any."""
    address = address or os.environ.get("RAY_ADDRESS")
    if not address:  # workers run this Python, not a fresh `uv run` environment each session
        os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
    ray = require_extra("ray", "ray", "--engine ray")
    require_extra("ray.data", "ray", "--engine ray")
    if address and num_proc:
        raise UserError("--num-proc sizes a local Ray instance; a cluster weighs on all its CPUs")
    if address and address != "auto":  # Ray itself tries for minutes before it gives up
        host, _, port = address.removeprefix("ray://").rpartition(":")
        try:
            socket.create_connection((host, int(port)), timeout=10).close()
        except (OSError, ValueError) as error:
            raise UserError(f"cannot reach the Ray cluster at {address} ({error})") from error
    try:
        if not ray.is_initialized():
            ray.init(address=address, num_cpus=None if address else num_proc)
    except ConnectionError as error:  # "auto" with no cluster on this machine
        raise UserError(f"cannot reach the Ray cluster at {address} ({error})") from error
    ray.data.DataContext.get_current().execution_options.preserve_order = True
    return ray


def rows_on_ray(ray, settings):
    """A Ray Dataset of the rows `settings` names, in their order (step 1): their JSON, JSON Lines
    or parquet files (sources.data_files, as load_vqa_dataset reads them) read on the workers."""
    name, found = settings.dataset, None
    if name is not None and column_maps.entry_spec(name, None) is None:
        found = sources.data_files(name, sources.absolute_root(settings.image_root))
    if found is None or found.kind == "saved":  # read here, weighed on Ray
        rows = settings.load()
        table = rows.select_columns([c for c in ROW_COLUMNS if c in rows.column_names])
        table = table.with_format("arrow")[:]
        starts = range(0, max(len(table), 1), BLOCK_ROWS)
        return ray.data.from_arrow([table.slice(s, BLOCK_ROWS) for s in starts])
    kind, files, base, source = found
    renames = column_maps.renames_of(settings.columns)
    read = ray.data.from_items([{"file": file} for file in files], override_num_blocks=len(files))
    read = read.map_batches(  # a reading that kills its worker (a huge .json) ends too
        read_files,
        batch_size=1,
        fn_args=(kind, settings.format, base, source, renames),
        max_retries=TASK_RETRIES,
    )
    # blocks of BLOCK_ROWS rows, each weighed by its own task (a file's rows on many CPUs)
    read = read.repartition(target_num_rows_per_block=BLOCK_ROWS)
    return read.limit(settings.num_rows) if settings.num_rows is not None else read


def read_files(batch: dict, kind: str, format, base, source, renames: dict):
    """A Ray task's rows (step 1): each file's, in the_cauldron's schema, BLOCK_ROWS at a time."""
    import fsspec
    import pyarrow.parquet as pq

    for file in batch["file"]:
        if kind == "json":
            rows = formats.json_rows([file], format, base, renames=renames)
            while chunk := [row for _, row in zip(range(BLOCK_ROWS), rows)]:
                yield pa.Table.from_pylist(chunk, schema=sources.CONVERSATION_FEATURES.arrow_schema)
            continue
        with fsspec.open(file, "rb") as opened, sources.no_progress_bars():
            for piece in pq.ParquetFile(opened).iter_batches(BLOCK_ROWS):
                rows = Dataset(pa.Table.from_batches([piece]))
                rows = sources.as_cauldron(rows, format, base, source, renames)
                columns = [c for c in ROW_COLUMNS if c in rows.column_names]
                yield rows.with_format("arrow")[:].select(columns)


def weigh_block(block: pa.Table, pickled_family: bytes) -> pa.Table:
    """A Ray task's weights (step 2): weigh_batch's, and each row's digest."""
    key = hashlib.sha256(pickled_family).digest()
    if key not in FAMILIES:
        FAMILIES[key] = pickle.loads(pickled_family)
    rows = block.to_pydict()
    counts = np.array([len(images or []) for images in rows["images"]], np.int32)
    indices = np.arange(len(counts))
    out = weigh.weigh_batch(rows, indices, FAMILIES[key], pretokenize=False, image_counts=counts)
    table = pa.table(out, schema=Features(weigh.WEIGHT_FEATURES).arrow_schema)
    digests = [prepared.row_digest(dict(zip(rows, values))) for values in zip(*rows.values())]
    return table.append_column("digest", pa.array(digests, pa.binary(8)))


@contextlib.contextmanager
def one_sentence():
    """What a Ray task raised, as one sentence: a UserError (a file that is not JSON...) as it is,
    a worker that died TASK_RETRIES + 1 times, or any other failure, named."""
    import ray.exceptions

    try:
        yield
    except ray.exceptions.RayError as error:
        cause = error  # under Ray's wrappers (RayTaskError, UserCodeException), what was raised
        while cause is not None and (
            isinstance(cause, ray.exceptions.RayError) or not isinstance(cause, UserError)
        ):
            cause = getattr(cause, "cause", None) or cause.__cause__
        if cause is not None:  # its sentence (Ray adds lines on its retries after it)
            raise UserError(str(cause).splitlines()[0]) from None
        what = f"{error.__class__.__name__}: {(str(error).strip() or '-').splitlines()[-1]}"
        if isinstance(error, ray.exceptions.WorkerCrashedError):
            what = f"a worker died {TASK_RETRIES + 1} times on the same rows: {what}"
        raise UserError(f"weighing on Ray failed ({what}); nothing was written") from error
