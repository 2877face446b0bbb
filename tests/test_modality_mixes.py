"""Every modality mix through every stage: a messages file (ms-swift's format) of images only,
videos only, text only, or all three mixed, through stages 1, 2, 3, 5 and 6 and their figures and
reports, in this process. TinyVLM takes no video: a video row is a counted drop (`video_refused`),
and a file of videos only is one sentence saying where videos go, never a traceback; the families
that take video pack them. The slow group runs the same on a local S3 server (moto's)."""

import json

import pytest

from mmdp.drop_reasons import VIDEO_REFUSED

MIXES = ("images_only", "videos_only", "text_only", "mixed")
# The default suite runs the mixes with videos; images only and text only, which the embedded
# dataset's runs cover already, run with the slow group.
SOME_SLOW = [
    pytest.param(m, marks=pytest.mark.slow) if m in ("images_only", "text_only") else m
    for m in MIXES
]
VIDEO_HINT = "TinyVLM takes no video: pack videos with 05_knapsack_multimodal.py --model"


def messages(question: str, answer: str) -> list[dict]:
    return [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]


def mix_rows() -> tuple[dict, dict]:
    """({mix: rows}, {relative path: bytes}): two rows of each kind, the files they name."""
    from mmdp.data.synthetic.rows import encode_png, generate_row
    from mmdp.data.synthetic.videos import generate_video_row

    files, images, videos = {}, [], []
    for k in range(2):
        row = generate_video_row(k)
        files[f"media/{k}.mp4"] = row["videos"][0]["bytes"]
        turn = row["texts"][0]
        videos.append(
            {
                "messages": messages("<video>" + turn["user"], turn["assistant"]),
                "videos": [f"media/{k}.mp4"],
            }  # fmt: skip
        )
    for k in (0, 3):  # rows with one image each
        row = generate_row(k)
        files[f"media/{k}.png"] = encode_png(row["images"][0])
        images.append(
            {
                "messages": messages("<image>What is shown?", row["texts"][0]["assistant"][:80]),
                "images": [f"media/{k}.png"],
            }  # fmt: skip
        )
    text = [{"messages": messages(f"What is {k} plus {k}?", f"{2 * k}.")} for k in range(2)]
    mixes = {"images_only": images, "videos_only": videos, "text_only": text,
             "mixed": [images[0], videos[0], text[0]]}  # fmt: skip
    return mixes, files


@pytest.fixture(scope="module")
def mix_files(tmp_path_factory) -> dict:
    """{mix: path of its messages .json}, the media beside them."""
    folder = tmp_path_factory.mktemp("mixes")
    mixes, files = mix_rows()
    for name, data in files.items():
        (folder / name).parent.mkdir(exist_ok=True)
        (folder / name).write_bytes(data)
    for mix, rows in mixes.items():
        (folder / f"{mix}.json").write_text(json.dumps(rows))
        # stage 6 holds a row out and trains on two, and compares strategies: rows twice over
        (folder / f"{mix}_twice.json").write_text(json.dumps(rows * 2))
    return {mix: str(folder / f"{mix}.json") for mix in mixes}


@pytest.mark.parametrize("mix", MIXES)
def test_stage1_shows_a_row_of_every_mix(run_main, tmp_path, mix_files, mix):
    status, out, err = run_main(
        "01_check_dataset.py", "--dataset", mix_files[mix], "--row", "0", "--out-dir", str(tmp_path)
    )
    assert status == 0, err
    assert ("1 video(s)" in out) == (mix == "videos_only")
    assert (tmp_path / "01.png").stat().st_size > 10_000


@pytest.mark.parametrize(
    "script", ["02_naive_pad_dataloader.py", "03_constrained_pad_dataloader.py"]
)
@pytest.mark.parametrize("mix", SOME_SLOW)
def test_padding_stages_count_videos_as_dropped(run_main, tmp_path, mix_files, mix, script):
    metrics = tmp_path / "m.json"
    status, out, err = run_main(
        script, "--dataset", mix_files[mix], "--batch-size", "2", "--num-workers", "0",
        "--out-dir", str(tmp_path), "--metrics-json", str(metrics),
    )  # fmt: skip
    if mix == "videos_only":  # TinyVLM takes no video: one sentence, where videos go
        assert status != 0 and "Traceback" not in err
        assert f"(dropped: 2 {VIDEO_REFUSED}); {VIDEO_HINT}" in err.strip().splitlines()[-1]
        return
    assert status == 0, err
    report = json.loads(metrics.read_text())
    assert report["dropped"] == ({VIDEO_REFUSED: 1} if mix == "mixed" else {})
    assert (tmp_path / f"{script[:2]}.png").stat().st_size > 10_000


@pytest.mark.parametrize("mix", SOME_SLOW)
def test_stage5_with_tinyvlm_packs_every_mix_but_videos(run_main, tmp_path, mix_files, mix):
    metrics = tmp_path / "m.json"
    status, out, err = run_main(
        "05_knapsack_multimodal.py", "--dataset", mix_files[mix], "--num-workers", "0",
        "--out-dir", str(tmp_path), "--metrics-json", str(metrics),
    )  # fmt: skip
    if mix == "videos_only":
        assert status != 0 and "Traceback" not in err
        assert err.strip().splitlines()[-1].endswith(f"{VIDEO_HINT} qwen2_5_vl")
        return
    assert status == 0, err
    report = json.loads(metrics.read_text())
    assert report["dropped"] == ({VIDEO_REFUSED: 1} if mix == "mixed" else {})
    for name in ("05.png", "05_vs_03.png", "05_samples.png"):
        assert (tmp_path / name).stat().st_size > 10_000


