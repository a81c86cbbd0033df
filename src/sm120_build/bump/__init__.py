"""`nox -s bump`: what a new upstream release does to the patch series, in one run.

The candidate sdist is fetched through pip into a scratch directory (nothing in pins.toml,
vendor/ or patches/ changes), unpacked as a git repo, and the whole series is tried on it
in order. Every patch and every hunk is classified; a patch that does not apply does not
stop the run, and the hunks that do apply are applied so later patches meet the tree they
would meet after a refresh.
"""

from . import write
from .candidate import (
    Candidate,
    GateSummary,
    _git_commit,
    evaluate,
    parse_candidate,
    pin_set_problems,
    sdist_requires,
    wheel_requires,
)
from .classify import HunkVerdict, PatchVerdict, classify_series
from .report import as_json, audit_summary, companion_hashes, table, verdict
from .write import (
    applied_upstream_hint,
    companion_pins,
    finish_interrupted,
    new_files,
    unsaved,
    write_in_place,
    write_new_stack,
)

__all__ = [
    "Candidate",
    "GateSummary",
    "HunkVerdict",
    "PatchVerdict",
    "_git_commit",
    "applied_upstream_hint",
    "as_json",
    "audit_summary",
    "classify_series",
    "companion_hashes",
    "companion_pins",
    "evaluate",
    "finish_interrupted",
    "new_files",
    "parse_candidate",
    "pin_set_problems",
    "sdist_requires",
    "table",
    "unsaved",
    "verdict",
    "wheel_requires",
    "write",
    "write_in_place",
    "write_new_stack",
]
