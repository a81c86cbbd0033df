"""Nox sessions for sm120-build. Each session is a thin call into the sm120_build package.

nox -s build_wheels                 the main job: wheels for sm_120a in wheelhouse/
nox -s tests                        the whole test suite (what .ci/run calls)
nox -l                              every session, with its help
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import nox

nox.options.default_venv_backend = "venv"
nox.options.sessions = ["build_wheels"]
nox.options.reuse_existing_virtualenvs = True

ROOT = Path(__file__).parent
SRC = ROOT / "src"
# Every Python that pyproject.toml's requires-python admits; the fast tests run on each.
PYTHONS = ["3.10", "3.11", "3.12", "3.13"]


def _tool_pins() -> dict[str, list[str]]:
    """The tool pins of pins.toml by table; a broken pins.toml stops nox with one line."""
    try:
        data = nox.project.load_toml(ROOT / "pins.toml")
        return {
            table: list(data[table]["requirements"])
            for table in ("build", "render", "test", "publish")
        }
    except (OSError, ValueError, KeyError, TypeError) as exc:
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


def _asks_for_help(session: nox.Session) -> bool:
    return any(arg in ("-h", "--help") for arg in session.posargs)


def _install_tool(session: nox.Session, *extra: str) -> None:
    _refuse_credentials(session)
    session.env["SM120_CACHE_DIR"] = str(CACHE)
    session.env["PIP_CACHE_DIR"] = str(CACHE / "pip")
    session.install(".", *extra)


def _sm120_build(session: nox.Session, command: str, *requirements: str) -> None:
    """`sm120-build COMMAND` with the session's options, in the session's environment with
    `requirements` installed. `-- --help` prints the command's help with nox's own Python
    and this checkout's source, and installs nothing."""
    if _asks_for_help(session):
        session.run(
            sys.executable, "-m", "sm120_build", command, "--help", env={"PYTHONPATH": str(SRC)}
        )
        return
    _install_tool(session, *requirements)
    session.run("sm120-build", command, *session.posargs)


@nox.session
def vendor(session: nox.Session) -> None:
    """Fetch, verify, unpack and patch both upstreams into vendor/<name>/.

    -- --continue NAME: after a patch stopped the series and its refresh is committed in
    vendor/NAME, apply the rest of the series.
    Every sm120-build command also takes --verbose (the traceback of an unexpected error)
    and --force (adopt a non-empty SM120_CACHE_DIR not marked as this tool's cache).
    """
    _sm120_build(session, "vendor")


@nox.session
def export_patches(session: nox.Session) -> None:
    """Regenerate patches/<name>/ from the commits in vendor/<name>/ (keeps headers).

    Every sm120-build command also takes --verbose (the traceback of an unexpected error)
    and --force (adopt a non-empty SM120_CACHE_DIR not marked as this tool's cache).
    """
    _sm120_build(session, "export-patches")


@nox.session
def bump(session: nox.Session) -> None:
    """Report what an upstream release does to every patch and hunk, without changing pins.

    -- flashinfer-python==0.6.17 [sglang==0.5.10] [--json FILE] [--write]
    Each patch is clean, offset, fuzz (refused), upstream, partly upstream, upstream in
    another form or a conflict, with keep/drop/refresh. --write updates pins.toml and drops
    the patches upstream carries; the rest are refreshed in vendor/.
    Every sm120-build command also takes --verbose (the traceback of an unexpected error)
    and --force (adopt a non-empty SM120_CACHE_DIR not marked as this tool's cache).
    """
    _sm120_build(session, "bump", *BUILD_REQUIREMENTS)


@nox.session
def audit_gates(session: nox.Session) -> None:
    """Find arch gates that still exclude SM120 (nvcc device preprocessing + Python AST).

    Fails when an unwaived gate remains on the allreduce-fusion path. Options after --:
    --pristine (audit the unpatched upstream; traces each gate to its patch),
    --json FILE, --scope all (whole trees, report only).
    Every sm120-build command also takes --verbose (the traceback of an unexpected error)
    and --force (adopt a non-empty SM120_CACHE_DIR not marked as this tool's cache).
    """
    _sm120_build(session, "audit-gates", *BUILD_REQUIREMENTS)


