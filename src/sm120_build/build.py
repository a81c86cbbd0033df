"""Compile FlashInfer JIT modules ahead of time into the flashinfer-jit-cache wheel.

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
import socket
import stat
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

from .cache import exclusive_lock
from .console import say, step
from .errors import UserError
from .gitrepo import export_tree
from .toolkit import Toolkit

# The default targets: see README ("Which arch") for the measurement behind the choice.
DEFAULT_ARCHS = ["12.0f"]
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
    def gencode(self) -> str:
        """As FlashInfer's CompilationContext writes it: machine code only, no PTX."""
        code = f"{self.major}{self.minor}{self.suffix}"
        return f"-gencode=arch=compute_{code},code=sm_{code}"


def check_archs(archs: list[Arch], toolkit: Toolkit) -> None:
    """Refuse, before compiling, any arch this toolkit cannot build or FP4 cannot use."""
    for arch in archs:
        if arch.major == 12 and not arch.suffix:
            raise UserError(
                f"--arch {arch}: plain sm_{arch.major}{arch.minor} lacks the FP4 instructions "
                f"FlashInfer's SM12x kernels use (ptxas rejects them); use {arch}a or {arch}f"
            )
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
        # nvcc knows which a/f variants exist; --dryrun asks it without compiling.
        with tempfile.TemporaryDirectory() as scratch:
            empty = Path(scratch) / "empty.cu"
            empty.write_text("")
            result = subprocess.run(
                [str(toolkit.nvcc), "--dryrun", "-c", str(empty), "-o", os.devnull, arch.gencode],
                capture_output=True,
                text=True,
            )
        if result.returncode != 0:
            message = result.stderr.strip().splitlines()[-1] if result.stderr.strip() else ""
            raise UserError(
                f"--arch {arch}: CUDA {toolkit.full_version}'s nvcc rejects it: {message}"
            )


def check_modules_cover_archs(modules: list[Module], archs: list[Arch]) -> None:
    """Refuse a build in which FlashInfer filtered a requested arch out of a module: the
    module would ship without code for it. A module that names its own arch (fp4_quantization_121
    is sm_121a whatever the list) is FlashInfer's choice, and is kept as it is, unless no
    requested major runs it (aot.py's FA3 attention-sink variants are sm_90a whatever the list:
    dead weight in a 12.0f wheel)."""
    requested = {arch.gencode for arch in archs}
    requested_majors = {arch.major for arch in archs}
    for module in modules:
        gencodes = set(module.gencodes)
        majors = {int(re.search(r"compute_(\d+?)(\d)[af]?,", g).group(1)) for g in gencodes}  # type: ignore[union-attr]
        if not gencodes <= requested:
            if not majors & requested_majors:
                raise UserError(
                    f"FlashInfer builds {module.name} only for {', '.join(sorted(gencodes))}, "
                    f"which none of --arch {' '.join(str(a) for a in archs)} runs. Drop the "
                    "module, or add its arch."
                )
            continue  # the module picks its own arch
        dropped = [a for a in archs if a.gencode not in gencodes and a.major not in majors]
        if dropped:
            raise UserError(
                f"FlashInfer builds {module.name} only for "
                f"{', '.join(sorted(gencodes))}; it filters out "
                f"{', '.join(str(a) for a in dropped)}. Drop that --arch, or the module."
            )


