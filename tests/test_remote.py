"""Remote files (mmdp.data.files): a user's JSON Lines file and its images on an S3-compatible
server (moto's, in this process, counting what it serves), weighed from their headers alone with
ranged reads, several requests in flight; the samples equal those of the same files on disk; a
missing file is undecodable at once, a store that does not answer is retried and then counted as
`unreachable_file`."""

import io
import json
from statistics import median

import fsspec
import numpy as np
import pytest
import torch
from counting_s3 import CountingS3Server
from PIL import Image

from mmdp.data import files
from mmdp.data.families import family_for, offline_processor
from mmdp.data.images import remote_image_size
from mmdp.data.reading.sources import load_vqa_dataset
from mmdp.data.videos import remote_video_metadata
from mmdp.drop_reasons import UNDECODABLE_IMAGE, UNREACHABLE_FILE

PHOTOS = 8
CLIPS = 6
CLOSED_PORT = "http://127.0.0.1:9"  # the discard port: nothing listens there, a refused connection


def photo(seed: int, width: int = 800, height: int = 600) -> bytes:
    """A JPEG that compresses like a photo (smooth colours and grain): about 110 KB."""
    rng = np.random.default_rng(seed)
    colours = rng.integers(0, 255, (6, 8, 3), dtype=np.uint8)
    smooth = np.asarray(Image.fromarray(colours).resize((width, height), Image.Resampling.BICUBIC))
    grain = rng.normal(0, 6, (height, width, 3))
    buffer = io.BytesIO()
    Image.fromarray((smooth + grain).clip(0, 255).astype(np.uint8)).save(buffer, "JPEG", quality=90)
    return buffer.getvalue()


def photo_with_a_large_exif() -> bytes:
    """A camera's JPEG: an EXIF block past the first HEADER_BYTES (its size comes after it)."""
    exif = Image.Exif()
    exif[0x010E] = "x" * (2 * files.HEADER_BYTES)  # ImageDescription, stored before the pixels
    exif[0x0112] = 6  # turned: stored 800x600, upright 600x800
    buffer = io.BytesIO()
    Image.open(io.BytesIO(photo(99))).save(buffer, "JPEG", quality=90, exif=exif.tobytes())
    return buffer.getvalue()


@pytest.fixture(scope="module")
def bucket(tmp_path_factory):
    """The server, with s3://users-data holding train.jsonl and images/ (the same files also on
    disk, in the folder returned second)."""
    import s3fs

    server = CountingS3Server()
    server.start()
    local = tmp_path_factory.mktemp("local_copy")
    with pytest.MonkeyPatch.context() as env:
        env.setenv("AWS_ENDPOINT_URL", server.url())
        env.setenv("AWS_ACCESS_KEY_ID", "testing")
        env.setenv("AWS_SECRET_ACCESS_KEY", "testing")
        env.setenv("AWS_DEFAULT_REGION", "us-east-1")
        env.setattr(files, "FIRST_PAUSE_SECONDS", 0.01)
        s3fs.S3FileSystem.clear_instance_cache()  # none made for another test's server
        fs = fsspec.filesystem("s3")
        fs.mkdir("users-data")
        images = {f"images/{k}.jpg": photo(k) for k in range(PHOTOS)}
        images["images/camera.jpg"] = photo_with_a_large_exif()
        from mmdp.data.synthetic.videos import generate_video_row

        moving = generate_video_row(0)["videos"][0]["bytes"]
        # the clip, and CLIPS copies of it under other names (each weighed: read in flight)
        clip = {"clips/moving.mp4": moving, **{f"clips/{k}.mp4": moving for k in range(CLIPS)}}
        for name, data in {**images, **clip}.items():
            fs.pipe(f"users-data/{name}", data)
            (local / name).parent.mkdir(exist_ok=True)
            (local / name).write_bytes(data)

        def row(question: str, *names: str) -> dict:
            messages = [
                {"role": "user", "content": question},
                {"role": "assistant", "content": "Colours."},
            ]
            return {"messages": messages, "images": list(names)}

        rows = [
            row(f"What is in <image> and <image>? ({k})", f"images/{k}.jpg", f"images/{k + 1}.jpg")
            for k in range(0, PHOTOS, 2)
        ]
        rows.append(row("<image> Which way up?", "images/camera.jpg"))
        missing = row("<image> And this?", "images/missing.jpg")
        unreachable = row("<image> And this?", f"{CLOSED_PORT}/a.jpg")
        video = {
            **row("<video> Where does it go, and <image>?", "images/0.jpg"),
            "videos": ["clips/moving.mp4"],
        }
        lines = "\n".join(json.dumps(row) for row in [*rows, missing, unreachable, video])
        fs.pipe("users-data/train.jsonl", lines.encode())
        (local / "train.jsonl").write_text(lines)
        yield server, images, local
        s3fs.S3FileSystem.clear_instance_cache()
    server.stop()


