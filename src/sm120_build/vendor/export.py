"""Write a vendor tree's commits back to patches/, losing nothing."""

from __future__ import annotations

import re
import tempfile
from dataclasses import replace
from pathlib import Path

from ..console import say
from ..errors import UserError
from ..gitrepo import commit_message, git, git_bytes, head
from ..files import replace_text
from ..patches import (
    dep3_problems,
    diff_start_in_header,
    load_series,
    parse_dep3,
    patch_file_name,
    read_patch,
    render_patch,
    series_names,
)
from ..pins import Upstream
from .series import untracked_or_modified
from .state import inputs_key, nox_command, read_state, tree_label, write_state


def _subject(message: str) -> str:
    fields = parse_dep3(message)
    return (fields.get("Subject") or fields.get("Description", "")).splitlines()[0]


def _series_text(series_dir: Path) -> str:
    series = series_dir / "series"
    return series.read_text() if series.is_file() else ""


def _check_reproduces_head(tree: Path, base: str, rendered: dict[str, str], label: str) -> None:
    """Refuse an export whose patches, applied in order to the pristine tree, do not give the
    vendor tree's HEAD exactly: whatever it would lose (a commit, a file git apply cannot
    take) is named before anything is written."""
    with tempfile.TemporaryDirectory(prefix="export-check-") as scratch:
        index = Path(scratch) / "index"
        git(tree, "read-tree", base, index=index)
        for name, text in rendered.items():
            patch = Path(scratch) / name
            patch.write_text(text)
            applied = git(tree, "apply", "--cached", str(patch), check=False, index=index)
            if applied.returncode != 0:
                raise UserError(
                    f"{label}: the exported {name} does not apply on top of the ones before "
                    f"it ({applied.stderr.strip()}); nothing was written to patches/"
                )
        written = git(tree, "write-tree", index=index).stdout.strip()
    head = git(tree, "rev-parse", "HEAD^{tree}").stdout.strip()
    if written != head:
        lost = git(tree, "diff", "--stat", written, head).stdout.strip()
        raise UserError(
            f"{label}: the exported series would not rebuild HEAD; it would lose:\n{lost}\n"
            "Nothing was written to patches/."
        )


def _diff_text(tree: Path, commit: str, label: str) -> str:
    """The commit's change as a plain a/ b/ diff, whatever the tree's git config says; a
    change to a file that is not UTF-8 text is refused, naming the file."""
    diff = git_bytes(
        tree,
        "diff",
        "--no-color",
        "--no-ext-diff",
        "--no-renames",
        "--src-prefix=a/",
        "--dst-prefix=b/",
        f"{commit}^",
        commit,
    )
    try:
        return diff.decode()
    except UnicodeDecodeError:
        sections = re.split(rb"^(?=diff --git )", diff, flags=re.M)
        files = [
            section.split(b"\n", 1)[0].decode(errors="replace").split(" b/", 1)[-1]
            for section in sections
            if section and _undecodable(section)
        ]
        raise UserError(
            f"{label} commit {commit[:12]} changes {', '.join(files)}, which is not UTF-8 "
            "text; patches are UTF-8 text (quilt and this tool read them so). Convert the "
            "file to UTF-8 in that commit, or leave its change out. Nothing was written to "
            "patches/."
        ) from None


def _undecodable(data: bytes) -> bool:
    try:
        data.decode()
    except UnicodeDecodeError:
        return True
    return False


def _refuse_links(series_dir: Path, names: list[str]) -> None:
    """patches/<name>/ and the files an export writes there must be the project's own
    files, not links that would send the writes elsewhere."""
    links = [series_dir] if series_dir.is_symlink() else []
    links += [series_dir / name for name in names if (series_dir / name).is_symlink()]
    if links:
        raise UserError(
            f"{', '.join(str(link) for link in links)}: a symbolic link where export writes "
            "a patch series; it writes only the project's own files. Replace the link by the "
            "file it stands for. Nothing was written to patches/."
        )


