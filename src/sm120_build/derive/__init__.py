"""Profiles derived from sglang's own code: for each served configuration of
served-models.toml, run sglang's server-argument resolution, model constructor, KV pool and
attention backend on the CPU (replay.py) and write what they ask FlashInfer and sglang's
jit_kernel for to profiles-derived.toml, which profiles.toml includes.

The replay runs in an environment that holds the pinned sglang's dependencies (a venv in
the cache, `pip install sglang==<pin>` through pip's own configuration, installed once),
with the patched vendor trees first on its path, so a new sglang is handled by bumping the
pin and running this again.
"""

from __future__ import annotations

import difflib
import json
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..cache import digest, scratch_directory
from ..console import say, step
from ..errors import UserError
from ..files import replace_text
from ..jit_cache.sources import data_links
from ..layout import Layout
from ..pins import Pins, check_plain_name, read_toml
from ..profiles import DERIVED_FILE as DERIVED_FILE
from ..sglang_env import environment
from . import readme

SERVED_FILE = "served-models.toml"
UNION_PROFILE = "served"
REPLAY = Path(__file__).with_name("replay.py")
REPLAY_TIMEOUT = 900  # seconds for one configuration; the largest takes about 90


@dataclass(frozen=True)
class Served:
    """One served configuration: a model directory (config.json, hf_quant_config.json),
    the sglang server arguments, the target GPU arch, and the recipes the replay does not
    reach yet, named by hand (`also`)."""

    name: str
    description: str
    model: Path
    server_args: dict[str, Any]
    arch: tuple[int, int]
    also: tuple[str, ...]


def load_served(root: Path) -> list[Served]:
    path = root / SERVED_FILE
    data = read_toml(path)
    tables = data.get("models", {})
    if not isinstance(tables, dict) or not tables:
        raise UserError(f"{path}: no [models.<name>] tables")
    served = []
    for name, table in tables.items():
        check_plain_name(name, "served configuration", path)
        if not isinstance(table, dict):
            raise UserError(f"{path}: [models.{name}] must be a table")
        model = root / str(table.get("model", ""))
        if not (model / "config.json").is_file():
            raise UserError(f"{path}: [models.{name}] model = {model} holds no config.json")
        arch = re.fullmatch(r"(\d+)\.(\d+)", str(table.get("arch", "")))
        if arch is None:
            raise UserError(f'{path}: [models.{name}] needs arch = "MAJOR.MINOR", such as "12.0"')
        server_args = table.get("server_args", {})
        also = table.get("also", [])
        if not isinstance(server_args, dict) or not isinstance(also, list):
            raise UserError(f"{path}: [models.{name}] server_args is a table, also a list")
        draft = server_args.get("speculative_draft_model_path")
        if draft is not None:  # read as the model is: a directory beside this file
            if not (root / str(draft) / "config.json").is_file():
                raise UserError(
                    f"{path}: [models.{name}] speculative_draft_model_path = {root / str(draft)} "
                    "holds no config.json: the draft model's modules are derived from it"
                )
            server_args = {**server_args, "speculative_draft_model_path": str(root / str(draft))}
        served.append(
            Served(
                name,
                str(table.get("description", "")),
                model,
                server_args,
                (int(arch[1]), int(arch[2])),
                tuple(str(x) for x in also),
            )
        )
    return served


