"""wheelhouse/SHA256SUMS read back strictly, in process (the publish and node tests reach it
through their command lines only)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from sm120_build.errors import UserError
from sm120_build.sums import SUMS_FILE, checked_wheels


def wheelhouse(tmp_path: Path, wheels: dict[str, bytes]) -> Path:
    house = tmp_path / "wheelhouse"
    house.mkdir()
    lines = []
    for name, content in wheels.items():
        (house / name).write_bytes(content)
        lines.append(f"{hashlib.sha256(content).hexdigest()}  {name}")
    (house / SUMS_FILE).write_text("".join(line + "\n" for line in lines))
    return house


def refusal(house: Path) -> str:
    """What checked_wheels refuses the wheelhouse with."""
    with pytest.raises(UserError) as error:
        checked_wheels(house)
    return str(error.value)


def test_every_listed_wheel_comes_back_with_its_sha256(tmp_path: Path) -> None:
    big = bytes(range(256)) * 5000  # over one read block (1 MiB)
    house = wheelhouse(tmp_path, {"a-1-py3-none-any.whl": b"a", "b-1-py3-none-any.whl": big})
    assert checked_wheels(house) == {
        house / "a-1-py3-none-any.whl": hashlib.sha256(b"a").hexdigest(),
        house / "b-1-py3-none-any.whl": hashlib.sha256(big).hexdigest(),
    }


def test_a_missing_sums_file_says_to_build(tmp_path: Path) -> None:
    house = tmp_path / "wheelhouse"
    house.mkdir()
    with pytest.raises(UserError, match=r"SHA256SUMS is missing: run `nox -s build_wheels`"):
        checked_wheels(house)


@pytest.mark.parametrize(
    "line",
    [
        "0" * 63 + "  a-1-py3-none-any.whl",  # short hash
        "A" * 64 + "  a-1-py3-none-any.whl",  # upper-case hex
        "0" * 64 + " a-1-py3-none-any.whl",  # one space
        "0" * 64 + "  ../a-1-py3-none-any.whl",  # a path
        "0" * 64 + "  a-1.tar.gz",  # not a wheel
    ],
)
def test_a_malformed_line_is_refused_with_its_number(tmp_path: Path, line: str) -> None:
    house = wheelhouse(tmp_path, {"a-1-py3-none-any.whl": b"a"})
    sums = house / SUMS_FILE
    sums.write_text(sums.read_text() + line + "\n")
    assert refusal(house) == (
        f"{sums}:2 is not '<sha256>  <wheel file name>': {line[:80]!r}. "
        "Rebuild the wheelhouse with `nox -s build_wheels`."
    )


def test_a_wheel_beside_them_is_refused(tmp_path: Path) -> None:
    house = wheelhouse(tmp_path, {"a-1-py3-none-any.whl": b"a"})
    (house / "planted-1-py3-none-any.whl").write_bytes(b"x")
    assert refusal(house) == (
        f"{house / 'planted-1-py3-none-any.whl'} is not listed in SHA256SUMS: it was not built "
        "with this wheelhouse. Remove it, or rebuild with `nox -s build_wheels`."
    )


def test_a_changed_wheel_is_refused_naming_both_hashes(tmp_path: Path) -> None:
    house = wheelhouse(tmp_path, {"a-1-py3-none-any.whl": b"a"})
    (house / "a-1-py3-none-any.whl").write_bytes(b"b")
    assert refusal(house) == (
        f"{house / 'a-1-py3-none-any.whl'} does not match SHA256SUMS (sha256 "
        f"{hashlib.sha256(b'b').hexdigest()}, listed {hashlib.sha256(b'a').hexdigest()}): it "
        "changed after the build. Rebuild with `nox -s build_wheels`, or copy the wheelhouse "
        "again."
    )


def test_listed_wheels_that_are_gone_are_named(tmp_path: Path) -> None:
    wheels = {f"{name}-1-py3-none-any.whl": name.encode() for name in "abc"}
    house = wheelhouse(tmp_path, wheels)
    (house / "b-1-py3-none-any.whl").unlink()
    (house / "c-1-py3-none-any.whl").unlink()
    assert refusal(house) == (
        f"{house} lacks b-1-py3-none-any.whl, c-1-py3-none-any.whl, which SHA256SUMS lists"
    )


def test_an_empty_wheelhouse_says_to_build(tmp_path: Path) -> None:
    house = wheelhouse(tmp_path, {})
    with pytest.raises(UserError, match=r"holds no wheels: run `nox -s build_wheels`"):
        checked_wheels(house)
