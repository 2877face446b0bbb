"""The benches' instruments still fit the code they measure: bench/bench_worker_profile.py
patches the loader's own functions by name, and broke once without a word when one of them moved
(TinyFamily's load_image, to mmdp.data.families.tiny)."""

import sys
import tempfile

import pytest
from conftest import REPO, RUN_DIR

from mmdp.data.reading.sources import load_vqa_dataset

sys.path.insert(0, str(REPO / "bench"))
import bench_decode_floor  # noqa: E402 - the benches are scripts, not a package
import bench_worker_profile  # noqa: E402

STEPS = {
    "tiny": ["decode", "resize to the model's pixels"],
    "qwen2_5_vl": ["decode", "image processor", "positions (rope index)"],
}


# Tokenizing each pack: the same patches as pre-tokenized (timed_steps patches every step either
# way), without pre-tokenizing the rows first.
@pytest.mark.parametrize("path", STEPS)
def test_the_worker_profile_times_each_step_of_a_worker(path, one_thread, capsys, monkeypatch):
    # The profile hands each batch over as a worker does, which starts multiprocessing's fd
    # sharer in a temporary folder that multiprocessing removes at exit, after the run's folder
    # is gone: the sharer's folder goes in the machine's temporary folder instead.
    monkeypatch.setattr(tempfile, "tempdir", str(RUN_DIR.parent))
    bench_worker_profile.profile(path, load_vqa_dataset(num_rows=12), pretokenize=False)
    table = capsys.readouterr().out
    timed = [line.split("|")[1].strip() for line in table.splitlines() if line.startswith("| ")]
    expected = STEPS[path] + ["make the sample (the rest)", "lay out the pack", "collate the batch"]
    expected += ["read rows", "tokenize"]
    assert set(expected) <= set(timed), table


def test_an_epochs_cpu_counts_its_dataloader_workers_once_the_epoch_returns():
    """bench_decode_floor's CPU columns: when an epoch returns, its DataLoader workers have ended and
    been reaped, so their CPU is in this process's children's (getrusage counts a child only
    then); with no workers, nothing is (the control: the check can fail)."""
    import resource

    from mmdp.data.families import family_for
    from mmdp.data.tokenizer import get_tokenizer

    def children_cpu() -> float:
        ended = resource.getrusage(resource.RUSAGE_CHILDREN)
        return ended.ru_utime + ended.ru_stime

    rows, family = load_vqa_dataset(num_rows=12), family_for(get_tokenizer())
    for workers in (0, 1):
        before = children_cpu()
        bench_decode_floor.floor_epoch(rows, family, workers=workers, batch_size=4)
        assert (children_cpu() > before) == (workers > 0)


BLOCK_DATA_SIDE = """import importlib.abc, sys
class Absent(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("datasets", "PIL"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, Absent())
"""


@pytest.mark.slow
def test_bench_loss_runs_with_torch_and_transformers_alone(tmp_path):
    """bench/bench_loss.py as on a lent GPU machine with torch and transformers only: datasets
    and PIL absent (a sitecustomize blocks them in every process), it loads mmdp.training.loss
    alone, and both paths agree on a short pack."""
    import os
    import subprocess

    (tmp_path / "sitecustomize.py").write_text(BLOCK_DATA_SIDE)
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    args = ["--lengths", "64", "--bf16-lengths", "--hidden", "8", "--repeats", "1"]
    done = subprocess.run(
        [sys.executable, str(REPO / "bench" / "bench_loss.py"), *args],
        capture_output=True, text=True, env=env, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert "absent here: mmdp.training.loss loaded alone" in done.stdout
    row = next(line for line in done.stdout.splitlines() if line.startswith("| 64 "))
    assert float(row.split("|")[-2]) < 1e-5  # the same loss and gradients
    assert done.stdout.strip().splitlines()[-1].startswith("loss over trained positions: fp32 ")
