"""README.md starts with the two set-up commands, and .ci/run runs both as written: the
first with Debian 12's own Python (3.11.2, PEP 668), the second exactly."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def readme_commands() -> list[str]:
    match = re.match(r"# [^\n]+\n\n```\n(.*?)\n```", (REPO / "README.md").read_text(), re.DOTALL)
    assert match, "README.md does not start with a title and a code block of commands"
    return match.group(1).splitlines()


def ci_lines() -> list[str]:
    return [line.strip() for line in (REPO / ".ci" / "run").read_text().splitlines()]


def test_readme_starts_with_the_build_and_the_test_command() -> None:
    build, tests = readme_commands()
    assert build.startswith("python3 -m venv .venv") and build.endswith("nox -s build_wheels")
    assert tests.startswith("python3 -m venv .venv") and tests.endswith("nox -s tests")


def test_ci_runs_the_first_command_with_debians_python_and_the_second_as_written() -> None:
    build, tests = readme_commands()
    lines = ci_lines()
    assert f"/usr/bin/{build}" in lines
    assert tests in lines
    assert lines.index(f"/usr/bin/{build}") < lines.index(tests)
