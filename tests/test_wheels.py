"""Arch parsing, toolkit checks, wheel finalisation and the atomic wheelhouse."""

import hashlib
import zipfile
from pathlib import Path

import pytest

from sm120_build.build import Arch, check_archs
from sm120_build.errors import UserError
from sm120_build.toolkit import Toolkit
from sm120_build.wheels import (
    PROVENANCE_FILE,
    _record_hash,
    assemble_wheelhouse,
    finalize_wheel,
    glibc_requirement,
)


def cuda(version: tuple[int, int], *codes: str) -> Toolkit:
    return Toolkit(
        home=Path("/opt/cuda"),
        version=version,
        full_version=f"{version[0]}.{version[1]}.0",
        gpu_codes=frozenset(codes),
    )


def test_arch_spellings() -> None:
    arch = Arch.parse("12.0a")
    assert (arch.sm, arch.label, arch.cmake, str(arch)) == (
        "sm_120a",
        "sm120a",
        "120a-real",
        "12.0a",
    )
    assert Arch.parse("9.0a") < Arch.parse("12.0a")
    with pytest.raises(UserError, match=r"expected MAJOR.MINOR"):
        Arch.parse("sm_120")


def test_toolkit_older_than_12_8_is_refused_for_sm12x() -> None:
    with pytest.raises(UserError, match=r"needs CUDA 12.8 or newer"):
        check_archs([Arch.parse("12.0a")], cuda((12, 6), "sm_90", "sm_120"))


def test_arch_the_toolkit_cannot_build_is_refused() -> None:
    with pytest.raises(UserError, match=r"cannot build 13.0a"):
        check_archs([Arch.parse("13.0a")], cuda((13, 0), "sm_90", "sm_120"))
    check_archs([Arch.parse("9.0a"), Arch.parse("12.0a")], cuda((12, 8), "sm_90", "sm_120"))


def make_wheel(path: Path, files: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in files.items():
            archive.writestr(name, data)
    return path


def demo_wheel(directory: Path) -> Path:
    return make_wheel(
        directory / "demo-1.0-py3-none-linux_x86_64.whl",
        {
            "demo/__init__.py": b"",
            "demo-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: demo\nVersion: 1.0\n",
            "demo-1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\nTag: py3-none-linux_x86_64\n",
            "demo-1.0.dist-info/RECORD": b"",
        },
    )


def test_finalize_is_deterministic_and_records_provenance(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    provenance = {"upstream": {"sha256": "ab" * 32}, "archs": ["12.0a"]}
    first = finalize_wheel(
        demo_wheel(tmp_path), tmp_path / "a", provenance, "manylinux_2_34_x86_64"
    )
    second = finalize_wheel(
        demo_wheel(tmp_path), tmp_path / "b", provenance, "manylinux_2_34_x86_64"
    )
    assert first.name == "demo-1.0-py3-none-manylinux_2_34_x86_64.whl"
    assert first.read_bytes() == second.read_bytes()
    with zipfile.ZipFile(first) as archive:
        assert b"Tag: py3-none-manylinux_2_34_x86_64" in archive.read("demo-1.0.dist-info/WHEEL")
        assert b'"12.0a"' in archive.read(f"demo-1.0.dist-info/{PROVENANCE_FILE}")
        record = archive.read("demo-1.0.dist-info/RECORD").decode().splitlines()
        for line in record:
            name, digest, _ = line.split(",")
            if name.endswith("RECORD"):
                continue
            assert digest == _record_hash(archive.read(name)), name
        assert archive.namelist()[-1].startswith("demo-1.0.dist-info/")


def test_assemble_replaces_wheelhouse_with_sums_and_hashes(tmp_path: Path) -> None:
    wheel = finalize_wheel(demo_wheel(tmp_path), tmp_path, {})
    wheelhouse = tmp_path / "wheelhouse"
    wheelhouse.mkdir()
    (wheelhouse / "stale.whl").write_text("old")
    assemble_wheelhouse([wheel], wheelhouse)
    assert sorted(p.name for p in wheelhouse.iterdir()) == [
        "SHA256SUMS",
        "demo-1.0-py3-none-linux_x86_64.whl",
        "requirements.txt",
    ]
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    assert (wheelhouse / "SHA256SUMS").read_text() == f"{digest}  {wheel.name}\n"
    assert (
        f"demo==1.0 \\\n    --hash=sha256:{digest}" in (wheelhouse / "requirements.txt").read_text()
    )
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".wheelhouse-")]


def test_failed_assembly_leaves_the_old_wheelhouse(tmp_path: Path) -> None:
    wheelhouse = tmp_path / "wheelhouse"
    wheelhouse.mkdir()
    (wheelhouse / "kept.whl").write_text("old")
    with pytest.raises(FileNotFoundError):
        assemble_wheelhouse([tmp_path / "missing-1.0-py3-none-any.whl"], wheelhouse)
    assert [p.name for p in wheelhouse.iterdir()] == ["kept.whl"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".wheelhouse-")]


def test_glibc_requirement_reads_symbol_versions() -> None:
    major, minor = glibc_requirement(Path("/bin/ls"))
    assert major == 2 and minor >= 17
