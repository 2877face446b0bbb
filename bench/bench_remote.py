"""Weighing 2,000 images (or 200 videos) on an S3-compatible server against the same files on
disk: the time, the bytes read and the requests (mmdp.data.files: headers only, ranged reads,
requests in flight).

    uv run bench/bench_remote.py                  # about 6 minutes on 2 cores
    uv run bench/bench_remote.py --images 500 --repeats 1
    uv run bench/bench_remote.py --videos 200     # videos instead

2,000 JPEG photos (1024x768, smooth colours and grain: about 170 KB each, as COCO's), one a row
of a messages JSON Lines file, are weighed for Qwen2.5-VL (`weigh_rows`: its datasets.map, one
process, no cache); or, with --videos, as many MP4 clips (one clip of 320x180 noise, 4 s at
15 fps: about 780 KB, its index at its end as FFmpeg writes it, under as many names), from:

- the disk (the files beside the JSON Lines file);
- moto's S3 server (tests/counting_s3.py, in a process of its own), which counts what it serves;
- the same server holding every request `--latency` seconds first (S3's first byte: tens of
  ms), with REQUESTS_IN_FLIGHT requests in flight, and with one at a time (what a loop over the
  files would do, as video headers were read before issue 54).

Medians of the repeats: the wall time, and this process's CPU time (the client's work: S3's
request signing, parsing, the family's rules; the server's is in its own process, though on
the same 2 cores). Every run weighs the same rows to the same weights (checked).
"""

import argparse
import io
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np
from PIL import Image

from mmdp.data import files
from mmdp.data.families import family_for, offline_processor
from mmdp.data.images import remote_image_size
from mmdp.data.reading.sources import load_vqa_dataset
from mmdp.data.videos import remote_video_metadata
from mmdp.weighing.weigh import weigh_rows

SERVER = Path(__file__).resolve().parents[1] / "tests" / "counting_s3.py"


def photo(seed: int, width: int = 1024, height: int = 768) -> bytes:
    rng = np.random.default_rng(seed)
    colours = rng.integers(0, 255, (6, 8, 3), dtype=np.uint8)
    smooth = np.asarray(Image.fromarray(colours).resize((width, height), Image.Resampling.BICUBIC))
    grain = rng.normal(0, 6, (height, width, 3))
    buffer = io.BytesIO()
    Image.fromarray((smooth + grain).clip(0, 255).astype(np.uint8)).save(buffer, "JPEG", quality=90)
    return buffer.getvalue()


def clip(seconds: int = 4, fps: int = 15, width: int = 320, height: int = 180) -> bytes:
    """An MP4 of noise that compresses little (about 780 KB), its index (moov) at its end."""
    from mmdp.data.synthetic.videos import encode_mp4

    rng = np.random.default_rng(0)
    frames = rng.integers(0, 255, (seconds * fps, height, width, 3), dtype=np.uint8)
    return encode_mp4(frames, fps)


def write_dataset(folder: Path, count: int, videos: bool = False) -> dict[str, bytes]:
    """count photos under folder/images (or copies of one clip under folder/videos) and
    train.jsonl naming them (relative paths)."""
    kind = "videos" if videos else "images"
    (folder / kind).mkdir(parents=True, exist_ok=True)
    if videos:
        data = clip()
        media = {f"videos/{k:05d}.mp4": data for k in range(count)}
    else:
        media = {f"images/{k:05d}.jpg": photo(k) for k in range(count)}
    for name, data in media.items():
        (folder / name).write_bytes(data)
    tag, what = ("<video>", "clip") if videos else ("<image>", "photo")
    rows = [
        {
            "messages": [
                {"role": "user", "content": f"{tag} What is in {what} {k}?"},
                {"role": "assistant", "content": "Colours, and grain."},
            ],
            kind: [name],
        }
        for k, name in enumerate(media)
    ]
    (folder / "train.jsonl").write_text("\n".join(json.dumps(row) for row in rows))
    return media


def weigh_once(dataset: str, family) -> tuple[float, float, np.ndarray]:
    """Wall and CPU seconds to weigh the rows (no weights cache, no header remembered), and their
    lengths."""
    rows = load_vqa_dataset(dataset)
    shutil.rmtree(Path(os.environ["MMDP_CACHE"]) / "weights", ignore_errors=True)
    remote_image_size.cache_clear()
    remote_video_metadata.cache_clear()
    start, cpu = time.perf_counter(), time.process_time()
    weights = weigh_rows(rows, family, num_proc=1).weights
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    assert not weights.reasons.any(), "a row was dropped"
    return seconds, cpu, weights.lengths