@nox.session
def build_wheels(session: nox.Session) -> None:
    """Build the three wheels into wheelhouse/.

    -- --profile NAME                the modules to build ahead of time (profiles.toml; comm)
    -- --module NAME                 one module recipe more (repeatable)
    -- --arch 12.0f [--arch 9.0a]    targets (default: the SM12x family, docs/benchmarks.md)
    -- --cuda-home PATH              a system CUDA toolkit instead of the pinned pip one
    -- --base-jit-cache WHEEL        keep another jit-cache wheel's modules (checked first)
    -- --glibc-baseline X.Y          refuse a jit-cache wheel that needs a newer glibc
    Every sm120-build command also takes --verbose (the traceback of an unexpected error)
    and --force (adopt a non-empty SM120_CACHE_DIR not marked as this tool's cache).
    """
    _sm120_build(session, "build-wheels", *COMPILE_REQUIREMENTS)


@nox.session
def plan_shards(session: nox.Session) -> None:
    """Split a build over N machines: print which modules each shard compiles.

    -- --shards N [--profile NAME] [--module NAME] [--arch ARCH] [--cuda-home PATH]
       [--base-jit-cache WHEEL] [--github-output FILE]
    Balanced by ci/module-costs.json (nox -s bench refreshes it); every shard computes the
    same plan, so this is for people and CI matrices, not an input of build_shard.
    Every sm120-build command also takes --verbose (the traceback of an unexpected error)
    and --force (adopt a non-empty SM120_CACHE_DIR not marked as this tool's cache).
    """
    _sm120_build(session, "plan-shards", *COMPILE_REQUIREMENTS)


@nox.session(venv_backend="none")
def shard_matrix(session: nox.Session) -> None:
    """The shard indices 1..N of a sharded build, for a CI matrix: installs nothing.

    -- --shards N [--github-output FILE] [--verbose] [--force]
    """
    session.run(
        sys.executable,
        "-m",
        "sm120_build",
        "shard-matrix",
        *session.posargs,
        env={"PYTHONPATH": str(SRC)},
    )


@nox.session
def build_shard(session: nox.Session) -> None:
    """Compile shard I of N into shards/I-of-N/ (one machine of a sharded build).

    -- --shard I/N, and the same --profile/--module/--arch/--cuda-home/--base-jit-cache on
    every shard.
    Point sccache at a shared backend with its own SCCACHE_* variables (docs/cache.md).
    Every sm120-build command also takes --verbose (the traceback of an unexpected error)
    and --force (adopt a non-empty SM120_CACHE_DIR not marked as this tool's cache).
    """
    _sm120_build(session, "build-shard", *COMPILE_REQUIREMENTS)


@nox.session
def merge_shards(session: nox.Session) -> None:
    """Assemble wheelhouse/ from all shards in shards/: the same bytes as build_wheels.

    -- [--base-jit-cache WHEEL] [--glibc-baseline X.Y]. Refuses shards of different builds,
    a missing or changed shard, or shards of another patch series than this checkout's; with
    --glibc-baseline, a jit-cache wheel that needs a newer glibc (naming the symbols).
    Every sm120-build command also takes --verbose (the traceback of an unexpected error)
    and --force (adopt a non-empty SM120_CACHE_DIR not marked as this tool's cache).
    """
    _sm120_build(session, "merge-shards", *BUILD_REQUIREMENTS)


