"""The fault suite (issue 22): inject each fault, check the outcome docs/faults.md promises.

`uv run pytest -m faults` runs it all (the multi-process ones are also marked slow)."""

import errno
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from bad_rows import BAD_ROWS, with_bad_rows
from conftest import config_and_rest
from datasets import Dataset, load_dataset, load_from_disk

from mmdp.data.reading.sources import FEATURES, load_vqa_dataset
from mmdp.data.vqa_dataset import VQADataset
from mmdp.drop_reasons import UNDECODABLE_IMAGE
from mmdp.errors import UserError, exit_on_user_error
from mmdp.loading.packed_dataset import PackedDataLoader, PackedDataset
from mmdp.loading.streaming import StreamingDataLoader, StreamingPackedDataset
from mmdp.loading.workers import WorkerFailed
from mmdp.packing.packing_config import PackingConfig
from mmdp.report.pack_report import PackReport
from mmdp.weighing import weigh as weighing
from mmdp.weighing.weigh import weigh_rows

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.faults


@pytest.fixture(scope="module")
def rows():
    return load_vqa_dataset(num_rows=120)


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MMDP_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def packed(rows, tokenizer, **settings) -> PackedDataset:
    config, rest = config_and_rest({"max_length": 512, "packs_per_batch": 1, **settings})
    return PackedDataset(VQADataset(rows, tokenizer), config=config, **rest)


def sample_ids(loader) -> list[list[int]]:
    return [batch["sample_index"].tolist() for batch in loader]


# 1. The training process is killed (SIGKILL) mid-epoch, and restarted -------------------------

UNDER_TORCHRUN = Path(__file__).with_name("faults_under_torchrun.py")


def torchrun(tmp_path, *args: str) -> subprocess.CompletedProcess:
    """tests/faults_under_torchrun.py under torchrun, 2 ranks; torchrun restarts nothing: a
    rank that dies ends the job, as a preempted or crashed job ends."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    command += ["--nproc-per-node", "2", "--max-restarts", "0", str(UNDER_TORCHRUN), *args]
    env = {**os.environ, "TMPDIR": str(tmp_path)}  # torchrun's logs go with the test's files
    return subprocess.run(command, capture_output=True, text=True, timeout=600, env=env)


def logged_steps(out: Path, launch: str, rank: int, loader: str) -> list[dict]:
    lines = (out / f"{launch}-rank-{rank}-{loader}.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def latest_checkpoint(out: Path) -> int:
    """The step the job's latest checkpoint was saved after (0: none yet, it starts over)."""
    if not (out / "latest.json").exists():
        return 0
    return json.loads((out / "latest.json").read_text())["steps_done"]


LOADERS = ("planned", "streaming")


@pytest.fixture(scope="module")
def killed_and_resumed(tmp_path_factory) -> dict:
    """Jobs of tests/faults_under_torchrun.py training both loaders side by side (one job for
    both: each launch starts 3 processes that import torch): one that never dies, then one
    killed with SIGKILL at 2 random steps (MMDP_FAULT_SEED picks others), by rank 0, then 1
    (each rank's death once: a third kill only repeated the first, for a launch more), each
    restart resuming from the latest checkpoint (every 3 steps), and the last run to the end. Per loader and rank: the whole run's steps and the killed job's stream, built
    as a trainer sees it (each restart's steps replacing those after its checkpoint)."""
    tmp_path = tmp_path_factory.mktemp("killed")
    loaders = [arg for kind in LOADERS for arg in ("--loader", kind)]
    whole_run = tmp_path / "whole"
    whole_run.mkdir()
    done = torchrun(tmp_path, "train", *loaders, "--out", str(whole_run), "--launch", "a")
    assert done.returncode == 0, done.stderr[-2000:]
    whole = {(k, r): logged_steps(whole_run, "a", r, k) for k in LOADERS for r in (0, 1)}
    shortest = min(len(steps) for steps in whole.values())
    seed = int(os.environ.get("MMDP_FAULT_SEED", 0))
    kills = sorted(random.Random(f"both-{seed}").sample(range(2, shortest - 2), 2))
    out, stream, resumes = tmp_path / "killed", {key: [] for key in whole}, []
    out.mkdir()
    for launch, kill_at in enumerate([*kills, None]):
        resume_at = latest_checkpoint(out) if launch else 0
        resumes.append(resume_at)
        args = ["train", *loaders, "--out", str(out), "--launch", str(launch)]
        if kill_at is not None:
            args += ["--kill-at", str(kill_at), "--kill-rank", str(launch % 2)]
        done = torchrun(tmp_path, *args)
        killed = "Signal 9 (SIGKILL) received by PID"
        assert (killed in done.stderr) == (kill_at is not None), done.stderr[-2000:]
        for loader, rank in stream:
            steps = logged_steps(out, str(launch), rank, loader)
            assert steps[0]["step"] == resume_at, f"kills at {kills}"  # resumed, not restarted
            stream[loader, rank] = stream[loader, rank][:resume_at] + steps
    return {"whole": whole, "stream": stream, "kills": kills, "resumes": resumes}


