"""What a stage script prints when it fails: one line and an exit status, no traceback
(every stage script runs its main under mmdp.errors.exit_on_user_error)."""

import pytest

from mmdp.errors import RanksStoppedAnswering, UserError, WorkerFailed, exit_on_user_error
from mmdp.packing import sharding


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
    assert sharding.RanksStoppedAnswering is RanksStoppedAnswering
