"""The benches' instruments still fit the code they measure: bench/bench_stage5.py --profile
patches the loader's own functions by name, and broke once without a word when one of them moved
(TinyFamily's load_image, to mmdp.data.families.tiny)."""

import sys
import tempfile

import pytest
from conftest import REPO, RUN_DIR

from mmdp.data.sources import load_vqa_dataset

sys.path.insert(0, str(REPO / "bench"))
import bench_stage5  # noqa: E402 - the benches are scripts, not a package

STEPS = {
    "tiny": ["decode", "resize to the model's pixels"],
    "qwen2_5_vl": ["decode", "image processor", "positions (rope index)"],
}


# Tokenizing each pack: the same patches as pre-tokenized (timed_steps patches every step either
# way), without pre-tokenizing the rows first.
@pytest.mark.parametrize("path", STEPS)
def test_the_stage5_profile_times_each_step_of_a_worker(path, one_thread, capsys, monkeypatch):
    # The profile hands each batch over as a worker does, which starts multiprocessing's fd
    # sharer in a temporary folder that multiprocessing removes at exit, after the run's folder
    # is gone: the sharer's folder goes in the machine's temporary folder instead.
    monkeypatch.setattr(tempfile, "tempdir", str(RUN_DIR.parent))
    bench_stage5.profile(path, load_vqa_dataset(num_rows=12), pretokenize=False)
    table = capsys.readouterr().out
    timed = [line.split("|")[1].strip() for line in table.splitlines() if line.startswith("| ")]
    expected = STEPS[path] + ["make the sample (the rest)", "lay out the pack", "collate the batch"]
    expected += ["read rows", "tokenize"]
    assert set(expected) <= set(timed), table