@dataclass(frozen=True)
class Launcher:
    """sccache, put in front of nvcc and c++ (CMake's *_COMPILER_LAUNCHER)."""

    program: Path
    env: dict[str, str]
    own_server: bool  # started for this build: report its counts and stop it afterwards

    def _environment(self) -> dict[str, str]:
        return dict(os.environ, **self.env)

    def _run(self, *args: str, timeout: float | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(self.program), *args],
            capture_output=True,
            text=True,
            env=self._environment(),
            timeout=timeout,
        )

    def _server_answers(self) -> bool:
        # Bounded: a client whose port some other program holds waits for it forever.
        try:
            return self._run("--show-stats", timeout=5).returncode == 0
        except subprocess.TimeoutExpired:
            return False

    def start(self) -> bool:
        """Start the server before ninja does. Left to the first compiles, each of the
        parallel clients spawns one and they race for the port (sccache issues #340 and
        #1153): now and then a compile fails with "Connection to server timed out". A
        server already running (another build's on the same settings, or one a killed
        build left) serves this build too. False, said, if none answers: the build then
        compiles without the cache rather than fail or hang."""
        for attempt in range(3):
            started = self._run("--start-server")
            if started.returncode == 0 or self._server_answers():
                return True
            time.sleep(1 + attempt)
        # The user's own SCCACHE_SERVER_PORT when sccache is theirs; 4226 is sccache's default.
        port = self._environment().get("SCCACHE_SERVER_PORT", "4226")
        say(
            f"sccache's server would not start on port {port} ({started.stderr.strip()}); "
            "compiling without the compiler cache"
        )
        return False

    def finish(self) -> None:
        if not self.own_server:
            return
        stats = self._run("--show-stats", "--stats-format", "json")
        with suppress(ValueError, KeyError):
            counts = json.loads(stats.stdout)["stats"]
            hits = sum(counts["cache_hits"]["counts"].values())
            misses = sum(counts["cache_misses"]["counts"].values())
            say(f"sccache: {hits} hits, {misses} misses ({self.env['SCCACHE_DIR']})")
        self._run("--stop-server")
        # --stop-server returns before the server has let go of its port; the next build's
        # start would find it there, then lose it.
        port = int(self.env["SCCACHE_SERVER_PORT"])
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
            except OSError:
                return
            time.sleep(0.1)


@dataclass(frozen=True)
class KernelBuild:
    wheel: Path
    modules: dict[str, str]  # JIT module name -> the recipe that made it
    compile_commands: list[list[str]]  # compiler argv per translation unit, paths symbolic
    compile_seconds: dict[str, float]  # module -> seconds its translation units took


def host_compilers() -> list[str]:
    """What compiles the host code: CMake's C++ compiler (CXX, else c++) and nvcc's (gcc),
    by the first line of their --version. A cached build is only reused by the same ones."""
    identities = []
    for program in (os.environ.get("CXX") or "c++", "gcc"):
        try:
            result = subprocess.run([program, "--version"], capture_output=True, text=True)
        except OSError as exc:
            raise UserError(f"{program}: {exc.strerror}; install a C++ compiler") from None
        lines = result.stdout.splitlines()
        identities.append(f"{program}: {lines[0] if lines else result.stderr.strip()}")
    return identities


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


# FlashInfer's JIT finds its headers and sources under flashinfer/data/, which its build
# backend links to the top-level directories (build_backend.py _create_data_dir).
_DATA_LINKS = {
    "cutlass": "3rdparty/cutlass",
    "spdlog": "3rdparty/spdlog",
    "csrc": "csrc",
    "include": "include",
}


@contextmanager
def sources_at_fixed_path(flashinfer_tree: Path, inputs_digest: str) -> Iterator[Path]:
    """The committed flashinfer tree, exported for the build's duration to a private
    directory named after the inputs; builds of the same inputs take turns. FlashInfer's
    generated sources are written beside it (workspace/), at a path as fixed as the tree's."""
    directory = SOURCE_ROOT / f"sm120-build-{inputs_digest[:16]}"
    _private_directory(directory)
    sources = directory / "flashinfer"
    workspace = directory / "workspace"
    with exclusive_lock(directory / "lock", "another build of the same inputs"):
        try:
            for leftover in (sources, workspace):
                if leftover.exists():
                    shutil.rmtree(leftover)
            export_tree(flashinfer_tree, sources)
            data = sources / "flashinfer" / "data"
            data.mkdir()
            for name, target in _DATA_LINKS.items():
                (data / name).symlink_to(Path("..", "..", target), target_is_directory=True)
            yield sources
        finally:
            shutil.rmtree(sources, ignore_errors=True)
            shutil.rmtree(workspace, ignore_errors=True)