def export_patches(upstream: Upstream, tree: Path, series_dir: Path) -> list[str]:
    """Regenerate series_dir from the commits above the pristine base in `tree`.

    An existing patch keeps its file name when a commit carries its subject, so an
    unchanged series exports byte-identically. Nothing is lost: the export refuses a tree
    whose series stopped part-way or whose patches/ changed since it was made, refuses
    two commits with one subject, and never deletes a patch file.
    """
    label = tree_label(tree)
    state = read_state(tree)
    if state is None:
        raise UserError(
            f"{label} was not made by this tool; run `{nox_command(tree, 'vendor')}` first"
        )
    if not state.complete:
        raise UserError(
            f"{label} stopped part-way through its series, at {state.stopped_at}: exporting "
            f"now would drop {', '.join(state.remaining) or 'nothing'} and "
            f"{state.stopped_at}. Commit the refresh of {state.stopped_at}, run "
            f"`{nox_command(tree, 'vendor', '--continue ' + tree.name)}`, then export."
        )
    if untracked_or_modified(tree):
        raise UserError(
            f"{label} has uncommitted or untracked files; commit them first, then export"
        )
    old_names = series_names(series_dir) if (series_dir / "series").is_file() else []
    current = [read_patch(series_dir / name) for name in old_names if (series_dir / name).is_file()]
    if len(current) != len(old_names) or inputs_key(upstream, current) != state.inputs:
        raise UserError(
            f"patches/{tree.name} changed since {label} was made; exporting would overwrite "
            f"those changes. Keep them (commit them), then run `{nox_command(tree, 'vendor')}` "
            "to rebuild "
            f"{label} from them, and make your tree changes there."
        )

    commits = git(tree, "rev-list", "--reverse", f"{state.base}..HEAD").stdout.split()
    messages = [commit_message(tree, commit) for commit in commits]
    for commit, message in zip(commits, messages, strict=True):
        missing = dep3_problems(message)
        if missing:
            raise UserError(
                f"{label} commit {commit[:12]}: its message is the patch header and lacks "
                f"{'; '.join(missing)}. Reword it (git commit --amend) and export again."
            )
        early = diff_start_in_header(message)
        if early is not None:
            raise UserError(
                f"{label} commit {commit[:12]}: its message has the line {early!r}, which "
                "starts at the line's first character as a diff does ('diff --git ', '--- ' "
                "or 'Index: '): quilt, git apply and this tool would take the patch's diff to "
                "start there. Indent that line (git commit --amend) and export again. "
                "Nothing was written to patches/."
            )
    subjects = [_subject(message) for message in messages]
    repeated = sorted({subject for subject in subjects if subjects.count(subject) > 1})
    if repeated:
        raise UserError(
            f"{label} has several commits with the subject {repeated[0]!r}; each patch needs "
            "its own subject (it names the patch file). Reword or squash them, then export."
        )
    # Subjects that differ only in case, punctuation or past the 50th character make the
    # same file name: one patch would take the other's file.
    slugs = [patch_file_name(0, subject) for subject in subjects]
    clashing = [s for s, slug in zip(subjects, slugs, strict=True) if slugs.count(slug) > 1]
    if clashing:
        raise UserError(
            f"{label} has commits whose subjects make the same patch file name: "
            f"{', '.join(repr(s) for s in clashing)}. Reword one of them, then export."
        )

    by_subject = {patch.subject: patch.path.name for patch in current}
    reused = {by_subject[subject] for subject in subjects if subject in by_subject}
    # A new file name must not take a name a kept patch keeps, nor overwrite a patch file
    # that stays behind for another patch.
    taken = {path.name for path in series_dir.glob("*.patch")} | reused
    rendered: dict[str, str] = {}
    for index, (commit, message, subject) in enumerate(
        zip(commits, messages, subjects, strict=True), start=1
    ):
        own = by_subject.get(subject)
        name = own or patch_file_name(index, subject)
        suffix = 1
        while own is None and name in taken | set(rendered):
            suffix += 1
            name = patch_file_name(index, subject, suffix)
        diff = _diff_text(tree, commit, label)
        rendered[name] = render_patch(message, diff)

    # Comment lines (such as bump's records of dropped patches) are kept, at the top.
    comments = [line for line in _series_text(series_dir).splitlines() if line.startswith("#")]
    series_text = "".join(f"{line}\n" for line in [*comments, *rendered])
    _check_reproduces_head(tree, state.base, rendered, label)
    _refuse_links(series_dir, [*rendered, "series"])
    series_dir.mkdir(parents=True, exist_ok=True)
    for name, text in rendered.items():
        replace_text(series_dir / name, text)
    replace_text(series_dir / "series", series_text)
    for name in sorted(set(old_names) - set(rendered)):
        say(
            f"patches/{tree.name}/{name} is no longer in the series; it is left in place. "
            "Delete it if that is what you meant."
        )

    patches = load_series(series_dir)
    write_state(
        tree,
        replace(state, inputs=inputs_key(upstream, patches), head=head(tree), exact=True),
    )
    return list(rendered)