def replay(layout: Layout, python: Path, served: Served) -> dict[str, Any]:
    """Run replay.py for one served configuration; its JSON."""
    request = {
        "model": str(served.model.resolve()),
        "server_args": served.server_args,
        "arch": list(served.arch),
    }
    with (
        step(f"replaying sglang for {served.name}"),
        scratch_directory(layout.cache, "replay") as scratch,
    ):
        flashinfer = _flashinfer_with_data(layout.vendor / "flashinfer", scratch / "flashinfer")
        env = dict(
            os.environ,
            PYTHONPATH=os.pathsep.join([str(layout.vendor / "sglang"), str(flashinfer)]),
            LD_LIBRARY_PATH=str(python.parent.parent.parent / "driver"),
            HF_HUB_OFFLINE="1",  # the model directory is all there is to read
            TRANSFORMERS_OFFLINE="1",
            SGLANG_DISABLE_JIT="1",
            # FlashInfer's generators run for the configuration's GPU, as its JIT would on
            # the node, writing what they generate into the scratch directory.
            FLASHINFER_CUDA_ARCH_LIST="{}.{}a".format(*served.arch),
            FLASHINFER_WORKSPACE_BASE=str(scratch),
        )
        try:
            result = subprocess.run(
                [str(python), str(REPLAY), json.dumps(request)],
                cwd=scratch,
                env=env,
                capture_output=True,
                text=True,
                timeout=REPLAY_TIMEOUT,
            )
        except subprocess.TimeoutExpired:
            raise UserError(
                f"the replay of {served.name} did not finish in {REPLAY_TIMEOUT} s"
            ) from None
    if result.returncode < 0:
        raise UserError(
            f"the replay of {served.name} was killed by signal {-result.returncode} "
            "(SIGKILL: the kernel's out-of-memory killer, most likely); its last words:\n"
            f"{result.stderr.strip()[-2000:]}"
        )
    if result.returncode != 0:
        raise UserError(
            f"the replay of {served.name} failed; sglang said:\n{result.stderr.strip()[-4000:]}"
        )
    answer: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    if answer.get("unreached"):
        raise UserError(
            f"the replay of {served.name} did not reach the kernels of "
            + "; ".join(
                f"{entry['step']} ({entry['error']}, at {entry['at']})"
                for entry in answer["unreached"]
            )
            + ": what they ask for is unknown, so no profile is written for it"
        )
    return answer


def _flashinfer_with_data(tree: Path, into: Path) -> Path:
    """The patched FlashInfer package as an installed one is laid out, for the replay's
    generators to run as the build runs them: a copy of its Python files with flashinfer/data/
    linking to the vendor tree's sources (the links its build backend makes). A copy, since
    FlashInfer finds data/ beside its own resolved file, and the vendor tree stays as git
    has it. Returns the directory to put on sys.path."""
    shutil.copytree(
        tree / "flashinfer",
        into / "flashinfer",
        ignore=shutil.ignore_patterns("__pycache__", "data"),
    )
    data = into / "flashinfer" / "data"
    data.mkdir()
    for name, target in data_links(tree).items():
        (data / name).symlink_to((tree / target).resolve(), target_is_directory=True)
    return into


# What the replay sees compile outside FlashInfer's and sglang's JIT, which no wheel of this
# project carries (derive/replay.py FIRST_USE).
FIRST_USE_COMPILERS = (
    "Triton's JIT (triton), DeepGEMM's, with nvcc or NVRTC (deep_gemm), torch.compile's "
    "(Dynamo, Inductor, Triton), CuTe DSL's (cute_dsl) and TileLang's (tilelang)"
)


def recipe_name(call: str) -> str:
    """A derived recipe's name: the generator's, less gen_/_jit_/_module, and a digest of
    the whole call."""
    function = call.split(":", 1)[1].split("(", 1)[0]
    stem = re.sub(r"^(gen_|_jit_)|_module$", "", function)
    return f"{stem}.{digest(call)[:8]}"


