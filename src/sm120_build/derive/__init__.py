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
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..cache import digest, scratch_directory
from ..console import say, step
from ..errors import UserError
from ..layout import Layout
from ..pins import Pins, check_plain_name, read_toml

SERVED_FILE = "served-models.toml"
DERIVED_FILE = "profiles-derived.toml"
UNION_PROFILE = "served"
REPLAY = Path(__file__).with_name("replay.py")


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


def environment(layout: Layout, pins: Pins) -> Path:
    """The Python of a venv in the cache that holds the pinned sglang and its dependencies
    (made once, through pip's configuration), and a libcuda.so.1 beside it."""
    sglang = pins.upstream("sglang")
    key = digest("derive", sglang.version, sys.version_info[:2])[:16]
    entry = layout.cache / "derive-env" / key
    python = entry / "venv" / "bin" / "python"
    if (entry / "complete").is_file():
        return python
    with step(
        f"installing sglang {sglang.version} and its dependencies into {entry} "
        "(the replay's environment; several GB, once)"
    ):
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(entry / "venv")], check=True)
        result = subprocess.run(
            [str(python), "-m", "pip", "install", "--quiet", f"sglang=={sglang.version}"],
            stderr=subprocess.PIPE,
            text=True,
        )
        if result.returncode != 0:
            raise UserError(
                f"pip could not install sglang {sglang.version} for the replay:\n"
                f"{result.stderr.strip()[-3000:]}"
            )
        _driver_stub(python, entry / "driver")
    (entry / "complete").write_text("")
    return python


def _driver_stub(python: Path, directory: Path) -> None:
    """libcuda.so.1 for a machine with no NVIDIA driver, as CUDA's own link stubs are: every
    driver entry point the environment's extensions import answers CUDA_ERROR_NO_DEVICE
    (100). It lets sgl_kernel's extension load; nothing here calls the driver."""
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['platlib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    symbols: set[str] = set()
    for library in Path(site).rglob("*.so*"):
        if not library.is_file():
            continue
        needed = subprocess.run(["readelf", "-d", str(library)], capture_output=True, text=True)
        if "libcuda.so.1" not in needed.stdout:
            continue
        undefined = subprocess.run(
            ["nm", "-D", "--undefined-only", str(library)], capture_output=True, text=True
        )
        symbols |= set(re.findall(r"\bU (cu[A-Z]\w*)", undefined.stdout))
    directory.mkdir(parents=True, exist_ok=True)
    source = directory / "stub.c"
    source.write_text(
        "/* No device: every driver call answers CUDA_ERROR_NO_DEVICE. */\n"
        + "".join(f"int {symbol}(void) {{ return 100; }}\n" for symbol in sorted(symbols))
    )
    subprocess.run(
        ["gcc", "-shared", "-fPIC", "-o", str(directory / "libcuda.so.1"), str(source)],
        check=True,
    )


def replay(layout: Layout, python: Path, served: Served) -> dict[str, Any]:
    """Run replay.py for one served configuration; its JSON."""
    request = {
        "model": str(served.model.resolve()),
        "server_args": served.server_args,
        "arch": list(served.arch),
    }
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join(str(layout.vendor / name) for name in ("sglang", "flashinfer")),
        LD_LIBRARY_PATH=str(python.parent.parent.parent / "driver"),
        HF_HUB_OFFLINE="1",  # the model directory is all there is to read
        TRANSFORMERS_OFFLINE="1",
        SGLANG_DISABLE_JIT="1",
    )
    with (
        step(f"replaying sglang for {served.name}"),
        scratch_directory(layout.cache, "replay") as scratch,
    ):
        result = subprocess.run(
            [str(python), str(REPLAY), json.dumps(request)],
            cwd=scratch,
            env=env,
            capture_output=True,
            text=True,
            timeout=900,
        )
    if result.returncode != 0:
        raise UserError(
            f"the replay of {served.name} failed; sglang said:\n{result.stderr.strip()[-4000:]}"
        )
    answer: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    return answer


