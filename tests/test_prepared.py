"""A prepared dataset (uv run -m mmdp.prepare): written once to a path or an S3-compatible server,
read by every later run and rank with nothing weighed, the same batches as weighing in the run,
and refused in one sentence when it was made for another run or never finished."""

import json
import subprocess
import sys
import urllib.request
from pathlib import Path

import fsspec
import pytest
from doc_blocks import check_output
from train_from_prepared import NUM_ROWS, batch_digests

from mmdp.data.reading.sources import load_vqa_dataset
from mmdp.data.vqa_dataset import VQADataset
from mmdp.errors import UserError
from mmdp.loading.packed_dataset import PackedDataLoader, PackedDataset
from mmdp.packing.packing_config import PackingConfig
from mmdp.prepare import main as prepare
from mmdp.weighing import prepared

TESTS = Path(__file__).parent


@pytest.fixture(scope="module")
def rows():
    return load_vqa_dataset(num_rows=NUM_ROWS)


@pytest.fixture(scope="module")
def s3_bucket():
    """A real S3-compatible server in this process (moto's server mode, as s3fs's own tests use),
    with an empty bucket; its address reaches s3fs (and child processes) through the
    environment, as a user's AWS_ENDPOINT_URL would."""
    import s3fs
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    host, port = server.get_host_and_port()
    # moto keeps its buckets in this process, not in the server: another test file's server (the
    # Ray tests import this fixture) may have left the bucket behind on this pytest worker
    reset = f"http://{host}:{port}/moto-api/reset"
    urllib.request.urlopen(urllib.request.Request(reset, method="POST")).close()
    with pytest.MonkeyPatch.context() as env:
        env.setenv("AWS_ENDPOINT_URL", f"http://{host}:{port}")
        env.setenv("AWS_ACCESS_KEY_ID", "testing")
        env.setenv("AWS_SECRET_ACCESS_KEY", "testing")
        env.setenv("AWS_DEFAULT_REGION", "us-east-1")
        # s3fs caches its filesystems by their arguments, not by the endpoint read from the
        # environment: one made for another file's server (stopped since) would be reused here
        s3fs.S3FileSystem.clear_instance_cache()
        fsspec.filesystem("s3").mkdir("prepared")
        yield "s3://prepared"
    s3fs.S3FileSystem.clear_instance_cache()
    server.stop()


def digests(rows, tokenizer, prepared_at=None, **settings) -> list[str]:
    """The batch digests of one epoch, weighed here or read from a prepared dataset."""
    samples = VQADataset(rows, tokenizer)
    config = PackingConfig(packs_per_batch=2)
    if prepared_at is None:
        packed = PackedDataset(samples, config=config, **settings)
    else:
        packed = PackedDataset.from_prepared(prepared_at, samples, config=config, **settings)
    return batch_digests(PackedDataLoader(packed, num_workers=0))


def no_weighing(*args, **kwargs):
    raise AssertionError("a run from a prepared dataset weighed its rows")


@pytest.mark.parametrize("pretokenize", [False, True])
def test_a_prepared_path_gives_the_batches_of_weighing_in_the_run_and_weighs_nothing(
    rows, tokenizer, tmp_path, monkeypatch, capsys, pretokenize
):
    weighed = digests(rows, tokenizer, pretokenize=pretokenize)
    flags = ["--pretokenize"] if pretokenize else []
    prepare(["--out", str(tmp_path / "prepared"), "--num-rows", str(NUM_ROWS), *flags])
    assert f"of {NUM_ROWS} rows fit the budgets" in capsys.readouterr().out
    monkeypatch.setattr(prepared, "weigh_rows", no_weighing)
    read = PackedDataset.from_prepared(tmp_path / "prepared", VQADataset(rows, tokenizer))
    assert read.weighing.rows_weighed_here == 0
    assert (read.tokens is not None) == pretokenize  # its tokens are used when it has them
    assert digests(rows, tokenizer, tmp_path / "prepared") == weighed
    assert len(weighed) > 5


