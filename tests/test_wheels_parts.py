"""wheels.py's smaller rules: the executable bit, version labels, the archive's order and
times, requirements.txt byte for byte, the wheelhouse's leftovers and mode, provenance."""

from __future__ import annotations

import hashlib
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from sm120_build.errors import UserError
from sm120_build.pins import Companion, Upstream
from sm120_build.wheels import (
    DEFAULT_EPOCH,
    assemble_wheelhouse,
    build_python_wheel,
    finalize_wheel,
    manylinux_tag,
    pip_wheel_command,
    requirement_lines,
    source_date_epoch,
    upstream_record,
)

from .test_wheels import demo_wheel


def wheel_with_modes(path: Path, modes: dict[str, int], version: str = "1.0") -> Path:
    info = f"demo-{version}.dist-info"
    files = {
        f"{info}/METADATA": (f"Metadata-Version: 2.1\nName: demo\nVersion: {version}\n", 0o644),
        f"{info}/WHEEL": ("Wheel-Version: 1.0\nTag: py3-none-linux_x86_64\n", 0o644),
        **{name: (f"contents of {name}\n", mode) for name, mode in modes.items()},
    }
    with zipfile.ZipFile(path / f"demo-{version}-py3-none-linux_x86_64.whl", "w") as archive:
        for name, (text, mode) in files.items():
            info_ = zipfile.ZipInfo(name)
            info_.external_attr = (0o100000 | mode) << 16
            archive.writestr(info_, text)
    return path / f"demo-{version}-py3-none-linux_x86_64.whl"


def modes_of(wheel: Path) -> dict[str, int]:
    with zipfile.ZipFile(wheel) as archive:
        return {info.filename: info.external_attr >> 16 for info in archive.infolist()}


def test_the_executable_bit_survives_and_only_it(tmp_path: Path) -> None:
    (tmp_path / "out").mkdir()
    wheel = wheel_with_modes(tmp_path, {"demo/run.sh": 0o750, "demo/data.txt": 0o600})
    modes = modes_of(finalize_wheel(wheel, tmp_path / "out", {}))
    assert modes["demo/run.sh"] == 0o100755
    assert modes["demo/data.txt"] == 0o100644


def test_a_changed_executable_bit_is_another_labelled_version(tmp_path: Path) -> None:
    versions = []
    for number, mode in enumerate((0o644, 0o755, 0o644)):
        directory = tmp_path / str(number)
        directory.mkdir()
        wheel = wheel_with_modes(directory, {"demo/tool": mode})
        labelled = finalize_wheel(wheel, directory, {}, None, True)
        versions.append(labelled.name.split("-")[1])
    assert versions[0] == versions[2] != versions[1]
    directory = tmp_path / "others-only"
    directory.mkdir()
    others = finalize_wheel(
        wheel_with_modes(directory, {"demo/tool": 0o641}), directory, {}, None, True
    )
    assert others.name.split("-")[1] == versions[1]  # executable for anyone is executable
    assert modes_of(others)["demo/tool"] == 0o100755
    assert versions[0].startswith("1.0+c")  # no local part yet: "+" starts it


def test_a_wheel_without_a_wheel_file_is_refused(tmp_path: Path) -> None:
    broken = tmp_path / "demo-1.0-py3-none-any.whl"
    with zipfile.ZipFile(broken, "w") as archive:
        archive.writestr("demo/__init__.py", "")
    with pytest.raises(UserError) as refused:
        finalize_wheel(broken, tmp_path, {})
    assert str(refused.value) == "demo-1.0-py3-none-any.whl has no demo-1.0.dist-info/WHEEL"