@pytest.mark.slow  # 4 torchrun jobs of 2 ranks x 2 loaders x 2 workers: about a minute
@pytest.mark.parametrize("loader", LOADERS)
def test_killed_mid_epoch_and_resumed_the_sample_stream_goes_on_exactly(loader, killed_and_resumed):
    whole, stream = killed_and_resumed["whole"], killed_and_resumed["stream"]
    kills, resumes = killed_and_resumed["kills"], killed_and_resumed["resumes"]
    # each restart began at the latest checkpoint before its kill
    assert all(resume_at <= kill_at for resume_at, kill_at in zip(resumes[1:], kills))
    for rank in (0, 1):
        # nothing lost, nothing repeated: the stream of a job that never died, step for step
        assert stream[loader, rank] == whole[loader, rank], f"rank {rank}, kills at {kills}"
    # the steps after a checkpoint were trained again (their model was lost)
    assert any(resume_at < kill_at for resume_at, kill_at in zip(resumes[1:], kills))


# 2. A DataLoader worker that raises or dies ----------------------------------------------------


class FaultyPackedDataset(PackedDataset):
    """Builds batch `fault_at` with a fault: raises ValueError, or sends its worker `signal`."""

    fault_at, signal = 3, None

    def load_pack(self, rows, planned, batch_index):
        if batch_index == self.fault_at:
            if self.signal is None:
                raise ValueError("boom")
            os.kill(os.getpid(), self.signal)
        return super().load_pack(rows, planned, batch_index)


def test_a_worker_that_raises_fails_in_one_sentence_naming_the_worker_and_the_batch(
    rows, tokenizer
):
    dataset = packed(rows, tokenizer)
    dataset.__class__ = FaultyPackedDataset
    start = time.monotonic()
    with pytest.raises(WorkerFailed) as failed:
        sample_ids(PackedDataLoader(dataset, num_workers=2))
    assert str(failed.value) == (
        "DataLoader worker 1 of rank 0 failed building batch 3: ValueError: boom"
    )
    assert "Traceback" in failed.value.worker_traceback  # kept for debugging, not printed
    assert time.monotonic() - start < 30


@pytest.mark.parametrize("sent", [signal.SIGKILL, signal.SIGSEGV], ids=["SIGKILL", "SIGSEGV"])
def test_a_worker_killed_or_crashing_in_native_code_fails_within_seconds(sent, rows, tokenizer):
    dataset = packed(rows, tokenizer)
    dataset.__class__ = FaultyPackedDataset
    dataset.fault_at, dataset.signal = 2, sent
    start = time.monotonic()
    # worker 0 owes batches 0, 2, 4...; it builds ahead, so it may die before delivering batch 0
    died = "DataLoader worker 0 of rank 0 died before delivering batch [02] "
    with pytest.raises(WorkerFailed, match=died):
        sample_ids(PackedDataLoader(dataset, num_workers=2))
    assert time.monotonic() - start < 30  # torch polls its workers every 5 s