@dataclass(frozen=True)
class Module:
    """One FlashInfer JIT module as FlashInfer's own JIT would build it (jit_specs.py)."""

    name: str
    recipe: str
    cuda_sources: list[str]
    cxx_sources: list[str]
    cuda_flags: list[str]
    cxx_flags: list[str]
    link_flags: list[str]
    device_link: bool

    @property
    def units(self) -> int:
        """Translation units: what the module costs to compile, roughly."""
        return len(self.cuda_sources) + len(self.cxx_sources)

    @property
    def gencodes(self) -> list[str]:
        return [flag for flag in self.cuda_flags if flag.startswith("-gencode=")]


def render_modules(
    sources: Path, recipes: dict[str, str], archs: list[Arch], toolkit: Toolkit
) -> list[Module]:
    """Ask the patched FlashInfer in `sources` what each recipe's modules consist of."""
    env = {
        name: value
        for name, value in os.environ.items()
        # FlashInfer adds these to every module; a build must not depend on the shell's.
        if not name.startswith(("FLASHINFER_", "CUDA_"))
        and name not in ("CC", "CXX", "PYTHONPATH", "MAX_JOBS")
    }
    env.update(
        # The patched FlashInfer first; this package too, wherever it is imported from.
        PYTHONPATH=os.pathsep.join([str(sources), str(Path(__file__).parent.parent)]),
        FLASHINFER_CUDA_ARCH_LIST=" ".join(str(arch) for arch in archs),
        FLASHINFER_WORKSPACE_BASE=str(sources.parent / "workspace"),
        CUDA_HOME=str(toolkit.home),
        PYTHONHASHSEED="0",  # FlashInfer keeps its arch list in a set: fix the order
    )
    with step(f"rendering {len(recipes)} module recipe(s) with the patched FlashInfer"):
        result = subprocess.run(
            [sys.executable, "-m", "sm120_build.jit_specs"],
            input=json.dumps({"recipes": recipes}),
            capture_output=True,
            text=True,
            env=env,
            cwd=sources.parent,
        )
    if result.returncode != 0:
        lines = result.stderr.strip().splitlines()
        last = lines[-1] if lines else "no output"
        hint = (
            "; run through `nox -s build_wheels`, which installs pins.toml's [render] requirements"
            if last.startswith("ModuleNotFoundError")
            else ""
        )
        raise UserError(
            f"FlashInfer could not render the modules for --arch "
            f"{' '.join(str(a) for a in archs)}: {last}{hint}"
        )
    modules = [Module(**module) for module in json.loads(result.stdout)]
    for module in modules:
        if module.device_link:
            raise UserError(
                f"{module.name} needs nvcc device linking, which this build does not do yet"
            )
    check_modules_cover_archs(modules, archs)
    return modules


# What FlashInfer's JIT links every module with, which CMake does its own way: a shared
# library, cudart static (see CMakeLists.txt), and no libcuda (no module calls the driver
# API directly; verify.py checks the .so files' undefined symbols).
_JIT_LINK_DEFAULTS = ("-shared", "-lcudart", "-lcuda")


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


