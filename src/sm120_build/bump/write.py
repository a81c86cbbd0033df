"""`bump --write`: the candidates' pins and series, written without losing anything.

What is written is worked out whole first (new_files): the new pins.toml and series files,
and the patch files that are dropped, which are only those the candidate carries as a whole
patch (classify.py). Then, with nothing unsaved in the way (unsaved_work), it is put in
place in one step:

- a new sglang release becomes a new stack, stacks/sglang-<version>/: the current stack's
  files, made in a scratch directory beside it and renamed into place;
- otherwise the stack is updated in place through a journal: the new files are staged
  beside the stack, the journal naming them is written (the point of no return), then they
  are renamed over the old ones. A run interrupted after the journal is finished by the
  next command (finish_interrupted), before anything reads the pins: every command sees
  the old set or the new one, never new pins with the old series.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from ..cache import scratch_directory
from ..console import say
from ..errors import UserError
from ..layout import STACKS_DIR, Layout
from ..patches import parse_dep3
from ..pins import Pins, Upstream
from ..vendor import unsaved_work
from .candidate import Candidate

JOURNAL = ".sm120-bump-journal.json"
STAGING = ".sm120-bump-staging"
# A stack's own files besides patches/ (those present are copied to a new stack).
STACK_FILES = (
    "pins.toml",
    "profiles.toml",
    "profiles-derived.toml",
    "served-models.toml",
    "audit-waivers.toml",
    "audit-scope.toml",
)


# A companion's new pin: (version, sha256 of each of its wheels), or None when the chosen
# sglang no longer requires it.
Pinned = tuple[str, tuple[str, ...]] | None


@dataclass
class NewFiles:
    """What --write puts in place, by path relative to the stack directory."""

    texts: dict[str, str] = field(default_factory=dict)
    dropped: list[str] = field(default_factory=list)
    done: list[str] = field(default_factory=list)  # what it did, for the user


def _toml_string(text: str) -> str:
    """`text` as a TOML string (tomli-w: quotes and escapes are its business)."""
    import tomli_w

    return tomli_w.dumps({"v": text})[len("v = ") :].rstrip("\n")


def _toml_value(value: object) -> str:
    """A string, or a list of strings or of {str: str} tables, inline."""
    if isinstance(value, str):
        return _toml_string(value)
    assert isinstance(value, list)
    if not value:
        return "[]"
    items = [
        _toml_string(item)
        if isinstance(item, str)
        else "{ " + ", ".join(f"{k} = {_toml_string(v)}" for k, v in item.items()) + " }"
        for item in value
    ]
    return "[\n" + "".join(f"  {item},\n" for item in items) + "]"


def _table_span(text: str, header: str) -> tuple[int, int] | None:
    """Where the body of the table `[header]` starts and ends in a TOML text."""
    match = re.search(rf"^\[{re.escape(header)}\]\n(.*?)(?=^\[|\Z)", text, re.M | re.S)
    return (match.start(1), match.end(1)) if match else None


_KEY_LINE = re.compile(r"^[A-Za-z0-9_-]+ = (\[[^\]]*\]|.*)\n", re.M)


def _set_key(block: str, key: str, value: object) -> str:
    """`key = value` in place of the key's line, or after the table's last key (before
    the comments that introduce the next table)."""
    line = f"{key} = {_toml_value(value)}\n"
    pattern = re.compile(rf"^{re.escape(key)} = (\[[^\]]*\]|.*)\n", re.M)
    if pattern.search(block):
        return pattern.sub(lambda _: line, block, count=1)
    keys = list(_KEY_LINE.finditer(block))
    at = keys[-1].end() if keys else 0
    return block[:at] + line + block[at:]


def _drop_key(block: str, key: str) -> str:
    """Remove `key = ...`, an array over several lines included."""
    return re.sub(rf"^{re.escape(key)} = (\[[^\]]*\]|.*)\n", "", block, flags=re.M)


def _comments_above(text: str, at: int) -> int:
    """Where the comment lines right above the line that starts at `at` begin (`at` if there
    are none)."""
    start = at
    while start > 0:
        previous = text.rfind("\n", 0, start - 1) + 1
        if not text[previous:start].startswith("#"):
            break
        start = previous
    return start


def _pins_text(text: str, results: list[Candidate], companions: Mapping[str, Pinned]) -> str:
    """pins.toml with each candidate's upstream table and the companions moved."""
    for result in results:
        upstream = result.upstream
        span = _table_span(text, f"upstream.{upstream.name}")
        if span is None:
            raise UserError(f"pins.toml has no [upstream.{upstream.name}] table to update")
        block = text[span[0] : span[1]]
        for key in ("version", "git_tag", "git_commit"):
            block = _set_key(block, key, getattr(upstream, key))
        for key in ("sdist", "sha256", "wheels"):
            block = _drop_key(block, key)
        if upstream.wheels:
            wheels = [{"file": w.file, "sha256": w.sha256} for w in upstream.wheels]
            block = _set_key(block, "wheels", wheels)
        else:
            block = _set_key(block, "sdist", upstream.sdist)
            block = _set_key(block, "sha256", upstream.sha256)
        text = text[: span[0]] + block + text[span[1] :]
    for name, pinned in companions.items():
        span = _table_span(text, f"companions.{name}")
        if span is None:
            continue
        if pinned is None:
            # The table goes, with the comment lines right above it, which describe it; those
            # right above the next table (its body's last lines) describe that one, and stay.
            header = text.rindex(f"[companions.{name}]", 0, span[0])
            text = text[: _comments_above(text, header)] + text[_comments_above(text, span[1]) :]
        else:
            block = _set_key(text[span[0] : span[1]], "version", pinned[0])
            block = _set_key(block, "sha256", list(pinned[1]))
            text = text[: span[0]] + block + text[span[1] :]
    return text


