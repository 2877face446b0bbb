import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# Tests never touch the user's cache or the committed figures: generated datasets go to a
# temporary cache shared by this test session (and by the scripts it starts).
os.environ["MMDP_CACHE"] = tempfile.mkdtemp(prefix="mmdp-test-cache-")


@pytest.fixture(scope="session")
def tokenizer():
    from mmdp.tokenizer import get_tokenizer

    return get_tokenizer()


@pytest.fixture(scope="session")
def run_script():
    return _run_script


def _run_script(name: str, *args: str, env: dict | None = None, timeout: int = 300):
    """Run a stage script as a user would; returns the CompletedProcess (never raises)."""
    return subprocess.run(
        [sys.executable, str(REPO / name), *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, **(env or {})},
        timeout=timeout,
    )
