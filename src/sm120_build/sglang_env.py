"""The pinned sglang's own Python environment: a virtual environment in the cache holding
sglang and every dependency it declares, made once through pip's configuration.

Two stages run sglang's code in it, where this tool's own environment cannot: the replay
that derives profiles (derive/), and, from sglang 0.5.11 on, the render of sglang's own
kernels (jit_cache/render.py), whose loader imports the server's utilities and so most of
sglang's dependencies. Wheels of sglang are for one CPython each (cp312 since 0.5.11): the
environment is made with that Python.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from packaging.utils import parse_wheel_filename

from .cache import digest
from .console import step
from .errors import UserError
from .layout import Layout
from .pins import Pins


def interpreter(pins: Pins) -> tuple[str, tuple[int, int]]:
    """The Python the replay runs in, and its version: the one the pinned sglang wheel is
    for (sglang publishes one CPython per wheel since 0.5.11: cp312), found on PATH as
    pythonX.Y; this one for an sdist."""
    sglang = pins.upstream("sglang")
    if not sglang.wheels:
        return sys.executable, (sys.version_info.major, sys.version_info.minor)
    tags = {tag.interpreter for tag in parse_wheel_filename(sglang.source.file)[3]}
    versions = sorted(
        (int(match[1]), int(match[2]))
        for tag in tags
        for match in [re.fullmatch(r"cp(\d)(\d+)", tag)]
        if match
    )
    if not versions:  # a pure-Python wheel (py3): any Python the package admits
        return sys.executable, (sys.version_info.major, sys.version_info.minor)
    major, minor = versions[0]
    found = _runnable_python(major, minor)
    if found is None:
        raise UserError(
            f"the pinned {sglang.source.file} is for CPython {major}.{minor}, and no "
            f"python{major}.{minor} is on PATH: install it (Debian: python{major}.{minor}-venv; "
            "or pyenv), then run again"
        )
    return found, (major, minor)


def _runnable_python(major: int, minor: int) -> str | None:
    """The first pythonMAJOR.MINOR on PATH that runs and is that version (a pyenv shim of a
    version that is not selected is on PATH, and fails)."""
    for directory in os.environ.get("PATH", "").split(os.pathsep):
        candidate = Path(directory or ".") / f"python{major}.{minor}"
        if not os.access(candidate, os.X_OK):
            continue
        probe = subprocess.run(
            [str(candidate), "-c", "import sys; print(*sys.version_info[:2])"],
            capture_output=True,
            text=True,
        )
        if probe.returncode == 0 and probe.stdout.split() == [str(major), str(minor)]:
            return str(candidate)
    return None


def environment(layout: Layout, pins: Pins) -> Path:
    """The Python of a venv in the cache that holds the pinned sglang and its dependencies
    (made once, through pip's configuration), and a libcuda.so.1 beside it."""
    sglang = pins.upstream("sglang")
    base, version = interpreter(pins)
    key = digest("derive", sglang.version, version)[:16]
    entry = layout.cache / "derive-env" / key
    python = entry / "venv" / "bin" / "python"
    if (entry / "complete").is_file():
        return python
    with step(
        f"installing sglang {sglang.version} and its dependencies into {entry} with Python "
        f"{version[0]}.{version[1]} (sglang's own environment; several GB, once)"
    ):
        subprocess.run([base, "-m", "venv", "--clear", str(entry / "venv")], check=True)
        result = subprocess.run(
            [str(python), "-m", "pip", "install", "--quiet", f"sglang=={sglang.version}"],
            stderr=subprocess.PIPE,
            text=True,
        )
        if result.returncode != 0:
            raise UserError(
                f"pip could not install sglang {sglang.version} for the replay:\n"
                f"{result.stderr.strip()[-3000:]}"
            )
        _driver_stub(python, entry / "driver")
    (entry / "complete").write_text("")
    return python


def _driver_stub(python: Path, directory: Path) -> None:
    """libcuda.so.1 for a machine with no NVIDIA driver, as CUDA's own link stubs are: every
    driver entry point the environment's extensions import answers CUDA_ERROR_NO_DEVICE
    (100). It lets sgl_kernel's extension load; nothing here calls the driver."""
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['platlib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    symbols: set[str] = set()
    for library in Path(site).rglob("*.so*"):
        if not library.is_file():
            continue
        needed = subprocess.run(["readelf", "-d", str(library)], capture_output=True, text=True)
        if "libcuda.so.1" not in needed.stdout:
            continue
        undefined = subprocess.run(
            ["nm", "-D", "--undefined-only", str(library)], capture_output=True, text=True
        )
        symbols |= set(re.findall(r"\bU (cu[A-Z]\w*)", undefined.stdout))
    directory.mkdir(parents=True, exist_ok=True)
    source = directory / "stub.c"
    source.write_text(
        "/* No device: every driver call answers CUDA_ERROR_NO_DEVICE. */\n"
        + "".join(f"int {symbol}(void) {{ return 100; }}\n" for symbol in sorted(symbols))
    )
    subprocess.run(
        ["gcc", "-shared", "-fPIC", "-o", str(directory / "libcuda.so.1"), str(source)],
        check=True,
    )
