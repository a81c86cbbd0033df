"""The cache's smaller rules, each by what it says and does: adoption, scratch clean-up and
its depth, the lock's pid, manifests and their reasons, cache keys."""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from sm120_build.cache import (
    MANIFEST,
    MARKER,
    SCRATCH_PREFIX,
    adopt_cache,
    cache_lock,
    cached_wheel,
    clean_scratch,
    digest,
    exclusive_lock,
    files_digest,
    scratch_directory,
    sha256_of,
    store_entry,
    store_wheel,
    verified_entry,
)
from sm120_build.errors import UserError


def test_a_file_or_a_link_is_not_adopted_as_the_cache(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    (tmp_path / "dir").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "dir")
    for name in ("file", "link"):
        with pytest.raises(UserError) as refused:
            adopt_cache(tmp_path / name, force=True)
        assert str(refused.value) == (
            f"{tmp_path / name} is not a directory; set SM120_CACHE_DIR to a directory of its own"
        )
    assert list((tmp_path / "dir").iterdir()) == []


def test_an_unmarked_directory_is_refused_by_its_whole_message(tmp_path: Path) -> None:
    (tmp_path / "theirs").write_text("x")
    with pytest.raises(UserError) as refused:
        adopt_cache(tmp_path, force=False)
    assert str(refused.value) == (
        f"{tmp_path} is not empty and is not marked as an sm120-build cache ({MARKER}): this "
        "tool would write into it and clean its scratch there. Point SM120_CACHE_DIR at a "
        "directory of its own, or pass --force to adopt this one."
    )
    assert not (tmp_path / MARKER).exists()


def test_a_new_cache_is_created_and_marked(tmp_path: Path) -> None:
    cache = tmp_path / "a" / "b"
    adopt_cache(cache, force=False)
    assert (cache / MARKER).read_text() == (
        "This directory is the cache of sm120-build (sdists, the CUDA toolkit, built wheels "
        "and modules).\nScratch directories here are named .sm120-tmp-<pid>-...; the next run "
        "removes those an interrupted run left.\n"
    )


def scratch(parent: Path, name: str = "x") -> Path:
    path = parent / f"{SCRATCH_PREFIX}{os.getpid()}-{name}"
    path.mkdir(parents=True)
    return path


def test_scratch_is_cleaned_three_levels_deep_and_no_deeper(tmp_path: Path) -> None:
    adopt_cache(tmp_path, force=False)
    levels = [tmp_path, tmp_path / "a", tmp_path / "a" / "b", tmp_path / "a" / "b" / "c"]
    made = [scratch(level) for level in levels]
    (tmp_path / f"{SCRATCH_PREFIX}{os.getpid()}-file").write_text("x")
    (tmp_path / f"{SCRATCH_PREFIX}{os.getpid()}-link").symlink_to(tmp_path / "a")
    assert clean_scratch(tmp_path) == 5
    assert [path.exists() for path in made] == [False, False, False, True]
    assert (tmp_path / "a").is_dir()  # the link's target stays


def test_scratch_names_must_carry_a_pid(tmp_path: Path) -> None:
    adopt_cache(tmp_path, force=False)
    kept = [tmp_path / f"{SCRATCH_PREFIX}x-1", tmp_path / "sm120-tmp-1-x"]
    for path in kept:
        path.mkdir()
    assert clean_scratch(tmp_path) == 0
    assert all(path.is_dir() for path in kept)


def test_pip_and_linked_directories_are_not_searched_for_scratch(tmp_path: Path) -> None:
    adopt_cache(tmp_path, force=False)
    in_pip = scratch(tmp_path / "pip")
    elsewhere = tmp_path.parent / f"{tmp_path.name}-elsewhere"
    in_link = scratch(elsewhere)
    (tmp_path / "linked").symlink_to(elsewhere)
    assert clean_scratch(tmp_path) == 0
    assert in_pip.is_dir() and in_link.is_dir()


def test_an_unmarked_cache_is_never_cleaned(tmp_path: Path) -> None:
    left = scratch(tmp_path)
    assert clean_scratch(tmp_path) == 0
    assert left.is_dir()


@pytest.mark.parametrize(("count", "word"), [(1, "directory"), (2, "directories")])
def test_the_lock_says_how_much_scratch_it_removed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], count: int, word: str
) -> None:
    adopt_cache(tmp_path, force=False)
    for number in range(count):
        scratch(tmp_path, str(number))
    with cache_lock(tmp_path):
        pass
    assert capsys.readouterr().err == (
        f"sm120-build: removed {count} scratch {word} left in the cache by an interrupted run\n"
    )
    with cache_lock(tmp_path):
        pass
    assert capsys.readouterr().err == ""


