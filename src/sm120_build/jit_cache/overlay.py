"""--base-jit-cache: start the jit-cache wheel from another jit-cache wheel's modules."""

from __future__ import annotations

import zipfile
from pathlib import Path

from packaging.utils import InvalidWheelFilename, parse_wheel_filename

from ..errors import UserError
from ..layout import JIT_CACHE_PREFIX


def _modules_of(names: list[str]) -> set[str]:
    return {
        n[len(JIT_CACHE_PREFIX) :].split("/")[0] for n in names if n.startswith(JIT_CACHE_PREFIX)
    }


def overlay_base(ours: Path, base: Path, out_dir: Path) -> tuple[Path, list[str]]:
    """Our jit-cache wheel with every module of the `base` jit-cache wheel added that we did
    not build: ours replace same-named ones, the rest are kept. Returns the merged wheel
    (finalize_wheel rewrites its RECORD) and the modules taken from `base`."""
    ours_name, ours_version = parse_wheel_filename(ours.name)[:2]
    try:
        base_name, base_version = parse_wheel_filename(base.name)[:2]
    except InvalidWheelFilename as exc:
        raise UserError(f"--base-jit-cache {base.name}: not a wheel ({exc})") from None
    if base_name != ours_name or base_version.public != ours_version.public:
        raise UserError(
            f"--base-jit-cache {base.name} is not a flashinfer-jit-cache {ours_version.public} "
            "wheel: its modules would not match this FlashInfer"
        )
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
