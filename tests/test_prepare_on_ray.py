"""`uv run -m mmdp.prepare --engine ray` (mmdp.weighing.on_ray): the prepared dataset Ray Data
writes is the local engine's, byte for byte, and examples/pack_prepared.py packs it the same; a
user's files are read by the workers as mmdp reads them, from a disk or an S3 server, their bad
rows counted the same; a worker killed mid-run is retried, and one that dies every time ends the
run in one sentence with nothing written.

One local Ray instance of 2 CPUs serves the module (about 10 s to start on a busy 2-core machine).
"""

import json
import os
import signal
import uuid
from collections import Counter
from pathlib import Path

import fsspec
import numpy as np
import pytest
from bad_rows import with_bad_rows
from doc_blocks import check_output
from test_prepared import s3_bucket  # noqa: F401 (a fixture: the moto server, before Ray)

from mmdp import prepare as prepare_module
from mmdp.data.families.tiny import TinyFamily
from mmdp.data.reading.sources import load_vqa_dataset
from mmdp.data.tokenizer import get_tokenizer
from mmdp.drop_reasons import EMPTY_REPLY, MEDIA_TAG_MISMATCH, NO_TEXTS, UNDECODABLE_IMAGE
from mmdp.errors import UserError
from mmdp.prepare import main as prepare
from mmdp.weighing import on_ray

pytestmark = pytest.mark.slow

TESTS = Path(__file__).parent


@pytest.fixture(scope="module")
def ray_cpus(s3_bucket):  # noqa: F811
    """A local Ray instance of 2 CPUs and an 80 MB object store, started after the S3 server (its
    workers inherit the server's address), with this folder on the workers' path (DiesOnce)."""
    with pytest.MonkeyPatch.context() as env:
        env.setenv("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")  # this Python, not a fresh uv venv
        env.setenv("PYTHONPATH", str(TESTS))
        import ray

        ray.init(num_cpus=2, object_store_memory=80 * 2**20, include_dashboard=False)
        yield ray
        ray.shutdown()


@pytest.fixture
def small_blocks(monkeypatch):
    """Blocks of 64 rows: a few hundred rows already cross many tasks, so that a row out of place
    shows."""
    monkeypatch.setattr(on_ray, "BLOCK_ROWS", 64)


def prepared(out: Path) -> tuple[dict, dict]:
    """(the manifest without its parts' name, each weights' array as its dtype and values)
    written at `out`."""
    manifest = json.loads((out / "manifest.json").read_text())
    with np.load(out / manifest.pop("parts") / "weights.npz") as weights:
        return manifest, {name: (str(a.dtype), a.tolist()) for name, a in weights.items()}


def both_engines(tmp_path: Path, *flags: str) -> tuple[dict, dict]:
    """Prepare with each engine; the manifests and weights must be the same. Returns the local's."""
    for engine in ("local", "ray"):
        prepare(["--out", str(tmp_path / engine), "--engine", engine, *flags])
    manifest, weights = prepared(tmp_path / "local")
    assert prepared(tmp_path / "ray") == (manifest, weights)  # manifest["files"]: their sha256
    return manifest, weights


@pytest.mark.docs  # its output is what docs/use-in-your-trainer.md quotes (tests/doc_blocks.py)
def test_ray_prepare_packs_exactly_as_the_local_one(
    ray_cpus, tmp_path, run_main, capsys, monkeypatch
):
    monkeypatch.setattr(on_ray, "BLOCK_ROWS", 256)  # 8 blocks of the embedded 2,000 rows
    manifest, weights = both_engines(tmp_path, "--num-rows", "2000")
    argv = ["-m", "mmdp.prepare", "--out", str(tmp_path / "ray"), "--engine", "ray"]
    command = "uv run --extra ray -m mmdp.prepare --engine ray --out /tmp/prepared/ray"
    out = capsys.readouterr().out
    check_output(command, argv, out, paths={str(tmp_path / "ray"): "/tmp/prepared/ray"})
    assert manifest["rows"] == 2000 and len(set(weights["lengths"][1])) > 100
    metrics = {}
    for engine in ("local", "ray"):
        argv = ["--prepared", str(tmp_path / engine), "--num-rows", "2000", "--num-workers", "0"]
        argv += ["--metrics-json", str(tmp_path / f"{engine}.json")]
        status, out, err = run_main("examples/pack_prepared.py", *argv)
        assert status == 0, err
        assert "(weighed nothing)" in out
        metrics[engine] = json.loads((tmp_path / f"{engine}.json").read_text())
        for timing in ("seconds", "weighing"):
            metrics[engine].pop(timing)
    assert metrics["ray"] == metrics["local"]  # every pack, batch and count of the report
    assert metrics["local"]["packs"] > 400 and metrics["local"]["dropped"] == {"too_long": 16}