def test_a_streaming_worker_that_raises_is_named_too(rows, tokenizer, monkeypatch):
    calls = Counter()

    def load_pack(self, rows, planned):
        calls[os.getpid()] += 1
        if calls[os.getpid()] == 2:
            raise ValueError("boom")
        return original(self, rows, planned)

    original = StreamingPackedDataset.load_pack
    monkeypatch.setattr(StreamingPackedDataset, "load_pack", load_pack)
    stream = rows.to_iterable_dataset(num_shards=2)
    dataset = StreamingPackedDataset(
        stream, tokenizer, config=PackingConfig(max_length=512, buffer_size=16)
    )
    with pytest.raises(WorkerFailed, match="DataLoader worker [01] of rank 0 failed building "):
        sample_ids(StreamingDataLoader(dataset, num_workers=2))


@pytest.fixture
def long_temp_folder(tmp_path, monkeypatch):
    """A temp folder 80 bytes long, for this process and the DataLoader workers it forks (and no
    multiprocessing folder made in a shorter one before)."""
    import multiprocessing.process

    folder = tmp_path / ("t" * (80 - len(str(tmp_path)) - 1))
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    monkeypatch.setitem(multiprocessing.process.current_process()._config, "tempdir", None)
    return folder


def test_a_temp_folder_too_long_for_the_workers_socket_is_one_sentence(
    long_temp_folder, rows, tokenizer
):
    """mmdp.loading.workers.check_temp_folder: both loaders refuse to start their workers
    there (the trap, below: they would wait forever); without workers they run."""
    stream = rows.to_iterable_dataset(num_shards=2)
    streaming = StreamingPackedDataset(stream, tokenizer, config=PackingConfig(max_length=512))
    for loader in (  # a timeout: without the check, a failure rather than a hang
        PackedDataLoader(packed(rows, tokenizer), num_workers=2, timeout=5),
        StreamingDataLoader(streaming, num_workers=2, timeout=5),
    ):
        with pytest.raises(UserError, match=f"the temp folder {long_temp_folder} is too long a "):
            next(iter(loader))
    assert next(iter(PackedDataLoader(packed(rows, tokenizer), num_workers=0)))["input_ids"].numel()


@pytest.mark.slow  # torch's own DataLoader timeout, 3 s
def test_the_trap_torchs_workers_never_deliver_a_batch_from_a_too_long_temp_folder(
    long_temp_folder,
):
    """What check_temp_folder prevents: the worker's socket cannot bind (OSError: AF_UNIX path too
    long, printed by its queue-feeding thread), so a plain DataLoader's batch never arrives; only
    a timeout (torch's default: none) ends the wait."""
    loader = torch.utils.data.DataLoader(torch.zeros(4, 8), batch_size=2, num_workers=1, timeout=3)
    with pytest.raises(RuntimeError, match="DataLoader timed out after 3 seconds"):
        next(iter(loader))


