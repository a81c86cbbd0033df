"""An upstream that publishes only wheels (sglang since 0.5.11): pinned by its wheels, vendored
from the first, patched twins for each target, and the wheels refused before anything of
them is written."""

from __future__ import annotations

import hashlib
import zipfile
from dataclasses import replace
from pathlib import Path

import pytest

from sm120_build.archives import check_wheel
from sm120_build.errors import UserError
from sm120_build.pins import Artifact, Upstream
from sm120_build.pins import load as load_pins
from sm120_build.vendor import vendor_upstream
from sm120_build.wheel_upstream import (
    patched_wheel,
    target_files,
    tree_files,
    wheel_files,
)

from .conftest import REPO, make_patch, write_series, zip_wheel

LINES = [f"line {n}" for n in range(1, 21)]
INFO = "sglang-0.5.23.dist-info"


def upstream_wheel(
    directory: Path, tag: str, binary: bytes, code: str = "\n".join(LINES) + "\n"
) -> Path:
    """A wheel of sglang 0.5.23 for `tag` (python-abi-platform), with an ELF extension."""
    directory.mkdir(parents=True, exist_ok=True)
    return zip_wheel(
        directory / f"sglang-0.5.23-{tag}.whl",
        {
            "sglang/__init__.py": b"",
            "sglang/srt/code.py": code.encode(),
            "sglang/srt/rust_extensions/_server.so": b"\x7fELF" + binary,
            f"{INFO}/METADATA": b"Metadata-Version: 2.1\nName: sglang\nVersion: 0.5.23\n",
            f"{INFO}/WHEEL": f"Wheel-Version: 1.0\nRoot-Is-Purelib: false\nTag: {tag}\n".encode(),
            f"{INFO}/entry_points.txt": b"[console_scripts]\nsglang = sglang.cli:main\n",
        },
    )


def pinned(*wheels: Path) -> Upstream:
    artifacts = tuple(
        Artifact(wheel.name, hashlib.sha256(wheel.read_bytes()).hexdigest()) for wheel in wheels
    )
    return Upstream("sglang", "sglang", "0.5.23", "", "", "", "", "", artifacts)


@pytest.fixture
def vendored(tmp_path: Path) -> tuple[Upstream, Path, Path, Path]:
    """cp312 and cp311 wheels, the first vendored with one patch: (upstream, tree, cp312,
    cp311)."""
    cp312 = upstream_wheel(tmp_path / "up", "cp312-cp312-manylinux_2_34_x86_64", b"312")
    cp311 = upstream_wheel(tmp_path / "up", "cp311-cp311-manylinux_2_34_x86_64", b"311")
    series = tmp_path / "patches" / "sglang"
    series.mkdir(parents=True)
    patch = make_patch(
        series / "0001-gate.patch", "sglang/srt/code.py", LINES, 4, "LINE 5", "lift the gate"
    )
    write_series(series, patch)
    upstream = pinned(cp312, cp311)
    tree = tmp_path / "vendor" / "sglang"
    vendor_upstream(upstream, cp312, series, tree)
    return upstream, tree, cp312, cp311


Vendored = tuple[Upstream, Path, Path, Path]


def test_the_vendor_tree_is_the_first_wheel_with_its_patches(vendored: Vendored) -> None:
    _, tree, _, _ = vendored
    files = tree_files(tree)
    assert "LINE 5" in files["sglang/srt/code.py"][0].decode()
    assert files["sglang/srt/rust_extensions/_server.so"][0] == b"\x7fELF312"
    assert f"{INFO}/RECORD" in files  # kept: the patched wheel gets a new one


def test_each_target_gets_its_own_binaries_and_the_patched_sources(
    vendored: Vendored,
    tmp_path: Path,
) -> None:
    _, tree, cp312, cp311 = vendored
    files = target_files(tree_files(tree), wheel_files(cp312), wheel_files(cp311), cp311.name)
    out = tmp_path / "out"
    out.mkdir()
    wheel = patched_wheel(files, cp311.name, "0.5.23+sm120.p12345678", out)
    assert wheel.name == "sglang-0.5.23+sm120.p12345678-cp311-cp311-manylinux_2_34_x86_64.whl"
    check_wheel(wheel, lambda name: None, "patched wheel")  # RECORD matches every file
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        info = "sglang-0.5.23+sm120.p12345678.dist-info"
        assert archive.read("sglang/srt/rust_extensions/_server.so") == b"\x7fELF311"
        assert "LINE 5" in archive.read("sglang/srt/code.py").decode()
        assert (
            archive.read(f"{info}/WHEEL")
            .decode()
            .endswith("Tag: cp311-cp311-manylinux_2_34_x86_64\n")
        )
        assert "Version: 0.5.23+sm120.p12345678\n" in archive.read(f"{info}/METADATA").decode()
        assert f"{info}/entry_points.txt" in names
        assert not any(name.startswith(INFO) for name in names)
        mode = archive.getinfo("sglang/srt/rust_extensions/_server.so").external_attr >> 16
        assert mode & 0o111


def test_a_target_whose_sources_differ_is_refused_by_name(tmp_path: Path) -> None:
    """The patches were made for the vendored wheel's sources; another target's different
    source file would be shipped unpatched."""
    cp312 = upstream_wheel(tmp_path / "up", "cp312-cp312-manylinux_2_34_x86_64", b"312")
    other = upstream_wheel(
        tmp_path / "up", "cp313-cp313-manylinux_2_34_x86_64", b"313", code="different\n"
    )
    vendored = wheel_files(cp312)
    with pytest.raises(UserError) as error:
        target_files(vendored, vendored, wheel_files(other), other.name)
    assert str(error.value).startswith(
        f"{other.name}: sglang/srt/code.py differs from the vendored wheel's and is not a "
        "binary extension"
    )


