"""Compile rendered modules into the flashinfer-jit-cache wheel with scikit-build-core,
CMake and ninja (kernel/CMakeLists.txt).

Everything the build depends on is passed in explicitly, and the flags nvcc really ran with
are read back from CMake's compile_commands.json so the wheel can record them.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
import threading
import time
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from .. import console
from ..console import step
from ..errors import UserError
from ..hosts import CrossCompilers
from ..toolkit import Toolkit
from ..wheels import pip_wheel_command
from .arch import Arch
from .driver_stub import driver_stub
from .render import Module
from .sccache import Launcher


@dataclass(frozen=True)
class KernelBuild:
    wheel: Path
    modules: dict[str, str]  # JIT module name -> the recipe that made it
    compile_commands: list[list[str]]  # compiler argv per translation unit, paths symbolic
    compile_seconds: dict[str, float]  # module -> seconds its translation units took


def host_compilers(cross: CrossCompilers | None = None) -> list[str]:
    """What compiles the host code: CMake's C++ compiler (CXX, else c++) and nvcc's (gcc),
    or for another host the cross compilers (C++ for both, C for the driver stub), by the
    first line of their --version. A cached build is only reused by the same ones."""
    identities = [] if cross is None else [f"host: {cross.host}"]
    programs = (os.environ.get("CXX") or "c++", "gcc") if cross is None else (cross.cxx, cross.cc)
    for program in programs:
        try:
            result = subprocess.run([program, "--version"], capture_output=True, text=True)
        except OSError as exc:
            raise UserError(f"{program}: {exc.strerror}; install a C++ compiler") from None
        lines = result.stdout.splitlines()
        identities.append(f"{program}: {lines[0] if lines else result.stderr.strip()}")
    return identities


def tvm_ffi_library_dir() -> str:
    from tvm_ffi import libinfo

    return str(Path(libinfo.find_libtvm_ffi()).parent)


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


def check_tvm_ffi_headers(wheel: Path) -> None:
    """Refuse a cross-build whose tvm-ffi headers are not those of `wheel`, the same release
    built for the nodes' host: the modules compile against the one and run against the
    other's library."""
    import tvm_ffi

    package = Path(tvm_ffi.__file__).parent
    with zipfile.ZipFile(wheel) as archive:
        shipped = set(archive.namelist())
        for directory in tvm_ffi_include_dirs():
            for header in sorted(Path(directory).rglob("*")):
                if not header.is_file():
                    continue
                name = f"tvm_ffi/{header.relative_to(package).as_posix()}"
                if name not in shipped or archive.read(name) != header.read_bytes():
                    raise UserError(
                        f"{name} of this environment's apache-tvm-ffi is not the one in "
                        f"{wheel.name}: pin the same release in pins.toml's [build] and "
                        "[cross.*]"
                    )


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


# What FlashInfer's JIT links every module with, which CMake does its own way: a shared
# library, and cudart static (see CMakeLists.txt). -lcuda stays, against the driver stub
# (driver_stub.py) and --as-needed: only a module that calls the driver needs libcuda.so.1.
_JIT_LINK_DEFAULTS = ("-shared", "-lcudart")
# tvm-ffi's own JIT (sglang's kernels) also links -ltvm_ffi from its package directory.
# `import tvm_ffi` loads that library with RTLD_GLOBAL before any module loads (tvm_ffi/
# __init__.py), which is how FlashInfer's modules, linked without it, find it; a NEEDED
# entry would name a library no manylinux policy knows, and tag the wheel linux_x86_64.
_TVM_FFI_LIBRARY = "-ltvm_ffi"


def _cmake_quote(word: str) -> str:
    for special in ("\\", '"', "$", ";"):
        word = word.replace(special, "\\" + special)
    return f'"{word}"'


def _split_includes(flags: list[str]) -> tuple[list[str], list[str], list[str]]:
    """(-I dirs, -isystem dirs, other flags), each in order."""
    includes: list[str] = []
    system: list[str] = []
    rest: list[str] = []
    words = iter(flags)
    for word in words:
        if word == "-isystem":
            system.append(next(words))
        elif word.startswith("-I"):
            includes.append(word[2:] or next(words))
        else:
            rest.append(word)
    return includes, system, rest


