"""Nox sessions for sm120-build. Each session is a thin call into the sm120_build package.

.venv/bin/nox -s build_wheels         the main job: the default stack's wheels, in wheelhouse/
.venv/bin/nox -s tests                the whole test suite (what .ci/run calls)
.venv/bin/nox -l                      every session, with the first line of its help
.venv/bin/nox -s NAME -- --help       a session's options (creates and installs nothing)
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import nox

nox.options.default_venv_backend = "venv"
nox.options.sessions = ["build_wheels"]
nox.options.reuse_existing_virtualenvs = True
# A Python that the package claims and this machine lacks fails its session, instead of
# being skipped with exit status 0.
nox.options.error_on_missing_interpreters = True

ROOT = Path(__file__).parent
SRC = ROOT / "src"
# Every Python that pyproject.toml's requires-python admits; the fast tests run on each.
PYTHONS = ["3.10", "3.11", "3.12", "3.13"]
# Two pytest workers (pytest-xdist): the slow tests wait on the index, pip and git as much as
# on the compiler, and overlap on two cores (docs/ci.md). Each test module runs on one
# worker, so that its module fixtures (builds, node venvs) are made once. `-- -n 0` runs the
# tests in this process (for --pdb).
TEST_WORKERS = ["-n", "2", "--dist", "loadfile"]
# One relocatable cache for everything large: sdists, the CUDA toolkit, built wheels, and
# pip's own downloads (torch, flashinfer-cubin) made by any session.
CACHE = Path(os.environ.get("SM120_CACHE_DIR", ROOT / ".cache")).resolve()


def _posargs_ask_for_help(argv: list[str]) -> bool:
    return "--" in argv and any(a in ("-h", "--help") for a in argv[argv.index("--") + 1 :])


# `nox -s NAME -- --help` prints the session's options with nox's own Python and this
# checkout's source: no environment is created and nothing is installed.
HELP_ONLY = _posargs_ask_for_help(sys.argv)


def _pyenv_interpreters() -> None:
    """pyenv serves one Python through its shims (the one in PYENV_VERSION, which its shims
    export); add every installed 3.x after it so that nox finds python3.10 ... python3.13
    for every session that names them."""
    versions = sorted(p.name for p in (Path.home() / ".pyenv" / "versions").glob("3.*"))
    if not versions:
        return
    current = (
        os.environ.get("PYENV_VERSION")
        or subprocess.run(["pyenv", "version-name"], capture_output=True, text=True).stdout.strip()
    )
    os.environ["PYENV_VERSION"] = ":".join(dict.fromkeys([*current.split(":"), *versions]))


_pyenv_interpreters()


def _stack_pins_file(posargs: list[str]) -> Path:
    """The pins.toml of the stack the options name (--stack NAME), else the default one;
    an unknown name is left to the command, which lists the stacks."""
    if "--stack" in posargs:
        index = posargs.index("--stack")
        name = posargs[index + 1] if index + 1 < len(posargs) else ""
        candidate = ROOT / "stacks" / name / "pins.toml"
        if re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", name) and candidate.is_file():
            return candidate
    return ROOT / "pins.toml"


def _tool_pins(posargs: list[str]) -> dict[str, list[str]]:
    """The tool pins of the stack's pins.toml by table; a broken one stops nox with one
    line."""
    path = _stack_pins_file(posargs)
    try:
        data = nox.project.load_toml(path)
        return {
            table: list(data[table]["requirements"])
            for table in ("build", "render", "test", "publish")
        }
    except (OSError, ValueError, KeyError, TypeError) as exc:
        sys.exit(f"nox: cannot read the tool pins in {path} ({type(exc).__name__}: {exc})")


def _compile_requirements(pins: dict[str, list[str]]) -> list[str]:
    """The sessions that compile modules also render them with the patched FlashInfer."""
    return [*pins["build"], *pins["render"]]


# user[:password]@ in a URL: a secret nox would print with the command line it runs.
_CREDENTIALS_IN_URL = re.compile(r"://[^/@\s]+@")


def _refuse_credentials(session: nox.Session) -> None:
    """Stop before nox runs (and so echoes) a command whose options carry a credential."""
    if any(_CREDENTIALS_IN_URL.search(arg) for arg in session.posargs):
        session.error(
            "a URL among the options carries credentials (user[:password]@host); nox prints "
            "every command it runs, so nothing was run. Give them as TWINE_USERNAME and "
            "TWINE_PASSWORD, in a keyring, or in ~/.pypirc, and the URL without them"
        )


def _project_digest() -> str:
    """The package's source as it is now: what an installed copy must match."""
    digest = hashlib.sha256((ROOT / "pyproject.toml").read_bytes())
    for path in sorted(SRC.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts and ".egg-info" not in str(path):
            digest.update(str(path.relative_to(SRC)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def _install(session: nox.Session, *requirements: str, project: bool = True) -> None:
    """pip install the project and `requirements` into the session's environment, unless it
    holds exactly these already (a stamp of both): a no-op rebuild installs nothing."""
    _refuse_credentials(session)
    session.env["SM120_CACHE_DIR"] = str(CACHE)
    session.env["PIP_CACHE_DIR"] = str(CACHE / "pip")
    location = getattr(session.virtualenv, "location", None)
    stamp = Path(location) / "sm120-build-installed" if location else None
    wanted = json.dumps([sorted(requirements), _project_digest() if project else None])
    if stamp is not None and stamp.is_file() and stamp.read_text() == wanted:
        session.log("the environment holds these pins and this source already: not installing")
        return
    session.log(f"installing {len(requirements)} pinned requirement(s) (minutes the first time)")
    # pip's own lines (Collecting, Downloading with sizes) are the progress of a long install.
    session.install(*([".[forge]"] if project else []), *requirements, silent=False)
    if stamp is not None:
        stamp.write_text(wanted)


def _help(session: nox.Session, *module: str) -> None:
    session.run(sys.executable, *module, "--help", env={"PYTHONPATH": str(SRC)}, external=True)


def _sm120_build(session: nox.Session, command: str, *requirements: str) -> None:
    """`sm120-build COMMAND` with the session's options, in the session's environment with
    `requirements` installed."""
    if HELP_ONLY:
        _help(session, "-m", "sm120_build", command)
        return
    if command in _COMPILING_COMMANDS:
        _refuse_unknown_platform(session.posargs)
    _install(session, *requirements)
    session.run("sm120-build", command, *session.posargs)


# The commands whose --platform is the host CPU the modules are compiled for (lock-node's
# names a node's platform tag, and is checked by the command itself).
_COMPILING_COMMANDS = ("build-wheels", "plan-shards", "build-shard")


def _refuse_unknown_platform(posargs: list[str]) -> None:
    """A --platform the build cannot target stops the session before it installs (fetches)
    anything, with the list of those it can (hosts.py)."""
    asked = [
        value
        for option, value in zip(["", *posargs], posargs, strict=False)
        if option == "--platform"
    ] + [arg.split("=", 1)[1] for arg in posargs if arg.startswith("--platform=")]
    sys.path.insert(0, str(SRC))
    try:
        from sm120_build import hosts
        from sm120_build.errors import UserError

        for name in asked:
            hosts.parse(name)
    except UserError as exc:
        sys.exit(f"nox: {exc}")
    finally:
        sys.path.remove(str(SRC))


_COMMON = (
    "Every sm120-build command also takes --stack NAME (the upstream pair, named after its "
    "sglang release; without a name the stacks are listed), --verbose (the traceback of an "
    "unexpected error) and --force (adopt a non-empty SM120_CACHE_DIR not marked as this "
    "tool's cache)."
)


def _profiles_line() -> str:
    """The profiles a build can name, as profiles.toml has them now."""
    sys.path.insert(0, str(SRC))
    try:
        from sm120_build.errors import UserError
        from sm120_build.profiles import load

        names = sorted(load(ROOT / "profiles.toml").profiles)
    except (ImportError, UserError) as exc:
        return f"(the profiles cannot be listed: {exc})"
    finally:
        sys.path.remove(str(SRC))
    return f"the default stack's {len(names)} profiles: {', '.join(names)}"


def _session(**options: Any) -> Callable[[Callable[[nox.Session], None]], Any]:
    """nox.session, with the options every sm120-build command takes added to the help of
    those that run one; a run that asks only for help creates no environment."""

    def register(function: Callable[[nox.Session], None]) -> Any:
        doc = (function.__doc__ or "").rstrip()
        if "{profiles}" in doc:
            doc = doc.replace("{profiles}", _profiles_line())
        if "{common}" in doc:
            doc = doc.replace("{common}", _COMMON)
        function.__doc__ = doc + "\n"
        if not HELP_ONLY:
            return nox.session(**options)(function)
        # Without an environment nox names no session after a Python: each is named here.
        pythons = options.pop("python", None)
        options["venv_backend"] = "none"
        for version in pythons or []:
            nox.session(name=f"{function.__name__}-{version}", **options)(function)
        return function if pythons else nox.session(**options)(function)

    return register


@_session()
def vendor(session: nox.Session) -> None:
    """Fetch, verify, unpack and patch the stack's upstreams into its vendor/<name>/.

    -- [NAME ...] [--continue NAME]: after a patch stopped the series and its refresh is
    committed in vendor/NAME, --continue applies the rest of the series.
    {common}
    """
    _sm120_build(session, "vendor")


@_session()
def export_patches(session: nox.Session) -> None:
    """Write the commits of vendor/<name>/ back to patches/<name>/, keeping their headers.

    -- [NAME ...]
    {common}
    """
    _sm120_build(session, "export-patches")


@_session()
def bump(session: nox.Session) -> None:
    """Report what an upstream release does to every patch; --write makes it a stack.

    -- flashinfer-python==0.6.17 [sglang==0.5.10] [--json FILE] [--write]
    Each patch is clean, offset, fuzz (refused), upstream, partly upstream, upstream in
    another form or a conflict, with keep/drop/refresh/review. --write writes the pins and
    the series (patches dropped only when the whole patch reverse-applies): a new sglang
    release becomes a new stack (stacks/sglang-X.Y.Z/), anything else updates the stack in
    place. Exit status: 0 nothing to do by hand, 1 refreshes or reviews remain, 2 the pins
    would not hold together, 3 the candidate could not be evaluated (not fetched, say).
    {common}
    """
    if HELP_ONLY:
        _help(session, "-m", "sm120_build", "bump")
        return
    pins = _tool_pins(session.posargs)
    _install(session, *pins["build"])
    command = [str(Path(session.bin) / "sm120-build"), "bump", *session.posargs]
    session.log(" ".join(command[1:]))
    env = {**os.environ, **{k: v for k, v in session.env.items() if v is not None}}
    env["PATH"] = f"{session.bin}{os.pathsep}{os.environ['PATH']}"
    status = subprocess.run(command, env=env).returncode
    if status:
        # nox turns every failing command into its own status 1; the bump's status is its
        # verdict, so it is passed on as it is.
        session.log(f"sm120-build bump ended with status {status}")
        raise SystemExit(status)


@_session()
def audit_gates(session: nox.Session) -> None:
    """Find arch gates that still exclude SM120 (nvcc device preprocessing + Python AST).

    Fails when an unwaived gate remains on the allreduce-fusion path.
    -- [--pristine (audit the unpatched upstream; traces each gate to its patch)]
       [--json FILE] [--scope all (whole trees, report only)]
    {common}
    """
    _sm120_build(session, "audit-gates", *_tool_pins(session.posargs)["build"])


@_session()
def build_wheels(session: nox.Session) -> None:
    """Build the stack's wheels (FlashInfer, its jit-cache, sglang, node tools).

    -- --profile NAME                the modules to build ahead of time (default: comm); {profiles}
    -- --module NAME                 one module recipe more (repeatable)
    -- --arch 12.0f [--arch 9.0a]    targets (default: the SM12x family, docs/benchmarks.md)
    -- --cuda-home PATH              a system CUDA toolkit instead of the pinned pip one
    -- --base-jit-cache WHEEL        keep another jit-cache wheel's modules (checked first)
    -- --glibc-baseline X.Y          refuse a jit-cache wheel tagged for a newer glibc
    -- --platform aarch64            cross-build for aarch64 hosts (DGX Spark) into
                                     wheelhouse-aarch64/ (default: x86_64, into wheelhouse/)
    -- --sign-key KEY                sign each wheel's provenance (Ed25519 PEM; or SM120_SIGN_KEY)
    {common}
    """
    _sm120_build(session, "build-wheels", *_compile_requirements(_tool_pins(session.posargs)))


@_session()
def plan_shards(session: nox.Session) -> None:
    """Split a build over N machines: print which modules each shard compiles.

    -- --shards N [--profile NAME] [--module NAME] [--arch ARCH] [--cuda-home PATH]
       [--base-jit-cache WHEEL] [--platform HOST] [--github-output FILE]
    Balanced by ci/module-costs.json (nox -s bench refreshes it); every shard computes the
    same plan, so this is for people and CI matrices, not an input of build_shard.
    {common}
    """
    _sm120_build(session, "plan-shards", *_compile_requirements(_tool_pins(session.posargs)))


@_session(venv_backend="none")
def shard_matrix(session: nox.Session) -> None:
    """The shard indices 1..N of a sharded build, for a CI matrix: installs nothing.

    -- --shards N [--github-output FILE]
    {common}
    """
    session.run(
        sys.executable,
        "-m",
        "sm120_build",
        "shard-matrix",
        *session.posargs,
        env={"PYTHONPATH": str(SRC)},
        external=True,
    )


@_session()
def build_shard(session: nox.Session) -> None:
    """Compile shard I of N into shards/I-of-N/ (one machine of a sharded build).

    -- --shard I/N, and the same --profile/--module/--arch/--cuda-home/--base-jit-cache/
    --platform on every shard.
    Point sccache at a shared backend with its own SCCACHE_* variables (docs/cache.md).
    {common}
    """
    _sm120_build(session, "build-shard", *_compile_requirements(_tool_pins(session.posargs)))


@_session()
def merge_shards(session: nox.Session) -> None:
    """Assemble the wheelhouse from all shards in shards/: the same bytes as build_wheels.

    -- [--base-jit-cache WHEEL] [--glibc-baseline X.Y] [--sign-key KEY: sign the merged
    wheels' provenance, so that no shard's signature reaches a node]. Refuses shards of
    different builds, a missing or changed shard, or shards of another patch series than
    this checkout's; with --glibc-baseline, a jit-cache wheel tagged for a newer glibc
    (naming the symbols).
    {common}
    """
    _sm120_build(session, "merge-shards", *_tool_pins(session.posargs)["build"])


@_session()
def publish(session: nox.Session) -> None:
    """Upload the wheelhouse to an index with twine and read it back, or write a static one.

    -- --repository-url URL --index-url URL   (or --repository NAME from ~/.pypirc)
    -- --static DIR                            PEP 503 tree for an air-gapped mirror, with
                                               the lock files under locks/
    -- --timeout SECONDS                       give up on an index that does not answer
    -- --with-dependencies                     also the closure of node-lock.txt
    -- --platform aarch64                      wheelhouse-aarch64/ instead of wheelhouse/
    Credentials: TWINE_USERNAME/TWINE_PASSWORD, a keyring, or ~/.pypirc. Never part of
    build_wheels.
    {common}
    """
    _sm120_build(session, "publish", *_tool_pins(session.posargs)["publish"])


@_session()
def derive_profiles(session: nox.Session) -> None:
    """Derive profiles-derived.toml from sglang's own code, for every served configuration.

    For each configuration of served-models.toml, sglang's server-argument resolution,
    model constructor, KV pool and attention backend run on the CPU and record what they ask
    FlashInfer and sglang's JIT for (docs/derive.md). The first run installs the pinned
    sglang's dependencies into the cache (several GB).
    -- [--check (compare instead of writing; exit 1 if it differs)]
       [--config NAME (only this configuration, repeatable; the others keep the file's)]
    {common}
    """
    _sm120_build(session, "derive-profiles")


@_session()
def lock_node(session: nox.Session) -> None:
    """Write node-lock.txt: what a fresh node needs with the wheelhouse, hash-pinned.

    Resolved with uv from pip's configured sources.
    -- [--python-version X.Y (default 3.12)] [--platform ARCH-manylinux_2_Y (default: the
       newest manylinux tag of the wheelhouse's wheels)]
    -- --pylock-index URL            instead: pylock.toml for node-lock.txt's target, from
       that index alone, once publish --with-dependencies put the closure there
    {common}
    """
    _sm120_build(session, "lock-node", *_tool_pins(session.posargs)["publish"])


@_session()
def bench(session: nox.Session) -> None:
    """Benchmark: cold build time by stage, no-op rebuild time, wheel sizes (not a test).

    -- [--profile NAME] [--module NAME] [--arch ARCH] [--cuda-home PATH]
       [--base-jit-cache WHEEL] [--platform HOST] [--sample N] [--shards N] [--verbose]
    """
    if HELP_ONLY:
        _help(session, "-m", "sm120_build.bench")
        return
    _install(session, *_compile_requirements(_tool_pins(session.posargs)))
    session.run("python", "-m", "sm120_build.bench", *session.posargs)


def _run_on_this_node(session: nox.Session, module: str) -> None:
    """Run `module` in the Python nox runs from, with JIT compilation disabled, after it has
    installed wheelhouse/'s wheels there, each checked against SHA256SUMS (`--install`; it
    checks for torch first and installs nothing without it). On a node of another CPU than
    x86_64 (DGX Spark), wheelhouse-<cpu>/ where the checkout has one (build_wheels --platform)."""
    if HELP_ONLY:
        _help(session, "-m", module)
        return
    _refuse_credentials(session)
    own = ROOT / f"wheelhouse-{platform.machine()}"
    wheelhouse = own if platform.machine() != "x86_64" and own.is_dir() else ROOT / "wheelhouse"
    session.run(
        sys.executable,
        "-m",
        module,
        "--install",
        str(wheelhouse),
        *session.posargs,
        env={"FLASHINFER_DISABLE_JIT": "1", "PYTHONPATH": str(SRC)},
        external=True,
    )


@_session(venv_backend="none")
def verify_gpu(session: nox.Session) -> None:
    """Check that every module of the jit-cache wheel computes the right thing on this GPU.

    Runs in the Python environment nox itself runs from, which must hold torch (the one that
    serves sglang: `python -m nox -s verify_gpu`). It installs wheelhouse/'s wheels there
    without dependencies, each checked against SHA256SUMS, then checks them with
    FLASHINFER_DISABLE_JIT=1; trtllm_comm over ranks (two share a single GPU).
    -- [--module NAME] [--profile NAME] [--pattern PATTERN] [--world-size N] [--json FILE]
       [--trust-key KEY.pub (verify the wheels' signed provenance before installing)]
       [--verbose]
    """
    _run_on_this_node(session, "sm120_build.node.verify")


@_session(venv_backend="none")
def node_check(session: nox.Session) -> None:
    """Prove this node will not JIT-compile: load every module of the profile, prebuilt.

    Runs like verify_gpu, in the Python nox runs from (torch installed), after installing
    wheelhouse/'s wheels there. Without a GPU it reports versions, patch series and archs,
    then what it could not check. Fails, naming the cause, when a module would be compiled
    or does not load, when the jit-cache has no code for this GPU, or when the two FlashInfer
    wheels come from different patch series.
    -- [--arch 12.0 (no GPU here: check for that arch)] [--profile NAME (default: the
       recipes the jit-cache wheel was built from)] [--json FILE] [--verbose]
       [--trust-key KEY.pub (verify the wheels' signed provenance before installing them)]
    """
    _run_on_this_node(session, "sm120_build.node.check")


@_session(venv_backend="none")
def bench_gpu(session: nox.Session) -> None:
    """Benchmark fused vs NCCL+separate allreduce/residual/RMSNorm, one rank per GPU (>= 2).

    Compares trtllm_allreduce_fusion with NCCL all_reduce followed by a separate residual add
    and RMSNorm. Runs like verify_gpu, in the Python nox runs from, after installing
    wheelhouse/'s wheels there. --launch-cost instead times each patch-0004 launcher's host
    cost per eager call (one GPU is enough).
    -- [--world-size N (repeatable)] [--replays N] [--launch-cost] [--json FILE] [--verbose]
       [--trust-key KEY.pub (verify the wheels' signed provenance before installing)]
    """
    _run_on_this_node(session, "sm120_build.node.bench_gpu")


@_session()
def tests(session: nox.Session) -> None:
    """Run the whole test suite on two workers, then the fast tests on the other Pythons.

    The other Pythons are the rest of those the package claims.
    -- [pytest options], e.g. -- -m 'not slow', or -n 0 for one process (--pdb)
    """
    if HELP_ONLY:
        session.log(tests.__doc__ or "")
        return
    pins = _tool_pins([])
    _install(session, *_compile_requirements(pins), *pins["test"], *pins["publish"])
    session.run("pytest", *TEST_WORKERS, *session.posargs)
    this = f"{sys.version_info.major}.{sys.version_info.minor}"
    for version in PYTHONS:
        if version != this:
            session.notify(f"tests_fast-{version}", ["-m", "not slow"])


@_session(python=PYTHONS)
def tests_fast(session: nox.Session) -> None:
    """The fast tests on one claimed Python (nox -s tests queues each).

    torch is installed only by `tests`, on the Python nox runs from: the index has no CPU
    build of the pinned torch for the other Pythons, only CUDA builds of several GB. So
    the in-process tests that need torch (the node check's, the render's) skip here, each
    saying why.
    -- [pytest options] (default: -m 'not slow')
    """
    if HELP_ONLY:
        session.log(tests_fast.__doc__ or "")
        return
    pins = _tool_pins([])
    _install(session, *pins["build"], *pins["test"], *pins["publish"])
    session.run("pytest", *TEST_WORKERS, *(session.posargs or ["-m", "not slow"]))


@_session()
def mutants(session: nox.Session) -> None:
    """Mutation testing (mutmut) of the modules that guard data and trust.

    Each mutant runs against the fast tests and the compile stage's own (nvcc on one-line
    kernels, with the pinned toolkit) that reach it; mypy rejects some before any test.

    The modules are listed under [tool.mutmut] in pyproject.toml. Prints each verdict's count
    and the share caught (killed by a test, timed out, or rejected by mypy), and fails below
    90 % (docs/mutation.md). Hours on two cores: CI runs it on a schedule, not on every push.
    Takes no options.
    """
    if HELP_ONLY:
        session.log(mutants.__doc__ or "")
        return
    pins = _tool_pins([])
    # Not the package itself: mutmut imports it from its mutated copy (mutants/src). The
    # tests' subprocesses (`python -m sm120_build ...`) run the unmutated source.
    _install(
        session,
        *_compile_requirements(pins),
        *pins["test"],
        *pins["publish"],
        # The package's own requirements, as `pip install .[forge]` would bring them.
        *nox.project.load_toml(ROOT / "pyproject.toml")["project"]["dependencies"],
        *nox.project.load_toml(ROOT / "pyproject.toml")["project"]["optional-dependencies"][
            "forge"
        ],
        project=False,
    )
    shutil.rmtree(ROOT / "mutants", ignore_errors=True)  # results of other code would be reused
    # mutmut forks each mutant's tests from a process that ran torch (the clean run): a forked
    # OpenMP pool waits forever, and every mutant after it timed out ("caught"), killed or not.
    env = {"PYTHONPATH": str(SRC), "OMP_NUM_THREADS": "1"}
    # The compile stage's tests (marked `mutation`) run nvcc: the pinned toolkit's, installed
    # into the cache as a build installs it, so the job needs no CUDA of its own.
    cuda_home = session.run(
        "python",
        "-c",
        "from pathlib import Path; from sm120_build import pins, toolkit; "
        "from sm120_build.layout import Layout; layout = Layout.from_root(Path.cwd()); "
        "print(toolkit.pip_toolkit(pins.load(layout.pins_file).toolkit_requirement, "
        "layout.cache).home)",
        env=env,
        silent=True,
    )
    if isinstance(cuda_home, str):  # None under nox --install-only
        env["CUDA_HOME"] = cuda_home.strip().splitlines()[-1]
    session.run("mutmut", "run", env=env, success_codes=[0, 1])
    listing = session.run("mutmut", "results", "--all", "true", silent=True)
    if listing is None:
        return  # nox --install-only: nothing ran, so there is nothing to count
    verdicts = Counter(
        line.rpartition(": ")[2].strip() for line in listing.splitlines() if ": " in line
    )
    session.run("mutmut", "results")  # the mutants not killed, for `mutmut show <name>`
    # A mutant mypy rejects cannot land (`nox -s lint`); one whose tests hang past mutmut's
    # limit was found out too, as mutmut's own score counts it.
    caught = verdicts["killed"] + verdicts["timeout"] + verdicts["caught by type check"]
    total = sum(verdicts.values())
    ratio = caught / max(total, 1)
    session.log(
        f"{caught} of {total} mutants caught ({ratio:.0%}): "
        + ", ".join(f"{count} {verdict}" for verdict, count in verdicts.most_common())
    )
    if verdicts["not checked"]:
        session.error("mutmut left mutants unchecked: run the session again")
    if ratio < 0.90:
        session.error("below 90 % caught: `mutmut show <name>` shows a survivor")


@_session()
def lint(session: nox.Session) -> None:
    """ruff, mypy --strict, actionlint on ci/github/ and hadolint on ci/docker/.

    ruff check and ruff format --check on everything; mypy on src/, tests/ and this file.
    Takes no options.
    """
    if HELP_ONLY:
        session.log(lint.__doc__ or "")
        return
    # mypy also reads the tests and this file: pytest's and nox's own types.
    linters = ("ruff", "mypy", "actionlint", "hadolint", "pytest", "nox")
    _install(session, *(r for r in _tool_pins([])["test"] if r.startswith(linters)))
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
    session.run("mypy")
    workflows = sorted(str(p) for p in (ROOT / "ci" / "github" / "workflows").glob("*.yml"))
    session.run("actionlint", "-config-file", str(ROOT / "ci/github/actionlint.yaml"), *workflows)
    dockerfiles = sorted(str(p) for p in (ROOT / "ci" / "docker").glob("*/Dockerfile"))
    session.run("hadolint", "--config", str(ROOT / "ci/docker/hadolint.yaml"), *dockerfiles)
