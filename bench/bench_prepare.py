"""Prepare on one machine or on Ray: the rows a second that `mmdp.prepare` reads and weighs with
its local engine (1 and 2 processes: datasets.map) and with Ray Data (a local instance of 1 and
2 CPUs), side by side.

    uv run bench/bench_prepare.py                         # 16,000 rows, 3 repeats (~8 min on 2 cores)
    uv run bench/bench_prepare.py --rows 1000000 --cpus 16 --engines ray --repeats 1  # 16 cores
    uv run bench/bench_prepare.py --rows 400 --cpus 1 --repeats 1   # the smallest run (the tests')

The rows: the embedded dataset tiled to --rows and written as parquet files of 2,000 rows (a
user's files: Ray's workers read them, a task per file), weighed for TinyVLM. Each run is a fresh
process with an empty cache, timed over what prepare does before it writes: the local engine
loads the files (datasets) and weighs them; the Ray engine reads and weighs them on its workers
and gathers the weights here, after a warm-up that starts the instance and its workers (their
imports: a cost a long job pays once, shown apart as "start"). The runs take turns (each setting
once, then again), so that other jobs' load falls on all alike; medians. The last line: rows a
second on the most CPUs against 1, for each engine.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

FILE_ROWS = 2_000


def write_rows(folder: Path, rows: int) -> None:
    """The embedded dataset's rows, tiled to `rows`, in parquet files of FILE_ROWS rows."""
    from mmdp.data.reading.sources import load_vqa_dataset

    base = load_vqa_dataset(num_rows=FILE_ROWS)
    base.to_parquet(folder / "whole.parquet")
    for k, start in enumerate(range(0, rows, FILE_ROWS)):
        if rows - start >= FILE_ROWS:  # a copy: 1,000,000 rows are 500 files
            shutil.copy(folder / "whole.parquet", folder / f"{k:05d}.parquet")
        else:
            base.select(range(rows - start)).to_parquet(folder / f"{k:05d}.parquet")
    (folder / "whole.parquet").unlink()


def one_run(engine: str, cpus: int, folder: str) -> dict:
    """Read and weigh the rows in `folder` (in this fresh process): seconds and rows."""
    from mmdp.data.families import family_for
    from mmdp.data.reading.settings import DataSettings
    from mmdp.data.tokenizer import get_tokenizer
    from mmdp.weighing.prepared import rows_digest
    from mmdp.weighing.weigh import weigh_rows

    family = family_for(get_tokenizer())
    settings = DataSettings(dataset=folder)
    start = time.perf_counter()
    if engine == "local":
        rows = settings.load()
        weigh_rows(rows, family, num_proc=cpus)
        rows_digest(rows)
        return {"seconds": time.perf_counter() - start, "rows": len(rows), "start": 0.0}
    from mmdp.weighing import on_ray

    warm_up = min(2 * cpus * on_ray.BLOCK_ROWS, FILE_ROWS * len(os.listdir(folder)))
    on_ray.weigh_on_ray(
        DataSettings(dataset=folder, num_rows=warm_up), family, num_proc=cpus, address=None
    )
    warm = time.perf_counter()
    weighing, _ = on_ray.weigh_on_ray(settings, family, num_proc=cpus, address=None)
    return {
        "seconds": time.perf_counter() - warm,
        "rows": len(weighing.weights),
        "start": warm - start,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=16_000, help="rows (default 16,000)")
    parser.add_argument("--cpus", type=int, nargs="+", default=[1, 2], help="default: 1 2")
    parser.add_argument("--engines", nargs="+", default=["local", "ray"], choices=["local", "ray"])
    parser.add_argument("--repeats", type=int, default=3, help="runs of each (default 3)")
    parser.add_argument("--one", nargs=3, metavar=("ENGINE", "CPUS", "FOLDER"), help="internal")
    args = parser.parse_args()
    if args.one:  # a run, in a process of its own
        print(json.dumps(one_run(args.one[0], int(args.one[1]), args.one[2])))
        return

    settings = [(engine, cpus) for engine in args.engines for cpus in args.cpus]
    runs = {setting: [] for setting in settings}
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch) / "rows"
        folder.mkdir()
        write_rows(folder, args.rows)
        print(f"load average before: {os.getloadavg()[0]:.1f}", flush=True)
        for repeat in range(args.repeats):
            for engine, cpus in settings:
                cache = tempfile.mkdtemp(dir=scratch)  # nothing weighed or converted before
                env = {**os.environ, "MMDP_CACHE": cache, "HF_DATASETS_CACHE": cache}
                command = [sys.executable, __file__, "--one", engine, str(cpus), str(folder)]
                done = subprocess.run(command, capture_output=True, text=True, env=env)
                assert done.returncode == 0, done.stderr[-3000:]
                result = json.loads(done.stdout.strip().splitlines()[-1])
                assert result["rows"] == args.rows, result
                runs[engine, cpus].append(result)
                rate = result["rows"] / result["seconds"]
                print(f"run {repeat + 1}: {engine}, {cpus} CPUs: {rate:,.0f} rows/s", flush=True)
        print(f"load average after: {os.getloadavg()[0]:.1f}\n")

    rate = {s: statistics.median(x["rows"] / x["seconds"] for x in runs[s]) for s in settings}
    first = rate[settings[0]]
    print(f"Reading and weighing {args.rows:,} rows (TinyVLM), median of {args.repeats} runs:\n")
    print("| engine | CPUs | rows/s | rows/s a CPU | against the first | start s |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for engine, cpus in settings:
        start = statistics.median(x["start"] for x in runs[engine, cpus])
        r = rate[engine, cpus]
        print(
            f"| {engine} | {cpus} | {r:,.0f} | {r / cpus:,.0f} | {r / first:.2f}x | {start:.1f} |"
        )
    most, fewest = max(args.cpus), min(args.cpus)
    scaling = ", ".join(
        f"{engine} {rate[engine, most] / rate[engine, fewest]:.2f}x" for engine in args.engines
    )
    print(f"\nrows/s on {most} CPUs against {fewest}: {scaling}")


if __name__ == "__main__":
    main()
