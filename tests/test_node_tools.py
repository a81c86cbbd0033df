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


def test_the_pcie_reference_is_the_sum_of_every_ranks_seeded_input() -> None:
    """Each rank rebuilds every rank's input from its seed: the same tensors in every process
    and every call, and another call's tensors are other ones."""
    torch = pytest.importorskip("torch")
    from sm120_build.node.pcie import TOLERANCE, rank_input, reference

    first = [rank_input(64, "bfloat16", rank, 0) for rank in range(2)]
    assert torch.equal(first[0], rank_input(64, "bfloat16", 0, 0))
    assert not torch.equal(first[0], first[1])
    assert not torch.equal(first[0], rank_input(64, "bfloat16", 0, 1))
    total = reference(64, "bfloat16", 2, 0)
    assert torch.equal(total, first[0].float() + first[1].float())
    # One unit in the last place of bf16 off at the largest element is caught.
    wrong = total.to(torch.bfloat16).float()
    at = int(total.abs().argmax())
    wrong[at] = wrong[at] * (1 + 2.0**-7)
    allowed = TOLERANCE["bfloat16"] * float(total.abs().max())
    assert float((total.to(torch.bfloat16).float() - total).abs().max()) <= allowed
    assert float((wrong - total).abs().max()) > allowed
