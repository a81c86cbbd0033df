"""--base-jit-cache: start the jit-cache wheel from another jit-cache wheel's modules."""

from __future__ import annotations

import re
import zipfile
from pathlib import Path

from packaging.utils import InvalidWheelFilename, parse_wheel_filename
from packaging.version import Version

from ..archives import check_wheel
from ..errors import UserError
from ..layout import JIT_CACHE_PREFIX


def _modules_of(names: list[str]) -> set[str]:
    return {
        n[len(JIT_CACHE_PREFIX) :].split("/")[0] for n in names if n.startswith(JIT_CACHE_PREFIX)
    }


_MODULE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+-]*")


def base_member_problem(name: str) -> str | None:
    """Why a jit-cache wheel may not hold `name` (None: it may): its package and its
    .dist-info, and under jit_cache/ only files inside a module's directory."""
    if name.startswith(JIT_CACHE_PREFIX):
        module, _, rest = name[len(JIT_CACHE_PREFIX) :].partition("/")
        if not rest or not _MODULE_NAME.fullmatch(module):
            return f"lies in {JIT_CACHE_PREFIX} but not inside a module's directory"
        return None
    if name.startswith("flashinfer_jit_cache/"):
        return None
    if re.fullmatch(r"flashinfer_jit_cache-[^/]+\.dist-info/.+", name):  # licenses/ too
        return None
    return "lies outside flashinfer_jit_cache/ and its .dist-info/"


def check_base(base: Path, flashinfer_version: str) -> None:
    """Refuse a --base-jit-cache wheel that is not a well-formed flashinfer-jit-cache wheel
    of this FlashInfer release whose members all lie where a jit-cache wheel keeps them,
    before anything of it is used."""
    try:
        name, version = parse_wheel_filename(base.name)[:2]
    except InvalidWheelFilename as exc:
        raise UserError(f"--base-jit-cache {base.name}: not a wheel ({exc})") from None
    if name != "flashinfer-jit-cache" or version.public != Version(flashinfer_version).public:
        raise UserError(
            f"--base-jit-cache {base.name} is not a flashinfer-jit-cache {flashinfer_version} "
            "wheel: its modules would not match this FlashInfer"
        )
    check_wheel(base, base_member_problem, "--base-jit-cache")


def overlay_base(ours: Path, base: Path, out_dir: Path) -> tuple[Path, list[str]]:
    """Our jit-cache wheel with every module of the `base` jit-cache wheel added that we did
    not build: ours replace same-named ones, the rest are kept. Returns the merged wheel
    (finalize_wheel rewrites its RECORD) and the modules taken from `base`."""
    check_base(base, str(parse_wheel_filename(ours.name)[1].public))
    merged = out_dir / ours.name
    with zipfile.ZipFile(ours) as source, zipfile.ZipFile(base) as extra:
        ours_modules = _modules_of(source.namelist())
        taken = sorted(_modules_of(extra.namelist()) - ours_modules)
        with zipfile.ZipFile(merged, "w") as archive:
            for info in source.infolist():
                archive.writestr(info, source.read(info))
            for info in extra.infolist():
                module = _modules_of([info.filename])
                if module and module <= set(taken) and not info.is_dir():
                    archive.writestr(info, extra.read(info))
    return merged, taken