def test_the_archive_is_stamped_with_source_date_epoch_and_nothing_partial_is_left(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")  # 2023-11-14T22:13:20Z
    (tmp_path / "out").mkdir()
    final = finalize_wheel(demo_wheel(tmp_path), tmp_path / "out", {"x": 1, "a": 2})
    with zipfile.ZipFile(final) as archive:
        infos = archive.infolist()
        assert {info.date_time for info in infos} == {(2023, 11, 14, 22, 13, 20)}
        assert {info.compress_type for info in infos} == {zipfile.ZIP_DEFLATED}
        names = [info.filename for info in infos]
        assert names == ["demo/__init__.py"] + [
            f"demo-1.0.dist-info/{name}" for name in ("METADATA", "RECORD", "WHEEL")
        ] + ["demo-1.0.dist-info/sm120-build.json"]
        # Keys sorted: the same provenance, however built, gives the same bytes.
        provenance = archive.read("demo-1.0.dist-info/sm120-build.json")
        assert provenance == b'{\n  "a": 2,\n  "x": 1\n}\n'
        # The source's RECORD is replaced, not listed in the new one.
        record = archive.read("demo-1.0.dist-info/RECORD").decode().splitlines()
        assert [row for row in record if "RECORD" in row] == ["demo-1.0.dist-info/RECORD,,"]
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [final.name]


def test_the_source_date_epoch_defaults_to_1980(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SOURCE_DATE_EPOCH", raising=False)
    assert source_date_epoch() == DEFAULT_EPOCH == 315532800
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "42")
    assert source_date_epoch() == 42


def test_only_the_version_line_of_metadata_and_quoted_versions_are_restamped(
    tmp_path: Path,
) -> None:
    version = "1.0+cu130"
    info = f"demo-{version}.dist-info"
    source = tmp_path / f"demo-{version}-py3-none-linux_x86_64.whl"
    with zipfile.ZipFile(source, "w") as archive:
        archive.writestr(
            f"{info}/METADATA",
            f"Metadata-Version: 2.1\nName: demo\nVersion: {version}\n\nVersion: {version} text\n",
        )
        archive.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nTag: py3-none-linux_x86_64\n")
        archive.writestr(f"{info}/notes.py", f'"{version}"\n')
        archive.writestr("demo/_meta.py", f'v = "{version}"\nplain = {version!r}x\n')
    (tmp_path / "out").mkdir()
    final = finalize_wheel(source, tmp_path / "out", {}, None, True)
    new = final.name.split("-")[1]
    assert new.startswith("1.0+cu130.c")  # a local part already: "." continues it
    with zipfile.ZipFile(final) as archive:
        metadata = archive.read(f"demo-{new}.dist-info/METADATA").decode()
        assert metadata.endswith(f"Version: {new}\n\nVersion: {version} text\n")
        assert archive.read(f"demo-{new}.dist-info/notes.py") == f'"{version}"\n'.encode()
        assert archive.read("demo/_meta.py") == f"v = \"{new}\"\nplain = '{version}'x\n".encode()


def test_requirements_txt_byte_for_byte(tmp_path: Path) -> None:
    wheels = []
    for name in ("zeta_pkg-2.0-py3-none-any.whl", "alpha_pkg-1.0+sm120.pab-py3-none-any.whl"):
        (tmp_path / name).write_bytes(name.encode())
        wheels.append(tmp_path / name)
    digest = {w.name: hashlib.sha256(w.name.encode()).hexdigest() for w in wheels}
    companion = Companion("flashinfer-cubin", "0.6.3", ("ab" * 32, "cd" * 32))
    assert requirement_lines(wheels, [companion]) == (
        "# Generated by sm120-build. On a node, with DIR this wheelhouse:\n"
        "#   pip install --require-hashes --no-deps --find-links DIR -r DIR/requirements.txt\n"
        "alpha-pkg==1.0+sm120.pab \\\n"
        f"    --hash=sha256:{digest['alpha_pkg-1.0+sm120.pab-py3-none-any.whl']}\n"
        "zeta-pkg==2.0 \\\n"
        f"    --hash=sha256:{digest['zeta_pkg-2.0-py3-none-any.whl']}\n"
        "flashinfer-cubin==0.6.3 \\\n"
        f"    --hash=sha256:{'ab' * 32} \\\n"
        f"    --hash=sha256:{'cd' * 32}\n"
    )


def test_a_swap_killed_midway_is_finished_by_the_next_assembly(tmp_path: Path) -> None:
    """A run killed after moving the old wheelhouse aside, before the new one took its
    place: the next run puts the old one back first, then replaces it as usual."""
    old = tmp_path / ".wheelhouse-old-abc"
    (old / "wheelhouse").mkdir(parents=True)
    (old / "wheelhouse" / "kept.whl").write_text("old")
    (tmp_path / ".wheelhouse-new-def").mkdir()
    (tmp_path / ".wheelhouse-new-def" / "half.whl").write_text("half")
    wheel = finalize_wheel(demo_wheel(tmp_path), tmp_path, {})
    wheelhouse = tmp_path / "wheelhouse"
    assemble_wheelhouse([wheel], [], [], wheelhouse)
    assert sorted(p.name for p in wheelhouse.iterdir()) == [
        "SHA256SUMS",
        wheel.name,
        "requirements.txt",
    ]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".wheelhouse-")]
    assert wheelhouse.stat().st_mode & 0o777 == 0o755


