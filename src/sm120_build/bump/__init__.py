"""`nox -s bump`: what a new upstream release does to the patch series, in one run.

The candidate sdist is fetched through pip into a scratch directory (nothing in pins.toml,
vendor/ or patches/ changes), unpacked as a git repo, and the whole series is tried on it
in order. Every patch and every hunk is classified; a patch that does not apply does not
stop the run, and the hunks that do apply are applied so later patches meet the tree they
would meet after a refresh.
"""

from .candidate import (
    Candidate,
    GateSummary,
    _git_commit,
    evaluate,
    parse_candidate,
    pin_set_problems,
    sdist_requires,
)
from .classify import HunkVerdict, PatchVerdict, classify_series
from .report import as_json, audit_summary, companion_hashes, table, verdict, write

__all__ = [
    "Candidate",
    "GateSummary",
    "HunkVerdict",
    "PatchVerdict",
    "_git_commit",
    "as_json",
    "audit_summary",
    "classify_series",
    "companion_hashes",
    "evaluate",
    "parse_candidate",
    "pin_set_problems",
    "sdist_requires",
    "table",
    "verdict",
    "write",
]
