"""Every script under bench/ and examples/ in its smallest run, ending on the figure it exists to
print (issue 55: bench_scale's planning path had called plan_epoch with keywords the library no
longer took, and no test ran it).

SMOKE_RUNS is the table: a script, its smallest flags, what its last line must read (shape and
sane values, never a measured number), and whether it runs in the slow group. The default
suite's rows run in this process, as a user's `python SCRIPT FLAGS` from the repository root
would (conftest's run_main; each script's own folder first on sys.path): the process holds torch
and mmdp already, and a fresh one costs 8-10 s of imports on 2 cores. The slow group's rows run
in a fresh process. A file added to bench/ or examples/ without a row here fails
test_every_script_has_a_smoke_run.
"""

import os
import re
import tempfile
from pathlib import Path
from typing import NamedTuple
from unittest import mock

import pytest
from conftest import REPO, RUN_DIR


class Smoke(NamedTuple):
    script: str
    flags: str  # split on spaces; {tmp} stands for the test's tmp_path
    last_line: str  # a regex the script's last line matches whole
    slow: bool = False


NUMBER = r"[\d,]+(?:\.\d+)?"
RATIO = rf"{NUMBER}x"
PERCENT = rf"[+-]?{NUMBER}%"
PLANNED = rf" rows planned in {NUMBER} s, peak {NUMBER} bytes a row over the weights"
# the epoch report's last row (mmdp.report.printing.print_epoch_report): the pack_* examples' end
SAMPLES_PER_ROW = rf"samples per row: +min \d+, max \d+, mean {NUMBER}, std {NUMBER}"
TRAIN = "--max-steps 1 --num-rows 16 --num-workers 0 --output-dir {tmp}"
FINAL_LOSS = r"final loss \d+\.\d{4} after 1 steps \(weights sha256 [0-9a-f]+\)"

SMOKE_RUNS = [
    # the default suite, in this process (bench_scale plans in a fresh process of its own)
    Smoke("bench/bench_scale.py", "--plan-only --rows 400", "400" + PLANNED),
    Smoke(
        "bench/bench_bad_rows.py",
        "--num-rows 40 --repeats 1",
        rf"epoch time per trained sample, bad / clean: {NUMBER} wall, {NUMBER} CPU",
    ),
    Smoke(
        "bench/bench_packing.py",
        "--skip-peers --quick --items 2000 --max-lengths 512 --worst-items 2000 "
        "--reference-items 100 --buffers 1 --buffer-size 512",
        rf"\| 8,192 / 36 / 16,384 \| balanced_greedy \| {NUMBER} \| {NUMBER} \| {RATIO} \| "
        rf"\d+ / \d+ \| {PERCENT} \|",
    ),
    Smoke("bench/bench_worker_profile.py", "--rows 24 --paths tiny", rf"\| all \| {NUMBER} \| \|"),
    # the slow group, each in a fresh process
    Smoke(
        "bench/bench_scale.py",
        "--sizes 100 --plan-rows 100 --batches 1 --repeats 1 --pretokenized-up-to 0",
        "100" + PLANNED,
        slow=True,
    ),
    Smoke(
        "bench/bench_decode_floor.py",
        "--rows 24 --repeats 1 --workers 0 --paths tiny",
        rf"\| stage 5, pre-tokenized \| {NUMBER} \| {PERCENT} \| {PERCENT} \| {NUMBER} \| "
        rf"{PERCENT} \| \d+ \| {NUMBER} \| {PERCENT} \|",
        slow=True,
    ),
    Smoke(
        "bench/bench_decoders.py",
        "--rows 24 --repeats 1",
        rf"\| {NUMBER} \| {NUMBER} \({RATIO} the time\) \| {NUMBER} \({RATIO}\) \|",
        slow=True,
    ),
    Smoke(
        "bench/bench_families.py",
        "--rows 8 --repeats 1",
        rf"the real families weigh a row in {RATIO}-{RATIO} tiny's time",
        slow=True,
    ),
    Smoke(
        "bench/bench_huge_pages.py",
        "--pairs 1 --steps 1",
        rf"  on / off: {RATIO} the wall time",
        slow=True,
    ),
    Smoke(
        "bench/bench_jpeg_draft.py",
        "--repeats 1",
        rf"\| 1024 \| {NUMBER} \| {NUMBER} \| {RATIO} \| {NUMBER} levels \|",
        slow=True,
    ),
    Smoke(
        "bench/bench_loader_memory.py",
        "--sizes 24 --workers 0",
        r"\| 24 of 24 \| [\d.]+ \| \d+ \| \d+ \|",
        slow=True,
    ),
    Smoke(
        "bench/bench_loss.py",
        "--lengths 64 --bf16-lengths --hidden 8 --repeats 1",
        rf"loss over trained positions: fp32 {RATIO}, bf16 not run time; "
        rf"memory {RATIO} of full logits",
        slow=True,
    ),
    Smoke(
        "bench/bench_prepare.py",
        "--rows 400 --cpus 1 --repeats 1",
        rf"rows/s on 1 CPUs against 1: local {RATIO}, ray {RATIO}",
        slow=True,
    ),
    Smoke(
        "bench/bench_remote.py",
        "--images 4 --repeats 1 --latency 0.001",
        rf"\| S3 \+ 1 ms a request, one at a time \(1 run\) \| {NUMBER} \| {RATIO} \| {NUMBER} "
        rf"\| {NUMBER} KB \| {PERCENT} \| 1\.00 \| 1 \|",
        slow=True,
    ),
    Smoke(
        "bench/bench_streaming.py",
        "--sizes 24 --repeats 1 --workers 0",
        rf"\| planned, rows already weighed \| {NUMBER} \| {PERCENT} \| \| \|",
        slow=True,
    ),
    Smoke(
        "examples/group_by_length.py",
        "--num-rows 120 --num-workers 0 --out-dir {tmp}",
        r"Saved the grouped padding figure to \S*03_grouped\.png",
        slow=True,
    ),
    Smoke(
        "examples/pack_mixture.py",
        "--mixture examples/mixture.json --num-rows 120 --num-workers 0",
        rf"multiturn +\d+ +\d+ +{NUMBER} +20\.0% +{PERCENT} +{PERCENT} +.+",
        slow=True,
    ),
    Smoke(
        "examples/pack_prepared.py",
        "--prepared {tmp}/prepared --num-rows 40 --num-workers 0",
        SAMPLES_PER_ROW,
        slow=True,
    ),
    Smoke(
        "examples/pack_streaming.py", "--num-rows 40 --num-workers 0", SAMPLES_PER_ROW, slow=True
    ),
    Smoke("examples/pack_planned.py", "--num-rows 40 --num-workers 0", SAMPLES_PER_ROW, slow=True),
    Smoke("examples/trainer.py", TRAIN, FINAL_LOSS, slow=True),
    Smoke("examples/accelerate_loop.py", TRAIN, FINAL_LOSS, slow=True),
    Smoke("examples/torchrun.py", TRAIN, FINAL_LOSS, slow=True),
]
# What a run needs first (python's arguments), and what launches it when `python SCRIPT` cannot.
BEFORE = {"examples/pack_prepared.py": "-m mmdp.prepare --out {tmp}/prepared --num-rows 40"}
LAUNCHER = {"examples/torchrun.py": "-m torch.distributed.run --standalone --nproc-per-node 1"}
NOT_SCRIPTS = {
    "bench/loader_epochs.py",  # what the loader benches share
    "examples/mixture.json",  # pack_mixture.py's --mixture
}
# Scripts whose smallest run is a test of their own, which also checks their last line.
OWN_SMOKE_TEST = {
    "bench/bench_train_step.py": "tests/test_bench_train_step.py::"
    "test_the_gpu_preset_runs_on_a_cpu_at_a_small_size (-m slow)",
}


