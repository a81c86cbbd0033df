"""What built a vendor tree: the state file inside its .git, and the inputs digest."""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from ..errors import UserError
from ..patches import Patch
from ..pins import Upstream

STATE_FILE = "sm120-build.json"


def _stack_of(tree: Path) -> str | None:
    """The stack a vendor tree belongs to: None for the default one (vendor/<name>),
    else <stack> of stacks/<stack>/vendor/<name>."""
    stack = tree.parent.parent
    return stack.name if stack.parent.name == "stacks" else None


def tree_label(tree: Path) -> str:
    """How messages name a vendor tree, as the user finds it from the checkout."""
    stack = _stack_of(tree)
    return f"stacks/{stack}/vendor/{tree.name}" if stack else f"vendor/{tree.name}"


def nox_command(tree: Path, session: str, options: str = "") -> str:
    """The nox command for `session` on the stack of `tree`, with `options`."""
    stack = _stack_of(tree)
    words = " ".join(word for word in (options, f"--stack {stack}" if stack else "") if word)
    return f"nox -s {session}" + (f" -- {words}" if words else "")


@dataclass(frozen=True)
class VendorState:
    """What built a vendor tree, kept in .git/sm120-build.json.

    inputs: digest of the sdist and the patches/ series the tree was made from.
    base, head: the pristine commit, and where this tool last left HEAD.
    complete: every patch of that series is in the tree.
    exact: the tree is that series as it stands in patches/ (false after a refresh was
        committed and `--continue`d, until export_patches writes it to patches/).
    stopped_at, remaining: when not complete, the patch that did not apply and the names
        after it, which `vendor --continue` applies once the refresh is committed.
    """

    inputs: str
    base: str
    head: str
    complete: bool
    exact: bool
    stopped_at: str | None = None
    remaining: tuple[str, ...] = ()


def inputs_key(upstream: Upstream, patches: list[Patch]) -> str:
    """Digest of everything a vendor tree is built from: the pinned upstream files (the sdist,
    or every target wheel) and the ordered patches."""
    digest = hashlib.sha256()
    for artifact in upstream.files:
        digest.update(f"{artifact.file}\0{artifact.sha256}\0".encode())
    for patch in patches:
        digest.update(f"{patch.path.name}\0".encode())
        digest.update(hashlib.sha256(patch.path.read_bytes()).digest())
    return digest.hexdigest()


def read_state(tree: Path) -> VendorState | None:
    path = tree / ".git" / STATE_FILE
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
        return VendorState(
            inputs=str(data["inputs"]),
            base=str(data["base"]),
            head=str(data["head"]),
            complete=bool(data["complete"]),
            exact=bool(data["exact"]),
            stopped_at=data.get("stopped_at"),
            remaining=tuple(data.get("remaining", ())),
        )
    except (ValueError, KeyError, TypeError) as exc:
        raise UserError(
            f"{path} is damaged ({type(exc).__name__}: {exc}), so it is unknown which commits "
            f"of {tree_label(tree)} are patches. Keep what you need (`git -C {tree_label(tree)} "
            f"log`), then remove {tree_label(tree)} and run `{nox_command(tree, 'vendor')}`."
        ) from None


def current_inputs(tree: Path) -> str:
    """The digest of the sdist and patches a complete vendor tree was made from."""
    state = read_state(tree)
    if state is None or not state.complete:
        raise UserError(
            f"{tree_label(tree)} is not complete; run `{nox_command(tree, 'vendor')}`"
        )
    return state.inputs


def series_label(tree: Path) -> str:
    """p<8 hex>: the patch-series label of the versions built from a vendor tree ("p" keeps
    the segment from being all digits, which PEP 440 would renormalise)."""
    return f"p{current_inputs(tree)[:8]}"


def write_state(tree: Path, state: VendorState) -> None:
    """Write the state file atomically: an interrupted write never leaves half a file."""
    path = tree / ".git" / STATE_FILE
    partial = path.with_suffix(".partial")
    partial.write_text(json.dumps(asdict(state), indent=2) + "\n")
    os.replace(partial, path)
