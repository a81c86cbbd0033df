"""sglang's own JIT kernels: reached without importing the server where the release allows.

sglang 0.5.9 compiles RoPE, the KV-cache store and QK-norm with nvcc at first use
(jit_kernel/utils.py load_jit -> tvm_ffi.cpp.load_inline). A recipe names one instantiation
as "sglang.jit_kernel.<module>:<expression>", e.g.
"sglang.jit_kernel.kvcache:_jit_kvcache_module(2048)": the module's own loader, called with
the template arguments the serving path passes. The build renders it (jit_specs.py), the
node check loads it (node/check.py), both through `evaluate`.

`import sglang` runs the whole frontend (sglang/__init__.py) and `sglang.srt.utils` all of
the server's utilities, with their dependencies (zmq, triton, starlette, ...); loading a
0.5.9 kernel needs neither. So the packages above jit_kernel/ are entered as bare
namespaces pointing at the same directories, and only the kernel modules themselves
execute. Their one import from the server, register_custom_op (which registers the Python
wrappers as torch custom ops for torch.compile, through the server's utilities), is taken
as the plain function: the kernel modules and their loaders are what is built and checked.

From 0.5.11 the kernels live in sglang/kernels/ ("sglang.kernels.ops.kvcache.kvcache:
_jit_kvcache_module(2048, 2048, 0)"), and their loader imports the server's utilities: sglang
is imported as installed (`has_kernels_package`), in sglang's own environment at build time
(jit_cache/sglang_specs.py).
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

PREFIX = "sglang."
# What load_jit names a kernel's module: "sgl_kernel_jit_" + its marker arguments.
MODULE_PREFIX = "sgl_kernel_jit_"


def is_sglang_call(call: str) -> bool:
    return call.startswith(PREFIX)


def installed_root() -> Path:
    """The importable sglang's directory, found without importing it (or from the package
    imported already, which may be a bare namespace of _bare_packages)."""
    imported = sys.modules.get("sglang")
    if imported is not None:
        return Path(next(iter(imported.__path__)))
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError("sglang is not importable")
    return Path(next(iter(spec.submodule_search_locations)))


def has_kernels_package(root: Path) -> bool:
    """Whether the sglang in `root` keeps its kernels in sglang/kernels/ (0.5.11 and later),
    whose loader imports the server's utilities, rather than in sglang/jit_kernel/."""
    return (root / "kernels" / "jit").is_dir()


def _bare_packages(root: Path, major: int) -> None:
    """Enter sglang, sglang.srt and sglang.srt.utils as namespaces over the importable
    sglang's directories, and make load_jit's PDL test answer for `major` (it asks the
    current GPU, which a build machine does not have)."""
    if "sglang.jit_kernel.utils" in sys.modules:
        return
    for name, directory in (
        ("sglang", root),
        ("sglang.srt", root / "srt"),
        ("sglang.srt.utils", root / "srt" / "utils"),
    ):
        package = types.ModuleType(name)
        package.__path__ = [str(directory)]
        sys.modules[name] = package
    custom_op = types.ModuleType("sglang.srt.utils.custom_op")
    custom_op.register_custom_op = _plain_function  # type: ignore[attr-defined]
    sys.modules[custom_op.__name__] = custom_op
    utils = importlib.import_module("sglang.jit_kernel.utils")
    # sglang's own rule (utils.py is_arch_support_pdl): PDL from compute capability 9.
    utils.is_arch_support_pdl = lambda: major >= 9  # type: ignore[attr-defined]


@contextmanager
def _installed(arch: tuple[int, int]) -> Iterator[None]:
    """sglang 0.5.11 and later (sglang/kernels/): its kernels' loader imports the server's
    utilities, so sglang is imported as it is. The loader names and builds a module for the
    GPU it detects (kernels/jit/utils/arch.py), and sglang's platform probe asks torch for
    one when it is imported: with no GPU here (a check run with --arch, a build machine),
    both are told of one of `arch` meanwhile, and the loader's target is what it would
    detect."""
    import torch

    cuda = torch.cuda
    names = (
        "is_available",
        "current_device",
        "device_count",
        "get_device_capability",
        "get_device_name",
        "get_device_properties",
    )
    saved = {name: getattr(cuda, name) for name in names}
    if not cuda.is_available():
        major, minor = arch

        class Properties:  # what sglang's platform probe reads (srt/platforms/__init__.py)
            name = f"virtual SM{major}{minor} (sm120-build, no GPU here)"
            total_memory = 96 * 2**30
            multi_processor_count = 188

        Properties.major, Properties.minor = major, minor  # type: ignore[attr-defined]
        vars(cuda).update(
            is_available=lambda: True,
            current_device=lambda: 0,
            device_count=lambda: 1,
            get_device_capability=lambda device=None: arch,
            get_device_name=lambda device=None: Properties.name,
            get_device_properties=lambda device=None: Properties(),
        )
    try:
        jit_arch = importlib.import_module("sglang.kernels.jit.utils.arch")
        vars(jit_arch)["_CUDA_ARCH"] = jit_arch.make_jit_cuda_arch(*arch)
        vars(jit_arch)["_init_jit_cuda_arch_once"] = lambda: None
        yield
    finally:
        vars(cuda).update(saved)


def _plain_function(fn: Any = None, **_: Any) -> Any:
    """register_custom_op's two forms, @register_custom_op and @register_custom_op(...),
    each giving back the function itself."""
    return fn if fn is not None else (lambda function: function)


def evaluate(call: str, arch: tuple[int, int]) -> Any:
    """Evaluate a recipe's "<module>:<expression>" in that sglang kernel module, for a GPU
    of compute capability `arch`."""
    root = installed_root()
    if not has_kernels_package(root):
        _bare_packages(root, arch[0])
        return _evaluated(call)
    with _installed(arch):
        return _evaluated(call)


def _evaluated(call: str) -> Any:
    module_name, _, expression = call.partition(":")
    namespace = vars(importlib.import_module(module_name))
    return eval(expression, dict(namespace))  # recipes come from our own profiles.toml