def users_files(folder: Path) -> Path:
    """A user's data: two JSON Lines files of messages rows (images beside them, some broken,
    one missing) and two parquet files of the_cauldron's rows with every bad row mmdp knows."""
    from PIL import Image

    jsonl, dropped = folder / "jsonl", Counter()
    jsonl.mkdir(parents=True)
    Image.new("RGB", (64, 48), (200, 30, 30)).save(jsonl / "red.png")
    (jsonl / "truncated.jpg").write_bytes(b"\xff\xd8\xff\xe0 cut short")

    def row(question, answer, *images, role="user"):
        messages = [{"role": role, "content": question}]
        messages += [{"role": "assistant", "content": answer}] if answer is not None else []
        return {"messages": messages, "images": list(images)}

    kinds = [  # each row, and the reason it is dropped for, if it is
        (row("<image> What colour?", "Red.", "red.png"), None),
        (row("Spell cat.", "C-A-T."), None),
        (row("<image> and <image>?", "Red.", "red.png"), MEDIA_TAG_MISMATCH),
        (row("<image> Here?", "Gone.", "missing.png"), UNDECODABLE_IMAGE),
        (row("<image> Grey?", "Grey.", "truncated.jpg"), UNDECODABLE_IMAGE),
        (row("Nobody answers this.", None), EMPTY_REPLY),
        (row("Run the tool.", "Done.", role="tool"), NO_TEXTS),
    ]
    for part in range(2):
        picked = [kinds[(k + part) % len(kinds)] for k in range(150)]
        dropped.update(reason for _, reason in picked if reason)
        (jsonl / f"part-{part}.jsonl").write_text("".join(json.dumps(r) + "\n" for r, _ in picked))
    (folder / "jsonl-dropped.json").write_text(json.dumps(dropped))
    rows, _, _ = with_bad_rows(load_vqa_dataset(num_rows=240), every=3)
    (folder / "parquet").mkdir()
    for part in range(2):
        rows.shard(2, part, contiguous=True).to_parquet(folder / "parquet" / f"part-{part}.parquet")
    return folder


@pytest.fixture(scope="module")
def users_data(tmp_path_factory) -> Path:
    return users_files(tmp_path_factory.mktemp("users") / "data")


@pytest.mark.parametrize("kind", ["jsonl", "parquet"])
def test_a_users_files_are_read_by_the_workers_and_bad_rows_counted_the_same(
    ray_cpus, users_data, tmp_path, small_blocks, kind
):
    flags = ["--dataset", str(users_data / kind), "--model", "qwen2_5_vl"]
    manifest, _ = both_engines(tmp_path, *flags)
    dropped = manifest["report"]["dropped"]
    if kind == "jsonl":  # 300 rows in 2 files, a file's rows in several blocks
        assert manifest["rows"] == 300
        assert dropped == json.loads((users_data / "jsonl-dropped.json").read_text())
    else:  # 80 of the bad rows of tests/bad_rows.py, in 2 files
        assert manifest["rows"] == 240 and dropped[UNDECODABLE_IMAGE] >= 5 and len(dropped) >= 5


def test_rows_and_images_on_an_s3_server_are_read_by_the_workers(
    ray_cpus, users_data, tmp_path, small_blocks
):
    fs = fsspec.filesystem("s3")
    fs.mkdir("rows")
    fs.put(str(users_data / "jsonl" / "red.png"), "rows/red.png")
    fs.put(str(users_data / "jsonl" / "truncated.jpg"), "rows/truncated.jpg")
    fs.put(str(users_data / "jsonl" / "part-0.jsonl"), "rows/part-0.jsonl")
    fs.put(str(users_data / "parquet" / "part-1.parquet"), "rows/part-1.parquet")
    for name, rows in (("part-0.jsonl", 150), ("part-1.parquet", 120)):
        flags = ["--dataset", f"s3://rows/{name}", "--model", "qwen2_5_vl"]
        manifest, weights = both_engines(tmp_path / name, *flags)
        assert manifest["rows"] == rows
    assert manifest["report"]["usable"] < rows  # the bad rows, read from S3, are counted too


def test_a_file_that_is_not_json_is_the_local_engines_sentence(ray_cpus, tmp_path):
    bad = tmp_path / "rows.jsonl"
    bad.write_text('{"messages": []}\nnot json\n')
    sentences = []
    for engine in ("local", "ray"):
        with pytest.raises(UserError) as refused:
            prepare(["--out", str(tmp_path / engine), "--dataset", str(bad), "--engine", engine])
        sentences.append(str(refused.value))
    assert sentences[0] == sentences[1] and f"{bad}, line 2: not JSON" in sentences[0]
    assert not (tmp_path / "ray").exists()


