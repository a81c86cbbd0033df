"""Every patch and hunk of a series against a candidate tree, with real `git apply`: clean,
at an offset, only with fuzz (refused), upstream (it reverse-applies), upstream in another
form, or a conflict; and what to do about each.

A patch is upstream, and may be dropped, only when the whole patch reverse-applies on the
candidate with the patches before it applied: hunks that each reverse-apply alone may all
match the same place (identical hunks do), which proves nothing for the others. Every
detail said of a hunk is checked against the candidate's file.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
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


def _meaningful(lines: list[str]) -> list[str]:
    """Lines that say something, stripped: a bare "}" or "{" is in every file."""
    return [line.strip() for line in lines if re.search(r"\w{3}", line)]


def classify_hunk(tree: Path, hunk: Hunk) -> HunkVerdict:
    """How one hunk meets the tree: applies (at an offset), only with fuzz (and where it
    would land), already there, there in another form, or not at all."""
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
    target = tree / hunk.file
    if _apply(tree, text, "--check", "-C1").returncode == 0:
        return HunkVerdict(hunk.file, hunk.header, "fuzz", detail=_where_fuzz_lands(tree, hunk))
    if not target.is_file():
        return HunkVerdict(hunk.file, hunk.header, "conflict", detail="file not found")
    present = {line.strip() for line in target.read_text(errors="replace").splitlines()}
    removed, added = _meaningful(hunk.removed), _meaningful(hunk.added)
    gone = not any(line in present for line in removed)
    there = bool(added) and all(line in present for line in added)
    if (removed and gone and there) or (not removed and there):
        # The change itself is in the file, in another place or indentation: evidence for a
        # maintainer to review, never proof enough to drop the patch.
        return HunkVerdict(
            hunk.file,
            hunk.header,
            "upstream in another form",
            detail=(
                "the lines it removes are gone from the file and the lines it adds are there"
                if removed
                else "the lines it adds are there, in another place or indentation"
            ),
        )
    if removed and gone:
        return HunkVerdict(
            hunk.file,
            hunk.header,
            "conflict",
            detail="the lines it removes are gone from the file and the lines it adds are not "
            "there: the code was rewritten; refresh the patch by hand",
        )
    return HunkVerdict(hunk.file, hunk.header, "conflict", detail=_where_it_differs(hunk, target))


# git's own function-name rules for the hunk header of the files this project patches.
_FUNCTION_NAMES = "*.py diff=python\n*.cu diff=cpp\n*.cuh diff=cpp\n*.h diff=cpp\n*.cpp diff=cpp\n"


def _function_of(diff_header: str) -> str:
    """The function context git wrote after a hunk's @@ ... @@, if any, without the ':' or
    '{' that opens its body."""
    context = diff_header.split("@@", 2)[2] if diff_header.count("@@") >= 2 else ""
    return context.strip().rstrip(":{").rstrip()


def _where_fuzz_lands(tree: Path, hunk: Hunk) -> str:
    """Where the hunk applies with 1 line of context, by function: git diffs the file before
    and after applying it there (in a copy), and names the function of each changed place."""
    target = tree / hunk.file
    with tempfile.TemporaryDirectory() as scratch:
        before, after = Path(scratch) / "before", Path(scratch) / "after"
        (after / hunk.file).parent.mkdir(parents=True)
        shutil.copyfile(target, after / hunk.file)
        before.mkdir()
        shutil.copyfile(target, before / Path(hunk.file).name)
        git(after, "init", "--quiet")
        applied = _apply(after, hunk.as_patch(), "-C1")
        attributes = Path(scratch) / "attributes"
        attributes.write_text(_FUNCTION_NAMES)
        diff = git(
            after,
            "-c",
            f"core.attributesFile={attributes}",
            "diff",
            "--no-index",
            "-U0",
            str(before / Path(hunk.file).name),
            str(after / hunk.file),
            check=False,
        ).stdout
    intended = _function_of(hunk.text.split("\n", 1)[0])
    landed = sorted(
        {_function_of(line) for line in diff.splitlines() if line.startswith("@@")} - {""}
    )
    lines = re.findall(r"^@@ -(\d+)", diff, re.M)
    if applied.returncode != 0 or not lines:
        return "applies only with 1 line of context"
    where = f"line {lines[0]} of {hunk.file}" + (f", in {', '.join(landed)}" if landed else "")
    if intended and landed and intended not in landed:
        return (
            f"applies only with 1 line of context, at {where}: NOT in {intended}, where the "
            "patch made it"
        )
    return f"applies only with 1 line of context, at {where}"


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
    stripped = [line.strip() for line in lines]
    for line in expected:
        if re.search(r"\w{3}", line) and line.strip() in stripped:
            at = stripped.index(line.strip())
            return (
                f"its context line {line.strip()[:50]!r} is at {hunk.file}:{at + 1}, indented "
                "otherwise; the candidate's file was re-indented there"
            )
    return f"none of the hunk's context lines is in the candidate's {hunk.file}"


def _patch_verdict(hunks: list[HunkVerdict]) -> str:
    kinds = {h.verdict for h in hunks}
    if kinds <= {"clean"}:
        return "clean"
    if kinds <= {"clean", "offset"}:
        return "offset"
    if kinds == {"upstream"}:
        # Each hunk alone, never the whole: the whole was tried first (classify_patch).
        return "partly upstream"
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
        # The whole patch, as one: the only proof that upstream carries it.
        verdicts = [HunkVerdict(h.file, h.header, "upstream") for h in hunks]
        return PatchVerdict(patch.path.name, "upstream", ACTIONS["upstream"], verdicts)
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
