"""Build the patched pure-Python wheels, stamp every wheel with its provenance, and
assemble wheelhouse/ atomically with SHA256SUMS and a hash-pinned requirements.txt.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from packaging.utils import parse_wheel_filename

from .cache import sha256_of
from .console import step
from .errors import UserError
from .gitrepo import export_tree
from .layout import PROVENANCE_FILE
from .patches import load_series
from .pins import Artifact, Companion, Upstream

# Zip cannot store times before 1980; this stands in when SOURCE_DATE_EPOCH is unset.
DEFAULT_EPOCH = 315532800  # 1980-01-01T00:00:00Z


def upstream_record(
    root: Path, series_dir: Path, upstream: Upstream, wheel: Artifact | None = None
) -> dict[str, object]:
    """The provenance of what a wheel is built from: the sdist (or, for a wheel-only
    upstream, the upstream wheel it is the patched twin of) and the ordered patches."""
    source = (
        {"sdist": upstream.sdist, "sha256": upstream.sha256}
        if wheel is None
        else {"wheel": wheel.file, "sha256": wheel.sha256, "vendored": upstream.source.file}
    )
    return {
        "upstream": {"project": upstream.project, "version": upstream.version, **source},
        "patches": [
            {"file": str(patch.path.relative_to(root)), "sha256": sha256_of(patch.path)}
            for patch in load_series(series_dir)
        ],
    }


def source_date_epoch() -> int:
    return int(os.environ.get("SOURCE_DATE_EPOCH", DEFAULT_EPOCH))


def pip_wheel_command(project: Path, out_dir: Path, *options: str) -> list[str]:
    """pip wheel in the current environment: the build requirements are already pinned in it."""
    return [
        sys.executable,
        "-m",
        "pip",
        "wheel",
        "--no-build-isolation",
        "--no-deps",
        *options,
        "--wheel-dir",
        str(out_dir),
        str(project),
    ]


def build_python_wheel(
    tree: Path,
    out_dir: Path,
    env_overrides: dict[str, str],
    prepare: Callable[[Path], None] | None = None,
) -> Path:
    """Build a pure-Python wheel from a vendor tree's HEAD, outside any git repository.

    Outside, because setuptools-scm and FlashInfer's build backend both look for an
    enclosing git repo and would take this project's version or commit for their own.
    """
    with tempfile.TemporaryDirectory(prefix=f"{tree.name}-") as scratch:
        stage = Path(scratch) / tree.name
        export_tree(tree, stage)
        if prepare is not None:
            prepare(stage)
        env = dict(
            os.environ,
            SOURCE_DATE_EPOCH=str(source_date_epoch()),
            GIT_CEILING_DIRECTORIES=scratch,
            **env_overrides,
        )
        command = pip_wheel_command(stage, out_dir, "--quiet")
        with step(f"building the {tree.name} wheel"):
            result = subprocess.run(command, env=env, capture_output=True, text=True)
        if result.returncode != 0:
            raise UserError(
                f"building the {tree.name} wheel failed:\n{result.stdout}{result.stderr}"
            )
    wheels = sorted(out_dir.glob("*.whl"))
    if len(wheels) != 1:
        raise UserError(f"expected one wheel from {tree.name}, found {wheels}")
    return wheels[0]


# The NVIDIA driver: on every node that runs these kernels, so never vendored into a wheel
# (as no manylinux policy lists it); a module that calls the driver links it
# (jit_cache/driver_stub.py).
DRIVER_LIBRARY = "libcuda.so.1"


@dataclass(frozen=True)
class PlatformAudit:
    """What auditwheel finds a wheel's binaries need: the platform tag, and the newest
    symbol version they ask of each versioned library (GLIBC_, GLIBCXX_, CXXABI_, GCC_)."""

    tag: str
    versioned_symbols: dict[str, list[str]]


def platform_audit(wheel: Path) -> PlatformAudit:
    """The platform tag auditwheel's policy gives the wheel's binaries: the newest symbol
    versions they use of glibc, libstdc++ (GLIBCXX, CXXABI) and libgcc, and the libraries
    they link, against the manylinux policies auditwheel ships. A wheel that links only
    the NVIDIA driver besides them keeps the tag its symbol versions give."""
    # auditwheel looks only at the files RECORD lists, and a composed wheel (shards merged,
    # a base wheel overlaid, cached modules added) still has its first part's RECORD: it
    # classifies a copy whose RECORD lists every file.
    with tempfile.TemporaryDirectory() as scratch:
        complete = Path(scratch) / wheel.name
        with zipfile.ZipFile(wheel) as source, zipfile.ZipFile(complete, "w") as target:
            files = {i.filename: source.read(i) for i in source.infolist() if not i.is_dir()}
            (record_name,) = [n for n in files if n.endswith(".dist-info/RECORD")]
            files[record_name] = record_bytes(files, record_name)
            for name, data in files.items():
                target.writestr(name, data)
        result = subprocess.run(
            [sys.executable, "-m", "auditwheel", "show", "--json", str(complete)],
            capture_output=True,
            text=True,
        )
    try:
        found = json.loads(result.stdout)
        tag, external = str(found["overall_tag"]), set(found["external_libs"])
        if tag.startswith("linux_") and external == {DRIVER_LIBRARY}:
            tag = str(found["sym_tag"])
        versioned = {str(lib): sorted(v) for lib, v in found["versioned_symbols"].items()}
    except (ValueError, KeyError, TypeError):
        output = (result.stderr or result.stdout)[-2000:]
        raise UserError(f"auditwheel could not classify {wheel.name}:\n{output}") from None
    if result.returncode != 0:
        raise UserError(f"auditwheel could not classify {wheel.name}:\n{result.stderr[-2000:]}")
    return PlatformAudit(tag, versioned)


def manylinux_tag(wheel: Path) -> str:
    return platform_audit(wheel).tag


def _record_hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
    return "sha256=" + digest.decode()


def record_bytes(files: dict[str, bytes], record_name: str) -> bytes:
    """The RECORD of a wheel holding `files` (RECORD itself aside)."""
    # RECORD is CSV: file names with commas or quotes are quoted (sglang ships such files).
    record = io.StringIO()
    writer = csv.writer(record, lineterminator="\n")
    for name, data in sorted(files.items()):
        if name != record_name:
            writer.writerow([name, _record_hash(data), len(data)])
    writer.writerow([record_name, "", ""])
    return record.getvalue().encode()


def _contents_digest(files: dict[str, tuple[bytes, int]], version: str) -> str:
    """sha256 of a wheel's files, its version spelled nowhere in them (names or bytes)."""
    digest = hashlib.sha256()
    for name, (data, mode) in sorted(files.items()):
        if name.endswith(".dist-info/RECORD"):
            continue
        digest.update(name.replace(version, "").encode() + b"\0")
        executable = b"x" if mode & 0o111 else b"-"  # all of a mode the wheel keeps
        digest.update(executable + data.replace(version.encode(), b"") + b"\0")
    return digest.hexdigest()


