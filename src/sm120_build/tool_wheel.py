"""This tool's own wheel, for the wheelhouse: the node tools (`sm120-node-check`,
`sm120-verify-gpu`) go to a node with the three wheels they check, so a node installed from
the internal index runs them with no checkout of this repository.

Built from the installed package, as it runs now, with the metadata it was installed with;
its version's local label is a digest of its contents, so two builds of different code never
share a version on an index.
"""

from __future__ import annotations

import importlib.metadata
import json
import shutil
import subprocess
import tempfile
from pathlib import Path

from .console import step
from .errors import UserError
from .wheels import finalize_wheel, pip_wheel_command

DISTRIBUTION = "sm120-build"
PACKAGE_DIR = Path(__file__).parent


def _pyproject(metadata: importlib.metadata.PackageMetadata, scripts: dict[str, str]) -> str:
    table = {
        "name": DISTRIBUTION,
        "version": metadata["Version"],
        "description": metadata["Summary"],
        "requires-python": metadata["Requires-Python"],
        "dependencies": metadata.get_all("Requires-Dist") or [],
    }
    lines = [
        "[build-system]",
        'requires = ["setuptools>=68"]',
        'build-backend = "setuptools.build_meta"',
        "",
        "[project]",
        *(f"{key} = {json.dumps(value)}" for key, value in table.items()),
        "",
        "[project.scripts]",
        *(f"{json.dumps(name)} = {json.dumps(value)}" for name, value in sorted(scripts.items())),
        "",
        "[tool.setuptools.packages.find]",
        'where = ["src"]',
        "",
        "[tool.setuptools.package-data]",
        'sm120_build = ["py.typed"]',
    ]
    return "\n".join(lines) + "\n"


def build_tool_wheel(out_dir: Path) -> Path:
    """The sm120-build wheel of the running package, finalized into out_dir."""
    try:
        distribution = importlib.metadata.distribution(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        raise UserError(
            f"{DISTRIBUTION} is not installed in this Python, so its wheel cannot be made for "
            "the node: run the build through nox (nox -s build_wheels), which installs it"
        ) from None
    scripts = {
        entry.name: entry.value
        for entry in distribution.entry_points
        if entry.group == "console_scripts"
    }
    with tempfile.TemporaryDirectory(prefix="sm120-build-wheel-") as scratch:
        stage = Path(scratch) / "stage"
        shutil.copytree(
            PACKAGE_DIR,
            stage / "src" / "sm120_build",
            ignore=shutil.ignore_patterns("__pycache__", "*.pyc"),
        )
        (stage / "pyproject.toml").write_text(_pyproject(distribution.metadata, scripts))
        built_dir = Path(scratch) / "built"
        with step(f"building the {DISTRIBUTION} wheel (the node tools)"):
            result = subprocess.run(
                pip_wheel_command(stage, built_dir, "--quiet"), capture_output=True, text=True
            )
        if result.returncode != 0:
            raise UserError(
                f"building the {DISTRIBUTION} wheel failed:\n{result.stdout}{result.stderr}"
            )
        (built,) = built_dir.glob("*.whl")
        provenance: dict[str, object] = {"node_tools": sorted(scripts), "toolkit": None}
        return finalize_wheel(built, out_dir, provenance, label_contents=True)
