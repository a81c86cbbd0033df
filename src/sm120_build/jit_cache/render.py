"""Render module recipes into what FlashInfer's own JIT would compile, with the patched
FlashInfer itself: jit_specs.py runs in a child process with the exported sources first on
PYTHONPATH."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from ..console import step
from ..errors import UserError
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
) -> list[Module]:
    """Ask the patched FlashInfer in `sources` (and, for sglang's own kernels, the patched
    sglang in `sglang`) what each recipe's modules consist of."""
    env = render_environment(os.environ, sources, archs, toolkit, sglang)
    with step(f"rendering {len(recipes)} module recipe(s) with the patched FlashInfer"):
        result = subprocess.run(
            [sys.executable, "-m", "sm120_build.jit_cache.jit_specs"],
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
