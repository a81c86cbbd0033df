"""Progress output: one line per step, with elapsed seconds for the long ones."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

# Set by the command line's --verbose: detail() speaks only then.
verbose = False


def detail(message: str) -> None:
    if verbose:
        say(message)


def say(message: str) -> None:
    print(f"sm120-build: {message}", file=sys.stderr, flush=True)


@contextmanager
def step(what: str) -> Iterator[None]:
    say(f"{what} ...")
    started = time.monotonic()
    yield
    say(f"{what}: done in {time.monotonic() - started:.1f} s")
