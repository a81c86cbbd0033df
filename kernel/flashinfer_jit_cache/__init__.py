"""Prebuilt FlashInfer kernels: the SM120-enabled trtllm_comm module.

FlashInfer looks for this package by name. When it is importable, FlashInfer loads
<get_jit_cache_dir()>/<module>/<module>.so instead of compiling the module at run time.
"""

from pathlib import Path

from ._build_meta import __version__ as __version__


def get_jit_cache_dir() -> str:
    return str(Path(__file__).parent / "jit_cache")
