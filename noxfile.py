"""Nox sessions for sm120-build. Each session is a thin call into the sm120_build package.

nox -s build_wheels                 the main job: wheels for sm_120a in wheelhouse/
nox -s tests                        the whole test suite (what .ci/run calls)
nox -l                              every session, with its help
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import nox

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

nox.options.default_venv_backend = "venv"
nox.options.sessions = ["build_wheels"]
nox.options.reuse_existing_virtualenvs = True

ROOT = Path(__file__).parent
# Every Python that pyproject.toml's requires-python admits; the fast tests run on each.
PYTHONS = ["3.10", "3.11", "3.12", "3.13"]


def _tool_pins() -> dict[str, list[str]]:
    """The tool pins of pins.toml by table; a broken pins.toml stops nox with one line."""
    try:
        data = tomllib.loads((ROOT / "pins.toml").read_text())
        return {
            table: list(data[table]["requirements"])
            for table in ("build", "render", "test", "publish")
        }
    except (OSError, tomllib.TOMLDecodeError, KeyError, TypeError) as exc:
        sys.exit(f"nox: cannot read the tool pins in pins.toml ({type(exc).__name__}: {exc})")


PINS = _tool_pins()
BUILD_REQUIREMENTS, TEST_REQUIREMENTS, PUBLISH_REQUIREMENTS = (
    PINS["build"],
    PINS["test"],
    PINS["publish"],
)
# The sessions that compile modules also render them with the patched FlashInfer.
COMPILE_REQUIREMENTS = [*BUILD_REQUIREMENTS, *PINS["render"]]


def _pyenv_interpreters() -> None:
    """pyenv serves one Python through its shims (the one in PYENV_VERSION, which its shims
    export); add every installed 3.x after it so nox finds python3.10 ... python3.13 too."""
    versions = sorted(p.name for p in (Path.home() / ".pyenv" / "versions").glob("3.*"))
    if not versions:
        return
    current = (
        os.environ.get("PYENV_VERSION")
        or subprocess.run(["pyenv", "version-name"], capture_output=True, text=True).stdout.strip()
    )
    os.environ["PYENV_VERSION"] = ":".join(dict.fromkeys([*current.split(":"), *versions]))


_pyenv_interpreters()
# One relocatable cache for everything large: sdists, the CUDA toolkit, built wheels, and
# pip's own downloads (torch, flashinfer-cubin) made by any session.
CACHE = Path(os.environ.get("SM120_CACHE_DIR", ROOT / ".cache")).resolve()


# user[:password]@ in a URL: a secret nox would print with the command line it runs.
_CREDENTIALS_IN_URL = re.compile(r"://[^/@\s]+@")


def _refuse_credentials(session: nox.Session) -> None:
    """Stop before nox runs (and so echoes) a command whose options carry a credential."""
    if any(_CREDENTIALS_IN_URL.search(arg) for arg in session.posargs):
        session.error(
            "a URL among the options carries credentials (user[:password]@host); nox prints "
            "every command it runs, so nothing was run. Give them as TWINE_USERNAME and "
            "TWINE_PASSWORD, in a keyring, or in ~/.pypirc, and the URL without them."
        )


def _install_tool(session: nox.Session, *extra: str) -> None:
    _refuse_credentials(session)
    session.env["SM120_CACHE_DIR"] = str(CACHE)
    session.env["PIP_CACHE_DIR"] = str(CACHE / "pip")
    session.install(".", *extra)


@nox.session
def vendor(session: nox.Session) -> None:
    """Fetch, verify, unpack and patch both upstreams into vendor/<name>/.

    -- --continue NAME: after a patch stopped the series and its refresh is committed in
    vendor/NAME, apply the rest of the series.
    """
    _install_tool(session)
    session.run("sm120-build", "vendor", *session.posargs)


@nox.session
def export_patches(session: nox.Session) -> None:
    """Regenerate patches/<name>/ from the commits in vendor/<name>/ (keeps headers)."""
    _install_tool(session)
    session.run("sm120-build", "export-patches", *session.posargs)


@nox.session
def bump(session: nox.Session) -> None:
    """Report what an upstream release does to every patch and hunk, without changing pins.

    -- flashinfer-python==0.6.17 [sglang==0.5.10] [--json FILE] [--write]
    Each patch is clean, offset, fuzz (refused), upstream, partly upstream, upstream in
    another form or a conflict, with keep/drop/refresh. --write updates pins.toml and drops
    the patches upstream carries; the rest are refreshed in vendor/.
    """
    _install_tool(session, *BUILD_REQUIREMENTS)
    session.run("sm120-build", "bump", *session.posargs)


@nox.session
def audit_gates(session: nox.Session) -> None:
    """Find arch gates that still exclude SM120 (nvcc device preprocessing + Python AST).

    Fails when an unwaived gate remains on the allreduce-fusion path. Options after --:
    --pristine (audit the unpatched upstream; traces each gate to its patch),
    --json FILE, --scope all (whole trees, report only).
    """
    _install_tool(session, *BUILD_REQUIREMENTS)
    session.run("sm120-build", "audit-gates", *session.posargs)


@nox.session
def build_wheels(session: nox.Session) -> None:
    """Build the three wheels into wheelhouse/.

    -- --profile comm|sglang-sm120   the FlashInfer modules to build ahead of time (profiles.toml)
    -- --module NAME                 one module recipe more (repeatable)
    -- --arch 12.0a [--arch 12.1a]   targets (default: the SM12x family, see README)
    -- --cuda-home PATH              a system CUDA toolkit instead of the pinned pip one
    """
    _install_tool(session, *COMPILE_REQUIREMENTS)
    session.run("sm120-build", "build-wheels", *session.posargs)


@nox.session
def plan_shards(session: nox.Session) -> None:
    """Split a build over N machines: print which modules each shard compiles.

    -- --shards N [--profile NAME] [--module NAME] [--arch ARCH] [--github-output FILE]
    Balanced by ci/module-costs.json (nox -s bench refreshes it); every shard computes the
    same plan, so this is for people and CI matrices, not an input of build_shard.
    """
    _install_tool(session, *COMPILE_REQUIREMENTS)
    session.run("sm120-build", "plan-shards", *session.posargs)


@nox.session
def build_shard(session: nox.Session) -> None:
    """Compile shard I of N into shards/I-of-N/ (one machine of a sharded build).

    -- --shard I/N, and the same --profile/--module/--arch/--cuda-home on every shard.
    Point sccache at a shared backend with its own SCCACHE_* variables (README).
    """
    _install_tool(session, *COMPILE_REQUIREMENTS)
    session.run("sm120-build", "build-shard", *session.posargs)


@nox.session
def merge_shards(session: nox.Session) -> None:
    """Assemble wheelhouse/ from all shards in shards/: the same bytes as build_wheels.

    -- [--base-jit-cache WHEEL]. Refuses shards of different builds, a missing shard, or
    shards of another patch series than this checkout's.
    """
    _install_tool(session, *BUILD_REQUIREMENTS)
    session.run("sm120-build", "merge-shards", *session.posargs)


@nox.session
def publish(session: nox.Session) -> None:
    """Upload wheelhouse/ to an index with twine and read it back, or write a static index.

    -- --repository-url URL --index-url URL   (or --repository NAME from ~/.pypirc)
    -- --static DIR                            PEP 503 tree for an air-gapped mirror
    Credentials: TWINE_USERNAME/TWINE_PASSWORD, a keyring, or ~/.pypirc. Never part of
    build_wheels.
    """
    _install_tool(session, *PUBLISH_REQUIREMENTS)
    session.run("sm120-build", "publish", *session.posargs)


@nox.session
def bench(session: nox.Session) -> None:
    """Benchmark: cold build time by stage, no-op rebuild time, wheel sizes (not a test)."""
    _install_tool(session, *COMPILE_REQUIREMENTS)
    session.run("python", "-m", "sm120_build.bench", *session.posargs)


def _run_on_this_node(session: nox.Session, module: str) -> None:
    """Run `module` in the Python nox runs from, with JIT compilation disabled, after it has
    installed wheelhouse/'s FlashInfer wheels there, each checked against SHA256SUMS
    (`--install`; `-- --help` installs nothing)."""
    _refuse_credentials(session)
    session.run(
        sys.executable,
        "-m",
        module,
        "--install",
        str(ROOT / "wheelhouse"),
        *session.posargs,
        env={"FLASHINFER_DISABLE_JIT": "1", "PYTHONPATH": str(ROOT / "src")},
    )


@nox.session(venv_backend="none")
def verify_gpu(session: nox.Session) -> None:
    """Check wheelhouse/'s trtllm_comm on every local GPU; two ranks share a single GPU.

    Runs in the Python environment nox itself runs from, which must hold torch (the one that
    serves sglang: `python -m nox -s verify_gpu`). It installs wheelhouse/'s two FlashInfer
    wheels there without dependencies, then checks them with FLASHINFER_DISABLE_JIT=1.
    Options after --: --world-size N, --json FILE.
    """
    _run_on_this_node(session, "sm120_build.node.verify")


@nox.session(venv_backend="none")
def node_check(session: nox.Session) -> None:
    """Prove this node will not JIT-compile: load every module of the profile, prebuilt.

    Runs like verify_gpu, in the Python nox runs from (torch installed), after installing
    wheelhouse/'s FlashInfer wheels there. Fails, naming the cause, when a module would be
    JIT-compiled or does not load, when the jit-cache has no code for this GPU, or when the
    two FlashInfer wheels come from different patch series.
    Options after --: --arch 12.0 (no GPU here: check for that arch), --profile NAME
    (default: the recipes the jit-cache wheel was built from), --json FILE.
    """
    _run_on_this_node(session, "sm120_build.node.check")


@nox.session(venv_backend="none")
def bench_gpu(session: nox.Session) -> None:
    """Benchmark fused vs NCCL+separate allreduce/residual/RMSNorm, one rank per GPU (>= 2).

    Compares trtllm_allreduce_fusion with NCCL all_reduce followed by a separate residual add
    and RMSNorm. Runs like verify_gpu, in the Python nox runs from, after installing
    wheelhouse/'s FlashInfer wheels there.
    Options after --: --world-size N (repeatable), --replays N, --json FILE.
    """
    _run_on_this_node(session, "sm120_build.node.bench_gpu")


@nox.session
def tests(session: nox.Session) -> None:
    """Run the test suite; pass pytest options after --, e.g. -- -m 'not slow'.

    Afterwards the fast tests run on every other Python the package claims (tests_fast).
    """
    _install_tool(session, *COMPILE_REQUIREMENTS, *TEST_REQUIREMENTS, *PUBLISH_REQUIREMENTS)
    session.run("pytest", *session.posargs)
    this = f"{sys.version_info.major}.{sys.version_info.minor}"
    for version in PYTHONS:
        if version != this:
            session.notify(f"tests_fast-{version}", ["-m", "not slow"])


@nox.session(python=PYTHONS)
def tests_fast(session: nox.Session) -> None:
    """The fast tests on one claimed Python (nox -s tests queues each)."""
    _install_tool(session, *BUILD_REQUIREMENTS, *TEST_REQUIREMENTS, *PUBLISH_REQUIREMENTS)
    session.run("pytest", *(session.posargs or ["-m", "not slow"]))


@nox.session
def lint(session: nox.Session) -> None:
    """ruff check, ruff format --check, mypy --strict on src/, actionlint on ci/github/."""
    session.install(*(r for r in TEST_REQUIREMENTS if r.startswith(("ruff", "mypy", "actionlint"))))
    session.install("-e", ".")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
    session.run("mypy")
    workflows = sorted(str(p) for p in (ROOT / "ci" / "github" / "workflows").glob("*.yml"))
    session.run("actionlint", "-config-file", str(ROOT / "ci/github/actionlint.yaml"), *workflows)
