"""Compile FlashInfer's trtllm_comm module ahead of time into the flashinfer-jit-cache wheel.

scikit-build-core drives kernel/CMakeLists.txt with CMake and ninja. Everything the build
depends on is passed in explicitly, and the flags nvcc really ran with are read back from
CMake's compile_commands.json so the wheel can record them.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import shlex
import shutil
import stat
import subprocess
import sys
import sysconfig
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

from .cache import exclusive_lock
from .console import step
from .errors import UserError
from .gitrepo import export_tree
from .toolkit import Toolkit

# The translation units of FlashInfer's trtllm_comm JIT module (flashinfer/jit/comm.py).
TRTLLM_COMM_SOURCES = (
    "csrc/trtllm_allreduce.cu",
    "csrc/trtllm_allreduce_fusion.cu",
    "csrc/trtllm_moe_allreduce_fusion.cu",
)
# FlashInfer's JIT flags for trtllm_comm (flashinfer/jit/core.py gen_jit_spec, cpp_ext.py),
# CUDA >= 12.8, non-debug. The flag-parity test compares them with what the JIT renders.
TRTLLM_COMM_DEFINES = (
    "FLASHINFER_ENABLE_F16",
    "FLASHINFER_ENABLE_BF16",
    "FLASHINFER_ENABLE_FP8_E4M3",
    "FLASHINFER_ENABLE_FP8_E5M2",
    "FLASHINFER_ENABLE_FP8_E8M0",
    "FLASHINFER_ENABLE_FP4_E2M1",
    "NDEBUG",
    "Py_LIMITED_API=0x03090000",
    "_GLIBCXX_USE_CXX11_ABI=1",
)
TRTLLM_COMM_CUDA_FLAGS = (
    "-O3",
    "--threads=1",
    "-use_fast_math",
    "--expt-relaxed-constexpr",
    "-static-global-template-stub=false",
)
_ARCH = re.compile(r"^(\d+)\.(\d)([af]?)$")

# nvcc names each translation unit's internal namespace after a hash of the source file's
# real path (_INTERNAL_<hash>_..., seen with CUDA 13.0; --frandom-seed does not change it).
# So sources are compiled from a path that depends only on the build's inputs: the same on
# every machine for the same inputs, different for different inputs. Literally /tmp, not
# $TMPDIR, for that reason.
SOURCE_ROOT = Path("/tmp")


@dataclass(frozen=True, order=True)
class Arch:
    """A target as FLASHINFER_CUDA_ARCH_LIST spells it, e.g. 12.0a."""

    major: int
    minor: int
    suffix: str

    @classmethod
    def parse(cls, text: str) -> Arch:
        match = _ARCH.match(text.strip())
        if match is None:
            raise UserError(
                f"--arch {text!r}: expected MAJOR.MINOR with an optional a/f, e.g. 12.0a or 9.0a"
            )
        return cls(int(match.group(1)), int(match.group(2)), match.group(3))

    def __str__(self) -> str:
        return f"{self.major}.{self.minor}{self.suffix}"

    @property
    def sm(self) -> str:
        return f"sm_{self.major}{self.minor}{self.suffix}"

    @property
    def label(self) -> str:
        return f"sm{self.major}{self.minor}{self.suffix}"

    @property
    def cmake(self) -> str:
        # "-real": machine code only, no PTX, like FlashInfer's code=sm_XYa.
        return f"{self.major}{self.minor}{self.suffix}-real"


def check_archs(archs: list[Arch], toolkit: Toolkit) -> None:
    """Refuse, before compiling, any arch this toolkit cannot build."""
    for arch in archs:
        if arch.major >= 12 and toolkit.version < (12, 8):
            raise UserError(
                f"{arch} needs CUDA 12.8 or newer; {toolkit.home} is CUDA "
                f"{toolkit.full_version}. Use the default toolkit or a newer --cuda-home."
            )
        if f"sm_{arch.major}{arch.minor}" not in toolkit.gpu_codes:
            buildable = " ".join(sorted(toolkit.gpu_codes, key=lambda c: int(c[3:])))
            raise UserError(
                f"CUDA {toolkit.full_version} at {toolkit.home} cannot build {arch} "
                f"(it builds {buildable})."
            )


@dataclass(frozen=True)
class KernelBuild:
    wheel: Path
    compile_commands: list[list[str]]  # nvcc argv per translation unit, paths symbolic


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


def include_dirs(tree: Path, toolkit: Toolkit) -> list[str]:
    """The include path of FlashInfer's JIT build, in its order, for a flashinfer tree."""
    return [
        sysconfig.get_path("include"),
        str(toolkit.home / "include"),
        str(toolkit.home / "include" / "cccl"),
        *tvm_ffi_include_dirs(),
        str(tree / "include"),
        str(tree / "csrc"),
        str(tree / "3rdparty" / "cutlass" / "include"),
        str(tree / "3rdparty" / "cutlass" / "tools" / "util" / "include"),
        str(tree / "3rdparty" / "spdlog" / "include"),
    ]


