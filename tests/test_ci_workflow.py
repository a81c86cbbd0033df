"""ci/github/: the release workflow only calls nox sessions, only ones that exist, and
publishes only what was verified."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from .conftest import REPO
from .test_noxfile import docstrings

WORKFLOWS = sorted((REPO / "ci" / "github" / "workflows").glob("*.yml"))
# A nox session call, as README gives it (nox from a fresh virtual environment) or from an
# image that brings nox.
NOX_RUN = re.compile(
    r"(?:python3 -m venv (?:--system-site-packages )?(?P<venv>\.\w+) && (?P=venv)/bin/pip "
    r"install -q nox==[\d.]+ && (?P=venv)/bin/)?(?:\.\w+/bin/)?nox -s (?P<session>[\w-]+)"
    r"(?: -- .*)?"
)


def nox_sessions() -> set[str]:
    """The sessions noxfile.py defines, as nox registers them (a session of several Pythons
    by its own name too)."""
    return {name.split("-")[0] for name in docstrings()} | set(docstrings())


def jobs(path: Path) -> dict[str, Any]:
    workflow = yaml.safe_load(path.read_text())
    found: dict[str, Any] = workflow["jobs"]
    return found


def run_steps(path: Path) -> list[tuple[str, str]]:
    return [
        (name, " ".join(step["run"].split()))
        for name, job in jobs(path).items()
        for step in job.get("steps", [])  # a job calling leg.yml has none
        if "run" in step
    ]


def test_the_release_workflow_is_there() -> None:
    assert [p.name for p in WORKFLOWS] == ["leg.yml", "mutants.yml", "release.yml"]


def test_the_cuda_legs_do_not_block_each_other_and_never_race() -> None:
    """A 12.9 failure used to block the 13.0 release (one merge needed the whole matrix),
    and two releases raced for the one sm120 runner."""
    legs = jobs(REPO / "ci" / "github" / "workflows" / "release.yml")
    assert set(legs) == {"cu130", "cu129", "cu130-aarch64"}
    for leg in legs.values():
        assert leg["uses"] == "./.github/workflows/leg.yml"
        assert "needs" not in leg
        assert leg["concurrency"]["cancel-in-progress"] is False
    groups = {leg["concurrency"]["group"] for leg in legs.values()}
    assert len(groups) == 3


def test_the_aarch64_leg_cross_builds_and_verifies_on_an_aarch64_node() -> None:
    """Its shards and merge are the x86_64 runners' (--platform aarch64), its artifacts
    named apart from the x86_64 leg's, its verify job on an arm64 SM121 runner."""
    legs = jobs(REPO / "ci" / "github" / "workflows" / "release.yml")
    aarch64 = legs["cu130-aarch64"]["with"]
    assert (
        aarch64["platform"] == "aarch64" and aarch64["image"] == "${{ vars.CROSS_AARCH64_IMAGE }}"
    )
    # What the Debian 12 cross glibc gives (dlopen@GLIBC_2.34), refused above it.
    assert aarch64["glibc-baseline"] == "2.34"
    assert yaml.safe_load(aarch64["verify-runner"]) == ["self-hosted", "linux", "arm64", "sm121"]
    assert all("platform" not in legs[name]["with"] for name in ("cu130", "cu129"))
    leg = jobs(REPO / "ci" / "github" / "workflows" / "leg.yml")
    (build,) = [step["run"] for step in leg["build"]["steps"] if "run" in step]
    assert '--platform "${{ inputs.platform }}"' in build
    assert leg["verify"]["runs-on"] == "${{ fromJSON(inputs.verify-runner) }}"
    uploads = [
        step["with"]
        for job in ("build", "merge")
        for step in leg[job]["steps"]
        if "upload-artifact" in step.get("uses", "")
    ]
    assert all("${{ inputs.platform }}" in upload["name"] for upload in uploads)
    workflow = yaml.safe_load((REPO / "ci" / "github" / "workflows" / "leg.yml").read_text())
    inputs = workflow[True]["workflow_call"]["inputs"]  # YAML 1.1 reads `on` as true
    assert inputs["platform"]["default"] == "x86_64"


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_actions_are_pinned_by_commit(path: Path) -> None:
    uses = [
        step["uses"]
        for job in jobs(path).values()
        for step in job.get("steps", [])
        if "uses" in step
    ]
    assert all(re.fullmatch(r"[\w.-]+/[\w.-]+@[0-9a-f]{40}", u) for u in uses), uses