def test_leftovers_beside_a_whole_wheelhouse_are_only_removed(tmp_path: Path) -> None:
    wheelhouse = tmp_path / "wheelhouse"
    wheelhouse.mkdir()
    (wheelhouse / "current.whl").write_text("current")
    old = tmp_path / ".wheelhouse-old-abc"
    (old / "wheelhouse").mkdir(parents=True)
    (old / "wheelhouse" / "older.whl").write_text("older")
    with pytest.raises(FileNotFoundError):  # a failing assembly: only the clean-up shows
        assemble_wheelhouse([tmp_path / "absent-1.0-py3-none-any.whl"], [], [], wheelhouse)
    assert [p.name for p in wheelhouse.iterdir()] == ["current.whl"]
    assert not old.exists()


def test_auditwheel_failing_to_classify_is_named(tmp_path: Path) -> None:
    (tmp_path / "out").mkdir()
    pure = finalize_wheel(demo_wheel(tmp_path), tmp_path / "out", {})
    with pytest.raises(UserError) as refused:
        manylinux_tag(pure)
    message = str(refused.value)
    assert message.startswith(f"auditwheel could not classify {pure.name}:\n")
    assert message.rstrip().endswith("found in the wheel archive")  # auditwheel's own words


def test_pip_wheel_runs_without_isolation_or_dependencies(tmp_path: Path) -> None:
    assert pip_wheel_command(tmp_path / "src", tmp_path / "out", "--quiet") == [
        sys.executable,
        "-m",
        "pip",
        "wheel",
        "--no-build-isolation",
        "--no-deps",
        "--quiet",
        "--wheel-dir",
        str(tmp_path / "out"),
        str(tmp_path / "src"),
    ]


def test_the_upstream_record_names_the_sdist_and_each_patch_in_order(tmp_path: Path) -> None:
    series = tmp_path / "patches" / "demo"
    series.mkdir(parents=True)
    texts = {}
    for name in ("0002-second.patch", "0001-first.patch"):
        texts[name] = (
            "Description: a change\nOrigin: other\nForwarded: not-needed\n---\n"
            f"--- a/{name}.txt\n+++ b/{name}.txt\n@@ -0,0 +1 @@\n+x\n"
        )
        (series / name).write_text(texts[name])
    (series / "series").write_text("0001-first.patch\n0002-second.patch\n")
    upstream = Upstream("demo", "demo", "1.0", "demo-1.0.tar.gz", "ef" * 32, "", "", "")
    assert upstream_record(tmp_path, series, upstream) == {
        "upstream": {
            "project": "demo",
            "version": "1.0",
            "sdist": "demo-1.0.tar.gz",
            "sha256": "ef" * 32,
        },
        "patches": [
            {
                "file": f"patches/demo/{name}",
                "sha256": hashlib.sha256(texts[name].encode()).hexdigest(),
            }
            for name in ("0001-first.patch", "0002-second.patch")
        ],
    }


def test_a_source_wheels_record_does_not_change_the_label(tmp_path: Path) -> None:
    """RECORD is rewritten anyway: two wheels that differ only there are the same wheel."""
    labels = []
    for number, record in enumerate((b"", b"demo/tool,sha256=stale,1\n")):
        directory = tmp_path / str(number)
        directory.mkdir()
        wheel = wheel_with_modes(directory, {"demo/tool": 0o644})
        with zipfile.ZipFile(wheel, "a") as archive:
            archive.writestr("demo-1.0.dist-info/RECORD", record)
        labels.append(finalize_wheel(wheel, directory, {}, None, True).read_bytes())
    assert labels[0] == labels[1]


