"""A link-time stand-in for the NVIDIA driver's libcuda.so.1, made from the toolkit's cuda.h.

FlashInfer's JIT links every module with -lcuda against the driver of the machine that
compiles; a build machine has no driver, and the pip toolkit ships no stub library. Most
modules call no driver function and need none; FlashInfer 0.7's PCIe all-reduce
(pcie_ipc_comm) does (cuDeviceGet, cuStreamWriteValue32, ...). So every module links this
stub with --as-needed (kernel/CMakeLists.txt): a module that calls the driver records
NEEDED libcuda.so.1, resolved by the real driver on the node; the others record nothing.

The stub defines each CUresult function cuda.h declares, by the name the linker sees
(after cuda.h's own #defines, e.g. cuStreamWriteValue32 -> cuStreamWriteValue32_v2), as
NVIDIA's own stubs do. Its bodies never run.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from ..errors import UserError
from ..toolkit import Toolkit

SONAME = "libcuda.so.1"
_DECLARATION = re.compile(r"^(?:extern\s+)?CUresult\s+(cu\w+)\s*\(", re.M)


def driver_functions(toolkit: Toolkit, compiler: str = "gcc") -> list[str]:
    """The driver functions cuda.h declares, by their link names."""
    result = subprocess.run(
        [compiler, "-E", "-P", "-x", "c", f"-I{toolkit.home / 'include'}", "-"],
        input="#include <cuda.h>\n",
        capture_output=True,
        text=True,
    )
    names = sorted(set(_DECLARATION.findall(result.stdout)))
    if result.returncode != 0 or not names:
        raise UserError(
            f"cannot read the driver API from {toolkit.home / 'include' / 'cuda.h'} "
            f"({compiler}: {result.stderr.strip()[-500:] or 'no declarations found'})"
        )
    return names


def driver_stub(toolkit: Toolkit, directory: Path, compiler: str = "gcc") -> Path:
    """directory/libcuda.so (soname libcuda.so.1), for -L<directory> -lcuda."""
    directory.mkdir(parents=True, exist_ok=True)
    source = directory / "libcuda-stub.c"
    source.write_text(
        "/* Link-time stand-in for the NVIDIA driver: never run (sm120_build/jit_cache/"
        "driver_stub.py). */\n"
        + "".join(
            f"int {name}(void) {{ return 999; }}\n" for name in driver_functions(toolkit, compiler)
        )
    )
    result = subprocess.run(
        [
            compiler,
            "-shared",
            "-fPIC",
            f"-Wl,-soname,{SONAME}",
            "-o",
            str(directory / "libcuda.so"),
            str(source),
        ],
        capture_output=True,
        text=True,
    )
    if result.returncode != 0:
        raise UserError(f"cannot build the link-time driver stub: {result.stderr.strip()[-1000:]}")
    return directory