@nox.session
def publish(session: nox.Session) -> None:
    """Upload wheelhouse/ to an index with twine and read it back, or write a static index.

    -- --repository-url URL --index-url URL   (or --repository NAME from ~/.pypirc)
    -- --static DIR                            PEP 503 tree for an air-gapped mirror
    -- --timeout SECONDS                       give up on an index that does not answer
    -- --with-dependencies                     also the closure of wheelhouse/node-lock.txt
    Credentials: TWINE_USERNAME/TWINE_PASSWORD, a keyring, or ~/.pypirc. Never part of
    build_wheels.
    Every sm120-build command also takes --verbose (the traceback of an unexpected error)
    and --force (adopt a non-empty SM120_CACHE_DIR not marked as this tool's cache).
    """
    _sm120_build(session, "publish", *PUBLISH_REQUIREMENTS)


@nox.session
def derive_profiles(session: nox.Session) -> None:
    """Derive profiles-derived.toml from sglang's own code: for each configuration of
    served-models.toml, sglang's server-argument resolution, model constructor, KV pool and
    attention backend run on the CPU and record what they ask FlashInfer and sglang's
    jit_kernel for (docs/derive.md). The first run installs the pinned sglang's
    dependencies into the cache (several GB).

    -- [--check (compare instead of writing; exit 1 if it differs)]
    Every sm120-build command also takes --verbose (the traceback of an unexpected error)
    and --force (adopt a non-empty SM120_CACHE_DIR not marked as this tool's cache).
    """
    _sm120_build(session, "derive-profiles")


@nox.session
def lock_node(session: nox.Session) -> None:
    """Write wheelhouse/node-lock.txt: everything a fresh node needs to run sglang with the
    wheelhouse's wheels, hash-pinned, resolved with uv from pip's configured sources.

    -- [--python-version X.Y (default 3.12)] [--platform ARCH-manylinux_2_Y (default: the
       newest manylinux tag of the wheelhouse's wheels)]
    Every sm120-build command also takes --verbose (the traceback of an unexpected error)
    and --force (adopt a non-empty SM120_CACHE_DIR not marked as this tool's cache).
    """
    _sm120_build(session, "lock-node", *PUBLISH_REQUIREMENTS)


@nox.session
def bench(session: nox.Session) -> None:
    """Benchmark: cold build time by stage, no-op rebuild time, wheel sizes (not a test).

    -- [--profile NAME] [--module NAME] [--arch ARCH] [--cuda-home PATH]
       [--base-jit-cache WHEEL] [--sample N] [--shards N] [--verbose]
    """
    if _asks_for_help(session):
        session.run(
            sys.executable, "-m", "sm120_build.bench", "--help", env={"PYTHONPATH": str(SRC)}
        )
        return
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
    """Check that every module of the jit-cache wheel computes the right thing on this GPU.

    Runs in the Python environment nox itself runs from, which must hold torch (the one that
    serves sglang: `python -m nox -s verify_gpu`). It installs wheelhouse/'s wheels there
    without dependencies, each checked against SHA256SUMS, then checks them with
    FLASHINFER_DISABLE_JIT=1; trtllm_comm over ranks (two share a single GPU).
    -- [--module NAME] [--profile NAME] [--pattern PATTERN] [--world-size N] [--json FILE]
       [--verbose]
    """
    _run_on_this_node(session, "sm120_build.node.verify")


@nox.session(venv_backend="none")
def node_check(session: nox.Session) -> None:
    """Prove this node will not JIT-compile: load every module of the profile, prebuilt.

    Runs like verify_gpu, in the Python nox runs from (torch installed), after installing
    wheelhouse/'s wheels there. Fails, naming the cause, when a module (FlashInfer's or
    sglang's own) would be compiled or does not load, when the jit-cache has no code for
    this GPU, or when the two FlashInfer wheels come from different patch series.
    -- [--arch 12.0 (no GPU here: check for that arch)] [--profile NAME (default: the
       recipes the jit-cache wheel was built from)] [--json FILE] [--verbose]
    """
    _run_on_this_node(session, "sm120_build.node.check")