# What the replay sees compile outside FlashInfer's and sglang's JIT, which no wheel of this
# project carries (derive/replay.py FIRST_USE).
FIRST_USE_COMPILERS = "Triton's JIT (triton) and DeepGEMM's, with nvcc or NVRTC (deep_gemm)"


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
) -> str:
    """profiles-derived.toml: one recipe per call the replays recorded, one profile per
    served configuration, and their union. A call that a recipe of profiles.toml already
    makes (`hand`: call -> name) is named by that recipe, not defined twice. Written by a
    TOML writer: names and text from served-models.toml and from sglang are data, never
    TOML of their own."""
    import tomli_w  # here: `--help` runs where the package's dependencies are not installed

    hand = hand or {}
    recipes: dict[str, dict[str, Any]] = {}
    profiles: dict[str, dict[str, Any]] = {}
    union: list[str] = []
    for item in served:
        names = []
        for request in answers[item.name]["requested"]:
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
        resolved = answers[item.name]["resolved"]
        profiles[item.name] = {
            "description": item.description,
            "modules": members,
            # What sglang resolved the server arguments to, and what compiles on the node
            # at first use outside these wheels (FIRST_USE_COMPILERS), with where.
            "resolved": {key: str(value) for key, value in sorted(resolved.items())},
            "compiled_on_node": [
                {
                    "name": entry["name"],
                    "defined_at": entry["defined_at"],
                    "loaded_by": list(entry["loaded_by"]),
                }
                for entry in answers[item.name].get("first_use", [])
            ],
        }
        union += [m for m in members if m not in union]
    profiles[UNION_PROFILE] = {
        "description": f"every configuration of {SERVED_FILE}: "
        + ", ".join(s.name for s in served),
        "modules": union,
    }
    header = (
        f"# Generated by `nox -s derive_profiles` from sglang {sglang}'s own code: do not edit.\n"
        "# Each [modules.*] is a call that sglang's server-argument resolution, model\n"
        "# constructor, KV pool and attention backend made on a virtual SM12x GPU (derive/\n"
        "# replay.py), with where it is defined and where sglang asked for it. Each profile is\n"
        f"# one configuration of {SERVED_FILE}, with what sglang resolved its arguments to and\n"
        "# what compiles on the node at first use (compiled_on_node): "
        f"{FIRST_USE_COMPILERS}.\n\n"
    )
    return header + tomli_w.dumps({"modules": dict(sorted(recipes.items())), "profiles": profiles})


def derive_profiles(layout: Layout, pins: Pins, check: bool) -> int:
    """Derive every served configuration and write profiles-derived.toml, or with `check`
    compare with it: 0 when it is what sglang asks for, 1 when it differs."""
    served = load_served(layout.stack)
    python = environment(layout, pins)
    answers = {item.name: replay(layout, python, item) for item in served}
    for item in served:
        requested = answers[item.name]["requested"]
        say(
            f"{item.name}: {len(requested)} modules requested "
            f"({sum(r['call'].startswith('flashinfer') for r in requested)} FlashInfer, "
            f"{sum(r['call'].startswith('sglang') for r in requested)} sglang JIT), "
            f"{len(item.also)} named by hand; "
            f"{len(answers[item.name].get('first_use', []))} compiled at first use outside them"
        )
    hand_written = read_toml(layout.profiles_file).get("modules", {})
    hand = {str(table.get("call")): name for name, table in hand_written.items()}
    text = render(served, answers, pins.upstream("sglang").version, hand)
    target = layout.stack / DERIVED_FILE
    if check:
        current = target.read_text() if target.is_file() else ""
        if current != text:
            difference = difflib.unified_diff(
                current.splitlines(), text.splitlines(), DERIVED_FILE, "derived now", lineterm=""
            )
            print("\n".join(list(difference)[:80]))
            say(f"{DERIVED_FILE} is not what sglang asks for now: run `nox -s derive_profiles`")
            return 1
        say(f"{DERIVED_FILE} is what sglang {pins.upstream('sglang').version} asks for")
        return 0
    partial = target.with_name(f".{target.name}.partial")
    partial.write_text(text)
    os.replace(partial, target)
    say(f"wrote {DERIVED_FILE}")
    return 0