# 3. A rank dies (or hangs) while the others wait for it ----------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def two_ranks(tmp_path, *args: str) -> list[subprocess.Popen]:
    """tests/faults_under_torchrun.py as 2 ranks started as plain processes (the environment
    torchrun would give them), so that no agent stops rank 0 when rank 1 is gone: what rank 0
    does then is its own doing."""
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    env |= {"WORLD_SIZE": "2", "TMPDIR": str(tmp_path), "OMP_NUM_THREADS": "1"}
    return [
        subprocess.Popen(
            [sys.executable, str(UNDER_TORCHRUN), *args],
            env={**env, "RANK": str(rank), "LOCAL_RANK": str(rank)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,  # its DataLoader workers with it, to stop them all at the end
        )
        for rank in (0, 1)
    ]


def last_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""


@pytest.mark.slow  # 2 ranks x 2 workers, and a few seconds of waiting: about a minute
@pytest.mark.parametrize(
    "where, answer_timeout",
    # a rank whose process is gone fails gloo's all-reduce at once, long before the timeout;
    # a rank that hangs, only at the timeout
    [("stream", 120), ("hang", 3), ("weighing", 3)],
    ids=["dies-in-the-stream", "hangs-in-the-stream", "dies-while-weighing"],
)
def test_a_rank_that_stops_answering_is_named_by_the_others(where, answer_timeout, rows, tmp_path):
    args = ["rank-dies", "--where", where, "--answer-timeout", str(answer_timeout)]
    ranks = two_ranks(tmp_path, *args)
    try:
        err = ranks[0].communicate(timeout=300)[1]
        rank_0_ended = time.time()
        one_left = ranks[1].poll() is not None  # an exit, not the hang
    finally:
        for rank in ranks:
            if rank.poll() is None:
                os.killpg(rank.pid, signal.SIGKILL)
    said = ranks[1].communicate()[0]
    assert ranks[0].returncode != 0
    when = "while the ranks weighed the rows together" if where == "weighing" else "at step 4"
    expected = f"RanksStoppedAnswering: rank 0: rank 1 stopped answering {when} ("
    assert expected in last_line(err), err[-3000:]
    assert one_left == (where != "hang")
    # rank 0 gave up within seconds: the closed connection or answer_timeout (3 s), then
    # silent_ranks's 5 s to tell who is silent (+ leeway for a busy machine)
    left_at = float(re.search(r"rank 1: (?:leaving|hanging) at ([\d.]+)", said)[1])
    assert rank_0_ended - left_at < 30


# 4. Corrupt data files -------------------------------------------------------------------------


def parquet_shards(rows, folder, shards=4):
    folder.mkdir()
    for k in range(shards):
        rows.shard(shards, k, contiguous=True).to_parquet(str(folder / f"part-{k}.parquet"))
    return sorted(folder.glob("*.parquet"))


def truncate(path):
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def test_a_truncated_parquet_or_arrow_shard_is_named_in_one_sentence(rows, tmp_path):
    files = parquet_shards(rows, tmp_path / "parquet")
    truncate(files[2])
    with pytest.raises(UserError, match=f"data file {files[2]} is damaged .*ArrowInvalid"):
        load_vqa_dataset(str(tmp_path / "parquet"))
    rows.save_to_disk(str(tmp_path / "saved"), num_shards=2)
    arrow = sorted((tmp_path / "saved").glob("*.arrow"))[1]
    truncate(arrow)
    with pytest.raises(UserError, match=f"data file {arrow} is damaged"):
        load_vqa_dataset(str(tmp_path / "saved"))


@pytest.mark.parametrize("workers", [0, 2])
def test_a_truncated_shard_in_a_stream_is_named_in_one_sentence(workers, rows, tokenizer, tmp_path):
    files = parquet_shards(rows, tmp_path / "parquet")
    truncate(files[3])
    stream = load_dataset(
        "parquet", data_files=list(map(str, files)), split="train", streaming=True
    )
    dataset = StreamingPackedDataset(
        stream, tokenizer, config=PackingConfig(max_length=512, buffer_size=16)
    )
    with pytest.raises(UserError, match=f"^data file {files[3]} is damaged") as failed:
        sample_ids(StreamingDataLoader(dataset, num_workers=workers))
    assert "\n" not in str(failed.value) and "Traceback" not in str(failed.value)


def test_a_shard_that_vanishes_mid_stream_is_named(rows, tokenizer, tmp_path):
    files = parquet_shards(rows, tmp_path / "parquet")
    stream = load_dataset(
        "parquet", data_files=list(map(str, files)), split="train", streaming=True
    )
    dataset = StreamingPackedDataset(
        stream, tokenizer, config=PackingConfig(max_length=512, buffer_size=16)
    )
    loader = iter(StreamingDataLoader(dataset, num_workers=0))
    next(loader)  # reading the first shard
    files[3].unlink()
    with pytest.raises(UserError, match=f"^data file {files[3]} has disappeared"):
        list(loader)


def with_broken_images(rows) -> Dataset:
    """The rows, with row 5's image garbage bytes and row 9's a truncated JPEG."""
    table = [dict(rows[i]) for i in range(len(rows))]
    for index, kind in ((5, "garbage_image_bytes"), (9, "truncated_jpeg")):
        table[index] = BAD_ROWS[kind][0](table[index])
    return Dataset.from_list(table, features=FEATURES)


def test_garbage_and_truncated_images_are_counted_not_raised(rows, tokenizer, fresh_cache):
    broken = with_broken_images(rows.select(range(40)))
    planned = packed(broken, tokenizer)
    report = PackReport()
    for batch in PackedDataLoader(planned, num_workers=2):
        report.add_batch(batch)
    assert report.dropped[UNDECODABLE_IMAGE] == 2
    streamed = StreamingPackedDataset(
        broken.to_iterable_dataset(num_shards=2),
        tokenizer,
        config=PackingConfig(max_length=512, buffer_size=16),
    )
    loader = StreamingDataLoader(streamed, num_workers=2)
    report = PackReport()
    for batch in loader:
        report.add_batch(batch)
    report.dropped.update(loader.dropped_at_end)
    assert report.dropped[UNDECODABLE_IMAGE] == 2
    assert report.samples + sum(report.dropped.values()) == 40


# 5. Caches under faults --------------------------------------------------------------------------

KILLED_WHILE_SAVING = """
import os, signal, sys
import numpy as np
from datasets import load_from_disk
from mmdp.data.tokenizer import get_tokenizer
from mmdp.weighing import weigh as weighing

savez = np.savez

def savez_then_die(file, **arrays):  # the weights are written, the manifest never is
    savez(file, **arrays)
    os.kill(os.getpid(), signal.SIGKILL)

np.savez = savez_then_die
weighing.weigh_rows(load_from_disk(sys.argv[1]), get_tokenizer())
"""


@pytest.mark.slow  # a second process importing mmdp: about a minute on a busy 2-core machine
def test_a_weighing_killed_halfway_is_weighed_again_and_leaves_nothing(
    rows, tokenizer, fresh_cache, tmp_path
):
    rows.save_to_disk(str(tmp_path / "rows"))
    saved = load_from_disk(str(tmp_path / "rows"))
    command = [sys.executable, "-c", KILLED_WHILE_SAVING, str(tmp_path / "rows")]
    killed = subprocess.run(command, env=dict(os.environ))
    assert killed.returncode == -signal.SIGKILL
    # a half copy, and the note of who was weighing (it tells waiting ranks the weigher is gone)
    left = sorted(p.name.split(".")[1][:7] for p in (fresh_cache / "weights").iterdir())
    assert left == ["partial", "weigher"]
    again = weigh_rows(saved, tokenizer)
    assert again.weighed_here
    assert np.array_equal(again.weights.lengths, weigh_rows(rows, tokenizer).weights.lengths)
    assert not weigh_rows(saved, tokenizer).weighed_here
    left = sorted(p.name for p in (fresh_cache / "weights").iterdir())
    assert again.path.name in left and all("." not in name for name in left)  # no copy, no note


def test_a_full_disk_while_saving_is_one_sentence_and_the_next_run_saves(
    rows, tokenizer, fresh_cache, monkeypatch
):
    def no_room(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    with monkeypatch.context() as patched:
        patched.setattr(weighing.np, "savez", no_room)
        with pytest.raises(UserError, match="the disk is full: .* set MMDP_CACHE"):
            weigh_rows(rows, tokenizer)
    assert list((fresh_cache / "weights").iterdir()) == []  # no half cache to plan from
    first = weigh_rows(rows, tokenizer)
    assert first.weighed_here and not weigh_rows(rows, tokenizer).weighed_here


def test_waiting_ranks_stop_when_the_weighing_rank_is_gone(
    rows, tokenizer, fresh_cache, monkeypatch
):
    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True
    )
    key = weighing.cache_key(rows, weighing.family_for(tokenizer), False)
    weigher = fresh_cache / "weights" / f"{key}.weigher"
    weigher.parent.mkdir(parents=True)
    weigher.write_text(f'{{"host": "{os.uname().nodename}", "pid": {int(gone.stdout)}}}')
    monkeypatch.setenv("LOCAL_RANK", "1")
    start = time.monotonic()
    with pytest.raises(RuntimeError, match=r"local rank 0 \(pid \d+\) stopped while weighing"):
        weigh_rows(rows, tokenizer)
    assert time.monotonic() - start < 5


# 6. Resume with changed settings -----------------------------------------------------------------


def test_resume_with_other_settings_is_refused_naming_the_difference(rows, tokenizer, fresh_cache):
    loader = PackedDataLoader(packed(rows, tokenizer), num_workers=0)
    batches = iter(loader)
    next(batches), next(batches)
    state = loader.state_dict()
    changes = {
        "max_length 512 \\(now 256\\)": (rows, {"max_length": 256}),
        "seed 0 \\(now 1\\)": (rows, {"seed": 1}),
        "world_size 1 \\(now 2\\)": (rows, {"rank": 0, "world_size": 2}),
        "rows 120 \\(now 100\\).*weights": (rows.select(range(100)), {}),
    }
    for difference, (other_rows, settings) in changes.items():
        other = PackedDataLoader(packed(other_rows, tokenizer, **settings), num_workers=0)
        with pytest.raises(
            ValueError, match=f"cannot resume: the state was saved with .*{difference}"
        ):
            other.load_state_dict(state)


def test_resume_with_another_number_of_workers_continues_exactly(rows, tokenizer, fresh_cache):
    whole = sample_ids(PackedDataLoader(packed(rows, tokenizer), num_workers=2))
    loader = PackedDataLoader(packed(rows, tokenizer), num_workers=2)
    batches = iter(loader)
    first = [next(batches)["sample_index"].tolist() for _ in range(3)]
    state = loader.state_dict()
    del batches
    resumed = PackedDataLoader(packed(rows, tokenizer), num_workers=0)
    resumed.load_state_dict(state)
    assert first + sample_ids(resumed) == whole


# 7. Bad input at scale -----------------------------------------------------------------------------


@pytest.mark.slow  # 10,000 rows through an epoch: about a minute on 2 cores
def test_ten_thousand_rows_with_one_in_ten_bad_are_all_accounted(tokenizer):
    # the run's cache, where the 2,000 embedded rows are already (a fresh cache generated them
    # again: 9-20 s); the bad rows' weights are cached by their own fingerprint
    good = load_vqa_dataset(None, num_rows=2000)
    good = good.select([i % len(good) for i in range(10_000)])
    bad, drops, conversions = with_bad_rows(good)
    # images resized to 32 px, not 256: every image is still decoded (a bad one still fails
    # there), and the workers hand over 64x fewer pixels
    config, _ = config_and_rest({"max_length": 2048, "packs_per_batch": 2})
    dataset = PackedDataset(VQADataset(bad, tokenizer, image_size=32), config=config)
    report = PackReport()
    for batch in PackedDataLoader(dataset, num_workers=2):
        report.add_batch(batch)
    report.dropped.update(dataset.plan().dropped)
    assert report.samples + sum(report.dropped.values()) == 10_000
    left_out = report.dropped.pop("left_out_to_equalise_ranks", 0)
    assert left_out == 0
    # every bad row with its own reason; the good rows converted too (grayscale, palette) add up
    assert report.dropped == drops
    assert all(report.converted[mode] >= n for mode, n in conversions.items())
    assert report.samples == 10_000 - sum(drops.values())


def test_a_stage_script_ends_a_failed_worker_with_its_one_line_and_status_1(capsys):
    """Every stage script runs main() under exit_on_user_error: a WorkerFailed is printed as its
    one sentence (no traceback) and the script exits non-zero, like every user-facing error."""
    message = "DataLoader worker 0 of rank 0 died before delivering batch 6"
    with pytest.raises(SystemExit) as done, exit_on_user_error():
        raise WorkerFailed(message, worker_traceback="Traceback (most recent call last): ...")
    assert done.value.code == 1
    assert capsys.readouterr().err == f"WorkerFailed: {message}\n"
    for script in sorted(ROOT.glob("0[1-6]_*.py")):  # and every script uses it
        if script.name == "04_knapsack_toy.py":
            # the toy raises no UserError (argparse refuses its flags) and starts no worker; it
            # imports no more of mmdp than its loops (tests/test_light_imports.py)
            continue
        assert "with exit_on_user_error():\n        main()" in script.read_text(), script.name