def _restamp(
    files: dict[str, tuple[bytes, int]], distribution: str, old: str, new: str
) -> dict[str, tuple[bytes, int]]:
    """The files of a wheel of version `old` as version `new`: the .dist-info directory,
    METADATA's Version and a Python file that spells the version (e.g. _build_meta.py)."""
    old_info, new_info = f"{distribution}-{old}.dist-info/", f"{distribution}-{new}.dist-info/"
    restamped: dict[str, tuple[bytes, int]] = {}
    for name, (data, mode) in files.items():
        if name == old_info + "METADATA":
            data = re.sub(rb"^Version: .*$", f"Version: {new}".encode(), data, count=1, flags=re.M)
        elif name.endswith(".py") and not name.startswith(old_info):
            data = data.replace(f'"{old}"'.encode(), f'"{new}"'.encode())
        restamped[name.replace(old_info, new_info, 1)] = (data, mode)
    return restamped


def finalize_wheel(
    wheel: Path,
    out_dir: Path,
    provenance: dict[str, object],
    platform_tag: str | None = None,
    label_contents: bool = False,
) -> Path:
    """Rewrite `wheel` into out_dir: add the provenance file, retag the platform if asked,
    and normalise the archive (sorted entries, fixed times and modes) so equal inputs give
    byte-identical wheels. With `label_contents`, the version's local part ends in
    c<8 hex>, a digest of the contents: wheels that differ (another module set, another
    base wheel) never share a version, which pip would take as already installed and an
    index would refuse to take twice."""
    distribution, version, *_, python_tag, abi_tag, old_platform = wheel.name[:-4].split("-")
    new_platform = platform_tag or old_platform
    with zipfile.ZipFile(wheel) as source:
        files = {
            info.filename: (source.read(info), info.external_attr >> 16)
            for info in source.infolist()
            if not info.is_dir()
        }
    dist_info = f"{distribution}-{version}.dist-info"
    if f"{dist_info}/WHEEL" not in files:
        raise UserError(f"{wheel.name} has no {dist_info}/WHEEL")
    if platform_tag:
        metadata, mode = files[f"{dist_info}/WHEEL"]
        retagged = re.sub(
            rf"^Tag: ({python_tag}-{abi_tag})-.*$",
            rf"Tag: \1-{platform_tag}",
            metadata.decode(),
            flags=re.MULTILINE,
        )
        files[f"{dist_info}/WHEEL"] = (retagged.encode(), mode)
    files[f"{dist_info}/{PROVENANCE_FILE}"] = (
        (json.dumps(provenance, indent=2, sort_keys=True) + "\n").encode(),
        0o644,
    )
    if label_contents:
        separator = "." if "+" in version else "+"
        labelled = f"{version}{separator}c{_contents_digest(files, version)[:8]}"
        files = _restamp(files, distribution, version, labelled)
        version, dist_info = labelled, f"{distribution}-{labelled}.dist-info"
    record_name = f"{dist_info}/RECORD"
    files.pop(record_name, None)
    files[record_name] = (record_bytes({n: d for n, (d, _) in files.items()}, record_name), 0o644)

    # .dist-info last, as the wheel spec recommends; everything else sorted.
    order = sorted(files, key=lambda name: (name.startswith(dist_info + "/"), name))
    stamp = time.gmtime(source_date_epoch())[:6]
    target = out_dir / f"{distribution}-{version}-{python_tag}-{abi_tag}-{new_platform}.whl"
    partial = target.with_suffix(".partial")
    with zipfile.ZipFile(partial, "w") as archive:
        for name in order:
            data, mode = files[name]
            info = zipfile.ZipInfo(name, date_time=stamp)
            info.external_attr = (0o100755 if mode & 0o111 else 0o100644) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(info, data, compresslevel=9)
    os.replace(partial, target)
    return target


