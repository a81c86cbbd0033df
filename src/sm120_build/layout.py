"""Where things live: the repository's own directories and the relocatable cache."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from .errors import UserError

CACHE_ENV = "SM120_CACHE_DIR"
# Where each wheel records what went into it (its .dist-info), and where the jit-cache wheel
# keeps its modules: names the build writes and the node side reads.
PROVENANCE_FILE = "sm120-build.json"
JIT_CACHE_PREFIX = "flashinfer_jit_cache/jit_cache/"


@dataclass(frozen=True)
class Layout:
    root: Path
    cache: Path

    @classmethod
    def from_root(cls, root: Path) -> Layout:
        cache = os.environ.get(CACHE_ENV)
        return cls(root=root, cache=Path(cache).resolve() if cache else root / ".cache")

    @property
    def pins_file(self) -> Path:
        return self.root / "pins.toml"

    @property
    def profiles_file(self) -> Path:
        return self.root / "profiles.toml"

    @property
    def waivers_file(self) -> Path:
        return self.root / "audit-waivers.toml"

    @property
    def vendor(self) -> Path:
        return self.root / "vendor"

    @property
    def patches(self) -> Path:
        return self.root / "patches"

    @property
    def wheelhouse(self) -> Path:
        return self.root / "wheelhouse"

    @property
    def shards(self) -> Path:
        return self.root / "shards"

    @property
    def costs_file(self) -> Path:
        return self.root / "ci" / "module-costs.json"

    @property
    def kernel_project(self) -> Path:
        return self.root / "kernel"

    @property
    def sdists(self) -> Path:
        return self.cache / "sdists"

    @property
    def built_modules(self) -> Path:
        """FlashInfer modules built before, one entry each (module_cache.py)."""
        return self.cache / "artifacts" / "modules"


def repo_root() -> Path:
    """The checkout this package runs from: the nearest parent holding pins.toml."""
    here = Path.cwd().resolve()
    for candidate in (here, *here.parents):
        if (candidate / "pins.toml").is_file():
            return candidate
    raise UserError("pins.toml not found here or above: run this from the project checkout")
