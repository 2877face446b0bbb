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


def _run_script(
    name: str, *args: str, env: dict | None = None, timeout: int = 300, python_args: bool = False
):
    """Run a stage script as a user would; returns the CompletedProcess (never raises).

    With python_args=True, `name` and `args` are passed to python as they are (e.g. "-m", ...).
    """
    command = (
        [sys.executable, name, *args] if python_args else [sys.executable, str(REPO / name), *args]
    )
    return subprocess.run(
        command,
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, **(env or {})},
        timeout=timeout,
    )
