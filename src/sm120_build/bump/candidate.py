"""The candidate release: fetched (never run), unpacked, its series classified, its audit
run, and the pins that would move with it checked for coherence from the sdists' own
metadata."""

from __future__ import annotations

import re
import subprocess
import sys
import tarfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import (
    InvalidSdistFilename,
    InvalidWheelFilename,
    canonicalize_name,
    parse_sdist_filename,
    parse_wheel_filename,
)
from packaging.version import Version

from .. import index
from ..cache import sha256_of
from ..console import say
from ..errors import UserError
from ..fetch import FETCH_TIMEOUT
from ..patches import load_series
from ..pins import Artifact, Pins, Upstream
from ..vendor import make_pristine_tree
from .classify import PatchVerdict, classify_series


@dataclass(frozen=True)
class GateSummary:
    """The gate audit of a candidate tree, series applied as far as it goes."""

    lines: list[str]
    report: dict[str, object]
    missing_scope: list[str]
    gates: int = 0  # in scope, unwaived


@dataclass
class Candidate:
    upstream: Upstream  # the pins entry as it would become
    patches: list[PatchVerdict] = field(default_factory=list)
    related: list[str] = field(default_factory=list)
    audit: GateSummary | None = None
    requires: dict[str, Requirement] = field(default_factory=dict)  # its sdist's Requires-Dist


def parse_candidate(text: str, pins: Pins) -> tuple[Upstream, str]:
    """`project==version` -> (the pinned upstream it replaces, the candidate version)."""
    try:
        requirement = Requirement(text)
        (specifier,) = requirement.specifier
    except (InvalidRequirement, ValueError):
        raise UserError(
            f"{text!r}: give a candidate as PROJECT==VERSION, e.g. sglang==0.5.10"
        ) from None
    if specifier.operator != "==":
        raise UserError(f"{text!r}: give an exact version with ==")
    for upstream in pins.upstreams.values():
        if canonicalize_name(upstream.project) == canonicalize_name(requirement.name):
            return upstream, specifier.version
    known = ", ".join(sorted(u.project for u in pins.upstreams.values()))
    raise UserError(f"{requirement.name} is not a pinned upstream (pinned: {known})")


def _download(link: index.Link, scratch: Path, sources: index.Sources) -> Path:
    say(f"fetching {link.name} from {sources.describe()}")
    got = index.download(link, scratch / link.name, sources, FETCH_TIMEOUT)
    if link.sha256 is not None and got != link.sha256:
        raise UserError(
            f"{link.name}: the index states sha256 {link.sha256}, the download has {got}; "
            "nothing of it was unpacked or run"
        )
    return scratch / link.name


def _target(wheel_name: str) -> tuple[str, str, str]:
    """(python tag, abi tag, CPU) of a wheel file name: a target, whatever its glibc."""
    python, abi, platform = wheel_name[:-4].split("-")[-3:]
    cpu = re.search(r"(x86_64|aarch64|arm64|ppc64le|s390x|i686|armv7l|any)$", platform)
    return python, abi, cpu.group(1) if cpu else platform


# The target a wheel-only candidate gets when the stack pinned an sdist so far: the Python
# sglang's own images run and the CPU of the nodes this project builds for by default.
DEFAULT_TARGET = ("cp312", "cp312", "x86_64")


