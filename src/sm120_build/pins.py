"""Read pins.toml: the pinned upstream sdists, the default toolkit and companion packages."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

from .errors import UserError


@dataclass(frozen=True)
class Upstream:
    """One pinned upstream source distribution, vendored as vendor/<name>."""

    name: str
    project: str
    version: str
    sdist: str
    sha256: str
    git_url: str
    git_tag: str
    git_commit: str


@dataclass(frozen=True)
class Companion:
    """A package installed beside our wheels on the nodes (flashinfer-cubin), pinned by the
    sha256 of each wheel the index serves for it, so requirements.txt can hash-pin it."""

    name: str
    version: str
    sha256: tuple[str, ...]


@dataclass(frozen=True)
class Pins:
    upstreams: dict[str, Upstream]
    toolkit_requirement: str
    companions: dict[str, Companion]
    build_requirements: list[str]

    def upstream(self, name: str) -> Upstream:
        try:
            return self.upstreams[name]
        except KeyError:
            known = ", ".join(sorted(self.upstreams))
            raise UserError(f"no upstream named {name!r} in pins.toml (known: {known})") from None


_UPSTREAM_KEYS = ("project", "version", "sdist", "sha256", "git_url", "git_tag", "git_commit")


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
        if not is_sha256(table["sha256"]):
            raise UserError(f"{path}: [upstream.{name}] sha256 is not 64 lowercase hex digits")
        upstreams[name] = Upstream(name=name, **{key: table[key] for key in _UPSTREAM_KEYS})
    if not upstreams:
        raise UserError(f"{path}: no [upstream.*] tables")
    toolkit = _table(data, "toolkit", path).get("requirement")
    if not isinstance(toolkit, str):
        raise UserError(f"{path}: [toolkit] requirement is missing or not a string")
    companions = {}
    for name, table in _table(data, "companions", path).items():
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
    return Pins(
        upstreams=upstreams,
        toolkit_requirement=toolkit,
        companions=companions,
        # Both shape what gets built: render's torch sets the C++ ABI flag of every module.
        build_requirements=[
            *_strings(build.get("requirements", []), "[build] requirements", path),
            *_strings(render.get("requirements", []), "[render] requirements", path),
        ],
    )
