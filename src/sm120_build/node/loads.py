"""Loading each module of a profile as the serving path does, with every JIT switched off:
FlashInfer's modules through its own generators (FLASHINFER_DISABLE_JIT=1), sglang's own
kernels through sglang's load_jit (SGLANG_DISABLE_JIT=1, no nvcc on PATH, an empty tvm-ffi
cache). Each outcome is a result row, each failure a problem naming the module."""

from __future__ import annotations

import ctypes
import importlib
import logging
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from .. import sglang_kernels
from ..profiles import specs_of

JIT_CACHE = "flashinfer-jit-cache"
# The NVIDIA driver, which a module that calls the driver API links (pcie_ipc_comm).
DRIVER = "libcuda.so.1"


def driver_present() -> bool:
    try:
        ctypes.CDLL(DRIVER)
    except OSError:
        return False
    return True


class _Recorded(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@contextmanager
def flashinfer_warnings() -> Iterator[list[str]]:
    """The warnings FlashInfer logs meanwhile: its JIT logger is a logger of its own
    (flashinfer/jit/core.py), beside the one logging.getLogger("flashinfer.jit") gives."""
    recorded = _Recorded()
    loggers = [logging.getLogger("flashinfer.jit")]
    core = sys.modules.get("flashinfer.jit.core")
    if isinstance(getattr(core, "logger", None), logging.Logger):
        loggers.append(core.logger)  # type: ignore[union-attr]
    for logger in loggers:
        logger.addHandler(recorded)
    try:
        yield recorded.messages
    finally:
        for logger in loggers:
            logger.removeHandler(recorded)


class FlashInferRefused(Exception):
    """`import flashinfer` raised: no module of it can load."""


def provider_problems() -> list[str]:
    """FlashInfer 0.7 takes prebuilt modules only from providers it accepts, and falls back
    to JIT-compiling with no more than a warning in the log when it ignores one (a version
    mismatch) or when no provider's archs cover the GPU. Each such case is a problem here,
    named. FlashInfer 0.6 has no providers: nothing to say (its modules are checked one by
    one). Call after FLASHINFER_CUDA_ARCH_LIST is set: FlashInfer reads the target from it
    when it is first imported. Raises FlashInferRefused when importing FlashInfer raises."""
    with flashinfer_warnings() as warnings:
        try:
            env = importlib.import_module("flashinfer.jit.env")
        except ModuleNotFoundError:
            return []  # no FlashInfer here: each module says so
        except Exception as exc:  # FlashInfer refuses to start (patch 0007's series check)
            raise FlashInferRefused(str(exc)) from exc
    providers = getattr(env, "FLASHINFER_AOT_PROVIDERS", None)
    if providers is None:
        return []
    problems = [
        f"FlashInfer ignored a prebuilt-kernel package and would JIT-compile instead: {message}"
        for message in warnings
        if message.startswith("Ignoring incompatible")
    ]
    ours = [provider for provider in providers if provider.distribution == JIT_CACHE]
    if not ours and not problems:
        problems.append(
            f"FlashInfer accepted no provider from {JIT_CACHE}: every module would be JIT-compiled"
        )
    targets = sorted(env._target_cuda_architectures())
    for provider in ours:
        uncovered = [
            target
            for target in targets
            if env._provider_target_compatibility_score(provider.cuda_architectures, target) is None
        ]
        if uncovered:
            archs = ", ".join(sorted(provider.cuda_architectures)) or "none"
            problems.append(
                f"{provider.distribution} {provider.version} provides code for {archs}, which "
                f"FlashInfer does not run on {', '.join(uncovered)}: every module would be "
                "JIT-compiled"
            )
    return problems


def check_sglang_kernel(
    recipe: str, call: str, arch: tuple[int, int]
) -> tuple[dict[str, Any], list[str]]:
    """Load one of sglang's own JIT kernels as the serving path does (its loader, through
    the installed sglang's load_jit) with every way to compile shut: no nvcc on PATH, an
    empty compile cache (tvm-ffi's up to 0.5.10, sglang's own from 0.5.11) and each
    release's switch (SGLANG_DISABLE_JIT of patch 0003 on 0.5.9, sglang's own
    SGLANG_CRASH_ON_JIT_COMPILE): it loads from the jit-cache wheel, or the check names it."""
    result: dict[str, Any] = {"module": recipe, "recipe": recipe, "aot": False, "loaded": False}
    with tempfile.TemporaryDirectory(prefix="jit-cache-") as empty:
        names = ("PATH", "TVM_FFI_CACHE_DIR", "SGLANG_JIT_CACHE_DIR", "CUDA_HOME", "CUDA_PATH")
        saved = {name: os.environ.get(name) for name in names}
        os.environ.update(
            SGLANG_DISABLE_JIT="1",
            SGLANG_CRASH_ON_JIT_COMPILE="1",
            TVM_FFI_CACHE_DIR=empty,
            SGLANG_JIT_CACHE_DIR=empty,
            # sglang's loader looks for nvcc under CUDA_HOME too (kernels/jit/utils/compile/
            # toolchain.py cuda_home)
            CUDA_HOME=os.path.join(empty, "no-cuda"),
            CUDA_PATH=os.path.join(empty, "no-cuda"),
            PATH=os.pathsep.join(
                d for d in os.environ.get("PATH", "").split(os.pathsep) if not _has_nvcc(d)
            ),
        )
        started = time.perf_counter()
        try:
            module = sglang_kernels.evaluate(call, arch)
        except Exception as exc:  # report every kernel, then fail once
            return result, [f"{recipe}: sglang's kernel does not load prebuilt: {exc}"]
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
        compiled = sorted(p.name for p in Path(empty).iterdir())
    if module is None:
        return result, [f"{recipe}: sglang's loader gave no module"]
    result.update(aot=not compiled, load_seconds=time.perf_counter() - started)
    if compiled:
        return result, [f"{recipe}: sglang compiled {', '.join(compiled)} with tvm-ffi"]
    result["loaded"] = True
    return result, []


def _has_nvcc(directory: str) -> bool:
    return bool(directory) and (Path(directory) / "nvcc").exists()


def _no_module(recipe: str) -> dict[str, Any]:
    """The result of a recipe that gave no module to load."""
    return {"module": None, "recipe": recipe, "aot": False, "loaded": False}


def check(recipes: dict[str, str], arch: tuple[int, int]) -> tuple[list[dict[str, Any]], list[str]]:
    """Load every module the recipes name; return (per-module results, problems)."""
    results: list[dict[str, Any]] = []
    try:
        problems: list[str] = provider_problems()
    except FlashInferRefused as refusal:
        return [_no_module(recipe) for recipe in recipes], [
            f"FlashInfer does not import, so no module loads: {refusal}"
        ]
    for recipe, call in recipes.items():
        if sglang_kernels.is_sglang_call(call):
            kernel, found = check_sglang_kernel(recipe, call, arch)
            results.append(kernel)
            problems += found
            continue
        try:
            specs = specs_of(call)
        except ModuleNotFoundError as exc:
            problems.append(
                f"{recipe}: the Python package {exc.name!r} is not installed here, which "
                f"FlashInfer needs for it: install it (pip install {exc.name}), or the whole "
                "environment the pinned sglang needs"
            )
            results.append(_no_module(recipe))
            continue
        except Exception as exc:  # e.g. an SM12x-only generator on another GPU
            problems.append(f"{recipe}: FlashInfer does not make it for this GPU ({exc})")
            results.append(_no_module(recipe))
            continue
        for spec in specs:
            if any(r["module"] == spec.name for r in results):
                continue  # FlashInfer's generators repeat some modules (as build.py dedupes)
            result: dict[str, Any] = {
                "module": spec.name,
                "recipe": recipe,
                "aot": spec.is_aot,
                "loaded": False,
            }
            if not spec.is_aot:
                problems.append(f"{spec.name} ({recipe}) would be JIT-compiled: no prebuilt .so")
            else:
                started = time.perf_counter()
                failure = ""
                with flashinfer_warnings() as warnings:
                    try:
                        spec.build_and_load()
                        result["loaded"] = True
                    except Exception as exc:  # report every module, then fail once
                        failure = str(exc)
                # FlashInfer 0.7 tries the next provider, then JIT, when a prebuilt .so does
                # not load, and says why only in a warning: that is the reason to give.
                reasons = [w for w in warnings if w.startswith("Failed to load AOT artifact")]
                if not result["loaded"]:
                    why = "; ".join(reasons) or failure
                    if DRIVER in why and not driver_present():
                        # Checked for --arch on a machine without a GPU: the module is
                        # prebuilt and FlashInfer takes it; loading it needs the driver.
                        result["needs_driver"] = True
                    else:
                        problems.append(f"{spec.name} ({recipe}) does not load: {why}")
                result["load_seconds"] = time.perf_counter() - started
            results.append(result)
    return results, problems