def test_remote_weighing_reads_only_headers_several_requests_in_flight(bucket):
    server, images, _ = bucket
    rows = load_vqa_dataset("s3://users-data/train.jsonl")
    assert rows[0]["images"][0]["path"] == "s3://users-data/images/0.jpg"
    family = family_for(offline_processor("qwen2_5_vl"))
    server.reset()
    files.STATS.clear()
    remote_image_size.cache_clear()
    server.latency = (
        0.2  # a store's first byte, long enough for the requests to overlap on a busy machine
    )
    try:
        _, counts, _, reasons = family.weigh(
            [r["texts"] for r in rows], [r["images"] for r in rows], [r["videos"] for r in rows]
        )
    finally:
        server.latency = 0.0

    assert reasons == [None] * 5 + [UNDECODABLE_IMAGE, UNREACHABLE_FILE, None]
    served = {key.removeprefix("/users-data/"): n for key, n in server.bytes.items()}
    read = [served[name] for name in images]
    assert all(server.ranged.values())  # only ranged reads: no image was fetched whole
    assert median(read) <= files.HEADER_BYTES < min(len(data) for data in images.values()) / 4
    assert sum(read) < 0.2 * sum(len(data) for data in images.values())
    assert served["images/camera.jpg"] > files.HEADER_BYTES  # its EXIF ran past the first read
    assert server.most_in_flight >= 2
    # the unreachable file: tried READ_ATTEMPTS times (retried, then given up); the missing
    # one not retried
    assert (files.STATS["retries"], files.STATS["unreachable"]) == (files.READ_ATTEMPTS - 1, 1)


def test_remote_video_headers_are_read_several_requests_in_flight_and_once(bucket):
    """A batch's video headers are read as its images' are: their requests (the file's size,
    then a block or two as PyAV seeks) wait on the store together, and each header once in
    this process."""
    server, _, _ = bucket
    family = family_for(offline_processor("qwen2_5_vl"))
    clips = [[{"bytes": None, "path": f"s3://users-data/clips/{k}.mp4"}] for k in range(CLIPS)]
    remote_video_metadata.cache_clear()
    server.reset()
    server.latency = 0.2  # as above
    try:
        costs = family.video_costs(clips)
    finally:
        server.latency = 0.0
    assert len(costs) == CLIPS and len(set(costs)) == 1  # six copies of one clip
    assert server.most_in_flight >= 2
    assert all(server.ranged[f"/users-data/clips/{k}.mp4"] for k in range(CLIPS))
    server.reset()
    assert family.video_costs(clips) == costs and not server.requests  # remembered


def test_remote_rows_make_the_samples_of_the_same_files_on_disk(bucket):
    _, _, local = bucket
    remote_rows = load_vqa_dataset("s3://users-data/train.jsonl")
    local_rows = load_vqa_dataset(str(local / "train.jsonl"))
    assert local_rows[0]["images"][0]["path"] == str(local / "images" / "0.jpg")
    family = family_for(offline_processor("qwen2_5_vl"))
    weights = [
        family.weigh([r["texts"] for r in rows], [r["images"] for r in rows], rows["videos"])
        for rows in (remote_rows, local_rows)
    ]
    assert weights[0][:3] == weights[1][:3]
    # two photos; the camera's, turned upright by its EXIF; a video, then a photo, in one turn
    for k, keys in ((0, ()), (4, ()), (7, ("pixel_values_videos", "video_grid_thw"))):
        remote, here = family.make_sample(remote_rows[k], k), family.make_sample(local_rows[k], k)
        assert remote["drop_reason"] is None
        for key in ("input_ids", "labels", "pixel_values", "image_grid_thw", *keys):
            assert torch.equal(remote[key], here[key]), key
    _, height, width = family.make_sample(remote_rows[4], 4)["image_grid_thw"][0].tolist()
    assert height > width  # stored 800x600, upright 600x800
    assert family.make_sample(remote_rows[6], 6)["drop_reason"] == UNREACHABLE_FILE


def test_remote_weights_with_an_unreachable_file_are_weighed_again_next_run(bucket):
    """The network failed, not the file: the weights are not cached, the next run reads it again
    (and counts it again if it still does not answer)."""
    from mmdp.weighing.weigh import weigh_rows

    rows = load_vqa_dataset("s3://users-data/train.jsonl")
    family = family_for(offline_processor("qwen2_5_vl"))
    first, second = weigh_rows(rows, family), weigh_rows(rows, family)
    assert first.rows_weighed_here == second.rows_weighed_here == len(rows)
    reachable = rows.select([k for k in range(len(rows)) if k != 6])  # the closed port's row
    weigh_rows(reachable, family)
    assert weigh_rows(reachable, family).rows_weighed_here == 0  # the control: cached


def test_a_parquet_file_replaced_on_s3_is_read_anew(bucket, tmp_path, monkeypatch):
    """datasets keys its cache of a remote parquet file by the file's name alone (datasets 5.2:
    the second read gives the first file's rows, the control below); mmdp keys its own by the
    file's stamp (mmdp.data.reading.sources.read_table), so a replaced file is read again."""
    from datasets import load_dataset

    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf"))
    fs, url = fsspec.filesystem("s3"), "s3://users-data/rows.parquet"
    seen, stale = [], []
    for num_rows in (4, 3):
        load_vqa_dataset(num_rows=num_rows).to_parquet(tmp_path / "rows.parquet")
        fs.put(str(tmp_path / "rows.parquet"), url)
        fs.invalidate_cache()
        seen.append(len(load_vqa_dataset(url)))
        stale.append(len(load_dataset("parquet", data_files=[url], split="train")))
    assert seen == [4, 3]
    assert stale == [4, 4]  # the trap: datasets' own cache
