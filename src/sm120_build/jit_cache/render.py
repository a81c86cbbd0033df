"""Render module recipes into what FlashInfer's own JIT would compile, with the patched
FlashInfer itself: jit_specs.py runs in a child process with the exported sources first on
PYTHONPATH."""

from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from ..console import step
from ..errors import UserError
from ..sglang_kernels import is_sglang_call
from ..toolkit import Toolkit
from .arch import Arch, check_modules_cover_archs

# What the render child takes from the shell: where programs and temporary files are, and
# the locale. Everything else it runs with is set below.
RENDER_ENVIRONMENT = frozenset({"PATH", "HOME", "TMPDIR", "LANG", "LC_ALL", "LC_CTYPE"})


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


def render_environment(
    shell: Mapping[str, str],
    sources: Path,
    archs: list[Arch],
    toolkit: Toolkit,
    sglang: Path | None = None,
) -> dict[str, str]:
    """The render child's environment: of the shell's, only RENDER_ENVIRONMENT. FlashInfer's
    generators read variables of their own (FLASHINFER_*, CUDA_*, SCHEDULING_MODE,
    GENERATE_CU_TRTLLM, NVSHMEM_*, ...), and so does tvm-ffi for sglang's kernels, none of
    them in a cache key: what they see is set here."""
    env = {name: value for name, value in shell.items() if name in RENDER_ENVIRONMENT}
    # sglang's load_jit sets TVM_FFI_CUDA_ARCH_LIST to the GPU's major.minor (utils.py
    # _get_cuda_arch_list): plain sm_XY machine code, which runs on that major's later minors.
    plain = dict.fromkeys(f"{arch.major}.{arch.minor}" for arch in archs)
    env.update(
        # The patched FlashInfer first; this package too, wherever it is imported from.
        PYTHONPATH=os.pathsep.join(
            [str(sources), *([str(sglang)] if sglang else []), str(Path(__file__).parents[2])]
        ),
        TVM_FFI_CUDA_ARCH_LIST=" ".join(plain),
        TVM_FFI_CACHE_DIR=str(sources.parent / "workspace" / "tvm-ffi"),
        TVM_FFI_GPU_BACKEND="cuda",
        FLASHINFER_CUDA_ARCH_LIST=" ".join(str(arch) for arch in archs),
        FLASHINFER_WORKSPACE_BASE=str(sources.parent / "workspace"),
        CUDA_HOME=str(toolkit.home),
        PYTHONHASHSEED="0",  # FlashInfer keeps its arch list in a set: fix the order
    )
    return env


def render_modules(
    sources: Path,
    recipes: dict[str, str],
    archs: list[Arch],
    toolkit: Toolkit,
    sglang: Path | None = None,
    sglang_python: Path | None = None,
) -> list[Module]:
    """Ask the patched FlashInfer in `sources` (and, for sglang's own kernels, the patched
    sglang in `sglang`) what each recipe's modules consist of. From sglang 0.5.11 on, its
    kernels are rendered by sglang's own environment's Python, `sglang_python`."""
    if sglang_python is not None:
        assert sglang is not None
        theirs = {name: call for name, call in recipes.items() if is_sglang_call(call)}
        ours = {name: call for name, call in recipes.items() if name not in theirs}
        modules = render_modules(sources, ours, archs, toolkit) if ours else []
        modules += render_sglang_kernels(sglang_python, sglang, theirs, archs, toolkit, sources)
        check_modules_cover_archs(modules, archs)
        return sorted(modules, key=lambda module: module.name)
    result = _run_child(
        [sys.executable, "-m", "sm120_build.jit_cache.jit_specs"],
        {"recipes": recipes},
        render_environment(os.environ, sources, archs, toolkit, sglang),
        sources.parent,
        f"rendering {len(recipes)} module recipe(s) with the patched FlashInfer",
    )
    if result.returncode != 0:
        last = _last_words(result)
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