def modules_cmake(modules: list[Module], toolkit: Toolkit, driver_stubs: Path) -> str:
    """The flashinfer_module() calls of kernel/CMakeLists.txt for `modules`; the driver is
    linked from `driver_stubs` (driver_stub.py), not the toolkit's stubs."""
    stubs = str(toolkit.home / "lib64" / "stubs")
    lines = ["# Rendered by sm120_build from the patched FlashInfer's JIT specs.", ""]
    for module in modules:
        includes, system, cuda_flags = _split_includes(module.cuda_flags)
        cxx_includes, cxx_system, cxx_flags = _split_includes(module.cxx_flags)
        if (cxx_includes, cxx_system) != (includes, system):
            raise UserError(f"{module.name}: FlashInfer gives C++ and CUDA different includes")
        link_dirs, libraries, link_flags = [], [], []
        tvm_ffi_lib = f"-L{tvm_ffi_library_dir()}"
        for flag in module.link_flags:
            if flag in (*_JIT_LINK_DEFAULTS, _TVM_FFI_LIBRARY, tvm_ffi_lib):
                continue
            if flag.startswith("-L"):
                directory = str(driver_stubs) if flag[2:] == stubs else flag[2:]
                if directory not in link_dirs:
                    link_dirs.append(directory)
            elif flag.startswith("-l"):
                if flag[2:] not in libraries:
                    libraries.append(flag[2:])
            else:
                link_flags.append(flag)
        lines.append("flashinfer_module(")
        lines.append(f"  NAME {module.name}")
        for keyword, values in (
            ("CUDA_SOURCES", module.cuda_sources),
            ("CXX_SOURCES", module.cxx_sources),
            ("INCLUDES", includes),
            ("SYSTEM_INCLUDES", system),
            ("CUDA_FLAGS", cuda_flags),
            ("CXX_FLAGS", cxx_flags),
            ("LINK_DIRS", link_dirs),
            ("LIBRARIES", libraries),
            ("LINK_FLAGS", link_flags),
        ):
            if values:
                lines.append(f"  {keyword}")
                lines.extend(f"    {_cmake_quote(value)}" for value in values)
        lines.append(")")
    return "\n".join(lines) + "\n"


# What would change the compiled bytes behind the build's back: compiler and linker flags
# from the shell, nvcc's own environment hooks, another host compiler for nvcc, and CMake's
# and scikit-build-core's settings. None of them is in a cache key, so none reaches the
# compile: a module cached from one shell is the same module in another.
_SCRUBBED = (
    "CFLAGS",
    "CXXFLAGS",
    "CPPFLAGS",
    "CUDAFLAGS",
    "LDFLAGS",
    "CUDAHOSTCXX",
    # The wheel's platform tag (scikit-build-core reads it): set by a cross-build alone.
    "_PYTHON_HOST_PLATFORM",
    "NVCC_APPEND_FLAGS",
    "NVCC_PREPEND_FLAGS",
    "NVCC_CCBIN",
    # What gcc itself reads from the environment (gcc's manual, "Environment Variables"):
    # header and library search paths, and where it finds its own parts.
    "CPATH",
    "C_INCLUDE_PATH",
    "CPLUS_INCLUDE_PATH",
    "OBJC_INCLUDE_PATH",
    "LIBRARY_PATH",
    "GCC_EXEC_PREFIX",
    "COMPILER_PATH",
    "LD_RUN_PATH",
    "DEPENDENCIES_OUTPUT",
    "SUNPRO_DEPENDENCIES",
)
_SCRUBBED_PREFIXES = ("CMAKE_", "SKBUILD_")
# Compile jobs at once: FlashInfer's build budgets 8 GB per nvcc job (the CUTLASS units of
# the fused MoE take that); more jobs than memory allows end in the kernel's OOM killer.
MEMORY_PER_JOB = 8 << 30


