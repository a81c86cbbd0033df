"""The compile stage: FlashInfer JIT modules built ahead of time into flashinfer-jit-cache.

Read top-down: what is asked for (KernelRequest), the version the wheel gets, compiling a
part (one machine's whole build, or one shard's share), and assembling the wheel from its
parts. How a module is compiled, by concern:

- arch.py: which targets a build may ask for, and which a module must cover;
- sources.py: the fixed source path the patched tree is exported to;
- render.py (+ jit_specs.py, its child process): what the patched FlashInfer's own JIT
  would compile for each recipe;
- cmake.py: the kernel project (kernel/), host compilers, licences;
- sccache.py: the compiler launcher;
- module_cache.py: built modules kept one by one under a digest of their inputs;
- shards.py: the plan over N machines, shard records and the merge;
- overlay.py: --base-jit-cache.
"""

from __future__ import annotations

import json
import platform
import sys
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

from .. import fetch, glibc, hosts, profiles, sglang_env, toolkit, vendor, wheels
from ..cache import (
    cached_wheel,
    digest,
    files_digest,
    scratch_directory,
    sha256_of,
    store_wheel,
)
from ..console import detail, say
from ..layout import Layout
from ..pins import Pins
from ..sglang_kernels import MODULE_PREFIX, has_kernels_package, is_sglang_call
from . import cmake, module_cache, overlay, render, shards, sources
from .arch import DEFAULT_ARCHS, Arch, check_archs
from .sccache import launcher_for
from .shards import WHOLE, Part, ShardSpec, read_shards, write_shard

__all__ = [
    "DEFAULT_ARCHS",
    "WHOLE",
    "Arch",
    "KernelRequest",
    "Part",
    "PartKeys",
    "ShardSpec",
    "assemble",
    "base_wheel",
    "check_archs",
    "check_paths",
    "compile_part",
    "part_keys",
    "part_record",
    "plan",
    "read_shards",
    "version",
    "write_shard",
]

_HERE = Path(__file__).parent
# The code that shapes each module's bytes (in every module-cache key), and the code that
# shapes how parts are split and recorded (in a part's key only).
_MODULE_CODE = [
    "arch.py",
    "sources.py",
    "render.py",
    "jit_specs.py",
    "cmake.py",
    "driver_stub.py",
    "sccache.py",
]
_PART_CODE = ["__init__.py", "shards.py", "module_cache.py"]


@dataclass(frozen=True)
class KernelRequest:
    """What goes into the jit-cache wheel: which modules (recipe -> FlashInfer call), for
    which archs, with which toolkit."""

    recipes: dict[str, str]
    archs: list[Arch]
    cuda_home: Path | None = None
    base_jit_cache: str | None = None  # a wheel path, or "NAME==VERSION --hash=sha256:HEX"
    glibc_baseline: str | None = None  # refuse a jit-cache needing a newer glibc, e.g. "2.28"
    platform: str = hosts.DEFAULT  # the nodes' host CPU (hosts.HOSTS): what the modules run on

    @property
    def wants_sglang(self) -> bool:
        """Whether sglang's own kernels are among the modules (rendered from the patched
        sglang)."""
        return any(is_sglang_call(call) for call in self.recipes.values())

    @property
    def cross(self) -> hosts.CrossCompilers | None:
        """The cross compilers of another host than this machine's, None for its own."""
        return hosts.compilers(hosts.parse(self.platform))


def check_paths(layout: Layout, request: KernelRequest) -> None:
    """Refuse, before anything runs, the paths nvcc would see that it cannot take."""
    paths = {
        "the cache (SM120_CACHE_DIR)": layout.cache,
        "this Python environment (its tvm-ffi headers are compiled against)": Path(sys.prefix),
    }
    if request.cuda_home is not None:
        paths["--cuda-home"] = request.cuda_home
    sources.check_paths(paths)