def tvm_ffi_include_dirs() -> list[str]:
    try:
        from tvm_ffi import libinfo
    except ImportError:
        raise UserError(
            "apache-tvm-ffi is not installed in this environment; run the build through "
            "`nox -s build_wheels`, which installs the pinned build requirements"
        ) from None
    return sorted({libinfo.find_include_path(), libinfo.find_dlpack_include_path()})


def _symbolic(argv: list[str], replacements: dict[str, str]) -> list[str]:
    """Replace machine-specific paths by names, longest first, so records are portable."""
    ordered = sorted(replacements.items(), key=lambda item: -len(item[0]))
    result = []
    for arg in argv:
        for path, name in ordered:
            arg = arg.replace(path, name)
        result.append(arg)
    return result


# License texts of what the .so is compiled from that ship in the sources (kernel/licenses
# holds those that do not: CUTLASS's and spdlog's).
LICENSE_TEXTS = {
    "LICENSE": "FlashInfer-LICENSE.txt",
    "3rdparty/spdlog/include/spdlog/fmt/bundled/fmt.license.rst": "fmt-LICENSE.rst",
}


def add_license_texts(sources: Path, licenses: Path) -> None:
    """Copy the license texts of FlashInfer, fmt and tvm-ffi into the wheel's licenses/."""
    for source, name in LICENSE_TEXTS.items():
        if not (sources / source).is_file():
            raise UserError(f"the flashinfer sources lack {source}, whose text the wheel ships")
        shutil.copyfile(sources / source, licenses / name)
    tvm_ffi = importlib.metadata.distribution("apache-tvm-ffi")
    for file in tvm_ffi.files or []:
        if file.parent.name == "licenses" and file.name in ("LICENSE", "NOTICE"):
            shutil.copyfile(Path(str(file.locate())), licenses / f"tvm-ffi-{file.name}.txt")


def _private_directory(path: Path) -> None:
    """Create `path` mode 0700, or accept it only when it already is ours and private:
    /tmp is shared, and whoever owns the directory owns what gets compiled."""
    with suppress(FileExistsError):
        path.mkdir(mode=0o700)
    info = path.lstat()
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
        raise UserError(
            f"{path} exists but is not a private directory of this user (it must be a real "
            "directory, owned by you, mode 0700). Someone else may have made it: remove it, "
            "or investigate, before building."
        )


@contextmanager
def sources_at_fixed_path(flashinfer_tree: Path, inputs_digest: str) -> Iterator[Path]:
    """The committed flashinfer tree, exported for the build's duration to a private
    directory named after the inputs; builds of the same inputs take turns."""
    directory = SOURCE_ROOT / f"sm120-build-{inputs_digest[:16]}"
    _private_directory(directory)
    sources = directory / "flashinfer"
    with exclusive_lock(directory / "lock", "another build of the same inputs"):
        try:
            if sources.exists():
                shutil.rmtree(sources)
            export_tree(flashinfer_tree, sources)
            yield sources
        finally:
            shutil.rmtree(sources, ignore_errors=True)