def test_requirements_are_sorted_by_file_name_wherever_the_wheels_lie(tmp_path: Path) -> None:
    wheels = []
    for directory, name in (
        ("a", "zeta_pkg-2.0-py3-none-any.whl"),
        ("b", "alpha_pkg-1.0-py3-none-any.whl"),
    ):
        (tmp_path / directory).mkdir()
        (tmp_path / directory / name).write_bytes(name.encode())
        wheels.append(tmp_path / directory / name)
    lines = requirement_lines(wheels, []).splitlines()
    assert [line.split("==")[0] for line in lines if "==" in line] == ["alpha-pkg", "zeta-pkg"]


def test_a_failing_assembly_after_a_killed_swap_leaves_the_old_wheelhouse_back(
    tmp_path: Path,
) -> None:
    old = tmp_path / ".wheelhouse-old-abc"
    (old / "wheelhouse").mkdir(parents=True)
    (old / "wheelhouse" / "kept.whl").write_text("old")
    wheelhouse = tmp_path / "wheelhouse"
    with pytest.raises(FileNotFoundError):
        assemble_wheelhouse([tmp_path / "absent-1.0-py3-none-any.whl"], [], [], wheelhouse)
    assert [p.name for p in wheelhouse.iterdir()] == ["kept.whl"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".wheelhouse-")]


def test_a_failing_first_assembly_raises_its_own_error_and_leaves_nothing(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"absent-1\.0-py3-none-any\.whl"):
        assemble_wheelhouse(
            [tmp_path / "absent-1.0-py3-none-any.whl"], [], [], tmp_path / "wheelhouse"
        )
    assert list(tmp_path.iterdir()) == []


def git_tree(root: Path, files: dict[str, str]) -> Path:
    """A committed git work tree holding `files`, as vendor/NAME is."""
    root.mkdir()
    for name, text in files.items():
        (root / name).write_text(text)
    git = ["git", "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "tree"], check=True)
    return root


PYPROJECT = (
    '[build-system]\nrequires = ["setuptools"]\nbuild-backend = "setuptools.build_meta"\n\n'
    '[project]\nname = "treepkg"\nversion = "1.0"\n'
)


def test_a_python_wheel_is_built_from_the_trees_head_outside_any_repository(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    tree = git_tree(tmp_path / "treepkg", {"pyproject.toml": PYPROJECT, "treepkg.py": "X = 1\n"})
    (tree / "treepkg.py").write_text("X = 'uncommitted'\n")  # HEAD is built, not the work tree
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")
    seen: list[Path] = []

    def prepare(stage: Path) -> None:
        seen.append(stage)
        assert not (stage / ".git").exists()
        (stage / "added.txt").write_text("prepared\n")

    (tmp_path / "out").mkdir()
    wheel = build_python_wheel(tree, tmp_path / "out", {"TREEPKG_FLAG": "1"}, prepare)
    assert wheel == tmp_path / "out" / "treepkg-1.0-py3-none-any.whl"
    assert seen and seen[0].name == "treepkg" and not seen[0].exists()  # scratch removed
    with zipfile.ZipFile(wheel) as archive:
        assert archive.read("treepkg.py") == b"X = 1\n"
        assert {info.date_time for info in archive.infolist()} == {(2023, 11, 14, 22, 13, 20)}
    err = capsys.readouterr().err
    assert "sm120-build: building the treepkg wheel ...\n" in err
    assert "sm120-build: building the treepkg wheel: done in " in err


def test_a_python_wheel_that_fails_to_build_says_why(tmp_path: Path) -> None:
    broken = PYPROJECT.replace('version = "1.0"', 'version = "not a version"')
    tree = git_tree(tmp_path / "treepkg", {"pyproject.toml": broken, "treepkg.py": ""})
    (tmp_path / "out").mkdir()
    with pytest.raises(UserError) as refused:
        build_python_wheel(tree, tmp_path / "out", {})
    message = str(refused.value)
    assert message.startswith("building the treepkg wheel failed:\n")
    assert "not a version" in message
    assert list((tmp_path / "out").iterdir()) == []


def test_a_build_that_leaves_two_wheels_is_refused(tmp_path: Path) -> None:
    tree = git_tree(tmp_path / "treepkg", {"pyproject.toml": PYPROJECT, "treepkg.py": ""})
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "stale-0.1-py3-none-any.whl").write_bytes(b"old")
    with pytest.raises(UserError, match=r"^expected one wheel from treepkg, found \["):
        build_python_wheel(tree, tmp_path / "out", {})