def test_the_lock_holds_its_holders_pid_and_checkout(tmp_path: Path) -> None:
    with exclusive_lock(tmp_path / "lock", "x"):
        assert (tmp_path / "lock").read_text() == f"{os.getpid()} {Path.cwd()}\n"
        assert (tmp_path / "lock").stat().st_mode & 0o777 == 0o600


def test_a_waiter_names_the_holders_checkout(tmp_path: Path) -> None:
    """A build waited 28 minutes on "another build of the same inputs (pid N)": the pid
    of an unrelated checkout, which the message did not name."""
    checkout = tmp_path / "other-checkout"
    checkout.mkdir()
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time\n"
            "from pathlib import Path\n"
            "from sm120_build.cache import exclusive_lock\n"
            "with exclusive_lock(Path(sys.argv[1]), 'x'):\n"
            "    print('held', flush=True)\n"
            "    time.sleep(1.5)\n",
            str(tmp_path / "lock"),
        ],
        cwd=checkout,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout is not None and holder.stdout.readline() == "held\n"
    waiter = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys\nfrom pathlib import Path\nfrom sm120_build.cache import exclusive_lock\n"
            "with exclusive_lock(Path(sys.argv[1]), 'another build of the same inputs'):\n"
            "    pass\n",
            str(tmp_path / "lock"),
        ],
        capture_output=True,
        text=True,
    )
    holder.wait()
    holder.stdout.close()
    assert waiter.stderr == (
        "sm120-build: waiting for another build of the same inputs "
        f"(pid {holder.pid}, in {checkout})\n"
    )


def test_a_lock_that_cannot_be_opened_is_named(tmp_path: Path) -> None:
    with (
        pytest.raises(UserError) as refused,
        exclusive_lock(tmp_path / "missing" / "lock", "x"),
    ):
        pass
    assert str(refused.value) == (
        f"cannot open the lock {tmp_path / 'missing' / 'lock'}: No such file or directory"
    )


def test_scratch_directories_carry_pid_and_purpose_and_go_away(tmp_path: Path) -> None:
    with scratch_directory(tmp_path / "new", "download") as path:
        assert path.parent == tmp_path / "new"
        assert re.fullmatch(rf"\.sm120-tmp-{os.getpid()}-download-\w+", path.name)
    assert not path.exists()


def entry_with(tmp_path: Path, files: dict[str, bytes]) -> Path:
    staging = tmp_path / "staging"
    staging.mkdir()
    for name, content in files.items():
        (staging / name).parent.mkdir(parents=True, exist_ok=True)
        (staging / name).write_bytes(content)
    store_entry(staging, tmp_path / "entry")
    return tmp_path / "entry"


def test_the_manifest_lists_every_file_and_link_by_path(tmp_path: Path) -> None:
    staging = tmp_path / "staging"
    (staging / "sub").mkdir(parents=True)
    (staging / "a.so").write_bytes(b"a")
    (staging / "sub" / "b.json").write_bytes(b"b")
    (staging / "link").symlink_to("a.so")
    store_entry(staging, tmp_path / "entry")
    assert (tmp_path / "entry" / MANIFEST).read_text() == (
        f"{sha256_of(tmp_path / 'entry' / 'a.so')}  a.so\n"
        "link a.so  link\n"
        f"{sha256_of(tmp_path / 'entry' / 'sub' / 'b.json')}  sub/b.json\n"
    )
    assert verified_entry(tmp_path / "entry", "x") == tmp_path / "entry"


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        ("remove manifest", "has no manifest"),
        ("binary manifest", "does not match its manifest"),
        ("extra file", "does not match its manifest"),
    ],
)
def test_a_damaged_entry_says_why_it_is_discarded(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], damage: str, reason: str
) -> None:
    entry = entry_with(tmp_path, {"a.so": b"a"})
    if damage == "remove manifest":
        (entry / MANIFEST).unlink()
    elif damage == "binary manifest":
        (entry / MANIFEST).write_bytes(b"\xff\xfe")
    else:
        (entry / "b.so").write_bytes(b"b")
    assert verified_entry(entry, "module norm") is None
    assert capsys.readouterr().err == (
        f"sm120-build: cached module norm at {entry} {reason}; discarding it and building it "
        "again\n"
    )
    assert not entry.exists()


