"""`nox -s bump`: what a new upstream release does to the patch series, in one run.

The candidate sdist is fetched through pip into a scratch directory (nothing in pins.toml,
vendor/ or patches/ changes), unpacked as a git repo, and the whole series is tried on it
in order. Every patch and every hunk is classified; a patch that does not apply does not
stop the run, and the hunks that do apply are applied so later patches meet the tree they
would meet after a refresh.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tarfile
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import InvalidSdistFilename, canonicalize_name, parse_sdist_filename
from packaging.version import Version

from . import index
from .audit import Report
from .cache import sha256_of
from .console import say
from .errors import UserError
from .fetch import FETCH_TIMEOUT, pip_download
from .gitrepo import git
from .patches import Hunk, Patch, hunks_of, load_series, parse_dep3
from .pins import Pins, Upstream
from .vendor import make_pristine_tree

# Patch verdicts and what to do about each.
ACTIONS = {
    "clean": "keep",
    "offset": "keep",
    "fuzz": "refresh",
    "upstream": "drop",
    "partly upstream": "refresh",
    # Evidence of change, not of equivalence: kept, for a maintainer to review.
    "upstream in another form": "review",
    "conflict": "refresh",
}


@dataclass(frozen=True)
class HunkVerdict:
    file: str
    hunk: str  # the @@ line
    verdict: str  # clean, offset, fuzz, upstream, upstream in another form, conflict
    offset: int = 0
    detail: str = ""


@dataclass(frozen=True)
class PatchVerdict:
    patch: str
    verdict: str
    action: str
    hunks: list[HunkVerdict]

    @property
    def failing(self) -> list[HunkVerdict]:
        return [h for h in self.hunks if h.verdict in ("conflict", "upstream in another form")]


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


def _apply(tree: Path, patch_text: str, *options: str) -> subprocess.CompletedProcess[str]:
    """git apply, strict unless `options` say otherwise, reading the patch from stdin."""
    return git(tree, "apply", "--verbose", *options, "-", check=False, stdin=patch_text)


_OFFSET = re.compile(r"Hunk #\d+ succeeded at \d+ \(offset (-?\d+) lines?\)")


def classify_hunk(tree: Path, hunk: Hunk) -> HunkVerdict:
    """How one hunk meets the tree: applies (at an offset), only with fuzz, already there,
    there in another form, or not at all."""
    text = hunk.as_patch()
    # Reverse first: a hunk that only adds lines still applies forward when upstream already
    # has them (and would add them twice); that it reverse-applies is the proof.
    if _apply(tree, text, "--check", "--reverse").returncode == 0:
        return HunkVerdict(hunk.file, hunk.header, "upstream")
    forward = _apply(tree, text, "--check")
    if forward.returncode == 0:
        offset = _OFFSET.search(forward.stderr + forward.stdout)
        moved = int(offset.group(1)) if offset else 0
        return HunkVerdict(hunk.file, hunk.header, "offset" if moved else "clean", moved)
    if _apply(tree, text, "--check", "-C1").returncode == 0:
        return HunkVerdict(hunk.file, hunk.header, "fuzz", detail="applies with 1 line of context")
    target = tree / hunk.file
    if not target.is_file():
        return HunkVerdict(hunk.file, hunk.header, "conflict", detail="file not found")
    present = {line.strip() for line in target.read_text(errors="replace").splitlines()}
    # Lines that say something: a bare "}" or "{" is in every file.
    removed = [line.strip() for line in hunk.removed if re.search(r"\w{3}", line)]
    if removed and not any(line in present for line in removed):
        return HunkVerdict(
            hunk.file,
            hunk.header,
            "upstream in another form",
            detail="none of the lines it removes is in the file any more",
        )
    return HunkVerdict(hunk.file, hunk.header, "conflict", detail=_where_it_differs(hunk, target))


def _where_it_differs(hunk: Hunk, target: Path) -> str:
    """Where the hunk's nearest context now lives in the candidate file, and the first line
    there that differs from what the hunk expects."""
    expected = [line[1:] for line in hunk.text.splitlines()[1:] if line[:1] in (" ", "-")]
    lines = target.read_text(errors="replace").splitlines()
    for offset, line in enumerate(expected):
        if not re.search(r"\w{3}", line) or line not in lines:
            continue
        at = lines.index(line)
        start = at - offset
        for step, want in enumerate(expected):
            found = lines[start + step] if 0 <= start + step < len(lines) else "<end of file>"
            if found != want:
                return (
                    f"context {line.strip()[:50]!r} is at {hunk.file}:{at + 1}; at line "
                    f"{start + step + 1} the hunk expects {want.strip()[:60]!r}, the candidate "
                    f"has {found.strip()[:60]!r}"
                )
    return f"none of the hunk's context lines is in the candidate's {hunk.file}"


def _patch_verdict(hunks: list[HunkVerdict]) -> str:
    kinds = {h.verdict for h in hunks}
    if kinds <= {"clean"}:
        return "clean"
    if kinds <= {"clean", "offset"}:
        return "offset"
    if kinds == {"upstream"}:
        return "upstream"
    if kinds <= {"upstream", "upstream in another form"}:
        return "upstream in another form"
    # A hunk that meets nothing it expects, beside hunks that still apply: the patch's
    # change is not upstream as a whole, so it is refreshed, not dropped.
    if kinds & {"conflict", "upstream in another form"}:
        return "conflict"
    if "upstream" in kinds:
        return "partly upstream"
    return "fuzz"


def classify_patch(tree: Path, patch: Patch) -> PatchVerdict:
    """Classify `patch` on `tree`, then apply what of it applies (fuzz included)."""
    hunks = hunks_of(patch.diff)
    whole = _apply(tree, patch.diff, "--check")
    already = [_apply(tree, h.as_patch(), "--check", "--reverse").returncode == 0 for h in hunks]
    if whole.returncode == 0 and not any(already):
        # Offsets come per hunk, in order, for those that moved.
        report = iter(_per_hunk_offsets(whole.stderr + whole.stdout, hunks))
        verdicts = [
            HunkVerdict(h.file, h.header, "offset" if moved else "clean", moved)
            for h, moved in zip(hunks, report, strict=True)
        ]
        _apply(tree, patch.diff)
    elif _apply(tree, patch.diff, "--check", "--reverse").returncode == 0:
        verdicts = [HunkVerdict(h.file, h.header, "upstream") for h in hunks]
    else:
        verdicts = []
        for hunk in hunks:
            verdict = classify_hunk(tree, hunk)
            if verdict.verdict in ("clean", "offset"):
                _apply(tree, hunk.as_patch())
            elif verdict.verdict == "fuzz":
                _apply(tree, hunk.as_patch(), "-C1")
            verdicts.append(verdict)
    kind = _patch_verdict(verdicts)
    return PatchVerdict(patch.path.name, kind, ACTIONS[kind], verdicts)


def _per_hunk_offsets(output: str, hunks: list[Hunk]) -> list[int]:
    """git apply --verbose names 'Hunk #N ... (offset K lines)' per file for moved hunks."""
    moved: dict[tuple[str, int], int] = {}
    current = ""
    for line in output.splitlines():
        checking = re.match(r"Checking patch (.+)\.\.\.$", line)
        if checking:
            current = checking.group(1)
            continue
        match = re.match(r"Hunk #(\d+) succeeded at \d+ \(offset (-?\d+) lines?\)", line)
        if match:
            moved[(current, int(match.group(1)))] = int(match.group(2))
    offsets, seen = [], dict[str, int]()
    for hunk in hunks:
        seen[hunk.file] = seen.get(hunk.file, 0) + 1
        offsets.append(moved.get((hunk.file, seen[hunk.file]), 0))
    return offsets


def classify_series(tree: Path, patches: list[Patch]) -> list[PatchVerdict]:
    return [classify_patch(tree, patch) for patch in patches]


# --- the candidate --------------------------------------------------------------------------


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


def fetch_candidate(upstream: Upstream, version: str, scratch: Path) -> Path:
    """The candidate sdist, from where pip is configured to look; downloaded by name and
    never run (index.py says why not through `pip download`)."""
    sources = index.pip_sources()
    wanted = (canonicalize_name(upstream.project), Version(version))
    links = []
    for link in index.project_links(sources, upstream.project, FETCH_TIMEOUT):
        try:
            name, found = parse_sdist_filename(link.name)
        except InvalidSdistFilename:
            continue
        if (name, found) == wanted:
            links.append(link)
    if not links:
        raise UserError(
            f"no sdist of {upstream.project}=={version} in {sources.describe()} (pip's "
            "configuration: `pip config list`); check the version, and that the index has "
            "its sdist"
        )
    link = sorted(links, key=lambda link: not link.name.endswith(".tar.gz"))[0]
    say(f"fetching {link.name} from {sources.describe()}")
    got = index.download(link, scratch / link.name, sources, FETCH_TIMEOUT)
    if link.sha256 is not None and got != link.sha256:
        raise UserError(
            f"{link.name}: the index states sha256 {link.sha256}, the download has {got}; "
            "nothing of it was unpacked or run"
        )
    return scratch / link.name


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
    """What else must move with the candidate: the FlashInfer sglang requires, the cubin
    companion, and the git reference (pin_set_problems decides whether the set holds)."""
    lines = [f"git_tag {candidate.git_tag}, git_commit {candidate.git_commit or '(not recorded)'}"]
    if candidate.name == "sglang":
        for name in ("flashinfer-python", "flashinfer-cubin"):
            if name in requires:
                lines.append(f"sglang {candidate.version} requires {requires[name]}")
    if candidate.name == "flashinfer":
        if "sglang" not in others and "flashinfer-python" in pinned_sglang_requires:
            lines.append(
                f"the pinned sglang {pins.upstream('sglang').version} requires "
                f"{pinned_sglang_requires['flashinfer-python']}"
            )
        cubin_versions = _index_versions("flashinfer-cubin")
        companion = pins.companions.get("flashinfer-cubin")
        if candidate.version in cubin_versions:
            lines.append(
                f"flashinfer-cubin {candidate.version} is on the index: the companion pin "
                f"(now {companion.version if companion else 'none'}) moves with it"
            )
        else:
            lines.append(
                f"flashinfer-cubin {candidate.version} is NOT on the index (it has "
                f"{', '.join(cubin_versions[:5]) or 'nothing'} ...): nodes cannot satisfy "
                "FlashInfer's exact cubin version check with a public cubin"
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
    exact = [spec.version for spec in wanted.specifier if spec.operator == "=="]
    ask = f"sglang=={sglang.version} flashinfer-python=={exact[0]}" if exact else str(wanted)
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
        sdist = fetch_candidate(pinned, version, directory)
        upstream = replace(
            pinned,
            version=version,
            sdist=sdist.name,
            sha256=sha256_of(sdist),
            git_tag=f"v{version}",
        )
        say(f"{upstream.project} {version}: {sdist.name} sha256 {upstream.sha256}")
        tree = directory / "tree"
        make_pristine_tree(upstream, sdist, tree)
        upstream = replace(upstream, git_commit=_git_commit(tree))
        moved[pinned.name] = upstream
        trees[pinned.name] = tree
        requires[pinned.name] = sdist_requires(sdist)
    for name, upstream in moved.items():
        tree = trees[name]
        result = Candidate(upstream, requires=requires[name])
        result.patches = classify_series(tree, load_series(patches_root / name))
        result.related = related_pins(upstream, requires[name], pins, moved, pinned_sglang_requires)
        result.audit = audit_candidate(tree, name)
        results.append(result)
    return results


# --- reporting and writing ----------------------------------------------------------------


def table(result: Candidate) -> str:
    upstream = result.upstream
    lines = [
        f"{upstream.project} {upstream.version}  ({upstream.sdist}, sha256 {upstream.sha256})",
        f"  {'patch':<62} {'verdict':<26} action",
    ]
    for patch in result.patches:
        lines.append(f"  {patch.patch:<62} {patch.verdict:<26} {patch.action}")
        for hunk in patch.hunks:
            if hunk.verdict == "clean" and patch.verdict == "clean":
                continue
            note = f"offset {hunk.offset:+d}" if hunk.verdict == "offset" else hunk.verdict
            detail = f" ({hunk.detail})" if hunk.detail else ""
            lines.append(f"      {hunk.file} {hunk.hunk}: {note}{detail}")
    lines.append("  related pins:")
    lines += [f"    {line}" for line in result.related]
    lines.append("  gate audit (candidate, series applied as far as it goes):")
    lines += [f"    {line}" for line in (result.audit.lines if result.audit else [])]
    return "\n".join(lines)


def as_json(results: list[Candidate], status: tuple[int, str]) -> str:
    return (
        json.dumps(
            {
                "exit_status": status[0],
                "verdict": status[1],
                "candidates": [
                    {
                        "upstream": asdict(r.upstream),
                        "patches": [asdict(p) for p in r.patches],
                        "related": r.related,
                        "requires": {name: str(req) for name, req in r.requires.items()},
                        "audit": asdict(r.audit) if r.audit else None,
                    }
                    for r in results
                ],
            },
            indent=2,
        )
        + "\n"
    )


def audit_summary(report: Report, missing: list[str]) -> GateSummary:
    gates = [f for f in report.findings if f.in_scope and f.waiver is None]
    outside = [f for f in report.findings if not f.in_scope]
    summary = [f"{len(gates)} gate(s) in scope still exclude SM120"]
    summary += [f"GATE {f.upstream}/{f.file}:{f.line} {f.condition[:70]}" for f in gates]
    summary.append(f"{len(outside)} reported outside the audit's scope (not failing)")
    summary += [f"MISSING scoped file(s): {pattern}" for pattern in missing]
    return GateSummary(summary, report.as_json(), missing, len(gates))


def companion_hashes(name: str, version: str, scratch: Path) -> list[str]:
    """sha256 of each wheel of a companion release, downloaded through pip."""
    result = pip_download(scratch, "--only-binary", ":all:", f"{name}=={version}")
    wheels = sorted(scratch.glob("*.whl"))
    if result.returncode != 0 or not wheels:
        available = _index_versions(name)
        raise UserError(
            f"the index has no {name}=={version} (it has {', '.join(available[:8]) or 'none'}), "
            f"and FlashInfer {version} accepts no other cubin. Publish a {name} {version} "
            "wheel to your index (from a machine that reaches one that has it), or bump to a "
            "FlashInfer release whose cubin the index carries. Nothing was written."
        )
    return [sha256_of(wheel) for wheel in wheels]


def _move_companion(text: str, name: str, version: str, hashes: list[str]) -> str:
    table = re.search(rf"^\[companions\.{re.escape(name)}\]\n(.*?)(?=^\[|\Z)", text, re.M | re.S)
    if table is None:
        return text
    block = re.sub(r'^version = "[^"]*"', f'version = "{version}"', table.group(1), flags=re.M)
    listed = ", ".join(f'"{digest}"' for digest in hashes)
    block = re.sub(r"^sha256 = \[[^\]]*\]", f"sha256 = [{listed}]", block, flags=re.M)
    return text[: table.start(1)] + block + text[table.end(1) :]


def _applied_upstream_in(patch: Path, version: str) -> bool:
    """Whether the patch's DEP-3 Applied-Upstream names a release at or below `version`."""
    field = parse_dep3(patch.read_text()).get("Applied-Upstream", "")
    match = re.search(r"\d+(?:\.\d+)+(?:\.post\d+)?", field)
    return match is not None and Version(match.group(0)) <= Version(version)