def modules_cmake(modules: list[Module], toolkit: Toolkit) -> str:
    """The flashinfer_module() calls of kernel/CMakeLists.txt for `modules`."""
    stubs = str(toolkit.home / "lib64" / "stubs")
    lines = ["# Rendered by sm120_build from the patched FlashInfer's JIT specs.", ""]
    for module in modules:
        includes, system, cuda_flags = _split_includes(module.cuda_flags)
        cxx_includes, cxx_system, cxx_flags = _split_includes(module.cxx_flags)
        if (cxx_includes, cxx_system) != (includes, system):
            raise UserError(f"{module.name}: FlashInfer gives C++ and CUDA different includes")
        link_dirs, libraries, link_flags = [], [], []
        for flag in module.link_flags:
            if flag in _JIT_LINK_DEFAULTS:
                continue
            if flag.startswith("-L"):
                if flag[2:] != stubs:
                    link_dirs.append(flag[2:])
            elif flag.startswith("-l"):
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
) -> KernelBuild:
    """Build flashinfer-jit-cache `version`, holding `modules` (rendered from `sources`, the
    tree sources_at_fixed_path exported), into out_dir, in a build tree under `scratch`."""
    build_dir = scratch / "build"
    project = scratch / "flashinfer-jit-cache"
    ignore = shutil.ignore_patterns("__pycache__", "_build_meta.py")
    shutil.copytree(kernel_project, project, ignore=ignore)
    (project / "flashinfer_jit_cache" / "_build_meta.py").write_text(f'__version__ = "{version}"\n')
    (project / "modules.cmake").write_text(modules_cmake(modules, toolkit))
    add_license_texts(sources, project / "licenses")
    workspace = sources.parent / "workspace"
    prefix_maps = [
        f"{sources}=flashinfer",
        f"{workspace}=flashinfer-generated",
        *(f"{d}=tvm_ffi" for d in tvm_ffi_include_dirs()),
    ]
    defines = {
        "MODULES_FILE": str(project / "modules.cmake"),
        "PREFIX_MAPS": ";".join(prefix_maps),
        "CMAKE_CUDA_COMPILER": str(toolkit.nvcc),
        "CMAKE_EXPORT_COMPILE_COMMANDS": "ON",
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
    env = dict(os.environ, CUDA_HOME=str(toolkit.home), CUDACXX=str(toolkit.nvcc))
    env.setdefault("CMAKE_BUILD_PARALLEL_LEVEL", str(os.cpu_count() or 1))
    if launcher is not None:
        env.update(launcher.env)
    units = sum(module.units for module in modules)
    doing = (
        f"compiling {len(modules)} module(s), {units} translation units, for "
        f"{', '.join(a.sm for a in archs)} with CUDA {toolkit.full_version} (minutes)"
        if modules
        else "making the jit-cache package (no module to compile)"
    )
    with step(doing):
        try:
            result = subprocess.run(command, env=env)
        finally:
            if launcher is not None:
                launcher.finish()
    if result.returncode != 0:
        raise UserError(
            "the jit-cache build failed (its output is above). Nothing was added to wheelhouse/."
        )
    wheels = sorted(out_dir.glob("flashinfer_jit_cache-*.whl"))
    if len(wheels) != 1:
        raise UserError(f"expected one flashinfer_jit_cache wheel in {out_dir}, found {wheels}")
    return KernelBuild(
        wheel=wheels[0],
        modules={module.name: module.recipe for module in modules},
        compile_commands=_recorded_commands(build_dir, sources, toolkit) if modules else [],
        compile_seconds=_compile_seconds(build_dir) if modules else {},
    )


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


def _recorded_commands(build_dir: Path, sources: Path, toolkit: Toolkit) -> list[list[str]]:
    """The compiler's command line per translation unit, from compile_commands.json, paths
    symbolic."""
    entries = json.loads((build_dir / "compile_commands.json").read_text())
    replacements = {
        str(sources): "$FLASHINFER",
        str(sources.parent / "workspace"): "$FLASHINFER_GENERATED",
        str(toolkit.home): "$CUDA_HOME",
        sysconfig.get_path("include"): "$PYTHON_INCLUDE",
        str(build_dir): "$BUILD",
        **{path: "$TVM_FFI" for path in tvm_ffi_include_dirs()},
    }
    return [
        _symbolic(shlex.split(entry["command"]), replacements)
        for entry in sorted(entries, key=lambda entry: (entry["file"], entry["output"]))
    ]
