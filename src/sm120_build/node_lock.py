"""wheelhouse/node-lock.txt: everything a fresh node needs to run sglang with our wheels in
place of upstream's, hash-pinned, for a named target (Python version and platform).

The closure is resolved by uv (`uv pip compile --generate-hashes --no-build`) against the
sources pip is configured with (index.pip_sources), with the wheelhouse as find-links: our
local labels (0.6.3+sm120.p...) satisfy sglang's own `==0.6.3` pins. --no-build: a node
installs binaries only, and resolving never runs an sdist's build backend.

mirror_files fetches the files of that lock a node of the target would install, through pip
(`pip download --require-hashes` for the target), for publish --with-dependencies.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from packaging.utils import canonicalize_name, parse_wheel_filename

from .console import say, step
from .errors import UserError
from .glibc import manylinux_platforms
from .index import Sources, pip_sources
from .sums import checked_wheels

LOCK_FILE = "node-lock.txt"
# sglang 0.5.9's own Docker image runs Python 3.12. The platform, unless given, is the
# newest manylinux tag among our wheels (the jit-cache's, set by the glibc its binaries
# need): a node must run those anyway, and an older target would exclude them.
# A fresh node's sm120-build checks signed provenance (--trust-key): the lock takes in what
# that needs, as the package's own `provenance` extra declares it.
NODE_EXTRAS = {"sm120-build": "[provenance]"}
DEFAULT_PYTHON = "3.12"
FALLBACK_PLATFORM = "x86_64-manylinux_2_28"  # when every wheel of ours is pure Python

_PLATFORM = re.compile(r"^(?P<arch>x86_64|aarch64)-manylinux_2_(?P<glibc>\d+)$")
_PINNED = re.compile(r"^(?P<name>[A-Za-z0-9_.-]+)==(?P<version>\S+)(?P<rest>.*)$")
_HASH = re.compile(r"--hash=sha256:([0-9a-f]{64})")


@dataclass(frozen=True)
class Target:
    """The node the lock is for: its Python (MAJOR.MINOR) and platform (uv's spelling,
    ARCH-manylinux_2_Y)."""

    python_version: str
    platform: str

    def __post_init__(self) -> None:
        if re.fullmatch(r"3\.\d+", self.python_version) is None:
            raise UserError(
                f"--python-version {self.python_version!r}: give MAJOR.MINOR, such as 3.12"
            )
        if _PLATFORM.match(self.platform) is None:
            raise UserError(
                f"--platform {self.platform!r}: give ARCH-manylinux_2_Y with ARCH x86_64 or "
                "aarch64 and Y the node's glibc minor version, such as x86_64-manylinux_2_28"
            )

    def pip_platforms(self) -> list[str]:
        """pip download's --platform values: pip takes each tag literally, so every older
        manylinux a wheel may carry is listed (manylinux2014 is manylinux_2_17)."""
        match = _PLATFORM.match(self.platform)
        assert match is not None
        return manylinux_platforms(match["arch"], int(match["glibc"]))

    def describe(self) -> str:
        return f"CPython {self.python_version}, {self.platform}"


@dataclass(frozen=True)
class Pin:
    name: str
    version: str
    hashes: tuple[str, ...]


def parse_pins(text: str) -> list[Pin]:
    """The NAME==VERSION --hash=... entries of a requirements file (continuations joined)."""
    pins = []
    for line in text.replace("\\\n", " ").splitlines():
        match = _PINNED.match(line.strip())
        if match is not None:
            pins.append(
                Pin(
                    str(canonicalize_name(match["name"])),
                    match["version"],
                    tuple(_HASH.findall(match["rest"])),
                )
            )
    return pins


def _source_options(sources: Sources) -> list[str]:
    """uv's spelling of pip's configuration. pip's constraint files too: pip fetches the
    closure (publish --with-dependencies) and would refuse a version they exclude."""
    options = [option for place in sources.find_links for option in ("--find-links", place)]
    options += [option for path in sources.constraints for option in ("--constraint", path)]
    if not sources.indexes:
        return [*options, "--no-index"]
    options += ["--index-url", sources.indexes[0]]
    for extra in sources.indexes[1:]:
        options += ["--extra-index-url", extra]
    return options


def _cuda_of(pins: list[Pin]) -> str:
    """The torch/CUDA variant a closure holds, as its header states it."""
    by_name = {pin.name: pin.version for pin in pins}
    if "torch" not in by_name:
        return "no torch in this closure"
    runtime = next(
        (
            (name, version)
            for name, version in sorted(by_name.items())
            if re.fullmatch(r"nvidia-cuda-runtime(-cu\d+)?", name)
        ),
        None,
    )
    if runtime is None:
        return f"torch {by_name['torch']} without a CUDA runtime package (a CPU build?)"
    cuda = ".".join(runtime[1].split(".")[:2])
    return f"torch {by_name['torch']} with CUDA {cuda} ({runtime[0]} {runtime[1]})"


def platform_of(wheels: list[Path]) -> str:
    """The newest ARCH-manylinux_2_Y among the wheels' platform tags."""
    found = [
        (int(match["glibc"]), match["arch"])
        for wheel in wheels
        for tag in parse_wheel_filename(wheel.name)[3]
        for match in [re.fullmatch(r"manylinux_2_(?P<glibc>\d+)_(?P<arch>\w+)", tag.platform)]
        if match is not None
    ]
    if not found:
        return FALLBACK_PLATFORM
    glibc, arch = max(found)
    return f"{arch}-manylinux_2_{glibc}"


