"""ci/github/: the release workflow only calls nox sessions, only ones that exist, and
publishes only what was verified."""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from .conftest import REPO

WORKFLOWS = sorted((REPO / "ci" / "github" / "workflows").glob("*.yml"))
NOX_RUN = re.compile(r"(?:python -m )?nox -s (?P<session>[\w-]+)(?: -- .*)?")


def nox_sessions() -> set[str]:
    """The sessions noxfile.py defines: functions decorated with @nox.session(...)."""
    tree = ast.parse((REPO / "noxfile.py").read_text())
    names = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            for decorator in node.decorator_list:
                target = decorator.func if isinstance(decorator, ast.Call) else decorator
                if ast.unparse(target) == "nox.session":
                    names.add(node.name)
    return names


def jobs(path: Path) -> dict[str, Any]:
    workflow = yaml.safe_load(path.read_text())
    found: dict[str, Any] = workflow["jobs"]
    return found


def run_steps(path: Path) -> list[tuple[str, str]]:
    return [
        (name, " ".join(step["run"].split()))
        for name, job in jobs(path).items()
        for step in job["steps"]
        if "run" in step
    ]


def test_the_release_workflow_is_there() -> None:
    assert [p.name for p in WORKFLOWS] == ["release.yml"]


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_every_run_step_calls_a_nox_session_that_exists(path: Path) -> None:
    sessions = nox_sessions()
    steps = run_steps(path)
    assert steps
    for job, command in steps:
        match = NOX_RUN.fullmatch(command)
        assert match, f"{job}: `{command}` is not a nox session call"
        assert match.group("session") in sessions, f"{job}: no nox session {match['session']}"


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_publish_waits_for_verify_which_waits_for_the_merge_of_all_shards(path: Path) -> None:
    graph = {name: job.get("needs", []) for name, job in jobs(path).items()}
    assert graph == {
        "plan": [],
        "build": "plan",
        "merge": "build",
        "verify": "merge",
        "publish": "verify",
    }
    steps = dict(run_steps(path))
    assert "build_shard" in steps["build"] and "merge_shards" in steps["merge"]
    assert "verify_gpu" in steps["verify"] and "publish" in steps["publish"]
