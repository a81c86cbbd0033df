"""Every patch and hunk of a series against a candidate tree, with real `git apply`: clean,
at an offset, only with fuzz (refused), upstream (it reverse-applies), upstream in another
form, or a conflict; and what to do about each."""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from ..gitrepo import git
from ..patches import Hunk, Patch, hunks_of

ACTIONS = {
    "clean": "keep",
    "offset": "keep",
    "fuzz": "refresh",
    "upstream": "drop",
    "partly upstream": "refresh",
    # Evidence of change, not of equivalence: kept, for a maintainer to review.
    "upstream in another form": "review",
    "conflict": "refresh",
}


@dataclass(frozen=True)
class HunkVerdict:
    file: str
    hunk: str  # the @@ line
    verdict: str  # clean, offset, fuzz, upstream, upstream in another form, conflict
    offset: int = 0
    detail: str = ""


@dataclass(frozen=True)
class PatchVerdict:
    patch: str
    verdict: str
    action: str
    hunks: list[HunkVerdict]

    @property
    def failing(self) -> list[HunkVerdict]:
        return [h for h in self.hunks if h.verdict in ("conflict", "upstream in another form")]


def _apply(tree: Path, patch_text: str, *options: str) -> subprocess.CompletedProcess[str]:
    """git apply, strict unless `options` say otherwise, reading the patch from stdin."""
    return git(tree, "apply", "--verbose", *options, "-", check=False, stdin=patch_text)


_OFFSET = re.compile(r"Hunk #\d+ succeeded at \d+ \(offset (-?\d+) lines?\)")


def classify_hunk(tree: Path, hunk: Hunk) -> HunkVerdict:
    """How one hunk meets the tree: applies (at an offset), only with fuzz, already there,
    there in another form, or not at all."""
    text = hunk.as_patch()
    # Reverse first: a hunk that only adds lines still applies forward when upstream already
    # has them (and would add them twice); that it reverse-applies is the proof.
    if _apply(tree, text, "--check", "--reverse").returncode == 0:
        return HunkVerdict(hunk.file, hunk.header, "upstream")
    forward = _apply(tree, text, "--check")
    if forward.returncode == 0:
        offset = _OFFSET.search(forward.stderr + forward.stdout)
        moved = int(offset.group(1)) if offset else 0
        return HunkVerdict(hunk.file, hunk.header, "offset" if moved else "clean", moved)
    if _apply(tree, text, "--check", "-C1").returncode == 0:
        return HunkVerdict(hunk.file, hunk.header, "fuzz", detail="applies with 1 line of context")
    target = tree / hunk.file
    if not target.is_file():
        return HunkVerdict(hunk.file, hunk.header, "conflict", detail="file not found")
    present = {line.strip() for line in target.read_text(errors="replace").splitlines()}
    # Lines that say something: a bare "}" or "{" is in every file.
    removed = [line.strip() for line in hunk.removed if re.search(r"\w{3}", line)]
    if removed and not any(line in present for line in removed):
        return HunkVerdict(
            hunk.file,
            hunk.header,
            "upstream in another form",
            detail="none of the lines it removes is in the file any more",
        )
    return HunkVerdict(hunk.file, hunk.header, "conflict", detail=_where_it_differs(hunk, target))


def _where_it_differs(hunk: Hunk, target: Path) -> str:
    """Where the hunk's nearest context now lives in the candidate file, and the first line
    there that differs from what the hunk expects."""
    expected = [line[1:] for line in hunk.text.splitlines()[1:] if line[:1] in (" ", "-")]
    lines = target.read_text(errors="replace").splitlines()
    for offset, line in enumerate(expected):
        if not re.search(r"\w{3}", line) or line not in lines:
            continue
        at = lines.index(line)
        start = at - offset
        for step, want in enumerate(expected):
            found = lines[start + step] if 0 <= start + step < len(lines) else "<end of file>"
            if found != want:
                return (
                    f"context {line.strip()[:50]!r} is at {hunk.file}:{at + 1}; at line "
                    f"{start + step + 1} the hunk expects {want.strip()[:60]!r}, the candidate "
                    f"has {found.strip()[:60]!r}"
                )
    return f"none of the hunk's context lines is in the candidate's {hunk.file}"


def _patch_verdict(hunks: list[HunkVerdict]) -> str:
    kinds = {h.verdict for h in hunks}
    if kinds <= {"clean"}:
        return "clean"
    if kinds <= {"clean", "offset"}:
        return "offset"
    if kinds == {"upstream"}:
        return "upstream"
    if kinds <= {"upstream", "upstream in another form"}:
        return "upstream in another form"
    # A hunk that meets nothing it expects, beside hunks that still apply: the patch's
    # change is not upstream as a whole, so it is refreshed, not dropped.
    if kinds & {"conflict", "upstream in another form"}:
        return "conflict"
    if "upstream" in kinds:
        return "partly upstream"
    return "fuzz"


def classify_patch(tree: Path, patch: Patch) -> PatchVerdict:
    """Classify `patch` on `tree`, then apply what of it applies (fuzz included)."""
    hunks = hunks_of(patch.diff)
    whole = _apply(tree, patch.diff, "--check")
    already = [_apply(tree, h.as_patch(), "--check", "--reverse").returncode == 0 for h in hunks]
    if whole.returncode == 0 and not any(already):
        # Offsets come per hunk, in order, for those that moved.
        report = iter(_per_hunk_offsets(whole.stderr + whole.stdout, hunks))
        verdicts = [
            HunkVerdict(h.file, h.header, "offset" if moved else "clean", moved)
            for h, moved in zip(hunks, report, strict=True)
        ]
        _apply(tree, patch.diff)
    elif _apply(tree, patch.diff, "--check", "--reverse").returncode == 0:
        verdicts = [HunkVerdict(h.file, h.header, "upstream") for h in hunks]
    else:
        verdicts = []
        for hunk in hunks:
            verdict = classify_hunk(tree, hunk)
            if verdict.verdict in ("clean", "offset"):
                _apply(tree, hunk.as_patch())
            elif verdict.verdict == "fuzz":
                _apply(tree, hunk.as_patch(), "-C1")
            verdicts.append(verdict)
    kind = _patch_verdict(verdicts)
    return PatchVerdict(patch.path.name, kind, ACTIONS[kind], verdicts)


def _per_hunk_offsets(output: str, hunks: list[Hunk]) -> list[int]:
    """git apply --verbose names 'Hunk #N ... (offset K lines)' per file for moved hunks."""
    moved: dict[tuple[str, int], int] = {}
    current = ""
    for line in output.splitlines():
        checking = re.match(r"Checking patch (.+)\.\.\.$", line)
        if checking:
            current = checking.group(1)
            continue
        match = re.match(r"Hunk #(\d+) succeeded at \d+ \(offset (-?\d+) lines?\)", line)
        if match:
            moved[(current, int(match.group(1)))] = int(match.group(2))
    offsets, seen = [], dict[str, int]()
    for hunk in hunks:
        seen[hunk.file] = seen.get(hunk.file, 0) + 1
        offsets.append(moved.get((hunk.file, seen[hunk.file]), 0))
    return offsets


def classify_series(tree: Path, patches: list[Patch]) -> list[PatchVerdict]:
    return [classify_patch(tree, patch) for patch in patches]
