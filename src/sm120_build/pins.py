"""Read pins.toml: the pinned upstream sources, the default toolkit and companion packages.

An upstream is pinned by its sdist, or, for a project that publishes only wheels (sglang
since 0.5.11), by the wheels of the targets the operator builds for: the first is vendored
(its files become vendor/<name>), the others lend their binaries to patched twins.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

from packaging.utils import (
    InvalidSdistFilename,
    InvalidWheelFilename,
    canonicalize_name,
    parse_sdist_filename,
    parse_wheel_filename,
)
from packaging.version import InvalidVersion, Version

from .errors import UserError

# A name that becomes a path (vendor/<name>, patches/<name>, cache entries): one plain path
# component, so that no name in a config file can point outside the directory it is put in.
_PLAIN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
# PEP 508's project names.
_PROJECT_NAME = re.compile(r"[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?")


@dataclass(frozen=True)
class Artifact:
    """One pinned upstream file: its name and sha256."""

    file: str
    sha256: str

    @property
    def is_wheel(self) -> bool:
        return self.file.endswith(".whl")


@dataclass(frozen=True)
class Upstream:
    """One pinned upstream, vendored as vendor/<name>: its sdist (sdist, sha256), or its
    wheels (sdist and sha256 empty; the first wheel is the one vendored)."""

    name: str
    project: str
    version: str
    sdist: str
    sha256: str
    git_url: str
    git_tag: str
    git_commit: str
    wheels: tuple[Artifact, ...] = ()

    @property
    def source(self) -> Artifact:
        """The file the vendor tree is made from."""
        return self.wheels[0] if self.wheels else Artifact(self.sdist, self.sha256)

    @property
    def files(self) -> tuple[Artifact, ...]:
        """Every pinned file of this upstream."""
        return self.wheels or (self.source,)


@dataclass(frozen=True)
class Companion:
    """A package installed beside our wheels on the nodes (flashinfer-cubin), pinned by the
    sha256 of each wheel the index serves for it, so requirements.txt can hash-pin it."""

    name: str
    version: str
    sha256: tuple[str, ...]


@dataclass(frozen=True)
class CrossPins:
    """What a build for another host CPU takes from that host's wheels (jit_cache/host.py),
    each "NAME==VERSION --hash=sha256:HEX ...": NVIDIA's CUDA runtime (the toolkit's own
    cudart release), and apache-tvm-ffi (the build's release)."""

    cuda_runtime: str
    tvm_ffi: str


@dataclass(frozen=True)
class Pins:
    upstreams: dict[str, Upstream]
    toolkit_requirement: str
    companions: dict[str, Companion]
    build_requirements: list[str]
    cross: dict[str, CrossPins] = field(default_factory=dict)  # host name -> its wheels

    def cross_pins(self, host: str, pins_file: Path) -> CrossPins:
        try:
            return self.cross[host]
        except KeyError:
            raise UserError(
                f"{pins_file} pins no CUDA runtime for {host} hosts: add [cross.{host}] with "
                'cuda_runtime = "nvidia-cuda-runtime==<the toolkit\'s cudart> --hash=sha256:<hex>" '
                'and tvm_ffi = "apache-tvm-ffi==<the [build] pin> --hash=sha256:<hex> ..." '
                "(the sha256 of each of their manylinux wheels for that host). Nothing was fetched."
            ) from None

    def upstream(self, name: str) -> Upstream:
        try:
            return self.upstreams[name]
        except KeyError:
            known = ", ".join(sorted(self.upstreams))
            raise UserError(f"no upstream named {name!r} in pins.toml (known: {known})") from None


_UPSTREAM_KEYS = ("project", "version", "git_url", "git_tag", "git_commit")


def read_toml(path: Path) -> dict[str, Any]:
    """A TOML file as a dict; a missing or malformed file is a UserError naming it."""
    try:
        data: dict[str, Any] = tomllib.loads(path.read_text())
        return data
    except OSError as exc:
        raise UserError(f"cannot read {path}: {exc.strerror}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise UserError(f"{path} is not valid TOML: {exc}") from None


def _table(data: dict[str, Any], key: str, path: Path) -> dict[str, Any]:
    value = data.get(key, {})
    if not isinstance(value, dict):
        raise UserError(f"{path}: [{key}] must be a table")
    return value


def _strings(value: object, where: str, path: Path) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise UserError(f"{path}: {where} must be a list of strings")
    return value


def plain_name_problem(name: str, what: str) -> str | None:
    """Why `name` cannot be used as one path component, or None: letters, digits, '_', '.'
    and '-', starting with a letter or digit (so never '..', a '/' or an absolute path)."""
    if _PLAIN_NAME.fullmatch(name):
        return None
    return (
        f"{what} {name!r} is not a plain name (letters, digits, '_', '.' and '-', starting "
        "with a letter or digit): it becomes a file or directory name"
    )


def check_plain_name(name: str, what: str, path: Path) -> None:
    problem = plain_name_problem(name, what)
    if problem is not None:
        raise UserError(f"{path}: {problem}")


def _check_upstream(name: str, table: dict[str, str], path: Path) -> Version:
    """The keys that become paths or requirements: a plain name, a PEP 508 project name and
    a PEP 440 version."""
    check_plain_name(name, "upstream", path)
    if not _PROJECT_NAME.fullmatch(table["project"]):
        raise UserError(
            f"{path}: [upstream.{name}] project {table['project']!r} is not a project name"
        )
    try:
        return Version(table["version"])
    except InvalidVersion:
        raise UserError(
            f"{path}: [upstream.{name}] version {table['version']!r} is not a PEP 440 version"
        ) from None


def _plain_file(file: str) -> bool:
    return "/" not in file and "\\" not in file and file not in ("", ".", "..")


def _checked_sdist(name: str, table: dict[str, Any], version: Version, path: Path) -> Artifact:
    if "sha256" not in table:
        raise UserError(f"{path}: [upstream.{name}] lacks sha256")
    sdist, sha256 = table["sdist"], table["sha256"]
    wrong = [
        key for key, value in (("sdist", sdist), ("sha256", sha256)) if not isinstance(value, str)
    ]
    if wrong:
        raise UserError(f"{path}: [upstream.{name}] {', '.join(wrong)} must be strings")
    if not is_sha256(sha256):
        raise UserError(f"{path}: [upstream.{name}] sha256 is not 64 lowercase hex digits")
    try:
        parsed = parse_sdist_filename(sdist) if _plain_file(sdist) else None
    except InvalidSdistFilename:
        parsed = None
    if parsed != (canonicalize_name(table["project"]), version):
        raise UserError(
            f"{path}: [upstream.{name}] sdist {sdist!r} is not the file name of an sdist of "
            f"{table['project']} {table['version']} (such as "
            f"{table['project'].replace('-', '_')}-{table['version']}.tar.gz)"
        )
    return Artifact(sdist, sha256)


def _checked_wheels(
    name: str, table: dict[str, Any], version: Version, path: Path
) -> tuple[Artifact, ...]:
    entries = table["wheels"]
    where = f"{path}: [upstream.{name}] wheels"
    if not isinstance(entries, list) or not entries:
        raise UserError(f'{where} must list {{ file = "...whl", sha256 = "..." }} tables')
    wheels = []
    for entry in entries:
        if not (isinstance(entry, dict) and set(entry) == {"file", "sha256"}):
            raise UserError(f'{where}: each entry is {{ file = "...whl", sha256 = "..." }}')
        file, sha256 = entry["file"], entry["sha256"]
        if not is_sha256(sha256):
            raise UserError(f"{where}: {file!r}: sha256 is not 64 lowercase hex digits")
        try:
            parsed = parse_wheel_filename(file)[:2] if _plain_file(str(file)) else None
        except InvalidWheelFilename:
            parsed = None
        if parsed != (canonicalize_name(table["project"]), version):
            raise UserError(
                f"{where}: {file!r} is not the file name of a wheel of {table['project']} "
                f"{table['version']}"
            )
        wheels.append(Artifact(file, sha256))
    if len({wheel.file for wheel in wheels}) != len(wheels):
        raise UserError(f"{where} names a wheel twice")
    return tuple(wheels)


def is_sha256(text: object) -> bool:
    return isinstance(text, str) and len(text) == 64 and all(c in "0123456789abcdef" for c in text)


def load(path: Path) -> Pins:
    data = read_toml(path)
    upstreams = {}
    for name, table in _table(data, "upstream", path).items():
        if not isinstance(table, dict):
            raise UserError(f"{path}: upstream.{name} must be a table")
        missing = [key for key in _UPSTREAM_KEYS if key not in table]
        if missing:
            raise UserError(f"{path}: [upstream.{name}] lacks {', '.join(missing)}")
        wrong = [key for key in _UPSTREAM_KEYS if not isinstance(table[key], str)]
        if wrong:
            raise UserError(f"{path}: [upstream.{name}] {', '.join(wrong)} must be strings")
        version = _check_upstream(name, table, path)
        fields = {key: table[key] for key in _UPSTREAM_KEYS}
        if ("sdist" in table) == ("wheels" in table):
            raise UserError(
                f"{path}: [upstream.{name}] needs either sdist and sha256, or wheels (for a "
                "project that publishes no sdist), and not both"
            )
        if "sdist" in table:
            source = _checked_sdist(name, table, version, path)
            upstreams[name] = Upstream(name=name, sdist=source.file, sha256=source.sha256, **fields)
        else:
            wheels = _checked_wheels(name, table, version, path)
            upstreams[name] = Upstream(name=name, sdist="", sha256="", wheels=wheels, **fields)
    if not upstreams:
        raise UserError(f"{path}: no [upstream.*] tables")
    toolkit = _table(data, "toolkit", path).get("requirement")
    if not isinstance(toolkit, str):
        raise UserError(f"{path}: [toolkit] requirement is missing or not a string")
    companions = {}
    for name, table in _table(data, "companions", path).items():
        if not _PROJECT_NAME.fullmatch(name):
            raise UserError(f"{path}: [companions.{name}] is not a project name")
        if not (isinstance(table, dict) and isinstance(table.get("version"), str)):
            raise UserError(f'{path}: [companions.{name}] needs version = "X.Y.Z"')
        hashes = _strings(table.get("sha256", []), f"[companions.{name}] sha256", path)
        if not hashes or not all(is_sha256(h) for h in hashes):
            raise UserError(
                f"{path}: [companions.{name}] sha256 must list the sha256 of each of its "
                "wheels (64 lowercase hex digits each)"
            )
        companions[name] = Companion(name, table["version"], tuple(hashes))
    build = _table(data, "build", path)
    render = _table(data, "render", path)
    cross = {
        host: _cross_pins(host, table, path) for host, table in _table(data, "cross", path).items()
    }
    return Pins(
        upstreams=upstreams,
        toolkit_requirement=toolkit,
        companions=companions,
        # Both shape what gets built: render's torch sets the C++ ABI flag of every module.
        build_requirements=[
            *_strings(build.get("requirements", []), "[build] requirements", path),
            *_strings(render.get("requirements", []), "[render] requirements", path),
        ],
        cross=cross,
    )


# "NAME==VERSION --hash=sha256:HEX ...": a wheel pinned by the sha256 of each file it may be.
PINNED_WHEEL = re.compile(
    r"(?P<requirement>[A-Za-z0-9_.-]+==\S+)(?P<hashes>(?:\s+--hash=sha256:[0-9a-f]{64})+)"
)


def _cross_pins(host: str, table: object, path: Path) -> CrossPins:
    fields = {}
    for key in ("cuda_runtime", "tvm_ffi"):
        value = table.get(key) if isinstance(table, dict) else None
        if not (isinstance(value, str) and PINNED_WHEEL.fullmatch(value.strip())):
            raise UserError(
                f'{path}: [cross.{host}] {key} must be "NAME==VERSION --hash=sha256:<64 hex>" '
                "(one --hash per wheel)"
            )
        fields[key] = value.strip()
    return CrossPins(**fields)
