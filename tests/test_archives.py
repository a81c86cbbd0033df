"""check_wheel, the gate for wheels taken from outside (a --base-jit-cache wheel, a shard
from another machine): each refusal, by its whole message, on wheels written here member by
member."""

from __future__ import annotations

import base64
import hashlib
import stat
import warnings
import zipfile
from pathlib import Path

import pytest

from sm120_build.archives import _kind_problem, _name_problem, check_wheel
from sm120_build.errors import UserError

RECORD = "demo-1.0.dist-info/RECORD"
TRUSTED = "Nothing of it was used; rebuild it, or take it from a source you trust."


def digest(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).decode().rstrip("=")


def record_rows(files: dict[str, bytes]) -> str:
    """RECORD's rows for the files (directories have none)."""
    return "".join(
        f"{name},{digest(data)},{len(data)}\n" for name, data in files.items() if name[-1:] != "/"
    )


def write(
    path: Path,
    members: list[tuple[str, bytes]],
    record: str | bytes | None = None,
    modes: dict[str, int] | None = None,
) -> Path:
    """A zip of `members` in order, then RECORD (by default listing them all, itself last)."""
    files = dict(members)
    text = record if record is not None else record_rows(files) + f"{RECORD},,\n"
    data = text if isinstance(text, bytes) else text.encode()
    with zipfile.ZipFile(path, "w") as archive, warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # zipfile warns of a repeated name
        for name, content in [*members, (RECORD, data)]:
            info = zipfile.ZipInfo(name)
            info.external_attr = (modes or {}).get(name, 0o100644) << 16
            archive.writestr(info, content)
    return path


def anywhere(name: str) -> str | None:
    return None


def refusal(path: Path, where: object = anywhere) -> str:
    with pytest.raises(UserError) as caught:
        check_wheel(path, where, "shard")  # type: ignore[arg-type]
    return str(caught.value)


def test_a_well_formed_wheel_with_directories_passes(tmp_path: Path) -> None:
    def only_pkg(name: str) -> str | None:
        return None if name.startswith(("pkg/", "demo-1.0.dist-info/")) else "is elsewhere"

    path = write(tmp_path / "w.whl", [("pkg/", b""), ("other/", b""), ("pkg/a.so", b"x" * 9)])
    check_wheel(path, only_pkg, "shard")  # directories are not asked about; "pkg/" is clean


@pytest.mark.parametrize(
    ("name", "problem"),
    [
        ("a\\b", "is not a plain POSIX path"),
        ("a\0b", "is not a plain POSIX path"),
        ("", "is not a plain POSIX path"),
        ("/etc/passwd", "is an absolute path"),
        ("/", "is an absolute path"),
        ("a//b", "is not a normalised relative path (it has '..', '.' or an empty part)"),
        ("a/../b", "is not a normalised relative path (it has '..', '.' or an empty part)"),
        ("./a", "is not a normalised relative path (it has '..', '.' or an empty part)"),
        ("a//X", "is not a normalised relative path (it has '..', '.' or an empty part)"),
        ("a/b/", None),
        ("a/b", None),
    ],
)
def test_member_names(name: str, problem: str | None) -> None:
    assert _name_problem(name) == problem


@pytest.mark.parametrize(
    ("name", "problem"),
    [
        ("a\\b", "is not a plain POSIX path"),
        ("/abs", "is an absolute path"),
        ("a/../b", "is not a normalised relative path (it has '..', '.' or an empty part)"),
    ],
)
def test_a_bad_name_refuses_the_wheel_whole(tmp_path: Path, name: str, problem: str) -> None:
    path = write(tmp_path / "w.whl", [("ok.so", b"1"), (name, b"2")])
    assert refusal(path) == f"shard w.whl: refusing member {name!r}: it {problem}. {TRUSTED}"


