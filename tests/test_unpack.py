"""Unpacking a verified sdist (vendor/unpack.py): what a link may point at, the refusals by
their whole message, the `data` filter behind our own checks, and the pristine commit."""

from __future__ import annotations

import io
import stat
import subprocess
import tarfile
import tempfile
from pathlib import Path, PurePosixPath

import pytest

from sm120_build.errors import UserError
from sm120_build.pins import Upstream
from sm120_build.vendor.unpack import _escapes, make_pristine_tree, unpack_sdist

from .conftest import install_this_project


def tarball(path: Path, *members: tarfile.TarInfo, data: dict[str, bytes] | None = None) -> Path:
    with tarfile.open(path, "w:gz") as archive:
        for member in members:
            content = (data or {}).get(member.name)
            if content is not None:
                member.size = len(content)
            archive.addfile(member, io.BytesIO(content) if content is not None else None)
    return path


def entry(
    name: str, kind: bytes = tarfile.REGTYPE, link: str = "", mode: int = 0o644
) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.mode = kind, link, mode
    return info


@pytest.mark.parametrize(
    ("path", "escapes"),
    [
        ("a", False),
        ("a/..", False),
        ("a/b/../..", False),
        ("a/b/../../c", False),
        ("..", True),
        ("../a", True),
        ("a/../..", True),
        ("a/b/../../..", True),
    ],
)
def test_a_path_escapes_when_it_climbs_above_its_start(path: str, escapes: bool) -> None:
    assert _escapes(PurePosixPath(path)) is escapes


def test_a_symlink_points_from_its_own_directory(tmp_path: Path) -> None:
    """`../x` from demo-1.0/sub/link is demo-1.0/x: inside the tree."""
    sdist = tarball(
        tmp_path / "ok.tar.gz",
        entry("demo-1.0/x"),
        entry("demo-1.0/sub/link", tarfile.SYMTYPE, "../x"),
        data={"demo-1.0/x": b"x"},
    )
    unpack_sdist(sdist, tmp_path / "out")
    assert (tmp_path / "out/sub/link").read_text() == "x"


def test_a_hard_link_points_from_the_archive_root(tmp_path: Path) -> None:
    """A hard link's target is a member name: `../x` from the root is outside, wherever the
    link itself sits."""
    sdist = tarball(tmp_path / "bad.tar.gz", entry("demo-1.0/a/b/link", tarfile.LNKTYPE, "../x"))
    with pytest.raises(UserError) as caught:
        unpack_sdist(sdist, tmp_path / "out")
    assert str(caught.value) == (
        "bad.tar.gz: refusing link 'demo-1.0/a/b/link' -> '../x', which points outside the tree"
    )


def test_a_device_file_is_refused(tmp_path: Path) -> None:
    sdist = tarball(tmp_path / "dev.tar.gz", entry("demo-1.0/null", tarfile.CHRTYPE))
    with pytest.raises(UserError) as caught:
        unpack_sdist(sdist, tmp_path / "out")
    assert str(caught.value) == "dev.tar.gz: refusing device file 'demo-1.0/null'"


def test_a_symlink_chain_out_of_the_tree_is_caught_by_the_data_filter(tmp_path: Path) -> None:
    """Each link alone stays inside (up -> .., up/out -> ..), so our own check passes them;
    followed on disk they lead out of the scratch directory, which tarfile's `data` filter
    refuses."""
    sdist = tarball(
        tmp_path / "chain.tar.gz",
        entry("demo-1.0/up", tarfile.SYMTYPE, ".."),
        entry("demo-1.0/up/out", tarfile.SYMTYPE, ".."),
    )
    (tmp_path / "work").mkdir()
    with pytest.raises(UserError) as caught:
        unpack_sdist(sdist, tmp_path / "work" / "out")
    assert str(caught.value).startswith("chain.tar.gz: refusing to unpack: ")
    assert not (tmp_path / "work" / "out").exists()


def test_the_data_filter_drops_setuid_and_group_write_bits(tmp_path: Path) -> None:
    sdist = tarball(
        tmp_path / "mode.tar.gz",
        entry("demo-1.0/tool", mode=0o4777),
        data={"demo-1.0/tool": b"#!/bin/sh\n"},
    )
    unpack_sdist(sdist, tmp_path / "out")
    assert stat.S_IMODE((tmp_path / "out/tool").stat().st_mode) == 0o755


