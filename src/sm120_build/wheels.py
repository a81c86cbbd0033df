"""Build the patched pure-Python wheels, stamp every wheel with its provenance, and
assemble wheelhouse/ atomically with SHA256SUMS and a hash-pinned requirements.txt.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import tempfile
import time
import zipfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from packaging.utils import parse_wheel_filename

from .build import pip_wheel_command
from .cache import sha256_of
from .console import step
from .errors import UserError
from .gitrepo import export_tree

PROVENANCE_FILE = "sm120-build.json"
# Zip cannot store times before 1980; this stands in when SOURCE_DATE_EPOCH is unset.
DEFAULT_EPOCH = 315532800  # 1980-01-01T00:00:00Z


def source_date_epoch() -> int:
    return int(os.environ.get("SOURCE_DATE_EPOCH", DEFAULT_EPOCH))


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


def glibc_requirement(binary: Path) -> tuple[int, int]:
    """The newest GLIBC_x.y symbol version the binary needs (2.17 when it needs none newer)."""
    result = subprocess.run(
        ["readelf", "--version-info", "--wide", str(binary)], capture_output=True, text=True
    )
    if result.returncode != 0:
        raise UserError(f"readelf cannot read {binary}: {result.stderr.strip()}")
    needed = [(int(a), int(b)) for a, b in re.findall(r"GLIBC_(\d+)\.(\d+)", result.stdout)]
    return max([(2, 17), *needed])


def manylinux_tag(binary: Path) -> str:
    major, minor = glibc_requirement(binary)
    return f"manylinux_{major}_{minor}_{platform.machine()}"


@contextmanager
def extracted_member(wheel: Path, basename: str) -> Iterator[Path]:
    """The wheel's one member called `basename`, extracted to a temporary file."""
    with zipfile.ZipFile(wheel) as archive:
        names = [n for n in archive.namelist() if n.rsplit("/", 1)[-1] == basename]
        if len(names) != 1:
            raise UserError(f"{wheel.name} holds {len(names)} files named {basename}, not one")
        with tempfile.TemporaryDirectory() as scratch:
            yield Path(archive.extract(names[0], scratch))


def _record_hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
    return "sha256=" + digest.decode()


def finalize_wheel(
    wheel: Path, out_dir: Path, provenance: dict[str, object], platform_tag: str | None = None
) -> Path:
    """Rewrite `wheel` into out_dir: add the provenance file, retag the platform if asked,
    and normalise the archive (sorted entries, fixed times and modes) so equal inputs give
    byte-identical wheels."""
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
    record_name = f"{dist_info}/RECORD"
    files.pop(record_name, None)
    record = "".join(
        f"{name},{_record_hash(data)},{len(data)}\n" for name, (data, _) in sorted(files.items())
    )
    files[record_name] = ((record + f"{record_name},,\n").encode(), 0o644)

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


def assemble_wheelhouse(wheels: list[Path], wheelhouse: Path) -> None:
    """Replace wheelhouse/ in one rename: a failed build never leaves a partial one."""
    staging = Path(tempfile.mkdtemp(prefix=".wheelhouse-new-", dir=wheelhouse.parent))
    try:
        staging.chmod(0o755)  # mkdtemp makes it private; wheelhouse/ is meant to be shared
        sums, requirements = [], []
        for wheel in sorted(wheels, key=lambda path: path.name):
            shutil.copyfile(wheel, staging / wheel.name)
            digest = sha256_of(staging / wheel.name)
            name, version, _, _ = parse_wheel_filename(wheel.name)
            sums.append(f"{digest}  {wheel.name}\n")
            requirements.append(f"{name}=={version} \\\n    --hash=sha256:{digest}\n")
        (staging / "SHA256SUMS").write_text("".join(sums))
        (staging / "requirements.txt").write_text(
            "# Generated by sm120-build: pip install --require-hashes --no-deps -r this file\n"
            + "".join(requirements)
        )
        retired = None
        if wheelhouse.exists():
            retired = Path(tempfile.mkdtemp(prefix=".wheelhouse-old-", dir=wheelhouse.parent))
            wheelhouse.rename(retired / "wheelhouse")
        staging.rename(wheelhouse)
        if retired is not None:
            shutil.rmtree(retired)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
