"""An aarch64 CPython to run under qemu-user, made from the distribution's own arm64 packages
(`apt-get download`, unpacked with `dpkg-deb -x`, nothing installed): what loads an aarch64
shared object on this x86_64 machine without a GPU. It needs `qemu-user` and arm64 among
dpkg's architectures (`dpkg --add-architecture arm64 && apt-get update`; .ci/run does both)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

# Debian 12's python3.11-minimal and what it and ctypes link (libffi: _ctypes).
PACKAGES = [
    "python3.11-minimal",
    "libpython3.11-minimal",
    "libpython3.11-stdlib",
    "libffi8",
    "libc6",
    "libstdc++6",
    "libgcc-s1",
    "zlib1g",
    "libexpat1",
]


def missing() -> str | None:
    """Why no aarch64 Python can be made here, or None."""
    if shutil.which("qemu-aarch64") is None:
        return "needs qemu-aarch64 (Debian: qemu-user)"
    if shutil.which("dpkg") is None or shutil.which("apt-get") is None:
        return "needs the distribution's arm64 packages (Debian's apt-get and dpkg)"
    foreign = subprocess.run(
        ["dpkg", "--print-foreign-architectures"], capture_output=True, text=True
    ).stdout.split()
    if "arm64" not in foreign:
        return "needs arm64 packages: dpkg --add-architecture arm64 && apt-get update"
    return None


def aarch64_python(sysroot: Path) -> list[str]:
    """The command that runs the aarch64 Python, its packages unpacked into `sysroot`."""
    debs = sysroot.parent / "debs"
    debs.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        ["apt-get", "download", "-q", *(f"{name}:arm64" for name in PACKAGES)],
        cwd=debs,
        check=True,
        capture_output=True,
    )
    for deb in sorted(debs.glob("*.deb")):
        subprocess.run(["dpkg-deb", "-x", str(deb), str(sysroot)], check=True)
    return ["qemu-aarch64", "-L", str(sysroot), str(sysroot / "usr" / "bin" / "python3.11")]
