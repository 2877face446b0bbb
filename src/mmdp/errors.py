"""Errors a user can fix (a wrong --dataset, no network), reported as one sentence."""

import contextlib
import sys


class UserError(Exception):
    """A problem with the user's input or environment; the message says what to do."""


@contextlib.contextmanager
def exit_on_user_error():
    """Print a UserError as one line and exit with status 2, instead of a traceback."""
    try:
        yield
    except UserError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