def render_sglang_kernels(
    python: Path,
    sglang: Path,
    recipes: dict[str, str],
    archs: list[Arch],
    toolkit: Toolkit,
    sources: Path,
) -> list[Module]:
    """sglang's own kernels (0.5.11 and later), rendered by sglang_specs.py in sglang's own
    environment. Their flags name that environment's tvm-ffi, which must be the release the
    build compiles against: they are rewritten to the build's, whose paths the binaries and
    the cache keys map away."""
    from tvm_ffi import libinfo

    if len(archs) != 1:
        raise UserError(
            f"sglang's kernels are built for one target each, as its loader builds them; "
            f"--arch asks for {' '.join(map(str, archs))}: build one --arch at a time"
        )
    workspace = sources.parent / "workspace"
    # This package alone, not the directory it is installed in: that holds this Python's
    # other packages, which are not for sglang's Python.
    package = workspace / "sm120-build-package"
    package.mkdir(parents=True, exist_ok=True)
    if not (package / "sm120_build").exists():
        (package / "sm120_build").symlink_to(Path(__file__).parents[1], target_is_directory=True)
    env = {name: value for name, value in os.environ.items() if name in RENDER_ENVIRONMENT}
    env.update(
        PYTHONPATH=os.pathsep.join([str(sglang), str(package)]),
        SGLANG_JIT_CACHE_DIR=str(workspace / "sglang-jit-cache"),
        CUDA_HOME=str(toolkit.home),
        PYTHONHASHSEED="0",
    )
    result = _run_child(
        [str(python), str(Path(__file__).with_name("sglang_specs.py"))],
        {"recipes": recipes, "arch": str(archs[0]), "workspace": str(workspace)},
        env,
        sglang.parent,
        f"rendering {len(recipes)} sglang kernel recipe(s) with the patched sglang",
    )
    if result.returncode != 0:
        raise UserError(
            f"sglang could not render its kernels for --arch {archs[0]}: {_last_words(result)}"
        )
    rendered = json.loads(result.stdout)
    theirs = rendered["tvm_ffi"]
    mine = importlib.metadata.version("apache-tvm-ffi")
    if theirs["version"] != mine:
        raise UserError(
            f"sglang's environment has apache-tvm-ffi {theirs['version']}, the build "
            f"{mine}: sglang's kernels would be compiled against other headers than the "
            f"node loads them with. Pin apache-tvm-ffi=={theirs['version']} in pins.toml's "
            "[build] requirements."
        )
    purelib = rendered["purelib"]
    paths = {
        theirs["include"]: libinfo.find_include_path(),
        theirs["dlpack"]: libinfo.find_dlpack_include_path(),
        theirs["lib_dir"]: str(Path(libinfo.find_libtvm_ffi()).parent),
        # CUTLASS from FlashInfer's package: the patched FlashInfer exported for this build,
        # the release the node installs.
        f"{purelib}/flashinfer/": f"{sources}/flashinfer/",
    }

    def ours(values: list[str]) -> list[str]:
        for theirs_path, our_path in sorted(paths.items(), key=lambda item: -len(item[0])):
            values = [value.replace(theirs_path, our_path) for value in values]
        return [_copied(value, purelib, workspace / "sglang-env") for value in values]

    return [
        Module(
            **{
                **module,
                "cuda_flags": ours(module["cuda_flags"]),
                "cxx_flags": ours(module["cxx_flags"]),
                "link_flags": ours(module["link_flags"]),
            }
        )
        for module in rendered["modules"]
    ]


def _copied(flag: str, purelib: str, into: Path) -> str:
    """An include flag that names another package of sglang's environment (DeepGEMM's
    headers, pinned by sglang's own requirements): the directory is copied beside the
    sources, where the build's paths are fixed and mapped away, and the flag names the copy.
    Anything else of that environment would make the build depend on where it lies."""
    if purelib not in flag:
        return flag
    if not flag.startswith(f"-I{purelib}/"):
        raise UserError(
            f"sglang's kernel flag {flag!r} names sglang's environment in a way the build "
            "cannot carry (only include directories are copied)"
        )
    relative = flag[len(f"-I{purelib}/") :]
    if not (into / relative).is_dir():
        shutil.copytree(Path(purelib) / relative, into / relative)
    return f"-I{into / relative}"


def _run_child(
    command: list[str], request: object, env: dict[str, str], cwd: Path, doing: str
) -> subprocess.CompletedProcess[str]:
    """A render child, given its request as JSON on stdin."""
    with step(doing):
        return subprocess.run(
            command, input=json.dumps(request), capture_output=True, text=True, env=env, cwd=cwd
        )


def _last_words(result: subprocess.CompletedProcess[str]) -> str:
    lines = result.stderr.strip().splitlines()
    return lines[-1] if lines else "no output"
