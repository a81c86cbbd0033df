"""Where things live: the repository's own directories, its stacks, and the relocatable cache.

A stack is one upstream pair with everything that is particular to it: its pins, patch
series, profiles, served configurations and gate waivers, and what is made from them (the
vendor trees, the wheelhouse, the shards). Stacks are named after their sglang release.
The default stack (the mission's pair) lives at the top of the checkout (pins.toml,
patches/, vendor/, wheelhouse/, ...); every other stack in stacks/<name>/, laid out alike.
What all stacks share stays at the top: the kernel project, the module costs, the models'
configs, the cache.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from . import hosts
from .errors import UserError

CACHE_ENV = "SM120_CACHE_DIR"
# Where each wheel records what went into it (its .dist-info), and where the jit-cache wheel
# keeps its modules: names the build writes and the node side reads.
PROVENANCE_FILE = "sm120-build.json"
JIT_CACHE_PREFIX = "flashinfer_jit_cache/jit_cache/"
STACKS_DIR = "stacks"
PINS_FILE = "pins.toml"


@dataclass(frozen=True)
class Layout:
    root: Path
    cache: Path
    stack_dir: Path | None = None  # None: the default stack, at the top of the checkout

    @classmethod
    def from_root(cls, root: Path, stack: str | None = None) -> Layout:
        cache = os.environ.get(CACHE_ENV)
        return cls(
            root=root,
            cache=Path(cache).resolve() if cache else root / ".cache",
            stack_dir=None if stack is None else stack_directory(root, stack),
        )

    @property
    def stack(self) -> Path:
        """The directory of this stack's own files."""
        return self.stack_dir or self.root

    @property
    def pins_file(self) -> Path:
        return self.stack / PINS_FILE

    @property
    def profiles_file(self) -> Path:
        return self.stack / "profiles.toml"

    @property
    def waivers_file(self) -> Path:
        return self.stack / "audit-waivers.toml"

    @property
    def scope_file(self) -> Path:
        return self.stack / "audit-scope.toml"

    @property
    def vendor(self) -> Path:
        return self.stack / "vendor"

    @property
    def patches(self) -> Path:
        return self.stack / "patches"

    @property
    def wheelhouse(self) -> Path:
        return self.stack / "wheelhouse"

    def wheelhouse_for(self, host: str) -> Path:
        """The wheelhouse of the nodes with `host` CPUs: wheelhouse/ for the default host
        (x86_64, hosts.py), wheelhouse-<host>/ beside it for another."""
        return self.wheelhouse if host == hosts.DEFAULT else self.stack / f"wheelhouse-{host}"

    @property
    def shards(self) -> Path:
        return self.stack / "shards"

    @property
    def costs_file(self) -> Path:
        return self.root / "ci" / "module-costs.json"

    @property
    def kernel_project(self) -> Path:
        return self.root / "kernel"

    @property
    def sdists(self) -> Path:
        """Upstream files (sdists and wheels), by sha256."""
        return self.cache / "sdists"

    @property
    def built_modules(self) -> Path:
        """FlashInfer modules built before, one entry each (module_cache.py)."""
        return self.cache / "artifacts" / "modules"

    def shown(self, path: Path) -> str:
        """`path` as the user sees it: relative to the checkout when inside it."""
        return str(path.relative_to(self.root)) if path.is_relative_to(self.root) else str(path)


def stack_name(pins_file: Path) -> str:
    """sglang-<version>: the name a stack takes from the sglang its pins.toml pins."""
    from .pins import load

    return f"sglang-{load(pins_file).upstream('sglang').version}"


def stacks(root: Path) -> dict[str, Path | None]:
    """Every stack of the checkout, by name: the default one (None: the top) first."""
    found: dict[str, Path | None] = {stack_name(root / PINS_FILE): None}
    directory = root / STACKS_DIR
    for path in sorted(directory.iterdir()) if directory.is_dir() else []:
        if (path / PINS_FILE).is_file() and not path.is_symlink():
            found.setdefault(path.name, path)
    return found


def stack_directory(root: Path, name: str) -> Path | None:
    """The directory of the stack `name` (None for the default one); an unknown or empty
    name lists the stacks there are."""
    known = stacks(root)
    if name not in known:
        listing = ", ".join(
            f"{stack} (default)" if path is None else stack for stack, path in known.items()
        )
        raise UserError(
            f"--stack {name or '(no name)'}: no such stack; the stacks of this checkout are "
            f"{listing}. A stack is named after its sglang release (stacks/<name>/pins.toml)."
        )
    path = known[name]
    if path is not None and stack_name(path / PINS_FILE) != name:
        raise UserError(
            f"{path / PINS_FILE} pins another sglang than {name}: a stack is named after its "
            "sglang release; rename the directory or fix the pin"
        )
    return path


def repo_root() -> Path:
    """The checkout this package runs from: the nearest parent holding pins.toml (a stack's
    own directory is skipped: the checkout holds stacks/)."""
    here = Path.cwd().resolve()
    for candidate in (here, *here.parents):
        if (candidate / PINS_FILE).is_file() and candidate.parent.name != STACKS_DIR:
            return candidate
    raise UserError("pins.toml not found here or above: run this from the project checkout")