def uv_compile(
    scratch: Path, target: Target, roots: list[Pin], *options: str
) -> subprocess.CompletedProcess[str]:
    """`uv pip compile` of `roots` (NAME==VERSION each, as node.in in `scratch`) for
    `target`, with uv's own configuration files ignored (pip's sources are what counts,
    given in `options`)."""
    (scratch / "node.in").write_text(
        "".join(f"{pin.name}{NODE_EXTRAS.get(pin.name, '')}=={pin.version}\n" for pin in roots)
    )
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "uv",
            "pip",
            "compile",
            "node.in",  # relative: a lock says "via -r node.in", not a scratch path
            "--no-config",
            "--python-version",
            target.python_version,
            "--python-platform",
            target.platform,
            *options,
        ],
        cwd=scratch,
        capture_output=True,
        text=True,
        env=dict(os.environ, NO_COLOR="1"),
    )


def lock_node(wheelhouse: Path, python_version: str, platform: str | None) -> Path:
    """Resolve the fresh-node closure of wheelhouse/requirements.txt for the target and
    write it to wheelhouse/node-lock.txt at once. Each wheelhouse project must be in it
    with no hash but those requirements.txt pins for it."""
    checked = checked_wheels(wheelhouse)
    target = Target(python_version, platform or platform_of(list(checked)))
    requirements = wheelhouse / "requirements.txt"
    if not requirements.is_file():
        raise UserError(f"{requirements} is missing: run `nox -s build_wheels` first")
    roots = parse_pins(requirements.read_text())
    # What requirements.txt lets each wheelhouse project be: ours by their one hash, a
    # companion (flashinfer-cubin) by its pinned hashes, whichever file the wheelhouse holds.
    allowed = {pin.name: set(pin.hashes) for pin in roots}
    for path, digest in checked.items():
        name = str(canonicalize_name(parse_wheel_filename(path.name)[0]))
        if digest not in allowed.get(name, set()):
            raise UserError(
                f"{path.name} is not what {requirements} pins for {name}: "
                "rebuild the wheelhouse with `nox -s build_wheels`"
            )
    sources = pip_sources()
    with tempfile.TemporaryDirectory(prefix="sm120-lock-") as scratch:
        resolved = Path(scratch) / LOCK_FILE
        with step(f"resolving the fresh-node closure for {target.describe()} with uv"):
            result = uv_compile(
                Path(scratch),
                target,
                roots,
                "--no-header",
                "--generate-hashes",
                "--no-build",
                # As pip: the best match across every source, not the first index that has it.
                "--index-strategy",
                "unsafe-best-match",
                "--find-links",
                str(wheelhouse.resolve()),
                *_source_options(sources),
                "--output-file",
                str(resolved),
            )
        if result.returncode != 0:
            raise UserError(
                f"uv could not resolve the closure for {target.describe()} from "
                f"{sources.describe()}:\n{result.stderr.strip()[-3000:]}"
            )
        pins = parse_pins(resolved.read_text())
        by_name = {pin.name: pin for pin in pins}
        for path in checked:
            name = str(canonicalize_name(parse_wheel_filename(path.name)[0]))
            locked = set(by_name[name].hashes) if name in by_name else set()
            if not locked or not locked <= allowed[name]:
                raise UserError(
                    f"the resolved closure does not take {name} from {wheelhouse} (it pins "
                    f"{by_name[name].version if name in by_name else 'nothing'}): another "
                    "source serves a version the resolver preferred; publish the wheelhouse "
                    "under a new version, or remove the other one from the sources"
                )
        uv_version = subprocess.run(
            [sys.executable, "-m", "uv", "--version"], capture_output=True, text=True
        ).stdout.strip()
        header = (
            "# The closure a fresh node needs to run sglang with this wheelhouse's wheels,\n"
            f"# hash-pinned. Target: {target.describe()}; {_cuda_of(pins)}.\n"
            f"# {len(pins)} packages, resolved by {uv_version} from pip's sources\n"
            "# (sm120-build lock-node). On a node of that target, in a fresh venv:\n"
            f"#   pip install --require-hashes --no-deps --index-url URL -r {LOCK_FILE}\n"
        )
        partial = wheelhouse / f".{LOCK_FILE}.partial"
        partial.write_text(header + resolved.read_text())
        os.replace(partial, wheelhouse / LOCK_FILE)
    say(f"wrote {wheelhouse / LOCK_FILE}: {len(pins)} packages for {target.describe()}")
    say(f"  {_cuda_of(pins)}")
    return wheelhouse / LOCK_FILE


