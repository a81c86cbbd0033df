"""`publish --static DIR`: a PEP 503 tree (packages/ + simple/) that pip installs from over
file:// or HTTP, each wheel's provenance envelope beside it in packages/, and what a node
installs from (the lock files, SHA256SUMS and the envelopes) under locks/<digest>/ for nodes
that reach only that tree.

The tree may be shared and written by others, so nothing in it is trusted: a tree holding a
symbolic link is refused, naming it, before anything is written; and every directory is
opened without following a link, every file created with O_EXCL|O_NOFOLLOW relative to its
directory and renamed into place, so a link planted while this runs is replaced, never
followed.
"""

from __future__ import annotations

import base64
import hashlib
import html
import json
import os
import secrets
import shutil
import stat
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from .console import say
from .errors import UserError
from .index import project_of

# What the tree holds besides packages/ and simple/: what a node installs from.
LOCKS = "locks"
LOCK_FILES = ("requirements.txt", "node-lock.txt", "pylock.toml", "SHA256SUMS")
ENVELOPE_SUFFIX = ".intoto.jsonl"
_NO_FOLLOW_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


@dataclass(frozen=True)
class StaticFile:
    """A file to put in the tree: where it comes from, its name there and its sha256."""

    source: Path
    name: str
    project: str
    sha256: str


class _Directory:
    """A directory of the tree, held open: names below it are resolved relative to it."""

    def __init__(self, descriptor: int, path: Path) -> None:
        self.descriptor = descriptor
        self.path = path

    def subdirectory(self, name: str) -> _Directory:
        """`name` below this one, made mode 0755 if missing; never a link."""
        with suppress(FileExistsError):
            os.mkdir(name, 0o755, dir_fd=self.descriptor)
        try:
            descriptor = os.open(name, _NO_FOLLOW_DIRECTORY, dir_fd=self.descriptor)
        except OSError as exc:
            raise UserError(
                f"{self.path / name} is not a directory of the static index "
                f"({exc.strerror}); nothing more was written"
            ) from None
        os.fchmod(descriptor, 0o755)
        return _Directory(descriptor, self.path / name)

    def names(self) -> list[str]:
        return sorted(os.listdir(self.descriptor))

    def sha256(self, name: str) -> str | None:
        """The sha256 of the regular file `name`, or None when there is none."""
        try:
            descriptor = os.open(name, os.O_RDONLY | os.O_NOFOLLOW, dir_fd=self.descriptor)
        except FileNotFoundError:
            return None
        with os.fdopen(descriptor, "rb") as stream:
            if not stat.S_ISREG(os.fstat(stream.fileno()).st_mode):
                raise UserError(f"{self.path / name} is not a regular file; nothing was written")
            digest = hashlib.sha256()
            for block in iter(lambda: stream.read(1 << 20), b""):
                digest.update(block)
            return digest.hexdigest()

    def read(self, name: str) -> bytes:
        """The regular file `name`, never through a link."""
        descriptor = os.open(name, os.O_RDONLY | os.O_NOFOLLOW, dir_fd=self.descriptor)
        with os.fdopen(descriptor, "rb") as stream:
            return stream.read()

    def write(self, name: str, fill: BinaryIO | bytes) -> None:
        """Create `name` whole, mode 0644: a new file beside it, then a rename over it."""
        partial = f".{name}.{secrets.token_hex(4)}.partial"
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        descriptor = os.open(partial, flags, 0o644, dir_fd=self.descriptor)
        try:
            with os.fdopen(descriptor, "wb") as stream:
                if isinstance(fill, bytes):
                    stream.write(fill)
                else:
                    shutil.copyfileobj(fill, stream, 1 << 20)
                os.fchmod(stream.fileno(), 0o644)
            os.replace(partial, name, src_dir_fd=self.descriptor, dst_dir_fd=self.descriptor)
        except BaseException as exc:
            os.unlink(partial, dir_fd=self.descriptor)
            if isinstance(exc, OSError):
                raise UserError(
                    f"cannot write {self.path / name}: {exc.strerror}; nothing of it was left"
                ) from None
            raise

    def close(self) -> None:
        os.close(self.descriptor)


@contextmanager
def _opened(path: Path) -> Iterator[_Directory]:
    path.mkdir(parents=True, exist_ok=True)
    try:
        descriptor = os.open(path, _NO_FOLLOW_DIRECTORY)
    except OSError as exc:
        raise UserError(f"--static {path}: {exc.strerror}; name a directory") from None
    os.fchmod(descriptor, 0o755)
    directory = _Directory(descriptor, path)
    try:
        yield directory
    finally:
        directory.close()


