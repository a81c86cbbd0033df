"""Wheels taken from outside (a --base-jit-cache wheel, a shard from another machine),
checked whole before anything of them is written anywhere.

A member name is a relative, normalised POSIX path (no `..`, no `.`, no empty part, no
absolute path, no backslash); no member is a link, a device or anything but a file or a
directory; no name repeats; every member lies where the caller's layout allows; and RECORD
lists every file with its sha256 and size, and nothing else.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import stat
import zipfile
from collections.abc import Callable
from pathlib import Path

from .errors import UserError


def _name_problem(name: str) -> str | None:
    if not name or "\\" in name or "\0" in name:
        return "is not a plain POSIX path"
    if name.startswith("/"):
        return "is an absolute path"
    parts = name.rstrip("/").split("/")
    if any(part in ("", ".", "..") for part in parts):
        return "is not a normalised relative path (it has '..', '.' or an empty part)"
    return None


def _kind_problem(info: zipfile.ZipInfo) -> str | None:
    mode = info.external_attr >> 16
    kind = stat.S_IFMT(mode)
    if kind == stat.S_IFLNK:
        return "is a symbolic link"
    if kind not in (0, stat.S_IFREG, stat.S_IFDIR):
        return "is a device or other special file"
    return None


def _record_hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
    return "sha256=" + digest.decode()


def check_wheel(path: Path, where: Callable[[str], str | None], what: str) -> None:
    """Refuse `path` unless it is a well-formed wheel whose every member `where` admits
    (`where(name)` returns why a name is not allowed there, or None)."""
    try:
        archive = zipfile.ZipFile(path)
    except (OSError, zipfile.BadZipFile) as exc:
        raise UserError(f"{what} {path.name} is not a readable wheel (zip): {exc}") from None
    with archive:
        infos = archive.infolist()
        seen: set[str] = set()
        for info in infos:
            problem = (
                _name_problem(info.filename)
                or _kind_problem(info)
                or ("appears twice" if info.filename in seen else None)
                or (None if info.is_dir() else where(info.filename))
            )
            if problem:
                raise UserError(
                    f"{what} {path.name}: refusing member {info.filename!r}: it {problem}. "
                    "Nothing of it was used; rebuild it, or take it from a source you trust."
                )
            seen.add(info.filename)
        files = {info.filename for info in infos if not info.is_dir()}
        records = [name for name in files if name.endswith(".dist-info/RECORD")]
        if len(records) != 1:
            raise UserError(f"{what} {path.name} has {len(records)} .dist-info/RECORD files")
        (record_name,) = records
        try:
            rows = list(csv.reader(io.StringIO(archive.read(record_name).decode())))
        except (UnicodeDecodeError, csv.Error) as exc:
            raise UserError(f"{what} {path.name}: RECORD is not CSV ({exc})") from None
        listed: dict[str, tuple[str, str]] = {}
        for row in rows:
            if len(row) != 3:
                raise UserError(f"{what} {path.name}: RECORD row {row!r} is not 3 fields")
            listed[row[0]] = (row[1], row[2])
        if set(listed) != files:
            extra = sorted(files - set(listed))
            missing = sorted(set(listed) - files)
            raise UserError(
                f"{what} {path.name}: RECORD does not match its members (not listed: "
                f"{extra[:3]}; listed but absent: {missing[:3]})"
            )
        for name, (digest, size) in listed.items():
            if name == record_name:
                continue
            data = archive.read(name)
            if digest != _record_hash(data) or size != str(len(data)):
                raise UserError(
                    f"{what} {path.name}: {name} does not match its RECORD hash; the wheel was "
                    "changed after it was built"
                )