def test_a_link_leading_out_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "outside").write_bytes(b"o")
    entry = entry_with(tmp_path, {"a.so": b"a"})
    (entry / "sub").mkdir()
    (entry / "sub" / "out").symlink_to(tmp_path / "outside")
    (entry / MANIFEST).write_text(
        f"{sha256_of(entry / 'a.so')}  a.so\nlink {tmp_path / 'outside'}  sub/out\n"
    )
    assert verified_entry(entry, "w") is None
    assert "holds a link leading out of it (sub/out); discarding it" in capsys.readouterr().err


def test_a_missing_entry_is_none_and_says_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert verified_entry(tmp_path / "absent", "w") is None
    (tmp_path / "file").write_text("x")
    assert verified_entry(tmp_path / "file", "w") is None
    assert (tmp_path / "file").is_file()
    assert capsys.readouterr().err == ""


def test_a_linked_entry_is_unlinked_with_a_message(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    entry = entry_with(tmp_path, {"a.so": b"a"})
    (tmp_path / "linked").symlink_to(entry)
    assert verified_entry(tmp_path / "linked", "w") is None
    assert capsys.readouterr().err == (
        f"sm120-build: cached w at {tmp_path / 'linked'} is a symbolic link; removing the "
        "link, not following it\n"
    )
    assert entry.is_dir()


def test_a_stored_wheel_comes_back_with_its_side_files(tmp_path: Path) -> None:
    built = tmp_path / "demo-1.0-py3-none-any.whl"
    built.write_bytes(b"wheel")
    stored = store_wheel(built, tmp_path / "cache" / "key", {"provenance.json": "{}"})
    assert stored == tmp_path / "cache" / "key" / built.name
    assert (tmp_path / "cache" / "key" / "provenance.json").read_text() == "{}"
    assert cached_wheel(tmp_path / "cache" / "key", "w") == stored
    assert [p.name for p in (tmp_path / "cache").iterdir()] == ["key"]  # no scratch left


def test_an_entry_of_two_wheels_is_no_wheel(tmp_path: Path) -> None:
    entry = entry_with(tmp_path, {"a-1-py3-none-any.whl": b"a", "b-1-py3-none-any.whl": b"b"})
    assert cached_wheel(entry, "w") is None
    assert cached_wheel(tmp_path / "absent", "w") is None


def test_cache_keys_depend_on_every_part_and_not_on_dict_order(tmp_path: Path) -> None:
    assert digest({"a": 1, "b": 2}) == digest({"b": 2, "a": 1})
    assert digest("a", 1) != digest("a", 2) != digest("a")
    assert digest(tmp_path) == digest(str(tmp_path))  # paths by their text
    assert len(digest()) == 64
    (tmp_path / "x").write_bytes(b"1")
    (tmp_path / "y").write_bytes(b"2")
    key = files_digest([tmp_path / "x", tmp_path / "y"])
    assert key == files_digest([tmp_path / "y", tmp_path / "x"])
    (tmp_path / "z").write_bytes(b"1")
    assert files_digest([tmp_path / "z", tmp_path / "y"]) != key  # the name counts
    (tmp_path / "y").write_bytes(b"3")
    assert files_digest([tmp_path / "x", tmp_path / "y"]) != key


def test_sha256_of_reads_files_larger_than_one_block(tmp_path: Path) -> None:
    data = os.urandom((1 << 20) + 17)
    (tmp_path / "big").write_bytes(data)
    assert sha256_of(tmp_path / "big") == hashlib.sha256(data).hexdigest()


def test_an_entry_is_stored_below_parents_that_do_not_exist_yet(tmp_path: Path) -> None:
    staging = tmp_path / "staging"
    staging.mkdir()
    (staging / "a.so").write_bytes(b"a")
    store_entry(staging, tmp_path / "cache" / "modules" / "key")
    assert verified_entry(tmp_path / "cache" / "modules" / "key", "w") is not None


def test_a_damaged_wheel_entry_is_named_by_what_it_holds(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    entry = entry_with(tmp_path, {"demo-1.0-py3-none-any.whl": b"w"})
    (entry / "demo-1.0-py3-none-any.whl").write_bytes(b"changed")
    assert cached_wheel(entry, "flashinfer wheel") is None
    assert f"cached flashinfer wheel at {entry} does not match" in capsys.readouterr().err