def read_lock(wheelhouse: Path) -> tuple[Target, list[Pin]]:
    """node-lock.txt's target (from its header) and pins."""
    lock = wheelhouse / LOCK_FILE
    if not lock.is_file():
        raise UserError(f"{lock} is missing: run `nox -s lock_node` first")
    text = lock.read_text()
    match = re.search(r"^# hash-pinned\. Target: CPython (3\.\d+), (\S+);", text, re.MULTILINE)
    if match is None:
        raise UserError(f"{lock} has no target line: write it again with `nox -s lock_node`")
    return Target(match[1], match[2]), parse_pins(text)


def mirror_files(wheelhouse: Path, into: Path) -> list[Path]:
    """The files of node-lock.txt a node of its target installs, fetched through pip with
    their pinned hashes into `into`; our own wheels come from the wheelhouse."""
    target, pins = read_lock(wheelhouse)
    platforms = [option for tag in target.pip_platforms() for option in ("--platform", tag)]
    say(f"fetching the {len(pins)} packages of {LOCK_FILE} for {target.describe()}")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--only-binary",
            ":all:",
            "--python-version",
            target.python_version,
            "--implementation",
            "cp",
            *platforms,
            "--require-hashes",
            "--find-links",
            str(wheelhouse.resolve()),
            "--requirement",
            str(wheelhouse / LOCK_FILE),
            "--dest",
            str(into),
        ],
    )  # pip's own output shows each file as it comes: the closure runs to gigabytes
    if result.returncode != 0:
        raise UserError("pip could not fetch the closure (its output above says why)")
    return sorted(into.glob("*.whl"))
