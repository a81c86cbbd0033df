"""The CUDA_HOME shim over NVIDIA's pip packages, on a generated tree."""

from __future__ import annotations

import os
from pathlib import Path

from sm120_build.toolkit import _make_shim


def test_shim_adds_the_unversioned_library_names_the_linker_needs(tmp_path: Path) -> None:
    root = tmp_path / "nvidia" / "cu13"
    for directory in ("bin", "lib", "include", "nvvm"):
        (root / directory).mkdir(parents=True)
    (root / "bin" / "nvcc").write_text("")
    for name in (
        "libcudart.so.13",
        "libnvrtc.so.13",
        "libnvrtc-builtins.so.13.0",
        "libcudadevrt.a",
    ):
        (root / "lib" / name).write_text(name)
    shim = tmp_path / "home"
    _make_shim(root, shim)
    lib64 = shim / "lib64"
    assert os.readlink(lib64 / "libcudart.so") == "libcudart.so.13"
    assert (lib64 / "libnvrtc.so").read_text() == "libnvrtc.so.13"
    assert not (lib64 / "libnvrtc-builtins.so").exists()  # .so.13.0: not a soname link
    assert (shim / "bin").is_dir() and not (shim / "bin").is_symlink()  # nvcc's own location
    assert (shim / "include").resolve() == (root / "include").resolve()
