"""The host CPU a jit-cache wheel's shared objects run on: x86_64 (RTX PRO 6000 and RTX 5090
servers) or aarch64 (DGX Spark and the other GB10 machines, whose Grace CPU hosts an SM121).

A build for a host other than this machine's cross-compiles: the device code with the same
nvcc, the host code with the distribution's cross compiler, linked against that host's CUDA
runtime from NVIDIA's pip wheel (pins.toml's [cross.<host>], hash-pinned). Which hosts a build
can target is the table below, and --platform is checked against it before anything is
fetched.
"""

from __future__ import annotations

import platform
import shutil
from dataclasses import dataclass
from pathlib import Path

from .errors import UserError


@dataclass(frozen=True)
class Host:
    name: str  # as `uname -m` and the wheel's platform tag spell it
    elf_machine: int  # e_machine in the ELF header of its shared objects
    cross_prefix: str  # of the distribution's cross compilers, e.g. aarch64-linux-gnu-
    cross_package: str  # the Debian package that installs them

    @property
    def cross_compilers(self) -> tuple[str, str]:
        """(C++, C) compiler names for this host when it is not the machine's own."""
        return f"{self.cross_prefix}g++", f"{self.cross_prefix}gcc"


HOSTS = {
    "x86_64": Host("x86_64", 62, "x86_64-linux-gnu-", "g++-x86-64-linux-gnu"),
    "aarch64": Host("aarch64", 183, "aarch64-linux-gnu-", "g++-aarch64-linux-gnu"),
}
DEFAULT = "x86_64"


def parse(name: str) -> Host:
    """The host `--platform NAME` asks for; an unknown one is refused with the list."""
    try:
        return HOSTS[name]
    except KeyError:
        raise UserError(
            f"--platform {name!r}: the build can target {', '.join(HOSTS)} hosts; give one of them"
        ) from None


def is_native(host: Host) -> bool:
    return platform.machine() == host.name


@dataclass(frozen=True)
class CrossCompilers:
    """The distribution's compilers for another host: C++ for the host code (CMake's, and
    nvcc's -ccbin), C for the driver stub (driver_stub.py)."""

    host: str
    cxx: str
    cc: str

    def cmake_defines(self) -> dict[str, str]:
        """What tells CMake it cross-compiles, and with what; nvcc's device code is the same."""
        return {
            "CMAKE_SYSTEM_NAME": "Linux",
            "CMAKE_SYSTEM_PROCESSOR": self.host,
            "CMAKE_CXX_COMPILER": self.cxx,
            "CMAKE_CUDA_HOST_COMPILER": self.cxx,
        }

    def wheel_environment(self) -> dict[str, str]:
        """What makes scikit-build-core tag the wheel for the host (linux_aarch64), so that
        auditwheel reads its binaries as that host's (sysconfig's spelling)."""
        return {"_PYTHON_HOST_PLATFORM": f"linux-{self.host}"}


def compilers(host: Host) -> CrossCompilers | None:
    """The cross compilers for `host`, None for this machine's own host; a missing one is
    refused naming the package that provides it."""
    if is_native(host):
        return None
    cxx, cc = (shutil.which(name) for name in host.cross_compilers)
    if cxx is None or cc is None:
        raise UserError(
            f"building for {host.name} hosts needs the cross compilers "
            f"{' and '.join(host.cross_compilers)}, which are not on PATH: install "
            f"them (Debian: apt-get install {host.cross_package}). Nothing was fetched."
        )
    return CrossCompilers(host.name, cxx, cc)


def elf_machine(path: Path) -> int | None:
    """e_machine of an ELF file (62: x86_64, 183: aarch64), None when it is not ELF."""
    with path.open("rb") as file:
        header = file.read(20)
    if len(header) < 20 or header[:4] != b"\x7fELF":
        return None
    # EI_DATA (byte 5): 1 little-endian, 2 big-endian.
    return int.from_bytes(header[18:20], "little" if header[5] == 1 else "big")


def named_machine(code: int | None) -> str:
    """The host an e_machine code stands for, by HOSTS, or the code itself."""
    for host in HOSTS.values():
        if host.elf_machine == code:
            return host.name
    return "not ELF" if code is None else f"ELF machine {code}"
