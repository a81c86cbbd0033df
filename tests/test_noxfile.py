"""The noxfile's session docstrings (what `nox -l` and `-- --help` users read first) name every
option the command behind each session takes, as its own argparse parser defines them."""

from __future__ import annotations

import ast
import re
import subprocess
import sys

import pytest

from .conftest import REPO

# session -> the command line whose --help lists its options.
COMMANDS = {
    "vendor": ["-m", "sm120_build", "vendor"],
    "export_patches": ["-m", "sm120_build", "export-patches"],
    "bump": ["-m", "sm120_build", "bump"],
    "audit_gates": ["-m", "sm120_build", "audit-gates"],
    "build_wheels": ["-m", "sm120_build", "build-wheels"],
    "plan_shards": ["-m", "sm120_build", "plan-shards"],
    "build_shard": ["-m", "sm120_build", "build-shard"],
    "shard_matrix": ["-m", "sm120_build", "shard-matrix"],
    "merge_shards": ["-m", "sm120_build", "merge-shards"],
    "publish": ["-m", "sm120_build", "publish"],
    "lock_node": ["-m", "sm120_build", "lock-node"],
    "derive_profiles": ["-m", "sm120_build", "derive-profiles"],
    "bench": ["-m", "sm120_build.bench"],
    "verify_gpu": ["-m", "sm120_build.node.verify"],
    "node_check": ["-m", "sm120_build.node.check"],
    "bench_gpu": ["-m", "sm120_build.node.bench_gpu"],
}
# Passed by the session itself, not by the user.
SET_BY_THE_SESSION = {"--help", "--install"}


def docstrings() -> dict[str, str]:
    tree = ast.parse((REPO / "noxfile.py").read_text())
    return {
        node.name: ast.get_docstring(node) or ""
        for node in tree.body
        if isinstance(node, ast.FunctionDef)
        and any("session" in ast.unparse(d) for d in node.decorator_list)
    }


def test_every_session_has_help_text() -> None:
    assert all(docstrings().values()), [n for n, d in docstrings().items() if not d]
    assert set(COMMANDS) <= set(docstrings())


@pytest.mark.parametrize("session", sorted(COMMANDS))
def test_the_docstring_names_every_option(session: str) -> None:
    result = subprocess.run(
        [sys.executable, *COMMANDS[session], "--help"],
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO,
    )
    listed = re.findall(r"^  (?:-\w, )?(--[a-z][a-z0-9-]*)", result.stdout, re.M)
    options = set(listed) - SET_BY_THE_SESSION
    missing = sorted(o for o in options if o not in docstrings()[session])
    assert not missing, f"{session}'s docstring does not name {missing}"