def test_pretokenize_on_ray_and_a_cluster_not_there_are_one_sentence_each(tmp_path):
    with pytest.raises(UserError, match=r"^--pretokenize needs --engine local \(on Ray"):
        prepare(["--out", str(tmp_path), "--engine", "ray", "--pretokenize"])
    with pytest.raises(UserError, match=r"^cannot reach the Ray cluster at 127.0.0.1:1 \("):
        prepare(["--out", str(tmp_path), "--engine", "ray", "--ray-address", "127.0.0.1:1"])
    assert list(tmp_path.iterdir()) == []


class DiesOnce(TinyFamily):
    """TinyVLM's family, whose weighing kills its own process: the first time (`marker` does not
    exist yet), or every time."""

    def __init__(self, marker: str, every_time: bool):
        super().__init__(get_tokenizer())
        self.marker, self.every_time = marker, every_time

    def weigh(self, *args):
        if self.every_time or not os.path.exists(self.marker):
            Path(self.marker).touch()
            os.kill(os.getpid(), signal.SIGKILL)  # as the OOM killer does
        return super().weigh(*args)


def test_a_worker_killed_mid_run_is_retried_and_the_prepared_dataset_is_the_same(
    ray_cpus, tmp_path, monkeypatch
):
    marker = tmp_path / "killed"
    prepare(["--out", str(tmp_path / "local"), "--num-rows", "600"])
    dies = DiesOnce(str(marker), every_time=False)
    monkeypatch.setattr(prepare_module, "family_for", lambda processor: dies)
    monkeypatch.setattr(on_ray, "BLOCK_ROWS", 200)
    prepare(["--out", str(tmp_path / "ray"), "--num-rows", "600", "--engine", "ray"])
    assert marker.exists()  # a worker was killed
    assert prepared(tmp_path / "ray") == prepared(tmp_path / "local")


def test_a_worker_that_dies_every_time_ends_in_one_sentence_and_writes_nothing(
    ray_cpus, tmp_path, monkeypatch
):
    out = tmp_path / "prepared"
    prepare(["--out", str(out), "--num-rows", "300"])  # an earlier prepare, readers use it
    before = sorted(p.name for p in out.iterdir()), (out / "manifest.json").read_text()
    dies = DiesOnce(str(tmp_path / "killed"), every_time=True)
    monkeypatch.setattr(prepare_module, "family_for", lambda processor: dies)
    with pytest.raises(UserError) as failed:
        prepare(["--out", str(out), "--num-rows", "300", "--engine", "ray"])
    sentence = str(failed.value)
    assert sentence.startswith(f"weighing on Ray failed (a worker died {on_ray.TASK_RETRIES + 1}")
    assert sentence.endswith("nothing was written") and "\n" not in sentence
    assert (sorted(p.name for p in out.iterdir()), (out / "manifest.json").read_text()) == before


def test_a_file_whose_reading_kills_its_worker_ends_in_one_sentence_after_the_retries(
    ray_cpus, users_data, tmp_path, monkeypatch
):
    """Reading is a Ray task of its own (not fused with weighing's): Ray Data's default for it
    would retry forever, as for a .json of several GB that kills every worker loading it whole."""
    attempts = tmp_path / "attempts"
    attempts.mkdir()

    def dies_reading(batch, *args):  # on_ray.read_files, on a worker the OOM killer kills
        (attempts / uuid.uuid4().hex).touch()
        os.kill(os.getpid(), signal.SIGKILL)
        yield from ()

    monkeypatch.setattr(on_ray, "read_files", dies_reading)
    rows = str(users_data / "jsonl" / "part-0.jsonl")
    with pytest.raises(UserError) as failed:
        prepare(["--out", str(tmp_path / "out"), "--dataset", rows, "--engine", "ray"])
    sentence = str(failed.value)
    assert sentence.startswith(f"weighing on Ray failed (a worker died {on_ray.TASK_RETRIES + 1}")
    assert len(list(attempts.iterdir())) == on_ray.TASK_RETRIES + 1
    assert not (tmp_path / "out").exists()


def test_a_cluster_that_reports_no_cpus_still_writes_its_prepared_dataset(
    ray_cpus, tmp_path, monkeypatch, capsys
):
    """An autoscaling cluster's head has no CPUs (ray start --num-cpus=0) until workers join, and
    none again once they leave: the rate a CPU is left out, never a division by 0 after weighing."""
    monkeypatch.setattr(on_ray, "cpus", lambda ray: 0)
    prepare(["--out", str(tmp_path / "ray"), "--num-rows", "300", "--engine", "ray"])
    out = capsys.readouterr().out
    assert "Weighing on Ray (0 CPUs)" in out and " a CPU)" not in out
    assert prepared(tmp_path / "ray")[0]["rows"] == 300