def fetch_candidate(upstream: Upstream, version: str, scratch: Path) -> list[Path]:
    """The candidate's files, from where pip is configured to look; downloaded by name and
    never run (index.py says why not through `pip download`): its sdist, or, for a project
    that publishes only wheels, one wheel per target the stack builds for (the targets of
    its pinned wheels, else DEFAULT_TARGET), the first to vendor."""
    sources = index.pip_sources()
    wanted = (canonicalize_name(upstream.project), Version(version))
    sdists, wheels = [], []
    for link in index.project_links(sources, upstream.project, FETCH_TIMEOUT):
        try:
            if link.name.endswith(".whl"):
                if parse_wheel_filename(link.name)[:2] == wanted:
                    wheels.append(link)
            elif parse_sdist_filename(link.name) == wanted:
                sdists.append(link)
        except (InvalidSdistFilename, InvalidWheelFilename):
            continue
    if sdists:
        link = sorted(sdists, key=lambda link: not link.name.endswith(".tar.gz"))[0]
        return [_download(link, scratch, sources)]
    if not wheels:
        raise UserError(
            f"no sdist or wheel of {upstream.project}=={version} in {sources.describe()} "
            "(pip's configuration: `pip config list`); check the version, and that the "
            "index has its files"
        )
    targets = [_target(w.file) for w in upstream.wheels] or [DEFAULT_TARGET]
    chosen = []
    for target in targets:
        matching = sorted(
            (link for link in wheels if _target(link.name) == target), key=lambda found: found.name
        )
        if not matching:
            offered = ", ".join(sorted(link.name for link in wheels))
            raise UserError(
                f"{upstream.project} {version} publishes no sdist and no wheel for "
                f"{'-'.join(target)} (it has {offered}); name a release that has one"
            )
        chosen.append(_download(matching[0], scratch, sources))
    return chosen


def wheel_requires(wheel: Path) -> dict[str, Requirement]:
    """A wheel's own Requires-Dist (its .dist-info/METADATA), read without installing it."""
    with zipfile.ZipFile(wheel) as archive:
        names = [n for n in archive.namelist() if re.fullmatch(r"[^/]+\.dist-info/METADATA", n)]
        if len(names) != 1:
            return {}
        return _parse_requires(archive.read(names[0]).decode(errors="replace"))


def _git_commit(tree: Path) -> str:
    """The upstream commit a release records: FlashInfer's _build_meta, sglang's _version."""
    for path, pattern in (
        ("flashinfer/_build_meta.py", r'__git_(?:version|commit)__ = "([0-9a-f]+)"'),
        ("sglang/_version.py", r"commit_id\s*[:=][^'\"]*['\"]g?([0-9a-f]+)['\"]"),
        ("python/sglang/_version.py", r"commit_id\s*[:=][^'\"]*['\"]g?([0-9a-f]+)['\"]"),
    ):
        if (tree / path).is_file():
            match = re.search(pattern, (tree / path).read_text())
            if match:
                return match.group(1)
    return ""


def _parse_requires(pkg_info: str) -> dict[str, Requirement]:
    requirements: dict[str, Requirement] = {}
    for line in pkg_info.splitlines():
        if line.startswith("Requires-Dist:"):
            try:
                requirement = Requirement(line.split(":", 1)[1].strip())
            except InvalidRequirement:
                continue
            requirements[canonicalize_name(requirement.name)] = requirement
    return requirements


def sdist_requires(sdist: Path) -> dict[str, Requirement]:
    """An sdist's own Requires-Dist (its top-level PKG-INFO), by canonical name: read from
    the archive, never by running anything, and the same in a fresh clone as anywhere."""
    with tarfile.open(sdist) as archive:
        for member in archive.getmembers():
            parts = member.name.split("/")
            if len(parts) == 2 and parts[1] == "PKG-INFO" and member.isfile():
                stream = archive.extractfile(member)
                assert stream is not None
                return _parse_requires(stream.read().decode(errors="replace"))
    return {}


def _index_versions(project: str) -> list[str]:
    """Versions the configured index has for `project` (pip index versions)."""
    result = subprocess.run(
        [sys.executable, "-m", "pip", "index", "versions", project],
        capture_output=True,
        text=True,
    )
    match = re.search(r"Available versions: (.+)", result.stdout)
    return [v.strip() for v in match.group(1).split(",")] if match else []