def test_the_plan_installs_nothing_heavy_and_builds_run_on_the_baseline_image() -> None:
    leg = jobs(REPO / "ci" / "github" / "workflows" / "leg.yml")
    (plan,) = [step["run"] for step in leg["plan"]["steps"] if "run" in step]
    assert "nox -s shard_matrix" in plan
    assert leg["build"]["container"] == leg["merge"]["container"] == "${{ inputs.image }}"
    (merge,) = [step["run"] for step in leg["merge"]["steps"] if "run" in step]
    assert '--glibc-baseline "${{ inputs.glibc-baseline }}"' in merge
    workflow = yaml.safe_load((REPO / "ci" / "github" / "workflows" / "leg.yml").read_text())
    assert workflow[True]["workflow_call"]["inputs"]["glibc-baseline"]["default"] == "2.28"
    verify = " ".join(step["run"] for step in leg["verify"]["steps"] if "run" in step)
    assert "python3 -m venv --system-site-packages" in verify


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_every_run_step_calls_a_nox_session_that_exists(path: Path) -> None:
    sessions = nox_sessions()
    steps = run_steps(path)
    for job, command in steps:
        match = NOX_RUN.fullmatch(command)
        assert match, f"{job}: `{command}` is not a nox session call"
        assert match.group("session") in sessions, f"{job}: no nox session {match['session']}"


def test_publish_waits_for_verify_which_waits_for_the_merge_of_all_shards() -> None:
    path = REPO / "ci" / "github" / "workflows" / "leg.yml"
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


def github_expression(expression: str, context: dict[str, Any]) -> Any:
    """A GitHub Actions expression of the forms release.yml uses (==, &&, ||, parentheses,
    startsWith, dotted names), evaluated as GitHub does for these operand types."""
    python = expression.replace("&&", " and ").replace("||", " or ")
    python = re.sub(r"startsWith\(([^,]+), ([^)]+)\)", r"str(\1).startswith(\2)", python)
    names = {name.replace(".", "__"): value for name, value in context.items()}
    python = re.sub(r"\b([a-z_]+)\.([a-z_]+)\b", r"\1__\2", python)
    return eval(python, {}, names)


@pytest.mark.parametrize(
    ("event", "ref", "publish", "expected"),
    [
        ("workflow_dispatch", "refs/tags/v1.0", False, False),  # it published anyway
        ("workflow_dispatch", "refs/tags/v1.0", True, True),
        ("workflow_dispatch", "refs/heads/main", False, False),
        ("push", "refs/tags/v1.0", None, True),
    ],
)
def test_a_manual_run_publishes_only_when_asked(
    event: str, ref: str, publish: bool | None, expected: bool
) -> None:
    legs = jobs(REPO / "ci" / "github" / "workflows" / "release.yml")
    context = {"github.event_name": event, "github.ref": ref, "inputs.publish": publish}
    for leg in legs.values():
        value = leg["with"]["publish"]
        assert value.startswith("${{ ") and value.endswith(" }}")
        assert bool(github_expression(value[4:-3], context)) is expected


def test_the_merge_signs_with_the_release_key_and_no_shard_does() -> None:
    """Per-shard signatures never reach a node: only the merge has the key."""
    leg = jobs(REPO / "ci" / "github" / "workflows" / "leg.yml")
    (merge,) = [step for step in leg["merge"]["steps"] if "run" in step]
    assert merge["env"]["SM120_SIGN_KEY"] == "${{ secrets.SM120_SIGN_KEY }}"
    for name, job in leg.items():
        if name != "merge":
            assert "SM120_SIGN_KEY" not in str(job), name