def compile_jobs(cpus: int, available: int) -> int:
    return max(1, min(cpus, available // MEMORY_PER_JOB))


def _available_memory() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return MEMORY_PER_JOB  # unknown: one job


def compile_environment(base: Mapping[str, str], toolkit: Toolkit) -> dict[str, str]:
    """The environment the kernel build runs in: `base` without what changes compiled bytes
    unseen (_SCRUBBED), with the toolkit, and as many jobs as cores and memory allow (the
    user's CMAKE_BUILD_PARALLEL_LEVEL, which changes no byte, is kept)."""
    env = {
        name: value
        for name, value in base.items()
        if name not in _SCRUBBED
        and not (name.startswith(_SCRUBBED_PREFIXES) and name != "CMAKE_BUILD_PARALLEL_LEVEL")
    }
    env.update(CUDA_HOME=str(toolkit.home), CUDACXX=str(toolkit.nvcc))
    jobs = compile_jobs(os.cpu_count() or 1, _available_memory())
    env.setdefault("CMAKE_BUILD_PARALLEL_LEVEL", str(jobs))
    return env


def build_jit_cache_wheel(
    *,
    sources: Path,
    modules: list[Module],
    kernel_project: Path,
    archs: list[Arch],
    toolkit: Toolkit,
    version: str,
    scratch: Path,
    out_dir: Path,
    launcher: Launcher | None,
    sglang: Path | None = None,
    cross: CrossCompilers | None = None,
) -> KernelBuild:
    """Build flashinfer-jit-cache `version`, holding `modules` (rendered from `sources`, the
    tree sources_at_fixed_path exported), into out_dir, in a build tree under `scratch`;
    for another host CPU with `cross`'s compilers (and `toolkit` that host's, cross_toolkit)."""
    build_dir = scratch / "build"
    project = scratch / "flashinfer-jit-cache"
    ignore = shutil.ignore_patterns("__pycache__", "_build_meta.py")
    shutil.copytree(kernel_project, project, ignore=ignore)
    (project / "flashinfer_jit_cache" / "_build_meta.py").write_text(f'__version__ = "{version}"\n')
    # Beside the sources, at their fixed path: the linker's search path reaches the .so's
    # build ID, so a stub in a scratch directory of a random name made every build differ.
    stubs = driver_stub(toolkit, sources.parent / "driver-stub", cross.cc if cross else "gcc")
    (project / "modules.cmake").write_text(modules_cmake(modules, toolkit, stubs))
    add_license_texts(sources, project / "licenses")
    workspace = sources.parent / "workspace"
    prefix_maps = [
        f"{sources}=flashinfer",
        f"{workspace}=flashinfer-generated",
        *(f"{d}=tvm_ffi" for d in tvm_ffi_include_dirs()),
        *([f"{sglang}=sglang"] if sglang else []),
    ]
    defines = {
        "MODULES_FILE": str(project / "modules.cmake"),
        "PREFIX_MAPS": ";".join(prefix_maps),
        "CMAKE_CUDA_COMPILER": str(toolkit.nvcc),
        "CMAKE_EXPORT_COMPILE_COMMANDS": "ON",
        **(cross.cmake_defines() if cross else {}),
    }
    # With nothing to compile (every module cached) the project still makes the package.
    if not modules or (launcher is not None and not launcher.start()):
        launcher = None
    if launcher is not None:
        defines["CMAKE_CUDA_COMPILER_LAUNCHER"] = str(launcher.program)
        defines["CMAKE_CXX_COMPILER_LAUNCHER"] = str(launcher.program)
    command = pip_wheel_command(project, out_dir, "--verbose")
    command += ["--config-settings", f"build-dir={build_dir}"]
    for name, value in defines.items():
        command += ["--config-settings", f"cmake.define.{name}={value}"]
    env = compile_environment(os.environ, toolkit)
    if cross is not None:
        env.update(cross.wheel_environment())
    if launcher is not None:
        env.update(launcher.env)
    units = sum(module.units for module in modules)
    doing = (
        f"compiling {len(modules)} module(s), {units} translation units, for "
        f"{', '.join(a.sm for a in archs)} with CUDA {toolkit.full_version}"
        + (f", host code for {cross.host} by {Path(cross.cxx).name}" if cross else "")
        + " (minutes)"
        if modules
        else "making the jit-cache package (no module to compile)"
    )
    log = scratch / "build.log"
    with step(doing):
        try:
            returncode = _run_showing_progress(command, env, log)
        finally:
            if launcher is not None:
                launcher.finish()
    if returncode != 0:
        tail = "".join(log.read_text(encoding="utf-8").splitlines(keepends=True)[-60:])
        raise UserError(
            f"the jit-cache build failed; the end of its output:\n{tail}\n"
            "(--verbose shows all of it as it runs.) Nothing was added to wheelhouse/."
        )
    wheels = sorted(out_dir.glob("flashinfer_jit_cache-*.whl"))
    if len(wheels) != 1:
        raise UserError(f"expected one flashinfer_jit_cache wheel in {out_dir}, found {wheels}")
    return KernelBuild(
        wheel=wheels[0],
        modules={module.name: module.recipe for module in modules},
        compile_commands=_recorded_commands(build_dir, sources, toolkit, sglang) if modules else [],
        compile_seconds=_compile_seconds(build_dir) if modules else {},
    )


_PROGRESS = re.compile(r"^\s*\[\d+/\d+\] ")


HEARTBEAT = 60.0  # seconds of silence before the build says it is still at work


def _run_showing_progress(command: list[str], env: dict[str, str], log: Path) -> int:
    """Run the wheel build, keeping all of its output in `log`: shown whole with --verbose,
    else only ninja's [n/N] progress lines (CMake's compiler detection and the install
    listing are noise unless something fails). ninja prints a unit's line when the unit
    ends, minutes after it began: after HEARTBEAT seconds without a line, the build says
    how long it has been at work."""
    started = time.monotonic()
    last = [started]
    finished = threading.Event()

    def heartbeat() -> None:
        while not finished.wait(HEARTBEAT / 4):
            now = time.monotonic()
            if now - last[0] >= HEARTBEAT:
                console.say(f"still compiling, {now - started:.0f} s so far")
                last[0] = now

    thread = threading.Thread(target=heartbeat, daemon=True)
    thread.start()
    try:
        with (
            log.open("w", encoding="utf-8") as kept,
            # A compiler echoes the source line it complains of, in whatever bytes the source
            # has: undecodable bytes must not end the build's reader (and hide the error).
            subprocess.Popen(
                command,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                encoding="utf-8",
                errors="replace",
            ) as process,
        ):
            assert process.stdout is not None
            for line in process.stdout:
                kept.write(line)
                if console.verbose or _PROGRESS.match(line):
                    print(line, end="", file=sys.stderr, flush=True)
                    last[0] = time.monotonic()
            return process.wait()
    finally:
        finished.set()
        thread.join()


def _compile_seconds(build_dir: Path) -> dict[str, float]:
    """Seconds of compiler time per module (summed over its translation units), from ninja's
    own log: `start_ms end_ms mtime output hash` per step."""
    seconds: dict[str, float] = {}
    for line in (build_dir / ".ninja_log").read_text().splitlines():
        fields = line.split("\t")
        match = re.match(r"CMakeFiles/([^/]+)\.dir/.*\.o$", fields[3]) if len(fields) == 5 else None
        if match:
            elapsed = (int(fields[1]) - int(fields[0])) / 1000
            seconds[match.group(1)] = seconds.get(match.group(1), 0.0) + elapsed
    return seconds


def machine_paths(sources: Path, toolkit: Toolkit, sglang: Path | None) -> dict[str, str]:
    """The paths of this machine and environment a module's flags name, each with the name
    that stands for it in records and keys: the same build in another checkout, cache or
    virtual environment is the same build (its binaries map these paths away)."""
    return {
        str(sources): "$FLASHINFER",
        str(sources.parent / "workspace"): "$FLASHINFER_GENERATED",
        str(toolkit.home): "$CUDA_HOME",
        sysconfig.get_path("include"): "$PYTHON_INCLUDE",
        **{path: "$TVM_FFI" for path in tvm_ffi_include_dirs()},
        **({str(sglang): "$SGLANG"} if sglang else {}),
    }


def portable(module: Module, paths: dict[str, str]) -> Module:
    """`module` with machine_paths() replaced by their names."""

    def named(values: list[str]) -> list[str]:
        return _symbolic(values, paths)

    return dataclasses.replace(
        module,
        cuda_sources=named(module.cuda_sources),
        cxx_sources=named(module.cxx_sources),
        cuda_flags=named(module.cuda_flags),
        cxx_flags=named(module.cxx_flags),
        link_flags=named(module.link_flags),
    )


def _recorded_commands(
    build_dir: Path, sources: Path, toolkit: Toolkit, sglang: Path | None
) -> list[list[str]]:
    """The compiler's command line per translation unit, from compile_commands.json, paths
    symbolic."""
    entries = json.loads((build_dir / "compile_commands.json").read_text())
    replacements = {**machine_paths(sources, toolkit, sglang), str(build_dir): "$BUILD"}
    return [
        _symbolic(shlex.split(entry["command"]), replacements)
        for entry in sorted(entries, key=lambda entry: (entry["file"], entry["output"]))
    ]