@pytest.mark.parametrize(
    ("mode", "problem"),
    [
        (stat.S_IFLNK | 0o777, "is a symbolic link"),
        (stat.S_IFCHR | 0o600, "is a device or other special file"),
        (stat.S_IFIFO | 0o600, "is a device or other special file"),
    ],
)
def test_links_and_special_files_are_refused(tmp_path: Path, mode: int, problem: str) -> None:
    info = zipfile.ZipInfo("x")
    info.external_attr = mode << 16
    assert _kind_problem(info) == problem
    path = write(tmp_path / "w.whl", [("x", b"/etc/passwd")], modes={"x": mode})
    assert refusal(path) == f"shard w.whl: refusing member 'x': it {problem}. {TRUSTED}"


def test_a_repeated_member_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path / "w.whl", [("a.so", b"1"), ("a.so", b"2")], record="")
    assert refusal(path) == f"shard w.whl: refusing member 'a.so': it appears twice. {TRUSTED}"


def test_where_the_caller_refuses_a_file(tmp_path: Path) -> None:
    path = write(tmp_path / "w.whl", [("elsewhere.so", b"1")])
    problem = refusal(
        path, lambda name: "lies outside jit_cache/" if name == "elsewhere.so" else None
    )
    assert problem == (
        f"shard w.whl: refusing member 'elsewhere.so': it lies outside jit_cache/. {TRUSTED}"
    )


def test_not_a_zip(tmp_path: Path) -> None:
    path = tmp_path / "w.whl"
    path.write_bytes(b"not a zip")
    assert refusal(path) == "shard w.whl is not a readable wheel (zip): File is not a zip file"


def test_record_count_and_form(tmp_path: Path) -> None:
    path = tmp_path / "none.whl"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("a.so", b"1")
    assert refusal(path) == "shard none.whl has 0 .dist-info/RECORD files"
    path = write(tmp_path / "two.whl", [("x-1.dist-info/RECORD", b"")])
    assert refusal(path) == "shard two.whl has 2 .dist-info/RECORD files"
    path = write(tmp_path / "bytes.whl", [("a.so", b"1")], record=b"\xff")
    assert refusal(path).startswith("shard bytes.whl: RECORD is not CSV (")
    path = write(tmp_path / "short.whl", [("a.so", b"1")], record="a.so,sha256=x\n")
    assert refusal(path) == "shard short.whl: RECORD row ['a.so', 'sha256=x'] is not 3 fields"


def test_record_must_list_exactly_the_members(tmp_path: Path) -> None:
    files = {f"f{n}.so": b"%d" % n for n in range(4)}
    unlisted = write(tmp_path / "unlisted.whl", list(files.items()), record=f"{RECORD},,\n")
    assert refusal(unlisted) == (
        "shard unlisted.whl: RECORD does not match its members (not listed: "
        "['f0.so', 'f1.so', 'f2.so']; listed but absent: [])"
    )
    ghosts = record_rows({f"g{n}.so": b"" for n in range(4)})
    absent = write(tmp_path / "absent.whl", [], record=ghosts + f"{RECORD},,\n")
    assert refusal(absent) == (
        "shard absent.whl: RECORD does not match its members (not listed: []; "
        "listed but absent: ['g0.so', 'g1.so', 'g2.so'])"
    )


def test_every_file_after_the_records_own_row_is_checked(tmp_path: Path) -> None:
    record = f"{RECORD},,\n" + record_rows({"a.so": b"good"})
    path = write(tmp_path / "w.whl", [("a.so", b"evil")], record=record)  # same size
    assert refusal(path) == (
        "shard w.whl: a.so does not match its RECORD hash; the wheel was changed after it was built"
    )


def test_a_size_that_does_not_match_is_refused(tmp_path: Path) -> None:
    record = record_rows({"a.so": b"1"}).replace(",1\n", ",2\n") + f"{RECORD},,\n"
    path = write(tmp_path / "w.whl", [("a.so", b"1")], record=record)
    assert "a.so does not match its RECORD hash" in refusal(path)