# A family's offline processor takes tens of seconds to build (and every family's is built for
# the figure of a file with images): the slow group.
@pytest.mark.slow
@pytest.mark.parametrize(
    ("model", "mix"),
    [("qwen2_5_vl", mix) for mix in MIXES]
    + [
        (model, mix)
        for model in ("qwen3_vl", "llava_onevision")
        for mix in ("videos_only", "mixed")
    ],
)
def test_the_planned_loader_with_a_video_family_packs_and_draws_every_mix(
    run_main, tmp_path, mix_files, model, mix
):
    metrics = tmp_path / "m.json"
    status, out, err = run_main(
        "examples/pack_planned.py", "--dataset", mix_files[mix], "--model", model,
        "--num-workers", "0", "--out-dir", str(tmp_path), "--metrics-json", str(metrics),
    )  # fmt: skip
    assert status == 0, err
    report = json.loads(metrics.read_text())
    assert report["samples"] == report["rows_read"] and report["dropped"] == {}
    videos = {"videos_only": 2, "mixed": 1}.get(mix, 0)
    assert f"videos packed:    {videos}" in out
    assert ("no images in these rows" in out) == (mix in ("videos_only", "text_only"))
    assert (tmp_path / f"05_{model}.png").stat().st_size > 10_000


def test_the_model_figure_of_rows_without_images_says_so():
    """examples/pack_planned.py --model's figure of videos or text only: "no images", and one
    pack (a lone dot) inside the axes, not under the legend."""
    from test_plots import example

    from mmdp.packing.weights import Budgets

    plot_model_budgets = example("pack_planned").plot_model_budgets

    budgets = Budgets(max_length=2048, max_images=18, max_patches=8192)
    fig = plot_model_budgets({}, [975], [5300], model="qwen2_5_vl", budgets=budgets)
    costs, fill = fig.axes
    assert [text.get_text() for text in costs.texts] == ["no images in these rows"]
    assert fill.get_xlim() == (0, 1.05) and fill.get_ylim() == (0, 1.05)


STAGE6_SMALL = ["--check-samples", "2", "--seeds", "1", "--train-samples", "2", "--eval-every",
                "2", "--eval-samples", "1", "--batch-size", "2", "--skip-ddp"]  # fmt: skip


@pytest.mark.slow  # the training stack's imports alone: 25 s on a busy 2-core machine
@pytest.mark.parametrize("mix", MIXES)
def test_stage6_trains_on_every_mix_but_videos(run_main, tmp_path, mix_files, mix):
    dataset = mix_files[mix].replace(".json", "_twice.json")
    status, out, err = run_main(
        "06_packing_pays_off.py", "--dataset", dataset, "--out-dir", str(tmp_path), *STAGE6_SMALL
    )
    if mix == "videos_only":
        assert status != 0 and "Traceback" not in err
        assert err.strip().splitlines()[-1].endswith(f"{VIDEO_HINT} qwen2_5_vl")
        return
    assert status == 0, err
    assert (tmp_path / "strategies.png").stat().st_size > 10_000


@pytest.mark.slow  # an S3 server, and Qwen2.5-VL's processor built offline
def test_videos_only_on_s3_run_stages_1_5_and_6(run_main, tmp_path, monkeypatch):
    """The issue's check: a messages file of video-only rows on a local S3 server (moto's) runs
    stages 1 and 5 (Qwen2.5-VL) and stage 6 (TinyVLM: one sentence), with no traceback."""
    import fsspec
    import s3fs
    from counting_s3 import CountingS3Server

    server = CountingS3Server()
    server.start()
    try:
        monkeypatch.setenv("AWS_ENDPOINT_URL", server.url())
        for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
            monkeypatch.setenv(name, "testing")
        monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
        s3fs.S3FileSystem.clear_instance_cache()  # none made for another test's server
        fs = fsspec.filesystem("s3")
        fs.mkdir("mixes")
        mixes, files = mix_rows()
        for name, data in files.items():
            fs.pipe(f"mixes/{name}", data)
        fs.pipe("mixes/videos_only.json", json.dumps(mixes["videos_only"]).encode())
        dataset = ["--dataset", "s3://mixes/videos_only.json", "--out-dir", str(tmp_path)]

        status, out, err = run_main("01_check_dataset.py", *dataset, "--row", "1")
        assert status == 0, err
        assert "video 1: s3://mixes/media/1.mp4" in out
        metrics = tmp_path / "m.json"
        status, out, err = run_main(
            "examples/pack_planned.py", *dataset, "--model", "qwen2_5_vl", "--num-workers", "0",
            "--metrics-json", str(metrics),
        )  # fmt: skip
        assert status == 0, err
        assert json.loads(metrics.read_text())["samples"] == 2
        assert "videos packed:    2" in out and "no images in these rows" in out
        assert (tmp_path / "05_qwen2_5_vl.png").stat().st_size > 10_000
        status, out, err = run_main("06_packing_pays_off.py", *dataset, *STAGE6_SMALL)
        assert status != 0 and "Traceback" not in err
        assert err.strip().splitlines()[-1].endswith(f"{VIDEO_HINT} qwen2_5_vl")
    finally:
        s3fs.S3FileSystem.clear_instance_cache()
        server.stop()