@pytest.mark.parametrize(
    ("member", "problem"),
    [
        ("../escape.py", "is not a normalised relative path"),
        ("/etc/cron.d/x", "is an absolute path"),
        ("sglang/.git/config", "is inside a .git directory"),
    ],
)
def test_an_upstream_wheel_with_an_unsafe_member_is_refused_before_writing(
    tmp_path: Path, member: str, problem: str
) -> None:
    bad = tmp_path / "sglang-0.5.23-cp312-cp312-manylinux_2_34_x86_64.whl"
    zip_wheel(bad, {"sglang/__init__.py": b"", member: b"x", f"{INFO}/METADATA": b""})
    series = tmp_path / "patches" / "sglang"
    series.mkdir(parents=True)
    (series / "series").write_text("")
    tree = tmp_path / "vendor" / "sglang"
    with pytest.raises(UserError) as error:
        vendor_upstream(pinned(bad), bad, series, tree)
    assert f"refusing member {member!r}: it {problem}" in str(error.value)
    assert not tree.exists()
    assert list((tmp_path / "vendor").iterdir()) == []


def test_a_symlink_member_or_a_lying_record_is_refused(tmp_path: Path) -> None:
    series = tmp_path / "patches" / "sglang"
    series.mkdir(parents=True)
    (series / "series").write_text("")
    good = upstream_wheel(tmp_path / "up", "cp312-cp312-manylinux_2_34_x86_64", b"312")
    linked = tmp_path / "linked" / good.name
    linked.parent.mkdir()
    with zipfile.ZipFile(good) as source, zipfile.ZipFile(linked, "w") as target:
        for info in source.infolist():
            if info.filename == "sglang/srt/code.py":
                info.external_attr = 0o120777 << 16  # a link to wherever its text says
            target.writestr(info, source.read(info))
    lying = tmp_path / "lying" / good.name
    lying.parent.mkdir()
    with zipfile.ZipFile(good) as source, zipfile.ZipFile(lying, "w") as target:
        for info in source.infolist():
            data = source.read(info)
            target.writestr(info, b"changed\n" if info.filename == "sglang/srt/code.py" else data)
    for wheel, says in ((linked, "it is a symbolic link"), (lying, "does not match its RECORD")):
        tree = tmp_path / "vendor" / wheel.parent.name
        with pytest.raises(UserError, match=says):
            vendor_upstream(pinned(wheel), wheel, series, tree)
        assert not tree.exists()


def test_wheel_pins_are_checked(tmp_path: Path) -> None:
    text = (REPO / "pins.toml").read_text()
    sdist_lines = (
        'sdist = "sglang-0.5.9.tar.gz"\n'
        'sha256 = "11b1445bfb039c20217783850fda66a71b814391b2cf313f4e6cadc3b9fea41b"\n'
    )
    assert sdist_lines in text
    wheel = "sglang-0.5.9-cp312-cp312-linux_x86_64.whl"
    good = f'wheels = [{{ file = "{wheel}", sha256 = "{"a" * 64}" }}]\n'
    path = tmp_path / "pins.toml"
    path.write_text(text.replace(sdist_lines, good))
    sglang = load_pins(path).upstream("sglang")
    assert sglang.source == Artifact("sglang-0.5.9-cp312-cp312-linux_x86_64.whl", "a" * 64)
    assert (sglang.sdist, sglang.sha256) == ("", "")
    for wheels, message in (
        (
            'wheels = [{ file = "../x.whl", sha256 = "' + "a" * 64 + '" }]\n',
            "is not the file name of a wheel of sglang 0.5.9",
        ),
        (
            'wheels = [{ file = "sglang-0.5.10-py3-none-any.whl", sha256 = "' + "a" * 64 + '" }]\n',
            "is not the file name of a wheel of sglang 0.5.9",
        ),
        (
            'wheels = [{ file = "sglang-0.5.9-py3-none-any.whl", sha256 = "A" }]\n',
            "sha256 is not 64 lowercase hex",
        ),
        ("wheels = []\n", "must list"),
        (sdist_lines + good, "needs either sdist and sha256, or wheels"),
    ):
        path.write_text(text.replace(sdist_lines, wheels))
        with pytest.raises(UserError, match=message):
            load_pins(path)


def test_no_wheel_for_the_platform_asked_for_is_refused_by_name(tmp_path: Path) -> None:
    from sm120_build.layout import Layout
    from sm120_build.pins import Pins
    from sm120_build.pipeline import _patched_upstream_wheels

    wheel = upstream_wheel(tmp_path / "up", "cp312-cp312-manylinux_2_34_x86_64", b"312")
    upstream = pinned(wheel)
    layout = Layout(tmp_path, tmp_path / ".cache")
    pins = Pins({"sglang": upstream}, "cuda-toolkit==13.0.2", {}, [])
    with pytest.raises(UserError) as error:
        _patched_upstream_wheels(layout, pins, replace(upstream), tmp_path, "aarch64")
    assert str(error.value) == (
        f"{tmp_path / 'pins.toml'} pins no sglang wheel for aarch64 (it pins {wheel.name}); "
        "add one to [upstream.sglang] wheels"
    )