def render(
    served: list[Served],
    answers: dict[str, dict[str, Any]],
    sglang: str,
    hand: dict[str, str] | None = None,
    previous: dict[str, Any] | None = None,
) -> str:
    """profiles-derived.toml: one recipe per call the replays recorded, one profile per
    served configuration, and their union. A call that a recipe of profiles.toml already
    makes (`hand`: call -> name) is named by that recipe, not defined twice. A configuration
    whose replay asked for a module FlashInfer cannot make for its arch is not servable:
    it is listed under [not_servable] with each such module and where sglang asked for it,
    and kept out of the union. A configuration not in `answers` (not derived this time, or
    its replay failed) keeps what `previous` (the file as it was) holds for it. Written by a
    TOML writer: names and text from served-models.toml and from sglang are data, never
    TOML of their own."""
    import tomli_w  # here: `--help` runs where the package's dependencies are not installed

    hand = hand or {}
    previous = previous or {}
    recipes: dict[str, dict[str, Any]] = {}
    profiles: dict[str, dict[str, Any]] = {}
    not_servable: dict[str, dict[str, Any]] = {}
    union: list[str] = []
    for item in served:
        if item.name not in answers:
            kept = previous.get("profiles", {}).get(item.name)
            if kept is None:
                if item.name in previous.get("not_servable", {}):
                    not_servable[item.name] = previous["not_servable"][item.name]
                continue
            profiles[item.name] = kept
            for member in kept["modules"]:
                if member in previous.get("modules", {}):
                    recipes.setdefault(member, previous["modules"][member])
            union += [m for m in kept["modules"] if m not in union]
            continue
        answer = answers[item.name]
        if answer.get("unavailable"):
            not_servable[item.name] = {
                "description": item.description,
                "arch": "{}.{}".format(*item.arch),
                "cannot_build": [
                    {
                        "call": entry["call"],
                        "reason": entry["reason"],
                        "loaded_by": list(entry["loaded_by"]),
                    }
                    for entry in answer["unavailable"]
                ],
            }
            continue
        names = []
        for request in answer["requested"]:
            if request["call"] in hand:
                names.append(hand[request["call"]])
                continue
            name = recipe_name(request["call"])
            known = recipes.setdefault(
                name,
                {"call": request["call"], "defined_at": request["defined_at"], "loaded_by": []},
            )
            for site in request["loaded_by"]:
                if site not in known["loaded_by"]:
                    known["loaded_by"].append(site)
            names.append(name)
        members = list(dict.fromkeys([*names, *item.also]))
        profiles[item.name] = {
            "description": item.description,
            "modules": members,
            # What sglang resolved the server arguments to, and what compiles on the node
            # at first use outside these wheels (FIRST_USE_COMPILERS), with where.
            "resolved": {key: str(value) for key, value in sorted(answer["resolved"].items())},
            "compiled_on_node": [
                {
                    "name": entry["name"],
                    "defined_at": entry["defined_at"],
                    "loaded_by": list(entry["loaded_by"]),
                }
                for entry in answer.get("first_use", [])
            ],
        }
        union += [m for m in members if m not in union]
    profiles[UNION_PROFILE] = {
        "description": f"every servable configuration of {SERVED_FILE}: "
        + ", ".join(s.name for s in served if s.name in profiles),
        "modules": union,
    }
    header = (
        f"# Generated by `nox -s derive_profiles` from sglang {sglang}'s own code: do not edit.\n"
        "# Each [modules.*] is a call that sglang's server-argument resolution, model\n"
        "# constructor, KV pool and attention backend made on a virtual SM12x GPU (derive/\n"
        "# replay.py), with where it is defined and where sglang asked for it. Each profile is\n"
        f"# one configuration of {SERVED_FILE}, with what sglang resolved its arguments to and\n"
        "# what compiles on the node at first use (compiled_on_node): "
        f"{FIRST_USE_COMPILERS}.\n"
        "# [not_servable.*]: configurations that ask for a module FlashInfer cannot build for\n"
        "# their GPU, each such call with FlashInfer's reason and where sglang asked for it.\n\n"
    )
    data: dict[str, Any] = {"modules": dict(sorted(recipes.items())), "profiles": profiles}
    if not_servable:
        data["not_servable"] = not_servable
    return header + tomli_w.dumps(data)


