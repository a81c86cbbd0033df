"""The one exception type every command turns into a clean message, and the exit statuses
every command shares: 0 done, 1 a failure the user can act on (UserError, or a check that
failed), 2 a bug (an unexpected exception), 130 interrupted."""

from __future__ import annotations

import sys
from collections.abc import Callable


class UserError(Exception):
    """A failure the user can act on. The message says what went wrong and what to do next."""


def exit_status(run: Callable[[], int], verbose: bool) -> int:
    """Run a command's body and turn how it ended into its exit status."""
    try:
        return run()
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted; the next run cleans up what this one left", file=sys.stderr)
        return 130
    except Exception as exc:
        # A failure nobody anticipated: one line by default, the traceback on request
        # (pypa/build does the same).
        if verbose:
            raise
        print(
            f"error: unexpected {type(exc).__name__}: {exc}\n"
            "This is a bug in sm120-build; run again with --verbose for the traceback.",
            file=sys.stderr,
        )
        return 2
