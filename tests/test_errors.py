"""What a stage script prints when it fails: one line and an exit status, no traceback
(every stage script runs its main under mmdp.errors.exit_on_user_error); and what needs a package
only an extra installs says so in one sentence naming the extra."""

import importlib.metadata
import re
import sys

import pytest

from mmdp import ranks
from mmdp.errors import (
    EXTRAS,
    MissingExtra,
    RanksStoppedAnswering,
    UserError,
    WorkerFailed,
    exit_on_user_error,
    require_extra,
)


@pytest.mark.parametrize(
    "error, status, line",
    [
        (UserError("no such dataset"), 2, "error: no such dataset"),
        (
            WorkerFailed("DataLoader worker 0 of rank 0 died"),
            1,
            "WorkerFailed: DataLoader worker 0 of rank 0 died",
        ),
        (
            RanksStoppedAnswering("rank 0: rank 1 stopped answering at step 4"),
            1,
            "RanksStoppedAnswering: rank 0: rank 1 stopped answering at step 4",
        ),
    ],
)
def test_a_failed_stage_ends_with_its_one_line_and_status(error, status, line, capsys):
    with pytest.raises(SystemExit) as stopped, exit_on_user_error():
        raise error
    assert stopped.value.code == status
    assert capsys.readouterr().err == line + "\n"


def test_any_other_error_keeps_its_traceback():
    """A bug is not a user's problem: it must reach the traceback, not one quiet line."""
    with pytest.raises(KeyError), exit_on_user_error():
        raise KeyError("position_ids")


def test_the_ranks_check_raises_the_error_the_scripts_catch():
    assert ranks.RanksStoppedAnswering is RanksStoppedAnswering


def test_the_extras_named_in_errors_are_pyprojects():
    """mmdp's metadata, as installed from pyproject.toml: `peft>=0.21.2; extra == "lora"`."""
    requires = importlib.metadata.requires("mmdp")
    extras = {}
    for line in requires:
        requirement, _, marker = line.partition(";")
        extra = re.search(r"extra == ['\"](\w+)['\"]", marker)
        if extra:
            extras.setdefault(extra[1], set()).add(requirement.strip().replace(" ", ""))
    assert set(EXTRAS) == set(extras)
    for extra, requirement in EXTRAS.items():
        assert requirement in extras[extra], extras[extra]


def without(monkeypatch, module: str) -> None:
    """Make `import module` fail as if it were not installed."""
    monkeypatch.setitem(sys.modules, module, None)


@pytest.mark.parametrize(
    ("extra", "module"), [("accelerate", "accelerate"), ("lora", "peft"), ("video", "av")]
)
def test_a_missing_extra_is_one_sentence_naming_it(monkeypatch, extra, module):
    without(monkeypatch, module)
    with pytest.raises(MissingExtra) as missing:
        require_extra(module, extra, "this")
    said = str(missing.value)
    assert "\n" not in said and ". " not in said
    assert f"mmdp's {extra} extra" in said and f"uv sync --extra {extra}" in said
    assert isinstance(missing.value, ImportError) and isinstance(missing.value, UserError)


def test_a_video_without_pyav_is_one_sentence_naming_the_video_extra(monkeypatch):
    from mmdp.data.videos import require_av

    without(monkeypatch, "av")
    with pytest.raises(MissingExtra, match="needs av, which mmdp's video extra installs"):
        require_av()