def ask(server: str, path: str) -> dict:
    """The counting server's counts (after `path`: /_reset, /_latency/S, /_counts)."""
    with urllib.request.urlopen(server + path) as answer:
        return json.loads(answer.read())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=2000, help="photos, one a row (2,000)")
    parser.add_argument(
        "--videos", type=int, default=0, help="weigh this many clips, one a row, instead"
    )
    parser.add_argument("--repeats", type=int, default=3, help="runs per setting (default 3)")
    parser.add_argument(
        "--latency", type=float, default=0.02, help="seconds the slow server holds each request"
    )
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench_remote-"))
    os.environ["MMDP_CACHE"] = str(work / "cache")
    try:
        run(args, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def run(args, work: Path) -> None:
    count = args.videos or args.images
    print(f"Writing {count:,} {'clips' if args.videos else 'photos'} to {work} ...", flush=True)
    images = write_dataset(work / "local", count, videos=bool(args.videos))
    process = subprocess.Popen(
        [sys.executable, str(SERVER)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        server = process.stdout.readline().strip()
        results, sizes = measure(args, work, server, images)
    finally:
        process.stdin.close()
        process.wait(timeout=60)
    report(args, results, sizes)


def measure(args, work: Path, server: str, images: dict) -> tuple[dict, np.ndarray]:
    import fsspec
    import s3fs

    sizes = np.array([len(data) for data in images.values()])
    family = family_for(offline_processor("qwen2_5_vl"))
    os.environ.update(
        AWS_ENDPOINT_URL=server,
        AWS_ACCESS_KEY_ID="bench",
        AWS_SECRET_ACCESS_KEY="bench",
        AWS_DEFAULT_REGION="us-east-1",
    )
    s3fs.S3FileSystem.clear_instance_cache()
    fs = fsspec.filesystem("s3")
    fs.mkdir("weigh-remote")
    fs.put(str(work / "local") + "/", "weigh-remote/data/", recursive=True)
    local, remote = str(work / "local" / "train.jsonl"), "s3://weigh-remote/data/train.jsonl"
    in_flight = files.REQUESTS_IN_FLIGHT
    ms = f"{args.latency * 1000:.0f} ms"
    settings = [
        ("disk", local, 0.0, in_flight),
        ("S3 (moto)", remote, 0.0, in_flight),
        (f"S3 + {ms} a request", remote, args.latency, in_flight),
        (f"S3 + {ms} a request, one at a time", remote, args.latency, 1),
    ]
    results, expected = {}, None
    for name, dataset, latency, requests in settings:
        ask(server, f"/_latency/{latency}")
        files.REQUESTS_IN_FLIGHT = requests
        runs = []
        for _ in range(1 if requests == 1 else args.repeats):  # one at a time: one slow run
            ask(server, "/_reset")
            seconds, cpu, lengths = weigh_once(dataset, family)
            expected = lengths if expected is None else expected
            assert np.array_equal(lengths, expected), "another weight from another source"
            runs.append((seconds, cpu))
        counts = ask(server, "/_counts")
        keys = [f"/weigh-remote/data/{name}" for name in images]
        served = np.array([counts["bytes"].get(key, 0) for key in keys])
        asked = np.array([counts["requests"].get(key, 0) for key in keys])
        assert name == "disk" or all(counts["ranged"].get(key) for key in keys)
        results[name] = (runs, served, asked, counts["most_in_flight"])
        print(f"{name}: {', '.join(f'{s:.2f} s ({c:.2f} s CPU)' for s, c in runs)}", flush=True)
    files.REQUESTS_IN_FLIGHT = in_flight
    return results, sizes


def report(args, results: dict, sizes: np.ndarray) -> None:
    disk = statistics.median(seconds for seconds, _ in results["disk"][0])
    what = "MP4 clips" if args.videos else "JPEGs"
    print(
        f"\nWeighing {args.videos or args.images:,} {what} (median "
        f"{np.median(sizes) / 1024:.0f} KB) for Qwen2.5-VL, medians of {args.repeats} runs:\n"
    )
    one = "video" if args.videos else "image"
    print(
        f"| {one}s from | s | against disk | CPU s (this process) | bytes read / {one} (median) "
        f"| of the file (median) | requests / {one} | most in flight |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name, (runs, served, asked, most) in results.items():
        seconds = statistics.median(s for s, _ in runs)
        cpu = statistics.median(c for _, c in runs)
        label = name + ("" if len(runs) > 1 else " (1 run)")
        if name == "disk":
            print(f"| {label} | {seconds:.2f} | 1.00x | {cpu:.2f} | - | - | - | - |")
            continue
        print(
            f"| {label} | {seconds:.2f} | {seconds / disk:.2f}x | {cpu:.2f} | "
            f"{np.median(served) / 1024:.1f} KB | {np.median(served / sizes):.1%} | "
            f"{asked.mean():.2f} | {most} |"
        )


if __name__ == "__main__":
    main()