def version(layout: Layout, pins: Pins, request: KernelRequest, cuda: toolkit.Toolkit) -> str:
    """<upstream>+<toolkit>.<archs>.p<series>; assemble() appends c<contents>."""
    upstream = pins.upstream("flashinfer")
    archs = ".".join(arch.label for arch in sorted(set(request.archs)))
    series = vendor.series_label(layout.vendor / upstream.name)
    return f"{upstream.version}+{cuda.label}.{archs}.{series}"


@dataclass(frozen=True)
class PartKeys:
    """A part's cache keys. `inputs`: what every module's build depends on besides its own
    sources and flags (each module's key holds it). `build`: what every shard of one build
    shares; the merge accepts only shards that agree. `entry`: this shard's cache entry."""

    inputs: str
    build: str
    entry: str


def part_keys(
    layout: Layout,
    pins: Pins,
    request: KernelRequest,
    cuda: toolkit.Toolkit,
    toolkit_source: str,
    shard: ShardSpec,
    costs: shards.Costs,
    jit_version: str,
    sglang_inputs: str,
) -> PartKeys:
    """`jit_version`: version() of the same request, which the caller has made already;
    `sglang_inputs`: the patched sglang's vendor inputs where sglang's kernels are asked
    for, else "". They key the part, not every module: FlashInfer's modules do not change
    with sglang (sglang's own are keyed by them in compile_part)."""
    inputs = digest(
        "jit-cache",
        jit_version,
        vendor.current_inputs(layout.vendor / "flashinfer"),
        toolkit_source,
        cuda.full_version,
        cmake.host_compilers(request.cross),
        platform.python_version(),  # its headers are on every module's include path
        pins.build_requirements,
        # The kernel project's build files shape every module; its Python package (the
        # shim FlashInfer imports) and licences only the wheel, so they key the part.
        files_digest(
            [layout.kernel_project / name for name in ("CMakeLists.txt", "pyproject.toml")]
        ),
        files_digest(
            [_HERE / name for name in _MODULE_CODE]
            + [_HERE.parent / name for name in ("toolkit.py", "hosts.py")]
        ),
    )
    build = digest(
        inputs,
        files_digest(
            [
                p
                for p in layout.kernel_project.rglob("*")
                if p.is_file() and "__pycache__" not in p.parts and p.name != "_build_meta.py"
            ]
        ),
        json.dumps(request.recipes, sort_keys=True),
        files_digest([_HERE / name for name in _PART_CODE]),
        sglang_inputs,
        shard.count,
        costs.modules,
        costs.per_unit,
    )
    return PartKeys(inputs, build, digest(build, shard.index))


def part_record(
    keys: PartKeys,
    shard: ShardSpec,
    split: list[list[str]],
    request: KernelRequest,
    jit_version: str,
    toolkit_record: dict[str, str],
    built: cmake.KernelBuild,
    cached: dict[str, module_cache.CachedModule],
) -> dict[str, object]:
    """What a part says of itself: the merge checks it against the other shards, and the
    wheel's provenance is made from it."""
    return {
        "key": keys.build,
        "index": shard.index,
        "count": shard.count,
        "plan": split,
        "version": jit_version,
        "toolkit": toolkit_record,
        "host": request.platform,
        "archs": [str(arch) for arch in sorted(set(request.archs))],
        "recipes": request.recipes,
        "modules": {**built.modules, **{name: module.recipe for name, module in cached.items()}},
        "compile_commands": built.compile_commands
        + [command for module in cached.values() for command in module.compile_commands],
    }


def _sglang_python(layout: Layout, pins: Pins) -> Path | None:
    """The Python of sglang's own environment, where its kernels are rendered from 0.5.11
    on (their loader, sglang/kernels/jit/, imports the server's utilities); None for the
    releases whose kernels jit_specs.py renders in this environment (sglang/jit_kernel/)."""
    if not has_kernels_package(layout.vendor / "sglang" / "sglang"):
        return None
    return sglang_env.environment(layout, pins)


