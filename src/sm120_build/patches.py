"""The quilt-style patch series: patches/<name>/series plus NNNN-short-name.patch files.

Each patch is a DEP-3 header followed by a unified diff with a/ and b/ prefixes, so
`QUILT_PATCHES=patches/<name> quilt push -a` applies the same series that we apply with
`git apply`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path

from .errors import UserError

# A diff starts at the first line that one of the diff formats quilt and git accept opens with.
_DIFF_START = re.compile(r"^(diff --git |--- |Index: )", re.MULTILINE)
_FIELD = re.compile(r"^([A-Za-z][A-Za-z0-9-]*):[ \t]*(.*)$")

# DEP-3 needs a description and an origin or author; this project also wants Forwarded,
# so that every patch says whether upstream has seen it.
REQUIRED_FIELDS = (("Description", "Subject"), ("Origin", "Author"), ("Forwarded",))


@dataclass(frozen=True)
class Patch:
    path: Path
    header: str
    diff: str

    @property
    def fields(self) -> dict[str, str]:
        return parse_dep3(self.header)

    @property
    def subject(self) -> str:
        fields = self.fields
        text = fields.get("Subject") or fields.get("Description", "")
        return text.splitlines()[0] if text else self.path.stem


def parse_dep3(header: str) -> dict[str, str]:
    """Fields of a DEP-3 header; continuation lines are folded into the field above them."""
    fields: dict[str, str] = {}
    current: str | None = None
    for line in header.splitlines():
        match = _FIELD.match(line)
        if match:  # a field name starts at the line's first character
            current = match.group(1)
            fields[current] = match.group(2)
        elif current is not None and line[:1] in (" ", "\t"):
            fields[current] += "\n" + line.strip()
        elif line.strip() in ("", "---"):
            current = None
    return fields


def dep3_problems(header: str) -> list[str]:
    fields = parse_dep3(header)
    return [
        " or ".join(alternatives)
        for alternatives in REQUIRED_FIELDS
        if not any(fields.get(name, "").strip() for name in alternatives)
    ]


def diff_start_in_header(header: str) -> str | None:
    """The first line of a would-be header that a reader of the patch (quilt, git apply,
    read_patch) takes for the start of its diff, if there is one."""
    match = _DIFF_START.search(header)
    return header[match.start() :].split("\n", 1)[0] if match else None


def split_patch(text: str) -> tuple[str, str]:
    match = _DIFF_START.search(text)
    if match is None:
        return text, ""
    return text[: match.start()], text[match.start() :]


def read_patch(path: Path) -> Patch:
    try:
        text = path.read_text()
    except OSError as exc:
        raise UserError(f"cannot read patch {path}: {exc.strerror}") from exc
    header, diff = split_patch(text)
    if not diff:
        raise UserError(f"{path}: no diff found (expected 'diff --git', '---' or 'Index:')")
    missing = dep3_problems(header)
    if missing:
        raise UserError(
            f"{path}: DEP-3 header lacks {'; '.join(missing)}. "
            "Add the fields at the top of the patch "
            "(docs/patches.md, 'Adding or refreshing a patch')."
        )
    return Patch(path=path, header=header, diff=diff)


def series_names(series_dir: Path) -> list[str]:
    """Patch file names listed in <series_dir>/series, in order."""
    series = series_dir / "series"
    if not series.is_file():
        raise UserError(f"{series} does not exist; create it, one patch file name per line")
    names = []
    for number, raw in enumerate(series.read_text().splitlines(), start=1):
        line = raw.partition("#")[0].strip()
        if not line:
            continue
        name, *options = line.split()
        if options not in ([], ["-p1"]):
            raise UserError(f"{series}:{number}: only '-p1' patches are supported, got {options}")
        names.append(name)
    return names


def load_series(series_dir: Path) -> list[Patch]:
    patches = []
    for name in series_names(series_dir):
        path = series_dir / name
        if not path.is_file():
            raise UserError(f"{series_dir / 'series'} names {name}, which does not exist")
        patches.append(read_patch(path))
    return patches


def render_patch(header: str, diff: str) -> str:
    return header.rstrip("\n") + "\n\n" + diff


def patch_file_name(index: int, subject: str, suffix: int = 1) -> str:
    """NNNN-<slug of the subject>[-suffix].patch; the slug is cut at 50 characters, so two
    subjects can share a slug: the suffix tells them apart."""
    slug = re.sub(r"[^a-z0-9]+", "-", subject.lower()).strip("-")[:50].rstrip("-")
    return f"{index:04d}-{slug or 'change'}{f'-{suffix}' if suffix > 1 else ''}.patch"


@dataclass(frozen=True)
class Hunk:
    """One hunk of one file of a patch, renderable as a patch of its own."""

    file: str
    file_header: str  # the "diff --git" / "---" / "+++" lines of its file
    text: str  # from its "@@" line to the next hunk

    @property
    def header(self) -> str:
        return self.text.split("\n", 1)[0].split(" @@", 1)[0] + " @@"

    @property
    def removed(self) -> list[str]:
        """The lines the hunk takes out (without the leading '-')."""
        return [line[1:] for line in self.text.splitlines()[1:] if line.startswith("-")]

    @property
    def added(self) -> list[str]:
        """The lines the hunk puts in (without the leading '+')."""
        return [line[1:] for line in self.text.splitlines()[1:] if line.startswith("+")]

    def as_patch(self) -> str:
        return self.file_header + self.text


def hunks_of(diff: str) -> list[Hunk]:
    """Every hunk of a unified diff, in order, each with its file's header."""
    hunks: list[Hunk] = []
    sections = [m.start() for m in re.finditer(r"^diff --git ", diff, re.MULTILINE)] or [0]
    for start, end in pairwise([*sections, len(diff)]):
        section = diff[start:end]
        first_hunk = section.find("\n@@ ")
        if first_hunk < 0:
            continue
        file_header = section[: first_hunk + 1]
        target = re.search(r"^\+\+\+ (?:b/)?(\S+)", file_header, re.MULTILINE)
        source = re.search(r"^--- (?:a/)?(\S+)", file_header, re.MULTILINE)
        name = target.group(1) if target and target.group(1) != "/dev/null" else ""
        name = name or (source.group(1) if source else "?")
        body = section[first_hunk + 1 :]
        starts = [m.start() for m in re.finditer(r"^@@ ", body, re.MULTILINE)]
        for hunk_start, hunk_end in pairwise([*starts, len(body)]):
            hunks.append(Hunk(name, file_header, body[hunk_start:hunk_end]))
    return hunks