def derive_profiles(layout: Layout, pins: Pins, check: bool, configs: list[str]) -> int:
    """Derive the served configurations (`configs`, or all) and write profiles-derived.toml,
    or with `check` compare with it. Each configuration is replayed on its own: one that
    fails is named and keeps what the file held for it, the others are derived. Returns 0
    when every configuration derived, is servable and (with `check`) matches the file;
    1 otherwise."""
    served = load_served(layout.stack)
    known = [item.name for item in served]
    unknown = [name for name in configs if name not in known]
    if unknown:
        raise UserError(
            f"no configuration {', '.join(map(repr, unknown))} in {SERVED_FILE} "
            f"(known: {', '.join(known)})"
        )
    chosen = [item for item in served if not configs or item.name in configs]
    python = environment(layout, pins)
    answers: dict[str, dict[str, Any]] = {}
    failed: dict[str, str] = {}
    for number, item in enumerate(chosen, 1):
        say(f"configuration {number} of {len(chosen)}: {item.name}")
        try:
            answers[item.name] = replay(layout, python, item)
        except UserError as error:
            failed[item.name] = str(error)
            say(f"{item.name}: FAILED, the others go on: {error}")
            continue
        answer = answers[item.name]
        requested = answer["requested"]
        say(
            f"{item.name}: {len(requested)} modules requested "
            f"({sum(r['call'].startswith('flashinfer') for r in requested)} FlashInfer, "
            f"{sum(r['call'].startswith('sglang') for r in requested)} sglang JIT), "
            f"{len(item.also)} named by hand; "
            f"{len(answer.get('first_use', []))} compiled at first use outside them"
        )
        for entry in answer.get("unavailable", []):
            say(
                f"{item.name}: NOT SERVABLE on SM{item.arch[0]}{item.arch[1]} with these "
                f"arguments: {entry['call']} cannot be built for it ({entry['reason']}); "
                f"sglang asks for it at {'; '.join(entry['loaded_by']) or 'an unknown site'}"
            )
    hand_written = read_toml(layout.profiles_file).get("modules", {})
    hand = {str(table.get("call")): name for name, table in hand_written.items()}
    target = layout.stack / DERIVED_FILE
    previous = read_toml(target) if target.is_file() else {}
    text = render(served, answers, pins.upstream("sglang").version, hand, previous)
    not_servable = [name for name, answer in answers.items() if answer.get("unavailable")]
    problems = [f"{name} (replay failed)" for name in failed] + [
        f"{name} (not servable)" for name in not_servable
    ]
    status = 1 if problems else 0
    # The README's table is the checkout's: a stack outside it (a test's) leaves it alone.
    readme_file = layout.root / readme.README if readme.is_checkout_stack(layout) else None
    if check:
        current = target.read_text() if target.is_file() else ""
        if current != text:
            difference = difflib.unified_diff(
                current.splitlines(), text.splitlines(), DERIVED_FILE, "derived now", lineterm=""
            )
            print("\n".join(list(difference)[:80]))
            say(f"{DERIVED_FILE} is not what sglang asks for now: run `nox -s derive_profiles`")
            status = 1
        else:
            say(f"{DERIVED_FILE} is what sglang {pins.upstream('sglang').version} asks for")
            if readme_file is not None and not readme.is_current(readme_file, layout.root):
                say(
                    f"{readme.README}'s table of what compiles on a node is not the one "
                    f"{DERIVED_FILE} gives: run `nox -s derive_profiles`"
                )
                status = 1
    elif not answers:
        # Nothing was derived now: the file keeps what it held (or stays absent), rather
        # than lose every profile to a run in which every replay failed.
        say(f"no configuration derived: {DERIVED_FILE} is left as it was")
    else:
        replace_text(target, text)
        derived = len(answers) - len(not_servable)
        say(f"wrote {DERIVED_FILE} ({derived} of {len(chosen)} configuration(s) derived now)")
        if readme_file is not None:
            # After the file above: the table reads every stack's derived file.
            replace_text(readme_file, readme.regenerated(readme_file, layout.root))
            say(f"rewrote {readme.README}'s table of what compiles on a node")
    if failed:
        kept = [name for name in failed if name in previous.get("profiles", {})]
        say(
            f"{len(failed)} configuration(s) failed: {', '.join(failed)}"
            + (f"; {', '.join(kept)} kept the profile the file held" if kept else "")
        )
    if problems:
        say(f"not derived as served: {', '.join(problems)}")
    return status