def _series_text(series: Path, result: Candidate, upstream: Upstream) -> tuple[str, list[str]]:
    """The new series file and the patches it drops: only those upstream carries whole;
    those upstream has in another form are kept with one REVIEW line above them."""
    lines = series.read_text().splitlines()
    dropped = []
    for patch in result.patches:
        mine = [
            n for n, line in enumerate(lines) if line.split("#", 1)[0].split()[:1] == [patch.patch]
        ]
        if patch.verdict == "upstream":
            for n in mine:
                lines[n] = (
                    f"# {patch.patch}: dropped, upstream in {upstream.project} "
                    f"{upstream.version} (nox -s bump: the whole patch reverse-applies)"
                )
            dropped += [patch.patch] if mine else []
        elif patch.action == "review":
            review = f"# REVIEW {patch.patch}:"
            for n in reversed(mine):
                if n > 0 and lines[n - 1].startswith(review):
                    continue  # said by an earlier run: a rerun adds nothing
                lines.insert(
                    n,
                    f"{review} upstream in another form in {upstream.project} "
                    f"{upstream.version} (nox -s bump); kept until it is proven equivalent",
                )
    return "".join(f"{line}\n" for line in lines), dropped


def new_files(
    results: list[Candidate],
    pins_file: Path,
    patches_root: Path,
    companions: Mapping[str, Pinned],
) -> NewFiles:
    """Everything --write would write, worked out before anything is written."""
    files = NewFiles()
    files.texts["pins.toml"] = _pins_text(pins_file.read_text(), results, companions)
    for name, pinned in companions.items():
        files.done.append(
            f"pins.toml: {name} -> {pinned[0]}"
            if pinned
            else f"pins.toml: {name} dropped (the chosen sglang no longer requires it)"
        )
    for result in results:
        upstream = result.upstream
        files.done.append(f"pins.toml: {upstream.name} -> {upstream.project} {upstream.version}")
        series = patches_root / upstream.name / "series"
        text, dropped = _series_text(series, result, upstream)
        files.texts[f"patches/{upstream.name}/series"] = text
        files.dropped += [f"patches/{upstream.name}/{name}" for name in dropped]
        files.done += [f"patches/{upstream.name}: dropped {name} (upstream)" for name in dropped]
        files.done += [
            f"patches/{upstream.name}: kept {p.patch} for review"
            for p in result.patches
            if p.action == "review"
        ]
    return files


def applied_upstream_hint(patch: Path) -> str | None:
    """A patch's DEP-3 Applied-Upstream field, for the report: a hint, never proof."""
    return parse_dep3(patch.read_text()).get("Applied-Upstream") or None


def companion_pins(
    pins: Pins, sglang_requires: Mapping[str, Requirement], sglang: str
) -> dict[str, tuple[str, str | None]]:
    """Each companion of the pins -> (its pinned version, the version the chosen sglang's
    metadata pins, or None when it requires none). A requirement that pins no one version
    is refused: nothing could tell which wheel to hash-pin."""
    moves: dict[str, tuple[str, str | None]] = {}
    for name, companion in pins.companions.items():
        requirement = sglang_requires.get(str(canonicalize_name(name)))
        if requirement is None:
            moves[name] = (companion.version, None)
            continue
        exact = [s.version for s in requirement.specifier if s.operator == "=="]
        if len(exact) != 1:
            raise UserError(
                f"sglang {sglang} requires {requirement}, which pins no one version of {name}: "
                "pin it in pins.toml by hand. Nothing was written."
            )
        moves[name] = (companion.version, exact[0])
    return moves