def compile_part(
    layout: Layout,
    pins: Pins,
    request: KernelRequest,
    cuda: toolkit.Toolkit,
    toolkit_source: str,
    shard: ShardSpec,
) -> Part:
    """Compile `shard`'s share of the requested modules (all of them for 1/1), or reuse the
    cached result of the same inputs."""
    tree = layout.vendor / "flashinfer"
    archs = sorted(set(request.archs))
    jit_version = version(layout, pins, request, cuda)
    costs = shards.load_costs(layout.costs_file) if shard.count > 1 else shards.Costs({}, {})
    # sglang's own kernels are rendered from the patched sglang, exported to a fixed path of
    # its own: a change to sglang's patches moves neither FlashInfer's path nor its modules,
    # but it is another part (part_keys) with other sglang modules.
    sglang_tree = layout.vendor / "sglang"
    sglang_inputs = vendor.current_inputs(sglang_tree) if request.wants_sglang else ""
    keys = part_keys(
        layout, pins, request, cuda, toolkit_source, shard, costs, jit_version, sglang_inputs
    )
    entry = layout.cache / "artifacts" / "jit-cache" / keys.entry
    detail(f"jit-cache build key {keys.build}, entry {entry.name}; shared inputs {keys.inputs}")
    what = f"flashinfer-jit-cache {jit_version}" + (
        f", shard {shard.index}/{shard.count}" if shard.count > 1 else ""
    )
    wheel = cached_wheel(entry, what)
    if wheel is not None:
        say(f"{what}: reusing the cached build")
        return Part(wheel, json.loads((entry / "record.json").read_text()))
    # Made (once) before the shared source path is taken: it takes minutes.
    sglang_python = _sglang_python(layout, pins) if request.wants_sglang else None
    with scratch_directory(layout.cache, "kernel-build") as scratch:
        (scratch / "out").mkdir()
        (scratch / "whole").mkdir()
        # The same source path for every shard and for one machine's build: nvcc hashes it
        # into symbol names, so it is part of the bytes (and of sccache's keys).
        source_key = digest(jit_version, vendor.current_inputs(tree))
        with (
            sources.at_fixed_path(tree, source_key) as exported,
            sources.at_fixed_path(sglang_tree, digest(jit_version, sglang_inputs))
            if request.wants_sglang
            else nullcontext(None) as sglang_exported,
        ):
            modules = render.render_modules(
                exported, request.recipes, archs, cuda, sglang_exported, sglang_python
            )
            split = shards.plan(modules, costs, shard.count)
            share = [module for module in modules if module.name in split[shard.index - 1]]
            # Keyed by the module with this machine's paths named, not spelled out: a build in
            # another virtual environment (build_shard's beside build_wheels') or cache
            # location takes the same entries. sglang's kernels also by sglang's inputs.
            paths = cmake.machine_paths(exported, cuda, sglang_exported)
            module_keys = {
                module.name: module_cache.key(
                    keys.inputs + (sglang_inputs if module.name.startswith(MODULE_PREFIX) else ""),
                    cmake.portable(module, paths),
                )
                for module in share
            }
            for name, key in module_keys.items():
                detail(f"module {name}: key {key}")
            cached = module_cache.lookup(layout.built_modules, module_keys)
            if cached:
                say(
                    f"{len(cached)} of {len(share)} module(s) built before from the same "
                    f"inputs: taken from {layout.built_modules}"
                )
            result = cmake.build_jit_cache_wheel(
                sources=exported,
                modules=[module for module in share if module.name not in cached],
                kernel_project=layout.kernel_project,
                archs=archs,
                toolkit=cuda,
                version=jit_version,
                scratch=scratch,
                out_dir=scratch / "out",
                launcher=launcher_for(layout),
                sglang=sglang_exported,
                cross=request.cross,
            )
        module_cache.store(layout.built_modules, result, module_keys)
        toolkit_record = {"cuda": cuda.full_version, "source": toolkit_source}
        record = part_record(
            keys, shard, split, request, jit_version, toolkit_record, result, cached
        )
        wheel = store_wheel(
            module_cache.add_to_wheel(
                result.wheel, list(cached.values()), scratch / "whole" / result.wheel.name
            ),
            entry,
            {
                "record.json": json.dumps(record),
                # Not in the wheel (it would change its bytes); for `nox -s bench`: the
                # modules compiled by this build only.
                "compile_seconds.json": json.dumps(result.compile_seconds),
            },
        )
    return Part(wheel, record)


