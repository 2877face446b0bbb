"""What keeps the test suite fast is in effect (docs/benchmarks.md, "Test suite durations").

tests/conftest.py asks PyTorch's CPU allocator for transparent huge pages before torch is
imported (THP_MEM_ALLOC_ENABLE=1). Asked too late (torch already imported by something loaded
before conftest.py), it is silently ignored, and the trainers' launch takes 245 s instead of 188.
It also freezes the objects of the collected session, which no garbage collection then walks,
and runs the slow group in 2 workers in an order of its files; xdist's controller, which runs
no test, does not import torch.
"""

import gc
import os
import re
import resource
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import LAUNCH, STARTS_RANKS

THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")


@pytest.mark.skipif(
    not THP.exists() or "[never]" in THP.read_text(), reason="no transparent huge pages here"
)
def test_large_tensors_are_backed_by_huge_pages():
    size = 64 * 2**20
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    torch.empty(size, dtype=torch.uint8).fill_(1)
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
    # 4 KB pages: one fault each, 16,384; 2 MB pages: 32 (and a few for the allocator itself).
    # Half of the small pages leaves room for a kernel that cannot find every huge page.
    assert faults < size // 4096 // 2, f"{faults} page faults for a 64 MB tensor"


def test_the_collected_session_is_frozen_out_of_garbage_collection():
    # torch, transformers, datasets and the collected tests: hundreds of thousands of objects
    assert gc.get_freeze_count() > 100_000


def test_the_slow_groups_order_names_every_file_that_starts_ranks():
    """The slow group's schedule (tests/conftest.py) goes by file names. A file that uses the
    trainers' launch left out of LAUNCH would start the launch again in the other worker; one that
    starts ranks left out of STARTS_RANKS would run them beside the compiles, early."""
    here = Path(__file__)
    texts = {p.name: p.read_text() for p in here.parent.glob("test_*.py") if p != here}
    uses_launch = {name for name, text in texts.items() if "trainers_under_torchrun" in text}
    starts_ranks = {
        name
        for name, text in texts.items()
        if re.search(r"torch\.distributed\.run|two_ranks\(|--nproc-per-node", text)
    }
    starts_ranks.add("test_figures.py")  # tools/figures.py --check: every figure's command, each a process
    assert uses_launch == set(LAUNCH)
    assert starts_ranks - uses_launch == set(STARTS_RANKS)


def test_loading_conftest_imports_no_torch(tmp_path):
    # pytest-xdist's controller loads conftest.py and runs no test: torch there cost every run
    # about 3 s before the workers started and 1.5 s at its exit
    code = "import sys, conftest; print('torch' in sys.modules)"
    env = {**os.environ, "PYTEST_XDIST_WORKER": "gw9", "MMDP_TESTS_DIR": str(tmp_path)}
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).parent), env.get("PYTHONPATH", "")])
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert done.stdout.strip() == "False", done.stderr[-2000:]
