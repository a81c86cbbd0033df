"""Read pins.toml: the pinned upstream sdists, the default toolkit and companion packages."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

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
class Pins:
    upstreams: dict[str, Upstream]
    toolkit_requirement: str
    companions: dict[str, str]
    build_requirements: list[str]

    def upstream(self, name: str) -> Upstream:
        try:
            return self.upstreams[name]
        except KeyError:
            known = ", ".join(sorted(self.upstreams))
            raise UserError(f"no upstream named {name!r} in pins.toml (known: {known})") from None


_UPSTREAM_KEYS = ("project", "version", "sdist", "sha256", "git_url", "git_tag", "git_commit")


def load(path: Path) -> Pins:
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise UserError(f"cannot read {path}: {exc}") from exc
    upstreams = {}
    for name, table in data.get("upstream", {}).items():
        missing = [key for key in _UPSTREAM_KEYS if key not in table]
        if missing:
            raise UserError(f"{path}: [upstream.{name}] lacks {', '.join(missing)}")
        sha = table["sha256"]
        if len(sha) != 64 or any(c not in "0123456789abcdef" for c in sha):
            raise UserError(f"{path}: [upstream.{name}] sha256 is not 64 lowercase hex digits")
        upstreams[name] = Upstream(name=name, **{key: table[key] for key in _UPSTREAM_KEYS})
    if not upstreams:
        raise UserError(f"{path}: no [upstream.*] tables")
    try:
        toolkit = data["toolkit"]["requirement"]
    except KeyError:
        raise UserError(f"{path}: [toolkit] requirement is missing") from None
    return Pins(
        upstreams=upstreams,
        toolkit_requirement=toolkit,
        companions=dict(data.get("companions", {})),
        build_requirements=list(data.get("build", {}).get("requirements", [])),
    )