def verdict(results: list[Candidate], problems: list[str]) -> tuple[int, str]:
    """The bump's exit status and why: 0 every patch clean or upstream (dropped on proof)
    and no gate left; 1 refreshes, reviews or gates remain; 2 it cannot be written."""
    if problems:
        return 2, "; ".join(problems)
    work = [
        f"{p.patch} ({p.verdict}: {p.action})"
        for r in results
        for p in r.patches
        if p.action != "keep" and p.verdict != "upstream"
    ]
    gates = [
        f"{r.upstream.name}: {r.audit.gates} gate(s), {len(r.audit.missing_scope)} missing"
        for r in results
        if r.audit and (r.audit.gates or r.audit.missing_scope)
    ]
    if work or gates:
        return 1, "; ".join(work + gates)
    return 0, "every patch applies or is upstream, and no gate remains"


def write(
    results: list[Candidate], pins: Pins, pins_file: Path, patches_root: Path, scratch: Path
) -> list[str]:
    """Apply the candidates: new pins (the flashinfer-cubin companion moves with FlashInfer);
    patches proven upstream (every hunk reverse-applies, or Applied-Upstream names a release
    at or below the candidate) dropped from their series with a comment; patches upstream
    in another form kept, marked for review. Everything is worked out before anything is
    written. Returns what was done, for the user."""
    text = pins_file.read_text()
    done = []
    series_texts: dict[Path, str] = {}
    dropped: list[Path] = []
    for result in results:
        if result.upstream.name == "flashinfer" and "flashinfer-cubin" in pins.companions:
            version = result.upstream.version
            hashes = companion_hashes("flashinfer-cubin", version, scratch / "cubin")
            text = _move_companion(text, "flashinfer-cubin", version, hashes)
            done.append(f"pins.toml: flashinfer-cubin -> {version}")
        upstream = result.upstream
        table_match = re.search(
            rf"^\[upstream\.{re.escape(upstream.name)}\]\n(.*?)(?=^\[|\Z)", text, re.M | re.S
        )
        if table_match is None:
            raise UserError(f"{pins_file} has no [upstream.{upstream.name}] table to update")
        block = table_match.group(1)
        for key in ("version", "sdist", "sha256", "git_tag", "git_commit"):
            block = re.sub(
                rf'^{key} = "[^"]*"', f'{key} = "{getattr(upstream, key)}"', block, flags=re.M
            )
        text = text[: table_match.start(1)] + block + text[table_match.end(1) :]
        done.append(f"pins.toml: {upstream.name} -> {upstream.project} {upstream.version}")
        series = patches_root / upstream.name / "series"
        lines = series.read_text().splitlines()
        for patch in result.patches:
            path = patches_root / upstream.name / patch.patch
            proven = patch.verdict == "upstream" or (
                patch.action == "review" and _applied_upstream_in(path, upstream.version)
            )
            mine = [
                n
                for n, line in enumerate(lines)
                if line.split("#", 1)[0].split()[:1] == [patch.patch]
            ]
            if proven:
                for n in mine:
                    lines[n] = (
                        f"# {patch.patch}: dropped, {patch.verdict} in {upstream.project} "
                        f"{upstream.version} (nox -s bump)"
                    )
                dropped.append(path)
                done.append(f"patches/{upstream.name}: dropped {patch.patch} ({patch.verdict})")
            elif patch.action == "review":
                for n in reversed(mine):
                    lines.insert(
                        n,
                        f"# REVIEW {patch.patch}: upstream in another form in {upstream.project} "
                        f"{upstream.version} (nox -s bump); kept until it is proven equivalent",
                    )
                done.append(f"patches/{upstream.name}: kept {patch.patch} for review")
        series_texts[series] = "".join(f"{line}\n" for line in lines)
    pins_file.write_text(text)
    for series, series_text in series_texts.items():
        series.write_text(series_text)
    for path in dropped:
        path.unlink(missing_ok=True)
    return done
