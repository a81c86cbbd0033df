"""Unpack a verified sdist into vendor/<name> as a git repo and apply its patch series.

vendor/<name> holds one commit for the pristine sdist, then one commit per patch whose
message is the patch's DEP-3 header. A small state file inside .git records which inputs
built the tree, so a re-run can tell "current" from "stale" from "edited by the user".

state: the state file; unpack: the sdist; series: applying and resuming; export: back to
patches/.
"""

from .export import export_patches
from .series import (
    PatchAlreadyApplied,
    PatchConflict,
    continue_series,
    unsaved_work,
    vendor_upstream,
)
from .state import current_inputs, read_state, series_label
from .unpack import make_pristine_tree, unpack_sdist

__all__ = [
    "PatchAlreadyApplied",
    "PatchConflict",
    "continue_series",
    "current_inputs",
    "export_patches",
    "make_pristine_tree",
    "read_state",
    "series_label",
    "unpack_sdist",
    "unsaved_work",
    "vendor_upstream",
]