def links_in(tree: Path) -> list[Path]:
    """Every symbolic link at or below `tree` (none is followed to find them)."""
    if tree.is_symlink():
        return [tree]
    found = []
    for directory, subdirectories, files in os.walk(tree, followlinks=False):
        for name in [*subdirectories, *files]:
            if (Path(directory) / name).is_symlink():
                found.append(Path(directory) / name)
    return sorted(found)


def _check_tree(destination: Path) -> None:
    """Refuse a destination that is not ours to add to, before anything is written."""
    if destination.is_symlink():
        raise UserError(
            f"--static {destination} is a symbolic link; name the directory itself. "
            "Nothing was written."
        )
    if destination.exists() and not destination.is_dir():
        raise UserError(f"--static {destination} is a file; name a directory")
    if not destination.exists():
        return
    links = links_in(destination)
    if links:
        shown = "\n  ".join(str(link) for link in links[:10])
        raise UserError(
            f"{destination} holds symbolic links, which a static index never has and this "
            f"tool never follows:\n  {shown}\nRemove them (or publish to another directory); "
            "nothing was written."
        )
    entries = {path.name for path in destination.iterdir()}
    if entries and not {"packages", "simple"} <= entries:
        raise UserError(
            f"{destination} is neither empty nor a static index (packages/ + simple/); "
            "choose another directory"
        )


def _page(title: str, body: str) -> str:
    return (
        f'<!DOCTYPE html>\n<html><head><meta name="pypi:repository-version" '
        f'content="1.0"><title>{html.escape(title)}</title></head>\n<body>\n{body}'
        "</body></html>\n"
    )


def _lock_directory_name(wheelhouse: Path) -> str:
    """locks/<16 hex>: a digest of the wheelhouse's requirements.txt, so that two builds
    never share a lock directory and the same build always finds its own."""
    digest = hashlib.sha256((wheelhouse / "requirements.txt").read_bytes()).hexdigest()
    return digest[:16]


def write_tree(wheelhouse: Path, destination: Path, files: list[StaticFile]) -> Path:
    """Add `files`, the envelopes of the wheelhouse's wheels among them and its lock files
    to the PEP 503 tree at `destination`, creating it or merging into it; return the lock
    directory a node reads.

    Files already there stay: other projects, and our earlier versions. A file of the same
    name with other content is refused before anything is written, as an index would. The
    pages of the projects we add to are regenerated from packages/; the others are kept.
    """
    _check_tree(destination)
    published = {file.name for file in files}
    envelopes = [
        path
        for path in sorted(wheelhouse.glob(f"*{ENVELOPE_SUFFIX}"))
        if path.name.removesuffix(ENVELOPE_SUFFIX) in published
    ]
    locks = [wheelhouse / name for name in LOCK_FILES if (wheelhouse / name).is_file()]
    lock_dir = _lock_directory_name(wheelhouse)
    with _opened(destination) as root:
        packages, simple = root.subdirectory("packages"), root.subdirectory("simple")
        try:
            _refuse_conflicts(packages, files)
            kept = _refuse_envelope_conflicts(packages, envelopes)
            _refuse_lock_conflicts(destination / LOCKS / lock_dir, locks)
            kept_for_nodes = _envelopes_there(destination / LOCKS / lock_dir, envelopes)
            added = _copy_packages(packages, files)
            for envelope in envelopes:
                if envelope.name not in kept:
                    packages.write(envelope.name, envelope.read_bytes())
            _read_back(packages, files, envelopes, kept)
            projects = _write_pages(packages, simple, files)
            locks_at = root.subdirectory(LOCKS)
            this_lock = locks_at.subdirectory(lock_dir)
            for lock in locks:
                this_lock.write(lock.name, lock.read_bytes())
            for envelope in envelopes:
                if envelope.name not in kept_for_nodes:
                    this_lock.write(envelope.name, envelope.read_bytes())
            this_lock.close()
            locks_at.close()
        finally:
            packages.close()
            simple.close()
    say(
        f"static index: {destination}/simple/ (added {added} of {len(files)} files, "
        f"{len(files) - added} already there; {projects} projects)"
    )
    say(f"provenance envelopes: {len(envelopes)} beside their wheels in packages/")
    say(
        f"for nodes: {destination}/{LOCKS}/{lock_dir}/ "
        f"({', '.join(lock.name for lock in locks) or 'no lock files'}, "
        f"{len(envelopes)} envelopes)"
    )
    return destination / LOCKS / lock_dir


