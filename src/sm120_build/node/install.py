"""--install DIR: put a wheelhouse's three wheels into the Python that runs the check, as
checked (without their dependencies, as the node recipe for an sglang environment does).

Every wheel in DIR must match DIR/SHA256SUMS; the chosen ones are installed with pip's
--require-hashes against those sums and --force-reinstall (an install of the same version
would otherwise keep what is there), and afterwards the installed versions must be the
wheels' own: the checks that follow look at what is installed.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from ..errors import UserError
from ..sums import SUMS_FILE, checked_wheels
from .provenance import keep, store, verified_wheels

# sglang too: patch 0003 is what loads its own kernels from the jit-cache wheel.
OURS = ("flashinfer-python", "flashinfer-jit-cache", "sglang")


def add_node_options(parser: argparse.ArgumentParser) -> None:
    """--install and --verbose, which every node tool takes."""
    parser.add_argument(
        "--install",
        type=Path,
        metavar="DIR",
        help="first install DIR's wheels into this Python, each checked against "
        "DIR/SHA256SUMS (nox passes wheelhouse/); without it, what is installed is checked",
    )
    parser.add_argument(
        "--trust-key",
        type=Path,
        metavar="KEY.pub",
        help="the Ed25519 public key (PEM) our wheels' provenance envelopes must be signed "
        "with: with --install, every wheel of ours in DIR is verified before anything is "
        "installed; without it, what the envelopes kept at install say is reported",
    )
    parser.add_argument(
        "--verbose", action="store_true", help="show the traceback of an unexpected error"
    )


def disable_jit() -> None:
    """FLASHINFER_DISABLE_JIT=1 for what follows, so a module that is not prebuilt fails
    instead of compiling; set before FlashInfer is imported. Another value is refused."""
    value = os.environ.setdefault("FLASHINFER_DISABLE_JIT", "1")
    if value != "1":
        raise UserError(
            f"FLASHINFER_DISABLE_JIT is {value!r}: a node check runs with JIT compilation "
            "disabled (1), so that a module missing from the wheels fails instead of being "
            "compiled; unset it"
        )


def _name_and_version(wheel: Path) -> tuple[str, str]:
    """A wheel file's project (canonical, PEP 503) and version (a node may lack packaging)."""
    name, version = wheel.name.split("-")[:2]
    return re.sub(r"[-_.]+", "-", name).lower(), version


def install_checked(
    wheelhouse: Path, projects: tuple[str, ...] = OURS, trust_key: Path | None = None
) -> None:
    wheels = checked_wheels(wheelhouse)
    statements = verified_wheels(wheelhouse, trust_key) if trust_key is not None else {}
    chosen = {
        path: digest for path, digest in wheels.items() if _name_and_version(path)[0] in projects
    }
    found = {_name_and_version(path)[0] for path in chosen}
    if found != set(projects):
        raise UserError(
            f"{wheelhouse} lacks the {', '.join(sorted(set(projects) - found))} wheel: run "
            "`nox -s build_wheels` first"
        )
    with tempfile.TemporaryDirectory() as scratch:
        requirements = Path(scratch) / "requirements.txt"
        requirements.write_text(
            "".join(f"{path.resolve()} --hash=sha256:{digest}\n" for path, digest in chosen.items())
        )
        print(f"installing {', '.join(p.name for p in chosen)} (checked against {SUMS_FILE})")
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "install",
                "--quiet",
                "--no-deps",
                "--force-reinstall",
                "--require-hashes",
                "--requirement",
                str(requirements),
            ],
            capture_output=True,
            text=True,
        )
    if result.returncode != 0:
        raise UserError(f"pip could not install the wheelhouse's wheels:\n{result.stderr.strip()}")
    importlib.invalidate_caches()
    for path in chosen:
        name, version = _name_and_version(path)
        installed = importlib.metadata.version(name)
        if installed != version:
            raise UserError(
                f"after installing {path.name}, {sys.prefix} holds {name} {installed}: "
                "another installation shadows it (check sys.path and PYTHONPATH)"
            )
    if statements:
        keep({wheel: found for wheel, found in statements.items() if wheel in chosen})
        print(f"provenance: {len(statements)} wheels verified, kept in {store()}")
