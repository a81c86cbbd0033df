"""Prebuilt FlashInfer kernels, built by sm120-build: one .so per module, at
jit_cache/<module>/<module>.so.

FlashInfer 0.6 loads <get_jit_cache_dir()>/<module>/<module>.so when this package is
importable. FlashInfer 0.7 asks get_jit_cache_providers() which installed packages provide
which modules for which GPU architectures, and takes a module only from a provider that
lists it and whose architectures run on the GPU: this package is that shim and its one
provider. It lists the modules it holds and the architectures its build recorded
(.dist-info/sm120-build.json, the build's --arch), so FlashInfer never loads one of its
modules on a GPU it was not built for.
"""

from __future__ import annotations

import importlib.metadata
import json
from dataclasses import dataclass
from pathlib import Path

from ._build_meta import __version__ as __version__

DISTRIBUTION = "flashinfer-jit-cache"


@dataclass(frozen=True)
class JitCacheProvider:
    """What FlashInfer 0.7's loader reads of a provider (flashinfer/jit/env.py)."""

    provider_id: str
    distribution: str
    version: str
    jit_cache_dir: str
    cuda_architectures: frozenset[str]
    modules: frozenset[str]


def get_jit_cache_dir() -> str:
    return str(Path(__file__).parent / "jit_cache")


def _recorded_architectures() -> frozenset[str]:
    """The build's archs in FlashInfer's spelling ("12.0f" -> "sm120f"); none when the
    provenance cannot be read, so that FlashInfer takes nothing from this package (a node
    check then names every module) rather than failing `import flashinfer`."""
    try:
        text = importlib.metadata.distribution(DISTRIBUTION).read_text("sm120-build.json")
        archs = json.loads(text or "{}").get("archs", [])
    except (importlib.metadata.PackageNotFoundError, ValueError, AttributeError):
        return frozenset()
    return frozenset("sm" + str(arch).replace(".", "") for arch in archs)


def get_jit_cache_providers() -> tuple[JitCacheProvider, ...]:
    directory = Path(get_jit_cache_dir())
    entries = directory.iterdir() if directory.is_dir() else iter(())
    modules = frozenset(entry.name for entry in entries if (entry / f"{entry.name}.so").is_file())
    return (
        JitCacheProvider(
            provider_id="sm120-build",
            distribution=DISTRIBUTION,
            version=__version__,
            jit_cache_dir=str(directory),
            cuda_architectures=_recorded_architectures(),
            modules=modules,
        ),
    )