@nox.session(venv_backend="none")
def bench_gpu(session: nox.Session) -> None:
    """Benchmark fused vs NCCL+separate allreduce/residual/RMSNorm, one rank per GPU (>= 2).

    Compares trtllm_allreduce_fusion with NCCL all_reduce followed by a separate residual add
    and RMSNorm. Runs like verify_gpu, in the Python nox runs from, after installing
    wheelhouse/'s wheels there. --launch-cost instead times each patch-0004 launcher's host
    cost per eager call (one GPU is enough).
    -- [--world-size N (repeatable)] [--replays N] [--launch-cost] [--json FILE] [--verbose]
    """
    _run_on_this_node(session, "sm120_build.node.bench_gpu")


@nox.session
def tests(session: nox.Session) -> None:
    """Run the test suite; pass pytest options after --, e.g. -- -m 'not slow'.

    Afterwards the fast tests run on every other Python the package claims (tests_fast).
    -- [pytest options]
    """
    if _asks_for_help(session):
        session.log(tests.__doc__ or "")
        return
    _install_tool(session, *COMPILE_REQUIREMENTS, *TEST_REQUIREMENTS, *PUBLISH_REQUIREMENTS)
    session.run("pytest", *session.posargs)
    _pyenv_interpreters()  # so that nox finds python3.10 ... python3.13 for tests_fast
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
def mutants(session: nox.Session) -> None:
    """Mutation testing (mutmut) of the modules that guard data and trust, listed under
    [tool.mutmut] in pyproject.toml, against the fast tests. Prints killed, survived and
    untested mutants and the kill ratio, and fails below 90 % (docs/mutation.md). Tens of
    minutes on two cores: CI runs it on a schedule, not on every push.

    Takes no options.
    """
    if _asks_for_help(session):
        session.log(mutants.__doc__ or "")
        return
    # Not the package itself: mutmut imports it from its mutated copy (mutants/src). The
    # tests' subprocesses (`python -m sm120_build ...`) run the unmutated source.
    session.install(*COMPILE_REQUIREMENTS, *TEST_REQUIREMENTS, *PUBLISH_REQUIREMENTS, "packaging")
    shutil.rmtree(ROOT / "mutants", ignore_errors=True)  # results of other code would be reused
    session.run("mutmut", "run", env={"PYTHONPATH": str(SRC)}, success_codes=[0, 1])
    if session.run("mutmut", "export-cicd-stats", silent=True) is None:
        return  # nox --install-only: nothing ran, so there is nothing to count
    stats = json.loads((ROOT / "mutants" / "mutmut-cicd-stats.json").read_text())
    session.run("mutmut", "results")
    ratio = stats["killed"] / max(stats["total"], 1)
    session.log(
        f"{stats['killed']} of {stats['total']} mutants killed ({ratio:.0%}); "
        f"{stats['survived']} survived, {stats['no_tests']} reached by no in-process test"
    )
    if ratio < 0.90:
        session.error("kill ratio below 90 %: `mutmut show <name>` shows a survivor")


@nox.session
def lint(session: nox.Session) -> None:
    """ruff check, ruff format --check, mypy --strict on src/, tests/ and this file,
    actionlint on ci/github/, hadolint on ci/docker/.

    Takes no options.
    """
    if _asks_for_help(session):
        session.log(lint.__doc__ or "")
        return
    # mypy also reads the tests and this file: pytest's and nox's own types.
    linters = ("ruff", "mypy", "actionlint", "hadolint", "pytest", "nox")
    session.install(*(r for r in TEST_REQUIREMENTS if r.startswith(linters)))
    session.install("-e", ".")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
    session.run("mypy")
    workflows = sorted(str(p) for p in (ROOT / "ci" / "github" / "workflows").glob("*.yml"))
    session.run("actionlint", "-config-file", str(ROOT / "ci/github/actionlint.yaml"), *workflows)
    dockerfiles = sorted(str(p) for p in (ROOT / "ci" / "docker").glob("*/Dockerfile"))
    session.run("hadolint", "--config", str(ROOT / "ci/docker/hadolint.yaml"), *dockerfiles)