def base_wheel(layout: Layout, pins: Pins, spec: str) -> Path:
    """The --base-jit-cache wheel, fetched once and checked whole: called before anything
    compiles, so a wrong one costs seconds, not the compile stage."""
    base = fetch.fetch_pinned_wheel(spec, layout.cache)
    overlay.check_base(base, pins.upstream("flashinfer").version)
    return base


def assemble(
    layout: Layout,
    pins: Pins,
    parts: list[Part],
    base_jit_cache: str | None,
    final_dir: Path,
    glibc_baseline: str | None = None,
) -> Path:
    """The jit-cache wheel of every part's modules, with its provenance, over the base
    wheel if one is asked for. One machine's build is a single part; a sharded build's parts
    give the same bytes."""
    upstream = pins.upstream("flashinfer")
    first = parts[0].record
    modules: dict[str, str] = {}
    commands: list[list[str]] = []
    for part in parts:
        modules.update(part.record["modules"])
        commands += part.record["compile_commands"]
    provenance: dict[str, object] = {
        **wheels.upstream_record(layout.root, layout.patches / upstream.name, upstream),
        "toolkit": first["toolkit"],
        # The CPU its shared objects run on: sm120-node-check loads them only there.
        "host": first["host"],
        "archs": first["archs"],
        "recipes": first["recipes"],
        # Every profile, so that `sm120-node-check --profile NAME` evaluates only recipes
        # the node installed with a checked hash.
        "profiles": profiles.load(layout.profiles_file).recorded(),
        # What each derived profile still compiles at first use outside these wheels, with
        # where (profiles-derived.toml): the node check reports it for `--profile NAME`.
        "compiled_on_node": profiles.compiled_on_node(layout.stack / profiles.DERIVED_FILE),
        "modules": modules,
        "compile_commands": sorted(commands),
    }
    with scratch_directory(layout.cache, "jit-cache-wheel") as scratch:
        wheel = shards.merge_wheels([part.wheel for part in parts], scratch / parts[0].wheel.name)
        if base_jit_cache is not None:
            base = base_wheel(layout, pins, base_jit_cache)
            (scratch / "overlay").mkdir()
            wheel, taken = overlay.overlay_base(wheel, base, scratch / "overlay")
            provenance["base_jit_cache"] = {
                "wheel": base.name,
                "sha256": sha256_of(base),
                "modules": taken,
            }
            say(f"kept {len(taken)} module(s) of {base.name}; ours replace the rest")
        found = wheels.platform_audit(wheel)
        platform_tag = found.tag
        say(glibc.describe(platform_tag, wheel))
        if glibc_baseline is not None:
            glibc.check_baseline(wheel, platform_tag, found.versioned_symbols, glibc_baseline)
        return wheels.finalize_wheel(
            wheel, final_dir, provenance, platform_tag, label_contents=True
        )


def plan(
    layout: Layout, pins: Pins, request: KernelRequest, cuda: toolkit.Toolkit, count: int
) -> list[list[str]]:
    """Render the request's modules and split them over `count` shards (printed)."""
    tree = layout.vendor / "flashinfer"
    costs = shards.load_costs(layout.costs_file)
    source_key = digest("plan", version(layout, pins, request, cuda), vendor.current_inputs(tree))
    sglang_tree = layout.vendor / "sglang"
    sglang_key = digest("plan", vendor.current_inputs(sglang_tree)) if request.wants_sglang else ""
    sglang_python = _sglang_python(layout, pins) if request.wants_sglang else None
    with (
        sources.at_fixed_path(tree, source_key) as exported,
        sources.at_fixed_path(sglang_tree, sglang_key)
        if request.wants_sglang
        else nullcontext(None) as sglang_exported,
    ):
        modules = render.render_modules(
            exported,
            request.recipes,
            sorted(set(request.archs)),
            cuda,
            sglang_exported,
            sglang_python,
        )
    split = shards.plan(modules, costs, count)
    print(shards.plan_table(modules, costs, split))
    return split