def _subject(envelope: bytes) -> object:
    """The subject an envelope's statement names (unverified: for telling two envelopes of
    the same wheel apart from two of different wheels)."""
    try:
        return json.loads(base64.b64decode(json.loads(envelope)["payload"]))["subject"]
    except (ValueError, KeyError, TypeError):
        return None


def _refuse_envelope_conflicts(packages: _Directory, envelopes: list[Path]) -> set[str]:
    """The envelopes already there for the same wheel (the same bytes signed by another
    build of them): those are kept; one for other bytes under the same name is refused."""
    kept = set()
    for envelope in envelopes:
        if packages.sha256(envelope.name) in (None, sha256_bytes(envelope.read_bytes())):
            continue
        there = _subject(packages.read(envelope.name))
        if there is None or there != _subject(envelope.read_bytes()):
            raise UserError(
                f"{packages.path / envelope.name} already exists and attests other content "
                "than this wheelhouse's wheel of that name; nothing was written"
            )
        say(f"  {envelope.name}: one for the same wheel is there already (another signing), kept")
        kept.add(envelope.name)
    return kept


def _envelopes_there(directory: Path, envelopes: list[Path]) -> set[str]:
    """As _refuse_envelope_conflicts, for a lock directory (checked before it is opened)."""
    kept = set()
    for envelope in envelopes:
        there = directory / envelope.name
        if there.is_symlink() or not there.exists():
            continue
        if there.read_bytes() == envelope.read_bytes():
            continue
        subject_there = _subject(there.read_bytes())
        if subject_there is not None and subject_there == _subject(envelope.read_bytes()):
            kept.add(envelope.name)
            continue
        raise UserError(
            f"{there} already exists and attests other content than this wheelhouse's wheel "
            "of that name; nothing was written"
        )
    return kept


def _read_back(
    packages: _Directory, files: list[StaticFile], envelopes: list[Path], kept: set[str]
) -> None:
    """Every file as the tree now holds it: each wheel with our sha256, each envelope ours
    (or the one kept for the same wheel)."""
    for file in files:
        if packages.sha256(file.name) != file.sha256:
            raise UserError(f"{packages.path / file.name} does not read back with our sha256")
    for envelope in envelopes:
        if envelope.name in kept:
            continue
        if packages.sha256(envelope.name) != sha256_bytes(envelope.read_bytes()):
            raise UserError(f"{packages.path / envelope.name} does not read back as written")


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _refuse_conflicts(packages: _Directory, files: list[StaticFile]) -> None:
    for file in files:
        existing = packages.sha256(file.name)
        if existing is not None and existing != file.sha256:
            raise UserError(
                f"{packages.path / file.name} already exists with other content:\n"
                f"  index sha256 {existing}\n  ours  sha256 {file.sha256}\n"
                "An index never replaces a file; nothing was written. Bump the version "
                "(a changed series does) or publish to another directory."
            )


def _refuse_lock_conflicts(directory: Path, locks: list[Path]) -> None:
    for lock in locks:
        existing = directory / lock.name
        if existing.is_file() and existing.read_bytes() != lock.read_bytes():
            raise UserError(
                f"{existing} already exists with other content; a lock directory is named "
                "after the build's requirements.txt, so another build wrote it. Nothing was "
                "written."
            )


def _copy_packages(packages: _Directory, files: list[StaticFile]) -> int:
    present = set(packages.names())
    missing = [file for file in files if file.name not in present]
    total = sum(file.source.stat().st_size for file in missing)
    done = 0
    for number, file in enumerate(missing, 1):
        size = file.source.stat().st_size
        say(
            f"copying {file.name} ({number} of {len(missing)}, {size / 1e6:.1f} MB; "
            f"{done / 1e9:.2f} of {total / 1e9:.2f} GB done)"
        )
        with file.source.open("rb") as stream:
            packages.write(file.name, stream)
        done += size
    return len(missing)


def _write_pages(packages: _Directory, simple: _Directory, files: list[StaticFile]) -> int:
    present = packages.names()
    for project in sorted({file.project for file in files}):
        names = [name for name in present if project_of(name) == project]
        links = "".join(
            f'<a href="../../packages/{urllib.parse.quote(name)}#sha256='
            f'{packages.sha256(name)}">{html.escape(name)}</a><br>\n'
            for name in names
        )
        page = simple.subdirectory(project)
        page.write("index.html", _page(project, links).encode())
        page.close()
    projects = [
        name
        for name in simple.names()
        if stat.S_ISDIR(os.stat(name, dir_fd=simple.descriptor, follow_symlinks=False).st_mode)
    ]
    root_links = "".join(f'<a href="{name}/">{name}</a><br>\n' for name in projects)
    simple.write("index.html", _page("Simple index", root_links).encode())
    return len(projects)
