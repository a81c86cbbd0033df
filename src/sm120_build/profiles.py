"""Read profiles.toml: which FlashInfer JIT modules a jit-cache wheel carries.

A recipe names a FlashInfer generator call; a profile names recipes. `--profile` and
`--module` select recipes; the build renders them with the patched FlashInfer (build.py).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import UserError
from .pins import check_plain_name, read_toml

DEFAULT_PROFILE = "comm"


@dataclass(frozen=True)
class Recipe:
    name: str
    call: str  # "<python module>:<expression>", evaluated in the patched FlashInfer
    defined_at: str
    loaded_by: tuple[str, ...]


@dataclass(frozen=True)
class Profiles:
    recipes: dict[str, Recipe]
    profiles: dict[str, tuple[str, ...]]
    descriptions: dict[str, str]

    def select(self, profile: str | None, modules: list[str]) -> dict[str, str]:
        """recipe -> call for `--profile` (default: comm, unless modules are named) plus
        every `--module`, in profiles.toml's order."""
        names: list[str] = []
        if profile is not None or not modules:
            chosen = profile or DEFAULT_PROFILE
            if chosen not in self.profiles:
                raise UserError(
                    f"no profile {chosen!r} in profiles.toml "
                    f"(known: {', '.join(sorted(self.profiles))})"
                )
            names += self.profiles[chosen]
        for module in modules:
            if module not in self.recipes:
                raise UserError(
                    f"no module recipe {module!r} in profiles.toml "
                    f"(known: {', '.join(sorted(self.recipes))})"
                )
            names.append(module)
        return {name: self.recipes[name].call for name in dict.fromkeys(names)}

    def recorded(self) -> dict[str, dict[str, str]]:
        """Every profile as recipe -> call: what the jit-cache wheel records, so that a node
        checks a profile from what it installed, never from a file beside it."""
        return {name: self.select(name, []) for name in sorted(self.profiles)}


DERIVED_FILE = "profiles-derived.toml"
# The compilers a derived profile names as still compiling on the node, by the word that
# begins each compiled_on_node entry (derive/replay.py), and how they are called.
FIRST_USE_COMPILERS = {
    "triton": "Triton",
    "deep_gemm": "DeepGEMM",
    "torch.compile": "torch.compile",
    "cute_dsl": "CuTe DSL",
    "tilelang": "TileLang",
}


def first_use(entry: dict[str, Any]) -> tuple[str, str, str]:
    """(compiler, function, where sglang first reached it) of a compiled_on_node entry,
    whose name is "<compiler> <function>"."""
    compiler, _, function = str(entry["name"]).partition(" ")
    sites = entry.get("loaded_by") or ["an unknown site"]
    return compiler, function, str(sites[0])


def compiled_on_node(path: Path) -> dict[str, list[dict[str, Any]]]:
    """profile -> what the derivation saw compile on the node at first use outside our
    wheels (Triton, DeepGEMM, torch.compile, CuTe DSL, TileLang), each with where it is
    defined and where sglang reached it; {} for a stack with no derived profiles."""
    if not path.is_file():
        return {}
    return {
        name: list(table.get("compiled_on_node", []))
        for name, table in read_toml(path).get("profiles", {}).items()
        if "compiled_on_node" in table
    }


def load(path: Path) -> Profiles:
    """profiles.toml and the files its `include = [...]` names (beside it; the derived
    profiles), as one set of recipes and profiles; a name defined twice is refused."""
    data = read_toml(path)
    included = data.get("include", [])
    if not isinstance(included, list) or not all(isinstance(x, str) for x in included):
        raise UserError(f"{path}: include must be a list of file names")
    for name in included:
        check_plain_name(name, "included file", path)
    sources = [(path, data)] + [
        (path.parent / name, read_toml(path.parent / name)) for name in included
    ]
    recipes: dict[str, Recipe] = {}
    for source, content in sources:
        for name, table in _tables(content, "modules", source).items():
            check_plain_name(name, "module recipe", source)
            if name in recipes:
                raise UserError(f"{source}: [modules.{name}] is defined twice")
            recipes[name] = _recipe(name, table, source)
    profiles: dict[str, tuple[str, ...]] = {}
    descriptions: dict[str, str] = {}
    for source, content in sources:
        for name, table in _tables(content, "profiles", source).items():
            check_plain_name(name, "profile", source)
            if name in profiles:
                raise UserError(f"{source}: [profiles.{name}] is defined twice")
            members = table.get("modules")
            if not isinstance(members, list) or not members:
                raise UserError(f"{source}: [profiles.{name}] needs a non-empty modules = [...]")
            unknown = [m for m in members if m not in recipes]
            if unknown:
                raise UserError(f"{source}: [profiles.{name}] names unknown modules: {unknown}")
            profiles[name] = tuple(members)
            descriptions[name] = str(table.get("description", ""))
    if DEFAULT_PROFILE not in profiles:
        raise UserError(f"{path}: the default profile [profiles.{DEFAULT_PROFILE}] is missing")
    return Profiles(recipes, profiles, descriptions)


def _recipe(name: str, table: dict[str, object], path: Path) -> Recipe:
    call = table.get("call")
    if not isinstance(call, str) or ":" not in call:
        raise UserError(f'{path}: [modules.{name}] needs call = "<module>:<expression>"')
    loaded_by = table.get("loaded_by", [])
    if not isinstance(loaded_by, list) or not all(isinstance(x, str) for x in loaded_by):
        raise UserError(f"{path}: [modules.{name}] loaded_by must be a list of strings")
    return Recipe(name, call, str(table.get("defined_at", "")), tuple(loaded_by))


def _tables(data: dict[str, object], key: str, path: Path) -> dict[str, dict[str, object]]:
    tables = data.get(key, {})
    if not isinstance(tables, dict) or not all(isinstance(t, dict) for t in tables.values()):
        raise UserError(f"{path}: [{key}.<name>] entries must be tables")
    return tables


def specs_of(call: str) -> list[Any]:
    """The JitSpecs a recipe's "<python module>:<expression>" makes, evaluated in that module
    of the importable FlashInfer with `torch` in scope."""
    import torch
    from flashinfer.jit.core import JitSpec

    module_name, _, expression = call.partition(":")
    namespace = {**vars(importlib.import_module(module_name)), "torch": torch}
    value = eval(expression, namespace)  # recipes come from our own profiles.toml
    return [value] if isinstance(value, JitSpec) else list(value)