def test_a_prepared_dataset_on_an_s3_server_gives_the_same_batches_as_on_a_path(
    rows, tokenizer, tmp_path, s3_bucket, monkeypatch
):
    for out in (str(tmp_path / "local"), f"{s3_bucket}/synthetic"):
        prepare(["--out", out, "--num-rows", str(NUM_ROWS), "--pretokenize"])
    fs = fsspec.filesystem("s3")
    assert sorted(Path(p).name for p in fs.find(f"{s3_bucket}/synthetic")) == [
        "manifest.json",
        "tokens.arrow",
        "weights.npz",
    ]
    monkeypatch.setattr(prepared, "weigh_rows", no_weighing)
    from_path = digests(rows, tokenizer, str(tmp_path / "local"))
    assert digests(rows, tokenizer, f"{s3_bucket}/synthetic") == from_path


@pytest.mark.parametrize(
    ("run", "theirs", "ours"),
    [
        ({"max_length": 256}, "max_length 512", "256"),
        ({"max_images": 4}, "max_images 18", "4"),
        (
            {"image_token_length": 32},
            "the image rule '64 tokens per image'",
            "'32 tokens per image'",
        ),
        ({"num_rows": NUM_ROWS - 20}, f"rows {NUM_ROWS}", f"{NUM_ROWS - 20}"),
    ],
)
def test_a_prepared_dataset_made_for_another_run_is_refused_naming_both_values(
    rows, tokenizer, tmp_path, run, theirs, ours
):
    prepare(["--out", str(tmp_path), "--num-rows", str(NUM_ROWS)])
    PackedDataset.from_prepared(tmp_path, VQADataset(rows, tokenizer))  # the control: accepted
    budgets = {key: run[key] for key in ("max_length", "max_images") if key in run}
    samples = VQADataset(
        rows.select(range(run.get("num_rows", NUM_ROWS))),
        tokenizer,
        image_token_length=run.get("image_token_length", 64),
    )
    with pytest.raises(UserError) as refused:
        PackedDataset.from_prepared(tmp_path, samples, config=PackingConfig(**budgets))
    sentence = str(refused.value)
    assert f"made with {theirs}" in sentence and f"but this run has {ours};" in sentence
    assert ". " not in sentence and "\n" not in sentence


@pytest.mark.docs  # and both print what docs/use-in-your-trainer.md quotes (tests/doc_blocks.py)
def test_pack_prepared_with_another_max_length_exits_2_with_one_sentence(
    tmp_path, run_main, capsys
):
    quoted = {str(tmp_path): "/tmp/prepared/synthetic"}
    flags = ["--out", str(tmp_path), "--num-rows", str(NUM_ROWS)]
    prepare(flags)
    command = "uv run -m mmdp.prepare --out /tmp/prepared/synthetic"
    check_output(command, ["-m", "mmdp.prepare", *flags], capsys.readouterr().out, paths=quoted)
    argv = ["examples/pack_prepared.py", "--prepared", str(tmp_path), "--num-rows", str(NUM_ROWS),
            "--max-length", "256"]  # fmt: skip
    status, out, err = run_main(*argv)
    assert status == 2
    assert err.strip().splitlines() == [err.strip()]
    assert "max_length 512, but this run has 256" in err
    command = "uv run examples/pack_prepared.py --prepared /tmp/prepared/synthetic --max-length 256"
    check_output(command, argv, err, paths=quoted)


@pytest.mark.slow  # a whole epoch of stage 5's packing
@pytest.mark.docs
def test_pack_prepared_reads_a_prepared_dataset_with_its_budgets_and_weighs_nothing(
    tmp_path, run_main, capsys
):
    prepare(["--out", str(tmp_path), "--num-rows", str(NUM_ROWS), "--max-length", "384"])
    capsys.readouterr()  # what prepare printed
    argv = ["examples/pack_prepared.py", "--prepared", str(tmp_path), "--num-rows", str(NUM_ROWS),
            "--num-workers", "0"]  # fmt: skip
    status, out, err = run_main(*argv)
    assert status == 0, err
    assert "max_length=384" in out  # the prepared budget, not given on the command line
    command = "uv run examples/pack_prepared.py --prepared /tmp/prepared/synthetic"
    check_output(command, argv, out, paths={str(tmp_path): "/tmp/prepared/synthetic"})
    assert f"Read the prepared weights of {NUM_ROWS} rows from {tmp_path}" in out
    assert "(weighed nothing)" in out and "Weighing rows" not in err