def build_jit_cache_wheel(
    *,
    flashinfer_tree: Path,
    kernel_project: Path,
    archs: list[Arch],
    toolkit: Toolkit,
    version: str,
    inputs_digest: str,
    scratch: Path,
    out_dir: Path,
) -> KernelBuild:
    """Build flashinfer-jit-cache `version` into out_dir, in a build tree under `scratch`.

    `flashinfer_tree` must be the committed vendor tree: its HEAD is what gets compiled.
    `inputs_digest` names the private source directory (see SOURCE_ROOT).
    """
    build_dir = scratch / "build"
    with sources_at_fixed_path(flashinfer_tree, inputs_digest) as sources:
        project = scratch / "flashinfer-jit-cache"
        ignore = shutil.ignore_patterns("__pycache__", "_build_meta.py")
        shutil.copytree(kernel_project, project, ignore=ignore)
        (project / "flashinfer_jit_cache" / "_build_meta.py").write_text(
            f'__version__ = "{version}"\n'
        )
        add_license_texts(sources, project / "licenses")
        prefix_maps = [f"{sources}=flashinfer", *(f"{d}=tvm_ffi" for d in tvm_ffi_include_dirs())]
        defines = {
            "FLASHINFER_SOURCE_DIR": str(sources),
            "CMAKE_CUDA_ARCHITECTURES": ";".join(arch.cmake for arch in archs),
            "CMAKE_CUDA_COMPILER": str(toolkit.nvcc),
            "TRTLLM_COMM_DEFINES": ";".join(TRTLLM_COMM_DEFINES),
            "TRTLLM_COMM_CUDA_FLAGS": ";".join(TRTLLM_COMM_CUDA_FLAGS),
            "TRTLLM_COMM_INCLUDE_DIRS": ";".join(include_dirs(sources, toolkit)),
            "TRTLLM_COMM_PREFIX_MAPS": ";".join(prefix_maps),
            "CMAKE_EXPORT_COMPILE_COMMANDS": "ON",
        }
        command = pip_wheel_command(project, out_dir, "--verbose")
        command += ["--config-settings", f"build-dir={build_dir}"]
        for name, value in defines.items():
            command += ["--config-settings", f"cmake.define.{name}={value}"]
        env = dict(os.environ, CUDA_HOME=str(toolkit.home), CUDACXX=str(toolkit.nvcc))
        env.setdefault("CMAKE_BUILD_PARALLEL_LEVEL", str(os.cpu_count() or 1))
        with step(
            f"compiling trtllm_comm for {', '.join(a.sm for a in archs)} "
            f"with CUDA {toolkit.full_version} (minutes)"
        ):
            result = subprocess.run(command, env=env)
        if result.returncode != 0:
            raise UserError(
                "the trtllm_comm build failed (its output is above). Nothing was added to "
                "wheelhouse/."
            )
    wheels = sorted(out_dir.glob("flashinfer_jit_cache-*.whl"))
    if len(wheels) != 1:
        raise UserError(f"expected one flashinfer_jit_cache wheel in {out_dir}, found {wheels}")
    return KernelBuild(
        wheel=wheels[0], compile_commands=_recorded_commands(build_dir, sources, toolkit)
    )


def _recorded_commands(build_dir: Path, sources: Path, toolkit: Toolkit) -> list[list[str]]:
    """nvcc's command line per translation unit, from compile_commands.json, paths symbolic."""
    entries = json.loads((build_dir / "compile_commands.json").read_text())
    replacements = {
        str(sources): "$FLASHINFER",
        str(toolkit.home): "$CUDA_HOME",
        sysconfig.get_path("include"): "$PYTHON_INCLUDE",
        str(build_dir): "$BUILD",
        **{path: "$TVM_FFI" for path in tvm_ffi_include_dirs()},
    }
    return [
        _symbolic(shlex.split(entry["command"]), replacements)
        for entry in sorted(entries, key=lambda entry: entry["file"])
    ]