def related_pins(
    candidate: Upstream,
    requires: dict[str, Requirement],
    pins: Pins,
    others: dict[str, Upstream],
    pinned_sglang_requires: dict[str, Requirement],
) -> list[str]:
    """What else must move with the candidate: the FlashInfer sglang requires, the
    companions (which follow the chosen sglang's metadata, --write), and the git reference
    (pin_set_problems decides whether the set holds)."""
    lines = [f"git_tag {candidate.git_tag}, git_commit {candidate.git_commit or '(not recorded)'}"]
    if candidate.name == "sglang":
        if "flashinfer-python" in requires:
            lines.append(f"sglang {candidate.version} requires {requires['flashinfer-python']}")
        sglang, chosen = candidate.version, requires
    else:
        sglang = pins.upstream("sglang").version
        chosen = pinned_sglang_requires
        if "sglang" not in others and "flashinfer-python" in pinned_sglang_requires:
            lines.append(
                f"the pinned sglang {sglang} requires {pinned_sglang_requires['flashinfer-python']}"
            )
    if candidate.name == "sglang" or "sglang" not in others:
        for name, companion in pins.companions.items():
            wanted = chosen.get(str(canonicalize_name(name)))
            lines.append(
                f"companion {name} (pinned {companion.version}): sglang {sglang} requires "
                + (f"{wanted}" if wanted else "none, so --write drops the pin")
            )
    return lines


def pin_set_problems(
    results: list[Candidate], pins: Pins, pinned_sglang_requires: dict[str, Requirement]
) -> list[str]:
    """Why the pins the candidates would write do not hold together: the sglang they name
    must accept the FlashInfer they name. Each problem names the pair to ask for."""
    moved = {result.upstream.name: result for result in results}
    flashinfer = (
        moved["flashinfer"].upstream if "flashinfer" in moved else pins.upstream("flashinfer")
    )
    if "sglang" in moved:
        sglang, requires = moved["sglang"].upstream, moved["sglang"].requires
    else:
        sglang, requires = pins.upstream("sglang"), pinned_sglang_requires
    wanted = requires.get("flashinfer-python")
    if wanted is None or wanted.specifier.contains(flashinfer.version, prereleases=True):
        return []
    if "sglang" in moved:
        # sglang names the FlashInfer it needs: ask for the two together.
        exact = [spec.version for spec in wanted.specifier if spec.operator == "=="]
        ask = f"sglang=={sglang.version} flashinfer-python=={exact[0]}" if exact else str(wanted)
    else:
        ask = (
            f"flashinfer-python=={flashinfer.version} together with an sglang release whose "
            f"metadata accepts it (the pinned {sglang.version} does not)"
        )
    return [
        f"sglang {sglang.version} requires {wanted}, which flashinfer-python "
        f"{flashinfer.version} does not meet; ask for: {ask}"
    ]


def evaluate(
    pins: Pins,
    patches_root: Path,
    pinned_sglang_requires: dict[str, Requirement],
    candidates: list[tuple[Upstream, str]],
    scratch: Path,
    audit_candidate: Callable[[Path, str], GateSummary],
) -> list[Candidate]:
    """Classify the series of each candidate; `audit_candidate(tree, name)` -> report dict.
    `pinned_sglang_requires`: the pinned sglang sdist's Requires-Dist (sdist_requires)."""
    results = []
    moved = {}
    trees = {}
    requires = {}
    for pinned, version in candidates:
        directory = scratch / pinned.name
        directory.mkdir()
        files = fetch_candidate(pinned, version, directory)
        artifacts = tuple(Artifact(path.name, sha256_of(path)) for path in files)
        if files[0].name.endswith(".whl"):
            upstream = replace(pinned, version=version, sdist="", sha256="", wheels=artifacts)
            requires[pinned.name] = wheel_requires(files[0])
        else:
            (sdist,) = artifacts
            upstream = replace(
                pinned, version=version, sdist=sdist.file, sha256=sdist.sha256, wheels=()
            )
            requires[pinned.name] = sdist_requires(files[0])
        upstream = replace(upstream, git_tag=f"v{version}")
        for artifact in artifacts:
            say(f"{upstream.project} {version}: {artifact.file} sha256 {artifact.sha256}")
        tree = directory / "tree"
        make_pristine_tree(upstream, files[0], tree)
        upstream = replace(upstream, git_commit=_git_commit(tree))
        moved[pinned.name] = upstream
        trees[pinned.name] = tree
    for name, upstream in moved.items():
        tree = trees[name]
        result = Candidate(upstream, requires=requires[name])
        result.patches = classify_series(tree, load_series(patches_root / name))
        result.related = related_pins(upstream, requires[name], pins, moved, pinned_sglang_requires)
        result.audit = audit_candidate(tree, name)
        results.append(result)
    return results
