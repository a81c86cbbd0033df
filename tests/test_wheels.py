"""Arch parsing, toolkit checks, wheel finalisation and the atomic wheelhouse."""

import base64
import csv
import hashlib
import io
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from sm120_build.errors import UserError
from sm120_build.jit_cache.arch import Arch, check_archs
from sm120_build.layout import PROVENANCE_FILE
from sm120_build.pins import Companion
from sm120_build.toolkit import Toolkit
from sm120_build.wheels import (
    assemble_wheelhouse,
    finalize_wheel,
    manylinux_tag,
)

from .conftest import small_wheel

CUBIN = Companion("flashinfer-cubin", "0.6.3", ("ab" * 32,))


def cuda(version: tuple[int, int], *codes: str) -> Toolkit:
    return Toolkit(
        home=Path("/opt/cuda"),
        version=version,
        full_version=f"{version[0]}.{version[1]}.0",
        gpu_codes=frozenset(codes),
    )


def test_arch_spellings() -> None:
    arch = Arch.parse("12.0a")
    assert (arch.sm, arch.label, arch.gencode, str(arch)) == (
        "sm_120a",
        "sm120a",
        "-gencode=arch=compute_120a,code=sm_120a",
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


SYSTEM_CUDA = Path("/usr/local/cuda")


@pytest.mark.skipif(not (SYSTEM_CUDA / "bin/nvcc").is_file(), reason="needs the system nvcc")
def test_arch_refusals_up_front_with_the_real_nvcc() -> None:
    from sm120_build.toolkit import probe

    real = probe(SYSTEM_CUDA)
    check_archs([Arch.parse(a) for a in ("9.0a", "12.0a", "12.0f", "12.1a", "12.1f")], real)
    with pytest.raises(UserError, match=r"plain sm_120 lacks the FP4 .*use 12.0a or 12.0f"):
        check_archs([Arch.parse("12.0")], real)
    for rejected in ("8.0a", "9.0f", "8.9f"):
        with pytest.raises(UserError, match=rf"--arch {rejected}: CUDA .*'s nvcc rejects it"):
            check_archs([Arch.parse(rejected)], real)


def make_wheel(path: Path, files: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in files.items():
            archive.writestr(name, data)
    return path


def demo_wheel(directory: Path, extra: dict[str, bytes] | None = None) -> Path:
    return make_wheel(
        directory / "demo-1.0-py3-none-linux_x86_64.whl",
        {
            "demo/__init__.py": b"",
            "demo-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: demo\nVersion: 1.0\n",
            "demo-1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\nTag: py3-none-linux_x86_64\n",
            "demo-1.0.dist-info/RECORD": b"",
            **(extra or {}),
        },
    )


def test_finalize_is_deterministic_and_records_provenance(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    provenance: dict[str, object] = {"upstream": {"sha256": "ab" * 32}, "archs": ["12.0a"]}
    extra = {"demo/data/a,b.txt": b"comma", "demo/run.sh": b"#!/bin/sh\n"}
    first = finalize_wheel(
        demo_wheel(tmp_path, extra), tmp_path / "a", provenance, "manylinux_2_34_x86_64"
    )
    second = finalize_wheel(
        demo_wheel(tmp_path, extra), tmp_path / "b", provenance, "manylinux_2_34_x86_64"
    )
    assert first.name == "demo-1.0-py3-none-manylinux_2_34_x86_64.whl"
    assert first.read_bytes() == second.read_bytes()
    with zipfile.ZipFile(first) as archive:
        assert b"Tag: py3-none-manylinux_2_34_x86_64" in archive.read("demo-1.0.dist-info/WHEEL")
        assert b'"12.0a"' in archive.read(f"demo-1.0.dist-info/{PROVENANCE_FILE}")
        for info in archive.infolist():
            assert info.date_time == (1980, 1, 1, 0, 0, 0), info.filename
            assert info.external_attr >> 16 == 0o100644, info.filename
        rows = list(csv.reader(io.StringIO(archive.read("demo-1.0.dist-info/RECORD").decode())))
        listed = {row[0]: row for row in rows}
        assert sorted(listed) == sorted(archive.namelist())
        assert listed["demo-1.0.dist-info/RECORD"] == ["demo-1.0.dist-info/RECORD", "", ""]
        for name, digest, size in rows:
            if name.endswith("/RECORD"):
                continue
            data = archive.read(name)
            expected = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
            assert digest == "sha256=" + expected.decode(), name
            assert int(size) == len(data), name
        assert archive.namelist()[-1].startswith("demo-1.0.dist-info/")


LOCAL = "1.0+cu130.p1a2b3c4d"


def modules_wheel(directory: Path, module: bytes) -> Path:
    """A jit-cache-like wheel: one module's bytes and a _build_meta.py spelling the version."""
    directory.mkdir()
    info = f"demo-{LOCAL}.dist-info"
    return make_wheel(
        directory / f"demo-{LOCAL}-py3-none-linux_x86_64.whl",
        {
            "demo/__init__.py": b"from ._build_meta import __version__ as __version__\n",
            "demo/_build_meta.py": f'__version__ = "{LOCAL}"\n'.encode(),
            "demo/module.so": module,
            f"{info}/METADATA": f"Metadata-Version: 2.1\nName: demo\nVersion: {LOCAL}\n".encode(),
            f"{info}/WHEEL": b"Wheel-Version: 1.0\nTag: py3-none-linux_x86_64\n",
            f"{info}/RECORD": b"",
        },
    )


def test_labelled_versions_follow_the_contents(tmp_path: Path) -> None:
    """Equal contents, equal wheels; other contents (or another provenance), another
    version, spelled the same in the file name, .dist-info, METADATA and _build_meta.py."""
    one = finalize_wheel(modules_wheel(tmp_path / "1", b"A"), tmp_path / "1", {}, None, True)
    again = finalize_wheel(modules_wheel(tmp_path / "2", b"A"), tmp_path / "2", {}, None, True)
    other = finalize_wheel(modules_wheel(tmp_path / "3", b"B"), tmp_path / "3", {}, None, True)
    moved = finalize_wheel(
        modules_wheel(tmp_path / "4", b"A"), tmp_path / "4", {"base": "x"}, None, True
    )
    assert one.read_bytes() == again.read_bytes()
    assert len({one.name, other.name, moved.name}) == 3
    version = one.name.split("-")[1]
    assert re.fullmatch(r"1\.0\+cu130\.p1a2b3c4d\.c[0-9a-f]{8}", version)
    with zipfile.ZipFile(one) as archive:
        names = archive.namelist()
        assert {n.split("/")[0] for n in names} == {"demo", f"demo-{version}.dist-info"}
        assert (
            f"Version: {version}\n" in archive.read(f"demo-{version}.dist-info/METADATA").decode()
        )
        assert archive.read("demo/_build_meta.py") == f'__version__ = "{version}"\n'.encode()
        listed = [
            row[0]
            for row in csv.reader(
                io.StringIO(archive.read(f"demo-{version}.dist-info/RECORD").decode())
            )
        ]
        assert sorted(listed) == sorted(names)


def test_pip_replaces_a_wheel_whose_contents_changed(tmp_path: Path) -> None:
    """Unlabelled, a rebuild with another module set keeps its version, and pip keeps the
    installed wheel ("already satisfied"); labelled, pip replaces it."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"

    def install(wheel: Path) -> str:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "--python",
                str(python),
                "install",
                "--no-deps",
                "--no-index",
                "--quiet",
                str(wheel),
            ],
            check=True,
        )
        shown = subprocess.run(
            [
                python,
                "-c",
                "import demo, pathlib; print(demo.__version__, "
                "(pathlib.Path(demo.__file__).parent / 'module.so').read_text())",
            ],
            check=True,
            capture_output=True,
            text=True,
        )
        return shown.stdout.strip()

    plain = finalize_wheel(modules_wheel(tmp_path / "1", b"A"), tmp_path / "1", {})
    plain_b = finalize_wheel(modules_wheel(tmp_path / "2", b"B"), tmp_path / "2", {})
    assert install(plain) == f"{LOCAL} A"
    assert install(plain_b) == f"{LOCAL} A"  # what a same-version rebuild used to get
    labelled_b = finalize_wheel(modules_wheel(tmp_path / "3", b"B"), tmp_path / "3", {}, None, True)
    assert install(labelled_b) == f"{labelled_b.name.split('-')[1]} B"


def test_assemble_replaces_wheelhouse_with_sums_and_hashes(tmp_path: Path) -> None:
    wheel = finalize_wheel(demo_wheel(tmp_path), tmp_path, {})
    wheelhouse = tmp_path / "wheelhouse"
    wheelhouse.mkdir()
    (wheelhouse / "stale.whl").write_text("old")
    assemble_wheelhouse([wheel], [CUBIN], [], wheelhouse)
    assert sorted(p.name for p in wheelhouse.iterdir()) == [
        "SHA256SUMS",
        "demo-1.0-py3-none-linux_x86_64.whl",
        "requirements.txt",
    ]
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    assert (wheelhouse / "SHA256SUMS").read_text() == f"{digest}  {wheel.name}\n"
    requirements = (wheelhouse / "requirements.txt").read_text()
    assert f"demo==1.0 \\\n    --hash=sha256:{digest}" in requirements
    assert f"flashinfer-cubin==0.6.3 \\\n    --hash=sha256:{'ab' * 32}" in requirements
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".wheelhouse-")]


def test_a_companions_wheel_is_in_the_sums_and_pinned_once_by_its_pinned_hashes(
    tmp_path: Path,
) -> None:
    """The wheelhouse alone installs (--find-links without an index): the companion's file
    is there, SHA256SUMS covers it, and requirements.txt pins it by every pinned hash,
    not by the one file's, and not twice."""
    ours = finalize_wheel(demo_wheel(tmp_path), tmp_path, {})
    (tmp_path / "companion").mkdir()
    cubin = small_wheel(tmp_path / "companion", "flashinfer_cubin", "0.6.3")
    cubin_digest = hashlib.sha256(cubin.read_bytes()).hexdigest()
    pin = Companion("flashinfer-cubin", "0.6.3", ("cd" * 32, cubin_digest))
    wheelhouse = tmp_path / "wheelhouse"
    assemble_wheelhouse([ours], [pin], [cubin], wheelhouse)
    assert sorted(p.name for p in wheelhouse.glob("*.whl")) == sorted([ours.name, cubin.name])
    assert f"{cubin_digest}  {cubin.name}\n" in (wheelhouse / "SHA256SUMS").read_text()
    requirements = (wheelhouse / "requirements.txt").read_text()
    assert requirements.count("flashinfer-cubin==") == 1
    assert (
        f"flashinfer-cubin==0.6.3 \\\n    --hash=sha256:{'cd' * 32} \\\n"
        f"    --hash=sha256:{cubin_digest}\n" in requirements
    )


def test_failed_assembly_leaves_the_old_wheelhouse(tmp_path: Path) -> None:
    wheelhouse = tmp_path / "wheelhouse"
    wheelhouse.mkdir()
    (wheelhouse / "kept.whl").write_text("old")
    with pytest.raises(FileNotFoundError):
        assemble_wheelhouse([tmp_path / "missing-1.0-py3-none-any.whl"], [], [], wheelhouse)
    assert [p.name for p in wheelhouse.iterdir()] == ["kept.whl"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".wheelhouse-")]


def test_failure_at_the_swap_puts_the_old_wheelhouse_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fault injection at the one rename that matters: the new wheelhouse into place, after
    the old one was moved aside."""
    wheel = finalize_wheel(demo_wheel(tmp_path), tmp_path, {})
    wheelhouse = tmp_path / "wheelhouse"
    wheelhouse.mkdir()
    (wheelhouse / "kept.whl").write_text("old")
    real_rename = os.rename

    def failing_rename(source: str | Path, target: str | Path) -> None:
        if Path(str(target)) == wheelhouse and ".wheelhouse-new-" in str(source):
            raise OSError(28, "No space left on device")
        real_rename(source, target)

    monkeypatch.setattr(os, "rename", failing_rename)
    with pytest.raises(OSError, match="No space left"):
        assemble_wheelhouse([wheel], [], [], wheelhouse)
    assert [p.name for p in wheelhouse.iterdir()] == ["kept.whl"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".wheelhouse-")]


def shared_library_wheel(tmp_path: Path, source: str) -> Path:
    """A wheel holding a shared library compiled from `source` with the system gcc."""
    tmp_path.mkdir()
    (tmp_path / "lib.c").write_text(source)
    library = tmp_path / "libfixture.so"
    subprocess.run(
        ["gcc", "-shared", "-fPIC", "-o", str(library), str(tmp_path / "lib.c")], check=True
    )
    wheel = demo_wheel(tmp_path, {"demo/libfixture.so": library.read_bytes()})
    (tmp_path / "final").mkdir()
    return finalize_wheel(wheel, tmp_path / "final", {})


def test_manylinux_tag_follows_the_newest_symbol_version_the_binary_needs(tmp_path: Path) -> None:
    """arc4random exists from glibc 2.36 on (the build machine's glibc): a library calling it
    needs manylinux_2_36; one calling nothing newer than memcpy gets an older tag."""
    modern = shared_library_wheel(
        tmp_path / "modern",
        "#include <stdlib.h>\nunsigned pick(void) { return arc4random(); }\n",
    )
    assert manylinux_tag(modern) == "manylinux_2_36_x86_64"
    plain = shared_library_wheel(
        tmp_path / "plain",
        "#include <string.h>\nvoid copy(char *a, const char *b, size_t n) { memcpy(a, b, n); }\n",
    )
    major, minor = (int(x) for x in manylinux_tag(plain).split("_")[1:3])
    assert (major, minor) < (2, 36)


def test_manylinux_tag_sees_binaries_the_record_does_not_list(tmp_path: Path) -> None:
    """A composed wheel (shards merged, a base overlaid, cached modules added) keeps its
    first part's RECORD; the tag must still follow every binary in it."""
    plain = shared_library_wheel(tmp_path / "plain", "int one(void) { return 1; }\n")
    modern = shared_library_wheel(
        tmp_path / "modern",
        "#include <stdlib.h>\nunsigned pick(void) { return arc4random(); }\n",
    )
    with zipfile.ZipFile(plain) as first, zipfile.ZipFile(modern) as second:
        files = {name: first.read(name) for name in first.namelist()}
        added = second.read("demo/libfixture.so")
    composed = make_wheel(tmp_path / plain.name, {**files, "demo/modern/libfixture.so": added})
    assert manylinux_tag(composed) == "manylinux_2_36_x86_64"
    (tmp_path / "only-stale").mkdir()
    del files["demo/libfixture.so"]  # RECORD names it; the wheel holds only the unlisted one
    only_stale = make_wheel(
        tmp_path / "only-stale" / plain.name, {**files, "demo/modern/libfixture.so": added}
    )
    assert manylinux_tag(only_stale) == "manylinux_2_36_x86_64"
