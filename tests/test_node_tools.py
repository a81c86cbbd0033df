"""The node tools ship in this tool's own wheel and run on a node with no checkout."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from sm120_build.errors import UserError
from sm120_build.node.install import disable_jit
from sm120_build.tool_wheel import build_tool_wheel


def test_the_node_tools_disable_jit_themselves(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FLASHINFER_DISABLE_JIT", raising=False)
    disable_jit()
    assert os.environ["FLASHINFER_DISABLE_JIT"] == "1"
    monkeypatch.setenv("FLASHINFER_DISABLE_JIT", "0")
    with pytest.raises(UserError, match=r"FLASHINFER_DISABLE_JIT is '0'.*unset it"):
        disable_jit()


@pytest.mark.slow
def test_the_tool_wheel_runs_its_node_commands_without_a_checkout(tmp_path: Path) -> None:
    wheel = build_tool_wheel(tmp_path)
    assert wheel.name.startswith("sm120_build-0.1.0+c") and wheel.name.endswith("-py3-none-any.whl")
    # Content-labelled: the same code gives the same wheel, byte for byte.
    (tmp_path / "again").mkdir()
    assert build_tool_wheel(tmp_path / "again").read_bytes() == wheel.read_bytes()
    venv = tmp_path / "node"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run(
        [str(venv / "bin/python"), "-m", "pip", "install", "--quiet", str(wheel)], check=True
    )
    env = {"PATH": f"{venv / 'bin'}:/usr/bin:/bin", "HOME": str(tmp_path)}
    for command in ("sm120-node-check", "sm120-verify-gpu"):
        shown = subprocess.run(
            [str(venv / "bin" / command), "--help"],
            env=env,
            cwd=tmp_path,
            capture_output=True,
            text=True,
        )
        assert shown.returncode == 0 and "--install DIR" in shown.stdout, shown.stderr
    # Nothing of FlashInfer installed: the check says so, naming the package, and fails.
    missing = subprocess.run(
        [str(venv / "bin/sm120-node-check"), "--arch", "12.0"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert missing.returncode == 1
    assert "flashinfer-jit-cache is not installed" in missing.stderr
