"""Patched wheels of an upstream that publishes only wheels (sglang since 0.5.11).

The vendor tree holds the files of the first pinned wheel, patched. Each pinned wheel (one
per target the operator builds for: a Python, a platform) gives one patched wheel with:

- that wheel's Python, ABI and platform tags (its WHEEL file);
- its binary extensions byte for byte (an ELF file there is taken from it, unchanged);
- every other file from the patched tree, which must have been the same file in that wheel
  as in the vendored one (so that the patches apply to it too), or the build is refused;
- a RECORD written anew, and the version `<upstream>+sm120.p<series>`.
"""

from __future__ import annotations

import io
import re
import zipfile
from pathlib import Path

from packaging.utils import parse_wheel_filename

from .errors import UserError
from .gitrepo import git_bytes
from .tarfiles import tarfile
from .wheels import record_bytes

ELF_MAGIC = b"\x7fELF"


def wheel_files(path: Path) -> dict[str, tuple[bytes, int]]:
    """name -> (bytes, mode) of a wheel's files (directories left out)."""
    with zipfile.ZipFile(path) as archive:
        return {
            info.filename: (archive.read(info), (info.external_attr >> 16) & 0o777)
            for info in archive.infolist()
            if not info.is_dir()
        }


def tree_files(tree: Path) -> dict[str, tuple[bytes, int]]:
    """name -> (bytes, mode) of a vendor tree's HEAD, as committed."""
    archive = git_bytes(tree, "archive", "--format=tar", "HEAD")
    files = {}
    with tarfile().open(fileobj=io.BytesIO(archive)) as tar:
        for member in tar.getmembers():
            if member.isfile():
                stream = tar.extractfile(member)
                assert stream is not None
                files[member.name] = (stream.read(), member.mode & 0o777)
    return files


def platform_of(wheel_name: str) -> str:
    """The platform tag of a wheel file name, e.g. manylinux_2_34_x86_64."""
    return wheel_name[:-4].split("-")[-1]


def _dist_info(files: dict[str, tuple[bytes, int]], what: str) -> str:
    infos = {name.split("/")[0] for name in files if name.split("/")[0].endswith(".dist-info")}
    if len(infos) != 1:
        raise UserError(f"{what} has {len(infos)} .dist-info directories, not one")
    return infos.pop()


def target_files(
    patched: dict[str, tuple[bytes, int]],
    vendored: dict[str, tuple[bytes, int]],
    target: dict[str, tuple[bytes, int]],
    target_name: str,
) -> dict[str, tuple[bytes, int]]:
    """The files of the patched twin of `target`: its binaries and WHEEL, the patched tree's
    other files. `vendored` is the wheel the tree was made from."""
    info = _dist_info(target, target_name)
    result: dict[str, tuple[bytes, int]] = {}
    for name, (data, mode) in target.items():
        if name in (f"{info}/RECORD", f"{info}/WHEEL"):
            continue
        if data.startswith(ELF_MAGIC):
            result[name] = (data, mode)
        elif vendored.get(name, (None, 0))[0] != data:
            raise UserError(
                f"{target_name}: {name} differs from the vendored wheel's and is not a binary "
                "extension, so the patches were not made for it. Vendor this wheel first (list "
                "it first in pins.toml), or build for one target at a time."
            )
    for name, (data, mode) in patched.items():
        pristine = vendored.get(name)
        if pristine is not None and pristine[0].startswith(ELF_MAGIC):
            continue  # the vendored wheel's own binary: the target brings its own
        if name in target or pristine is None:  # kept, or added by a patch
            result[name] = (data, mode)
    result[f"{info}/WHEEL"] = target[f"{info}/WHEEL"]
    return result


def patched_wheel(
    files: dict[str, tuple[bytes, int]], target_name: str, version: str, out_dir: Path
) -> Path:
    """Write `files` (a wheel of the upstream version, patched) as a wheel of `version`,
    tagged as `target_name` is, with a RECORD of its files."""
    parse_wheel_filename(target_name)  # a malformed name is refused before anything is written
    distribution, upstream_version = target_name.split("-")[:2]
    old_info = _dist_info(files, target_name)
    new_info = f"{distribution}-{version}.dist-info"
    renamed: dict[str, bytes] = {}
    modes: dict[str, int] = {}
    for name, (data, mode) in files.items():
        if name == f"{old_info}/RECORD":
            continue
        if name == f"{old_info}/METADATA":
            data = re.sub(
                rb"^Version: .*$", f"Version: {version}".encode(), data, count=1, flags=re.M
            )
        new_name = new_info + name[len(old_info) :] if name.startswith(old_info + "/") else name
        renamed[new_name], modes[new_name] = data, mode
    record_name = f"{new_info}/RECORD"
    renamed[record_name] = record_bytes(renamed, record_name)
    modes[record_name] = 0o644
    suffix = target_name[len(f"{distribution}-{upstream_version}") :]
    target = out_dir / f"{distribution}-{version}{suffix}"
    with zipfile.ZipFile(target, "w") as archive:
        for name in sorted(renamed):
            info = zipfile.ZipInfo(name)
            info.external_attr = (0o100755 if modes[name] & 0o111 else 0o100644) << 16
            archive.writestr(info, renamed[name])
    return target
