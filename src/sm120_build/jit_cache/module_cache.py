"""Built FlashInfer modules, cached one by one under a digest of everything that goes
into each.

A module's shared library depends on its own rendered sources and flags and on what all
modules share: the patched sources, the toolkit, the host compilers, the build
requirements and this build's code (the caller's `inputs`). Keyed by those, a module built
once (in a profile, a shard, one step of a larger build) serves every later build that asks
for it, whatever else that build holds: shards, steps joined by --base-jit-cache and a
one-step profile build compose without compiling a module twice.

It sits in front of sccache, which still serves the translation units of modules not found
here: an sccache hit for an nvcc call runs nvcc's host and device preprocessing again
(1.5-3.7 s per attention unit on the build machine), a module found here costs reading its
files back.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import zipfile
from pathlib import Path

from ..cache import scratch_directory, store_entry, verified_entry
from ..layout import JIT_CACHE_PREFIX
from ..wheels import record_bytes
from .cmake import KernelBuild
from .render import Module

ARCHIVE = "module.zip"  # the module's files, as the jit-cache wheel holds them
RECORD = "module.json"  # its recipe and compile commands, for the provenance


@dataclasses.dataclass(frozen=True)
class CachedModule:
    name: str
    recipe: str
    compile_commands: list[list[str]]
    archive: Path


def key(inputs: str, module: Module) -> str:
    spec = json.dumps(dataclasses.asdict(module), sort_keys=True)
    return hashlib.sha256(f"{inputs}\0{spec}".encode()).hexdigest()


def lookup(directory: Path, keys: dict[str, str]) -> dict[str, CachedModule]:
    """The modules of `keys` (name -> key) found whole in `directory`; a damaged entry is
    discarded (and said so), and its module built again."""
    found: dict[str, CachedModule] = {}
    for name, digest in keys.items():
        entry = verified_entry(directory / digest, f"module {name}")
        if entry is not None:
            record = json.loads((entry / RECORD).read_text())
            found[name] = CachedModule(
                name, record["recipe"], record["compile_commands"], entry / ARCHIVE
            )
    return found


def _commands_of(name: str, commands: list[list[str]]) -> list[list[str]]:
    """The compile commands whose output is in `name`'s CMake target directory."""
    target = f"CMakeFiles/{name}.dir"
    return [c for c in commands if c[c.index("-o") + 1].startswith(target)]


def store(directory: Path, built: KernelBuild, keys: dict[str, str]) -> None:
    """Cut a freshly built jit-cache wheel into one entry per module."""
    with zipfile.ZipFile(built.wheel) as wheel:
        for name, recipe in built.modules.items():
            prefix = f"{JIT_CACHE_PREFIX}{name}/"
            with scratch_directory(directory, "module") as scratch:
                staging = scratch / "entry"
                staging.mkdir()
                with zipfile.ZipFile(staging / ARCHIVE, "w") as archive:
                    for info in wheel.infolist():
                        if info.filename.startswith(prefix) and not info.is_dir():
                            archive.writestr(info, wheel.read(info))
                record = {
                    "name": name,
                    "recipe": recipe,
                    "compile_commands": _commands_of(name, built.compile_commands),
                }
                (staging / RECORD).write_text(json.dumps(record, sort_keys=True))
                store_entry(staging, directory / keys[name])


def add_to_wheel(wheel: Path, modules: list[CachedModule], out: Path) -> Path:
    """`wheel` with the cached modules' files added, and a RECORD that lists them: a part is
    a wheel another machine's merge checks whole (archives.check_wheel)."""
    with zipfile.ZipFile(wheel) as source, zipfile.ZipFile(out, "w") as target:
        entries = [(info, source.read(info)) for info in source.infolist()]
        for module in modules:
            with zipfile.ZipFile(module.archive) as archive:
                entries += [(info, archive.read(info)) for info in archive.infolist()]
        files = {info.filename: data for info, data in entries if not info.is_dir()}
        for info, data in entries:
            if info.filename.endswith(".dist-info/RECORD"):
                data = record_bytes(files, info.filename)
            target.writestr(info, data)
    return out
