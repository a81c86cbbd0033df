"""The CUDA toolkit a build compiles with: NVIDIA's pip packages (default) or a system one.

The pip packages install under nvidia/cu13/ with lib/ instead of lib64/. nvcc finds its
own files relative to the physical directory it runs from, so the CUDA_HOME we hand to
CMake is a small shim: a real bin/ and lib64/ holding per-file links into the install.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from .cache import scratch_directory, store_entry, verified_entry
from .console import step
from .errors import UserError


@dataclass(frozen=True)
class Toolkit:
    home: Path
    version: tuple[int, int]  # release major.minor, from nvcc --version
    full_version: str  # e.g. "13.0.88"
    gpu_codes: frozenset[str]  # sm_XY values nvcc can emit, without the a/f suffix

    @property
    def nvcc(self) -> Path:
        return self.home / "bin" / "nvcc"

    @property
    def label(self) -> str:
        return f"cu{self.version[0]}{self.version[1]}"


def _nvcc_output(nvcc: Path, option: str) -> str:
    try:
        result = subprocess.run([nvcc, option], capture_output=True, text=True)
    except OSError as exc:
        raise UserError(f"cannot run {nvcc}: {exc.strerror}; is it an executable nvcc?") from None
    if result.returncode != 0:
        raise UserError(
            f"`{nvcc} {option}` exited with status {result.returncode}:\n"
            f"{(result.stderr or result.stdout).strip()}"
        )
    return result.stdout


def probe(home: Path) -> Toolkit:
    nvcc = home / "bin" / "nvcc"
    if not nvcc.is_file():
        raise UserError(f"{nvcc} does not exist; --cuda-home must name a CUDA toolkit root")
    if not os.access(nvcc, os.X_OK):
        raise UserError(f"{nvcc} is not executable; --cuda-home must name a CUDA toolkit root")
    match = re.search(r"release (\d+)\.(\d+), V([\d.]+)", _nvcc_output(nvcc, "--version"))
    if match is None:
        raise UserError(f"cannot read the CUDA version from `{nvcc} --version`")
    codes = _nvcc_output(nvcc, "--list-gpu-code")
    return Toolkit(
        home=home,
        version=(int(match.group(1)), int(match.group(2))),
        full_version=match.group(3),
        gpu_codes=frozenset(codes.split()),
    )


def _link(link: Path, target: Path) -> None:
    # Relative links keep the cache relocatable.
    link.symlink_to(os.path.relpath(target, link.parent))


def _link_each(source: Path, target: Path) -> None:
    target.mkdir(parents=True)
    for entry in sorted(source.iterdir()):
        _link(target / entry.name, entry)


def _link_unversioned(lib: Path) -> None:
    """The wheels ship only versioned libraries (libnvrtc.so.13); `-lcudart`, `-lnvrtc` need
    the unversioned name a -dev package would add."""
    for library in sorted(lib.glob("lib*.so.*")):
        plain = library.with_name(library.name.split(".so.")[0] + ".so")
        if not plain.exists() and library.name.count(".") == 2:
            plain.symlink_to(library.name)


def _make_shim(cuda_root: Path, shim: Path) -> None:
    _link_each(cuda_root / "bin", shim / "bin")
    _link_each(cuda_root / "lib", shim / "lib64")
    _link_unversioned(shim / "lib64")
    for name in ("include", "nvvm"):
        _link(shim / name, cuda_root / name)


# Bump when _make_shim changes: an installed toolkit keeps the shim it was made with.
_SHIM_LAYOUT = "2"


def pip_toolkit(requirement: str, cache: Path) -> Toolkit:
    """Install `requirement` into the cache once, and return its shimmed CUDA_HOME.

    The entry is checked against its manifest on every reuse; a damaged one is reinstalled.
    """
    key = hashlib.sha256(f"{requirement} shim {_SHIM_LAYOUT}".encode()).hexdigest()[:16]
    entry = cache / "toolkits" / key
    if verified_entry(entry, f"CUDA toolkit {requirement}") is None:
        with (
            step(f"installing {requirement} into {entry} (about 800 MB, once)"),
            scratch_directory(entry.parent, "toolkit") as scratch,
        ):
            site = scratch / "entry" / "site"
            result = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "pip",
                    "install",
                    "--quiet",
                    "--target",
                    str(site),
                    requirement,
                ],
                capture_output=True,
                text=True,
            )
            if result.returncode != 0:
                raise UserError(f"pip could not install {requirement}:\n{result.stderr.strip()}")
            cuda_roots = sorted(site.glob("nvidia/cu*"))
            if len(cuda_roots) != 1:
                raise UserError(f"{requirement} installed no single nvidia/cu*/ tree")
            _make_shim(cuda_roots[0], scratch / "entry" / "home")
            store_entry(scratch / "entry", entry)
    return probe(entry / "home")


def cudart_release(cuda: Toolkit) -> str | None:
    """The nvidia-cuda-runtime release a pip toolkit installed, None for a system toolkit."""
    found = sorted((cuda.home.parent / "site").glob("nvidia_cuda_runtime-*.dist-info"))
    if not found:
        return None
    return found[0].name.removeprefix("nvidia_cuda_runtime-").removesuffix(".dist-info")


def cross_toolkit(cuda: Toolkit, host: str, runtime_wheel: Path) -> Toolkit:
    """The pip toolkit `cuda` as a CUDA_HOME for `host` CPUs: its nvcc, headers and NVVM, with
    lib64/ holding that host's CUDA runtime from `runtime_wheel` (nvidia-cuda-runtime's wheel
    for it). nvcc and CMake take lib64/ under the CUDA_HOME they are run from, so both link
    the host's cudart. Made again at a fixed path beside the toolkit on every call (a second
    or two, under the cache's lock): the path reaches the flags, and links out of a cache
    entry would void its manifest."""
    if cudart_release(cuda) is None:
        raise UserError(
            f"a build for {host} hosts takes its CUDA runtime from pins.toml's hash-pinned "
            f"wheel, which matches only the pinned pip toolkit; {cuda.home} is a system "
            "toolkit. Drop --cuda-home."
        )
    entry = cuda.home.parent
    target = entry.parent / f"{entry.name}-{host}"
    with scratch_directory(entry.parent, f"toolkit-{host}") as scratch:
        # Absolute links: the directory moves from the scratch to its place, and is made
        # again by every build, so it never outlives a move of the cache.
        home = scratch / "cross" / "home"
        (home / "bin").mkdir(parents=True)
        for program in sorted((cuda.home / "bin").iterdir()):
            (home / "bin" / program.name).symlink_to(program.resolve())
        for name in ("include", "nvvm"):
            (home / name).symlink_to((cuda.home / name).resolve())
        lib = home / "lib64"
        lib.mkdir()
        with zipfile.ZipFile(runtime_wheel) as wheel:
            for info in wheel.infolist():
                path = PurePosixPath(info.filename)
                if len(path.parts) == 4 and path.parts[0] == "nvidia" and path.parts[2] == "lib":
                    (lib / path.name).write_bytes(wheel.read(info))
        _link_unversioned(lib)
        if not (lib / "libcudart_static.a").is_file():
            raise UserError(f"{runtime_wheel.name} holds no lib/libcudart_static.a for {host}")
        shutil.rmtree(target, ignore_errors=True)
        (scratch / "cross").rename(target)
    return probe(target / "home")