def smoke_id(run: Smoke) -> str:
    """bench_scale-plan-only and bench_scale-sizes: the script's name, and its first flag when
    the table runs it twice."""
    name = Path(run.script).stem
    twice = sum(other.script == run.script for other in SMOKE_RUNS) > 1
    return f"{name}-{run.flags.split()[0].lstrip('-')}" if twice else name


def test_every_script_has_a_smoke_run():
    files = {
        path.relative_to(REPO).as_posix()
        for folder in ("bench", "examples")
        for path in (REPO / folder).iterdir()
        if path.is_file()
    }
    assert files - NOT_SCRIPTS - set(OWN_SMOKE_TEST) == {run.script for run in SMOKE_RUNS}


@pytest.mark.parametrize(
    "run",
    [
        pytest.param(run, id=smoke_id(run), marks=[pytest.mark.slow] if run.slow else [])
        for run in SMOKE_RUNS
    ],
)
def test_smallest_run_ends_on_its_figure(run, tmp_path, run_main, run_script, monkeypatch):
    def argv(text: str) -> list[str]:
        return text.replace("{tmp}", str(tmp_path)).split()

    if run.script in BEFORE:
        done = run_script(*argv(BEFORE[run.script]), python_args=True)
        assert done.returncode == 0, done.stderr[-3000:]
    if run.slow:
        launcher = argv(LAUNCHER.get(run.script, ""))
        done = run_script(*launcher, run.script, *argv(run.flags), python_args=True, timeout=600)
        status, out, err = done.returncode, done.stdout, done.stderr
    else:
        status, out, err = in_this_process(run.script, argv(run.flags), run_main, monkeypatch)
    command = " ".join([run.script, *argv(run.flags)])
    assert status == 0, f"{command} exited {status}:\n{err[-3000:]}"
    last = out.strip().splitlines()[-1]
    assert re.fullmatch(run.last_line, last), f"{command} ended on {last!r}"


def in_this_process(script: str, flags: list[str], run_main, monkeypatch) -> tuple:
    """run_main's (status, stdout, stderr), with the script's folder first on sys.path (as
    `python SCRIPT` puts it: the benches import loader_epochs), and the environment and torch's
    threads as they were before it (scripts may set MMDP_CACHE, or one thread)."""
    import torch

    monkeypatch.syspath_prepend(str((REPO / script).parent))
    # a worker's hand-off (bench_worker_profile) starts multiprocessing's fd sharer in a folder
    # removed at exit, after the run's folder is gone: the machine's temporary folder instead
    monkeypatch.setattr(tempfile, "tempdir", str(RUN_DIR.parent))
    threads = torch.get_num_threads()
    try:
        with mock.patch.dict(os.environ):
            return run_main(script, *flags)
    finally:
        torch.set_num_threads(threads)
