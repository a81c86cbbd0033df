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
    except OSError as exc:
        if exc.filename is None:
            return _unexpected(exc, verbose)
        # A file the command could not read or write (permissions, a full disk, a path
        # that is a file where a directory should be): the user's to fix, so named.
        target = f"{exc.filename}" + (f" -> {exc.filename2}" if exc.filename2 else "")
        print(f"error: {target}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted; the next run cleans up what this one left", file=sys.stderr)
        return 130
    except Exception as exc:
        return _unexpected(exc, verbose)


def _unexpected(exc: Exception, verbose: bool) -> int:
    """A failure nobody anticipated: one line by default, the traceback on request (pypa/build
    does the same)."""
    if verbose:
        raise exc
    print(
        f"error: unexpected {type(exc).__name__}: {exc}\n"
        "This is a bug in sm120-build; run again with --verbose for the traceback.",
        file=sys.stderr,
    )
    return 2