def test_unreadable_and_many_rooted_tarballs_are_named(tmp_path: Path) -> None:
    junk = tmp_path / "junk.tar.gz"
    junk.write_bytes(b"not a tarball")
    with pytest.raises(UserError) as caught:
        unpack_sdist(junk, tmp_path / "out")
    assert str(caught.value).startswith(f"cannot open {junk} as a tarball: ")
    two = tarball(tmp_path / "two.tar.gz", entry("b/x"), entry("a/y"))
    with pytest.raises(UserError) as caught:
        unpack_sdist(two, tmp_path / "out")
    assert str(caught.value) == "two.tar.gz: expected one top-level directory, got ['a', 'b']"


def test_it_unpacks_beside_its_destination_not_in_the_system_temp(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The scratch directory sits beside the destination, so the final rename stays on one
    file system and a half-unpacked tree never lands at the destination."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "no-such-temp"))
    sdist = tarball(tmp_path / "ok.tar.gz", entry("demo-1.0/a"), data={"demo-1.0/a": b"a"})
    unpack_sdist(sdist, tmp_path / "out")
    assert (tmp_path / "out/a").read_text() == "a"


def test_the_pristine_commit_holds_every_file_on_main(tmp_path: Path) -> None:
    """Files the sdist's own .gitignore names are upstream's too: they are committed."""
    sdist = tarball(
        tmp_path / "demo-1.0.tar.gz",
        entry("demo-1.0/.gitignore"),
        entry("demo-1.0/built.so"),
        data={"demo-1.0/.gitignore": b"*.so\n", "demo-1.0/built.so": b"\x7fELF"},
    )
    upstream = Upstream("demo", "demo", "1.0", sdist.name, "0" * 64, "", "", "")
    tree = tmp_path / "tree"
    commit = make_pristine_tree(upstream, sdist, tree)

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", *args], cwd=tree, capture_output=True, text=True, check=True
        ).stdout.strip()

    assert git("rev-parse", "HEAD") == commit
    assert git("symbolic-ref", "--short", "HEAD") == "main"
    assert git("ls-tree", "--name-only", "HEAD").split() == [".gitignore", "built.so"]
    assert git("status", "--porcelain") == ""


def _python_without_tar_filters() -> str | None:
    """An interpreter on this machine whose tarfile lacks PEP 706's filters (Debian 12's
    /usr/bin/python3 is 3.11.2), if there is one."""
    for candidate in ("/usr/bin/python3", "/usr/bin/python3.11", "/usr/bin/python3.10"):
        if Path(candidate).is_file():
            probe = subprocess.run(
                [candidate, "-c", "import tarfile, sys; sys.exit(hasattr(tarfile, 'data_filter'))"],
                capture_output=True,
            )
            if probe.returncode == 0:
                return candidate
    return None


@pytest.mark.slow
def test_a_python_without_tar_filters_unpacks_as_strictly(tmp_path: Path) -> None:
    """On Debian 12's 3.11.2 the package installs and unpacks with the same `data` filter:
    the link chain out of the tree is refused, setuid bits are dropped (it crashed with
    AttributeError: tarfile.FilterError before backports.tarfile stood in)."""
    python = _python_without_tar_filters()
    if python is None:
        pytest.skip("no interpreter without tarfile's filters on this machine")
    subprocess.run([python, "-m", "venv", str(tmp_path / "venv")], check=True)
    venv_python = str(tmp_path / "venv" / "bin" / "python")
    install_this_project(venv_python, tmp_path, "forge")
    chain = tarball(
        tmp_path / "chain.tar.gz",
        entry("demo-1.0/up", tarfile.SYMTYPE, ".."),
        entry("demo-1.0/up/out", tarfile.SYMTYPE, ".."),
    )
    tarball(
        tmp_path / "mode.tar.gz",
        entry("demo-1.0/tool", mode=0o4777),
        data={"demo-1.0/tool": b"#!/bin/sh\n"},
    )
    script = (
        "import sys, stat; from pathlib import Path\n"
        "from sm120_build.errors import UserError\n"
        "from sm120_build.vendor.unpack import unpack_sdist\n"
        "root = Path(sys.argv[1])\n"
        "(root / 'work').mkdir()\n"
        "try:\n"
        "    unpack_sdist(root / 'chain.tar.gz', root / 'work' / 'out')\n"
        "except UserError as exc:\n"
        "    print('refused:', exc)\n"
        "unpack_sdist(root / 'mode.tar.gz', root / 'mode')\n"
        "print('mode', oct(stat.S_IMODE((root / 'mode' / 'tool').stat().st_mode)))\n"
    )
    result = subprocess.run(
        [venv_python, "-c", script, str(tmp_path)], capture_output=True, text=True, cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr
    assert chain.name in result.stdout
    assert "refused: chain.tar.gz: refusing to unpack: " in result.stdout
    assert not (tmp_path / "work" / "out").exists()
    assert "mode 0o755" in result.stdout