def requirement_lines(wheels: list[Path], companions: list[Companion]) -> str:
    """requirements.txt: our wheels and the companions (flashinfer-cubin), hash-pinned."""
    lines = [
        "# Generated by sm120-build. On a node, with DIR this wheelhouse:\n"
        "#   pip install --require-hashes --no-deps --find-links DIR -r DIR/requirements.txt\n"
    ]
    for wheel in sorted(wheels, key=lambda path: path.name):
        name, version, _, _ = parse_wheel_filename(wheel.name)
        lines.append(f"{name}=={version} \\\n    --hash=sha256:{sha256_of(wheel)}\n")
    for companion in companions:
        hashes = " \\\n".join(f"    --hash=sha256:{digest}" for digest in companion.sha256)
        lines.append(f"{companion.name}=={companion.version} \\\n{hashes}\n")
    return "".join(lines)


def assemble_wheelhouse(
    wheels: list[Path],
    companions: list[Companion],
    companion_wheels: list[Path],
    wheelhouse: Path,
    beside: list[Path] | None = None,
) -> None:
    """`wheels` (ours) and the companions' wheels, with SHA256SUMS over all of them and
    requirements.txt pinning ours by their hash and the companions by their pinned ones;
    `beside`: more files to keep with them (the wheels' provenance envelopes).

    Replace wheelhouse/ by renames: a failed build never leaves a partial one, and a
    failure at the swap itself puts the old one back. What a run killed during the swap
    left beside it is removed first (the old one back in place if it is all there is)."""
    for leftover in sorted(wheelhouse.parent.glob(".wheelhouse-old-*")):
        if not wheelhouse.exists() and (leftover / "wheelhouse").is_dir():
            os.rename(leftover / "wheelhouse", wheelhouse)
        shutil.rmtree(leftover)
    for leftover in sorted(wheelhouse.parent.glob(".wheelhouse-new-*")):
        shutil.rmtree(leftover)
    staging = Path(tempfile.mkdtemp(prefix=".wheelhouse-new-", dir=wheelhouse.parent))
    retired: Path | None = None
    try:
        staging.chmod(0o755)  # mkdtemp makes it private; wheelhouse/ is meant to be shared
        for wheel in [*wheels, *companion_wheels, *(beside or [])]:
            shutil.copyfile(wheel, staging / wheel.name)
        (staging / "SHA256SUMS").write_text(
            "".join(f"{sha256_of(path)}  {path.name}\n" for path in sorted(staging.glob("*.whl")))
        )
        ours = [staging / wheel.name for wheel in wheels]
        (staging / "requirements.txt").write_text(requirement_lines(ours, companions))
        if wheelhouse.exists():
            retired = Path(tempfile.mkdtemp(prefix=".wheelhouse-old-", dir=wheelhouse.parent))
            os.rename(wheelhouse, retired / "wheelhouse")
        os.rename(staging, wheelhouse)
    except BaseException:
        if retired is not None and not wheelhouse.exists():
            os.rename(retired / "wheelhouse", wheelhouse)
        shutil.rmtree(staging, ignore_errors=True)
        if retired is not None:
            shutil.rmtree(retired, ignore_errors=True)
        raise
    if retired is not None:
        shutil.rmtree(retired)