def test_a_prepare_that_did_not_finish_is_refused_and_an_earlier_one_stays_readable(
    rows, tokenizer, tmp_path, monkeypatch
):
    def interrupted(*args):
        raise KeyboardInterrupt

    args = ["--num-rows", str(NUM_ROWS)]
    with monkeypatch.context() as patch:
        patch.setattr(prepared, "commit", interrupted)
        with pytest.raises(KeyboardInterrupt):
            prepare(["--out", str(tmp_path / "new"), *args])
    assert list((tmp_path / "new").glob("parts-*/weights.npz"))  # the parts were written
    with pytest.raises(UserError, match="holds no prepared dataset .no manifest.json"):
        PackedDataset.from_prepared(tmp_path / "new", VQADataset(rows, tokenizer))
    # over an earlier prepare: readers keep reading the earlier one, whole
    prepare(["--out", str(tmp_path / "old"), *args])
    before = json.loads((tmp_path / "old" / "manifest.json").read_text())
    with monkeypatch.context() as patch:
        patch.setattr(prepared, "commit", interrupted)
        with pytest.raises(KeyboardInterrupt):
            prepare(["--out", str(tmp_path / "old"), *args, "--pretokenize"])
    read = PackedDataset.from_prepared(tmp_path / "old", VQADataset(rows, tokenizer))
    assert read.tokens is None and read.weighing.rows_weighed_here == 0
    # a finished prepare replaces it and removes the earlier parts
    prepare(["--out", str(tmp_path / "old"), *args])
    assert not (tmp_path / "old" / before["parts"]).exists()


def test_weights_changed_after_the_manifest_are_refused(rows, tokenizer, tmp_path):
    prepare(["--out", str(tmp_path), "--num-rows", str(NUM_ROWS)])
    weights = next(tmp_path.glob("parts-*/weights.npz"))
    weights.write_bytes(weights.read_bytes()[:-10])
    with pytest.raises(UserError, match="do not match their manifest's sha256"):
        PackedDataset.from_prepared(tmp_path, VQADataset(rows, tokenizer))


@pytest.mark.slow  # torchrun, 2 ranks, and a moto server: about a minute on a busy 2-core machine
def test_two_ranks_read_from_an_s3_server_weigh_nothing_and_get_the_batches_of_a_path(
    rows, tokenizer, tmp_path, s3_bucket
):
    url = f"{s3_bucket}/two-ranks"
    prepare(["--out", url, "--num-rows", str(NUM_ROWS)])
    prepare(["--out", str(tmp_path / "local"), "--num-rows", str(NUM_ROWS)])
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
    ]
    command += [str(TESTS / "train_from_prepared.py"), url]
    done = subprocess.run(
        [*command, str(tmp_path / "out")], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout + done.stderr
    log = done.stdout + done.stderr
    for rank in (0, 1):
        assert f"rank {rank}: weighed nothing: read the prepared weights of {NUM_ROWS} rows" in log
    results = [json.loads((tmp_path / f"out.{rank}.json").read_text()) for rank in (0, 1)]
    assert [r["weighed"] for r in results] == [0, 0]
    for rank, result in enumerate(results):  # the same batches as from the path, rank by rank
        local = PackedDataset.from_prepared(
            tmp_path / "local",
            VQADataset(rows, tokenizer),
            config=PackingConfig(packs_per_batch=2),
            rank=rank,
            world_size=2,
        )
        assert result["batches"] == batch_digests(PackedDataLoader(local, num_workers=0))
    assert "Weighing rows" not in log