def unsaved(layout: Layout, pins: Pins) -> list[str]:
    """What --write could lose: uncommitted changes to the stack's pins, series and profiles
    (by git), and whatever a vendor tree of the stack holds that patches/ lacks."""
    own = [layout.stack / name for name in STACK_FILES] + [layout.patches]
    status = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=all", "--", *map(str, own)],
        cwd=layout.root,
        capture_output=True,
        text=True,
    )
    if status.returncode != 0:
        return [
            f"{layout.root} is not a git checkout, so what is uncommitted in pins.toml and "
            "patches/ cannot be told: --write runs in a git checkout (git init and commit)"
        ]
    problems = [
        f"{line[3:]}: uncommitted ({line[:2].strip()})" for line in status.stdout.splitlines()
    ]
    for name in sorted(pins.upstreams):
        problems += unsaved_work(layout.vendor / name, layout.shown(layout.vendor / name))
    return problems


def write_new_stack(layout: Layout, name: str, files: NewFiles) -> Path:
    """stacks/<name>/: the current stack's own files, with `files` in place. Made whole in
    a scratch directory beside it, then renamed: it appears complete or not at all."""
    stacks = layout.root / STACKS_DIR
    target = stacks / name
    if target.exists() or target.is_symlink():
        raise UserError(
            f"{layout.shown(target)} exists already: bump from it (--stack {name}), or move "
            "it away. Nothing was written."
        )
    with scratch_directory(stacks, "bump") as scratch:
        made = scratch / name
        made.mkdir()
        for own in STACK_FILES:
            if (layout.stack / own).is_file():
                shutil.copyfile(layout.stack / own, made / own)
        shutil.copytree(
            layout.patches,
            made / "patches",
            ignore=lambda directory, names: [
                n
                for n in names
                if f"{Path(directory).relative_to(layout.stack)}/{n}" in files.dropped
            ],
        )
        for relative, text in files.texts.items():
            (made / relative).write_text(text)
        os.rename(made, target)
    return target


def write_in_place(layout: Layout, files: NewFiles) -> None:
    """Put `files` in place in the stack through the journal (module docstring)."""
    _finish(layout.stack, stage(layout, files))


def stage(layout: Layout, files: NewFiles) -> dict[str, list[str]]:
    """Stage `files` beside the stack and write the journal naming them: after this, the
    new set is the one, whatever interrupts the renames."""
    finish_interrupted(layout)
    staging = layout.stack / STAGING
    if staging.exists():
        shutil.rmtree(staging)  # a run interrupted before its journal: the old set stands
    staging.mkdir()
    for relative, text in files.texts.items():
        (staging / relative).parent.mkdir(parents=True, exist_ok=True)
        (staging / relative).write_text(text)
    journal = {"replace": sorted(files.texts), "delete": sorted(files.dropped)}
    partial = layout.stack / f"{JOURNAL}.partial"
    partial.write_text(json.dumps(journal, indent=2) + "\n")
    os.replace(partial, layout.stack / JOURNAL)  # from here on, the new set is the one
    return journal


def _finish(stack: Path, journal: dict[str, list[str]]) -> None:
    staging = stack / STAGING
    for relative in journal["replace"]:
        if (staging / relative).is_file():
            os.replace(staging / relative, stack / relative)
    for relative in journal["delete"]:
        (stack / relative).unlink(missing_ok=True)
    (stack / JOURNAL).unlink(missing_ok=True)
    shutil.rmtree(staging, ignore_errors=True)


def finish_interrupted(layout: Layout) -> None:
    """Finish a --write that was interrupted after its journal (module docstring)."""
    path = layout.stack / JOURNAL
    if not path.is_file():
        return
    try:
        journal = json.loads(path.read_text())
        paths = [*journal["replace"], *journal["delete"]]
    except (ValueError, KeyError, TypeError) as exc:
        raise UserError(f"{path} is damaged ({exc}); see docs/bumps.md to finish by hand") from None
    if any(".." in Path(p).parts or Path(p).is_absolute() for p in paths):
        raise UserError(f"{path} names paths outside the stack; it was not written by bump")
    say(f"finishing the bump --write that was interrupted ({len(paths)} files)")
    _finish(layout.stack, journal)
