"""The main job, `nox -s build_wheels`: pins -> fetch -> vendor -> compile -> wheels.

Each built wheel is cached under a digest of everything that went into it, so a re-run
with no change reuses all three, and a change to one upstream's patches rebuilds only
that upstream's wheels.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

from . import attest, audit, fetch, glibc, jit_cache, toolkit, vendor, wheel_upstream, wheels
from .cache import cached_wheel, digest, files_digest, scratch_directory, sha256_of, store_wheel
from .console import say, step
from .errors import UserError
from .jit_cache import KernelRequest, Part, ShardSpec
from .jit_cache.cmake import check_tvm_ffi_headers
from .layout import Layout
from .pins import Pins, Upstream
from .tool_wheel import build_tool_wheel

PACKAGE_DIR = Path(__file__).parent


def vendor_all(layout: Layout, pins: Pins, names: list[str] | None = None) -> None:
    """Fetch, verify, unpack and patch the named upstreams (default: all pinned)."""
    for name in names or sorted(pins.upstreams):
        upstream = pins.upstream(name)
        sdist = fetch.fetch_sdist(upstream, layout.sdists)
        vendor.vendor_upstream(upstream, sdist, layout.patches / name, layout.vendor / name)


def _vendor_label(layout: Layout, upstream: Upstream) -> str:
    return f"sm120.{vendor.series_label(layout.vendor / upstream.name)}"


def check_gates(layout: Layout, pins: Pins, cuda: toolkit.Toolkit) -> None:
    """Refuse to compile while an arch gate on the fusion path still excludes SM120.

    The verdict is cached under a digest of the trees' inputs, the waivers and the audit
    code, so an unchanged re-run does not preprocess again."""
    inputs = [vendor.current_inputs(layout.vendor / name) for name in sorted(pins.upstreams)]
    waivers_text = layout.waivers_file.read_text() if layout.waivers_file.is_file() else ""
    scope = audit.load_scope(layout.scope_file)
    key = digest(
        "audit",
        inputs,
        waivers_text,
        scope,
        cuda.full_version,
        files_digest(sorted((PACKAGE_DIR / "audit").glob("*.py"))),
    )
    passed = layout.cache / "artifacts" / "audit" / f"{key}.passed"
    if passed.is_file():
        say("gate audit: unchanged inputs, passed before")
        return
    report = audit.audit(
        layout.vendor,
        layout.patches,
        audit.load_waivers(layout.waivers_file),
        scope,
        cuda,
        pristine=False,
        whole_tree=False,
    )
    if report.failing or report.missing_scope:
        print(report.table())
        raise UserError(
            f"{len(report.failing)} arch gate(s) on the fusion path still exclude SM120, and "
            f"{len(report.missing_scope)} scoped file pattern(s) match nothing (table above); "
            f"patch or waive the gates in {layout.shown(layout.waivers_file)}, or update the "
            f"audit's scope in {layout.shown(layout.scope_file)}. "
            "Nothing was built."
        )
    say(f"gate audit: {len(report.findings)} findings, none unwaived in scope")
    passed.parent.mkdir(parents=True, exist_ok=True)
    passed.write_text(json.dumps(report.as_json(), indent=2) + "\n")


def _python_wheel(
    layout: Layout,
    pins: Pins,
    upstream: Upstream,
    env: dict[str, str],
    final_dir: Path,
    prepare: Callable[[Path], None] | None = None,
) -> Path:
    version = f"{upstream.version}+{_vendor_label(layout, upstream)}"
    key = digest(
        upstream.name,
        version,
        pins.build_requirements,
        # The wheel command (wheels.py) and the tree export (gitrepo.py) shape it too.
        files_digest([PACKAGE_DIR / n for n in ("pipeline.py", "wheels.py", "gitrepo.py")]),
    )
    entry = layout.cache / "artifacts" / upstream.name / key
    wheel = cached_wheel(entry, f"{upstream.project} {version}")
    if wheel is None:
        with scratch_directory(layout.cache, "wheel") as scratch:
            built = wheels.build_python_wheel(layout.vendor / upstream.name, scratch, env, prepare)
            wheel = store_wheel(built, entry)
    else:
        say(f"{upstream.project} {version}: reusing the cached wheel")
    provenance = {
        **wheels.upstream_record(layout.root, layout.patches / upstream.name, upstream),
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

    # FlashInfer 0.7's build backend pip-installs cuda-tile's compiler and builds the NIXL
    # and NCCL expert-parallel backends when it builds a wheel, unless told not to (its
    # own switches; 0.6 reads neither). The wheel is pure Python: nothing to install or
    # build.
    env = {"FLASHINFER_BUILD_NO_PIP": "1", "BUILD_NVEP": "0"}
    return _python_wheel(layout, pins, upstream, env, final_dir, stamp_version)


def build_sglang(layout: Layout, pins: Pins, final_dir: Path, platform: str) -> list[Path]:
    upstream = pins.upstream("sglang")
    if upstream.wheels:
        return _patched_upstream_wheels(layout, pins, upstream, final_dir, platform)
    version = f"{upstream.version}+{_vendor_label(layout, upstream)}"
    # setuptools-scm would otherwise derive a version from whatever git repo encloses the tree.
    env = {"SETUPTOOLS_SCM_PRETEND_VERSION_FOR_SGLANG": version}
    return [_python_wheel(layout, pins, upstream, env, final_dir)]


def _patched_upstream_wheels(
    layout: Layout, pins: Pins, upstream: Upstream, final_dir: Path, platform: str
) -> list[Path]:
    """One patched wheel per pinned wheel of the upstream for `platform` (wheel_upstream.py)."""
    targets = [
        wheel
        for wheel in upstream.wheels
        if wheel_upstream.platform_of(wheel.file).endswith(f"_{platform}")
    ]
    if not targets:
        pinned = ", ".join(wheel.file for wheel in upstream.wheels)
        raise UserError(
            f"{layout.pins_file} pins no {upstream.project} wheel for {platform} (it pins "
            f"{pinned}); add one to [upstream.{upstream.name}] wheels"
        )
    version = f"{upstream.version}+{_vendor_label(layout, upstream)}"
    tree = layout.vendor / upstream.name
    code = files_digest(
        [PACKAGE_DIR / n for n in ("wheel_upstream.py", "wheels.py", "pipeline.py")]
    )
    built = []
    patched: dict[str, tuple[bytes, int]] | None = None
    vendored: dict[str, tuple[bytes, int]] | None = None
    for target in targets:
        entry = layout.cache / "artifacts" / upstream.name / digest(version, target, code)
        wheel = cached_wheel(entry, f"{upstream.project} {version} ({target.file})")
        if wheel is None:
            if patched is None or vendored is None:
                patched = wheel_upstream.tree_files(tree)
                source = fetch.fetch_artifact(upstream, upstream.source, layout.sdists)
                vendored = wheel_upstream.wheel_files(source)
            path = fetch.fetch_artifact(upstream, target, layout.sdists)
            files = (
                patched
                if target == upstream.source
                else wheel_upstream.target_files(
                    patched, vendored, wheel_upstream.wheel_files(path), target.file
                )
            )
            with scratch_directory(layout.cache, "wheel") as scratch:
                raw = wheel_upstream.patched_wheel(files, target.file, version, scratch)
                wheel = store_wheel(raw, entry)
            say(f"{upstream.project} {version}: patched {target.file}")
        else:
            say(f"{upstream.project} {version} ({target.file}): reusing the cached wheel")
        provenance = {
            **wheels.upstream_record(layout.root, layout.patches / upstream.name, upstream, target),
            "toolkit": None,  # nothing compiled here: its binaries are upstream's own
            "archs": [],
            "compile_commands": [],
        }
        built.append(wheels.finalize_wheel(wheel, final_dir, provenance))
    return built


def _toolkit(layout: Layout, pins: Pins, request: KernelRequest) -> tuple[toolkit.Toolkit, str]:
    """The toolkit the request compiles with, and how the provenance names its source."""
    if request.cuda_home is None:
        cuda = toolkit.pip_toolkit(pins.toolkit_requirement, layout.cache)
        source = f"pip: {pins.toolkit_requirement}"
    else:
        cuda = toolkit.probe(request.cuda_home.resolve())
        source = f"system: {request.cuda_home.resolve()}"
    jit_cache.check_archs(request.archs, cuda)  # before anything compiles
    if request.cross is not None:
        return _cross_toolkit(layout, pins, request.platform, cuda, source)
    return cuda, source


# The newest glibc a cross-build's pinned wheels may ask for: the manylinux_2_28 promise.
_CROSS_GLIBC_MINOR = 28


def _cross_toolkit(
    layout: Layout, pins: Pins, host: str, cuda: toolkit.Toolkit, source: str
) -> tuple[toolkit.Toolkit, str]:
    """The pinned pip toolkit for another host CPU: with that host's CUDA runtime, of the
    toolkit's own cudart release, after the build's tvm-ffi headers are found to be those of
    the release the nodes load (both wheels hash-pinned in [cross.<host>])."""
    wanted = pins.cross_pins(host, layout.pins_file)
    platforms = glibc.manylinux_platforms(host, _CROSS_GLIBC_MINOR)
    runtime = fetch.fetch_pinned_wheel(wanted.cuda_runtime, layout.cache, platforms)
    release = toolkit.cudart_release(cuda)
    if runtime.name.split("-")[1] != release:
        raise UserError(
            f"{layout.pins_file} [cross.{host}] pins {runtime.name}, but the toolkit's cudart is "
            f"nvidia-cuda-runtime {release}: pin that release's {host} wheel"
        )
    check_tvm_ffi_headers(fetch.fetch_pinned_wheel(wanted.tvm_ffi, layout.cache, platforms))
    cross = toolkit.cross_toolkit(cuda, host, runtime)
    return cross, f"{source}; {host} cudart: {runtime.name} sha256:{sha256_of(runtime)}"


def _wheelhouse(
    layout: Layout,
    pins: Pins,
    parts: list[Part],
    base: str | None,
    lap: Callable[[str], None],
    run: attest.BuildRun,
    glibc_baseline: str | None = None,
    platform: str = "x86_64",
) -> None:
    """The jit-cache wheel from `parts`, the Python wheels, their provenance envelopes,
    SHA256SUMS and requirements.txt, into wheelhouse/ at once; then what was written, and
    what to do next."""
    with scratch_directory(layout.cache, "final") as final_dir:
        with step("making the jit-cache wheel (auditwheel, provenance)"):
            jit = jit_cache.assemble(layout, pins, parts, base, final_dir, glibc_baseline)
        built = [jit]
        lap("jit-cache wheel")
        built.append(build_flashinfer_python(layout, pins, final_dir))
        lap("flashinfer-python wheel")
        built += build_sglang(layout, pins, final_dir, platform)
        lap("sglang wheel")
        built.append(build_tool_wheel(final_dir))
        lap("node tools wheel")
        tool = {
            "version": built[-1].name.split("-")[1],
            "toolkit": json.dumps(parts[0].record["toolkit"], sort_keys=True),
        }
        envelopes = attest.write_envelopes(layout, pins, run, built, tool)
        companions = list(pins.companions.values())
        wheelhouse = layout.wheelhouse_for(platform)
        wheels.assemble_wheelhouse(
            built,
            companions,
            _companion_wheels(pins, layout.cache),
            wheelhouse,
            envelopes,
        )
        lap("wheelhouse")
    where = layout.shown(wheelhouse)
    say(f"wrote {where}/:")
    for name in [*(wheel.name for wheel in built), "SHA256SUMS", "requirements.txt"]:
        say(f"  {name}")
    for companion in companions:
        say(f"  {companion.name} {companion.version} (a pinned companion, as the index serves it)")
    if run.signer is not None:
        say(
            f"  {len(envelopes)} provenance envelopes (*.intoto.jsonl), signed with key "
            f"{attest.key_id(run.signer)}"
        )
    else:
        say(
            f"  {len(envelopes)} provenance envelopes (*.intoto.jsonl), UNSIGNED: give "
            f"--sign-key KEY (or {attest.SIGN_KEY_ENV}) to sign them"
        )
    say(
        f"next: on a node, pip install --require-hashes --no-deps --find-links {where}/ "
        f"-r {where}/requirements.txt, then sm120-node-check; or nox -s lock_node and "
        "nox -s publish"
    )


def _companion_wheels(pins: Pins, cache: Path) -> list[Path]:
    """The pinned companions (flashinfer-cubin), fetched through pip with their pinned
    hashes, so that the wheelhouse alone installs: `--find-links wheelhouse/` without an
    index needs them there."""
    return [
        fetch.fetch_pinned_wheel(
            f"{pin.name}=={pin.version} "
            + " ".join(f"--hash=sha256:{digest}" for digest in pin.sha256),
            cache,
        )
        for pin in pins.companions.values()
    ]


class _Laps:
    """Seconds per stage, for `nox -s bench`."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._clock = time.monotonic()

    def __call__(self, stage: str) -> None:
        now = time.monotonic()
        self.seconds[stage] = now - self._clock
        self._clock = now


def build_wheels(
    layout: Layout, pins: Pins, request: KernelRequest, run: attest.BuildRun
) -> dict[str, float]:
    """Run the main job on this machine; return the seconds each stage took."""
    lap = _Laps()
    jit_cache.check_paths(layout, request)
    vendor_all(layout, pins)
    if request.base_jit_cache is not None:
        jit_cache.base_wheel(layout, pins, request.base_jit_cache)
    lap("fetch + vendor")
    cuda, source = _toolkit(layout, pins, request)
    lap("toolkit")
    check_gates(layout, pins, cuda)
    lap("gate audit")
    part = jit_cache.compile_part(layout, pins, request, cuda, source, jit_cache.WHOLE)
    lap("render + compile")
    _wheelhouse(
        layout,
        pins,
        [part],
        request.base_jit_cache,
        lap,
        run,
        request.glibc_baseline,
        request.platform,
    )
    return lap.seconds


def plan_shards(layout: Layout, pins: Pins, request: KernelRequest, count: int) -> list[list[str]]:
    """Render the request's modules and split them over `count` shards (printed)."""
    jit_cache.check_paths(layout, request)
    vendor_all(layout, pins, ["flashinfer"])
    cuda, _ = _toolkit(layout, pins, request)
    return jit_cache.plan(layout, pins, request, cuda, count)


def build_shard(layout: Layout, pins: Pins, request: KernelRequest, shard: ShardSpec) -> Path:
    """Compile one shard's modules into shards/<i>-of-<N>/ for `merge_shards`."""
    jit_cache.check_paths(layout, request)
    vendor_all(layout, pins)
    cuda, source = _toolkit(layout, pins, request)
    check_gates(layout, pins, cuda)
    part = jit_cache.compile_part(layout, pins, request, cuda, source, shard)
    written = jit_cache.write_shard(layout.shards, shard, part.wheel, part.record)
    say(
        f"shard {shard.index}/{shard.count}: {len(part.record['modules'])} module(s) in "
        f"{written.relative_to(layout.root)}/"
    )
    return written


def merge_shards(
    layout: Layout,
    pins: Pins,
    base_jit_cache: str | None,
    run: attest.BuildRun,
    glibc_baseline: str | None = None,
) -> None:
    """Assemble wheelhouse/ from every shard in shards/: the same bytes as one machine's
    build of the same request."""
    vendor_all(layout, pins)
    if base_jit_cache is not None:
        jit_cache.base_wheel(layout, pins, base_jit_cache)
    parts = jit_cache.read_shards(layout.shards)
    upstream = pins.upstream("flashinfer")
    series = vendor.series_label(layout.vendor / upstream.name)
    version = parts[0].record["version"]
    if not version.endswith(f".{series}"):
        raise UserError(
            f"the shards in {layout.shards.relative_to(layout.root)}/ are flashinfer-jit-cache "
            f"{version}, built from another patch series than this checkout's ({series}): "
            "merge them in the checkout (same commit) that built them"
        )
    say(f"merging {len(parts)} shard(s), {sum(len(p.record['modules']) for p in parts)} modules")
    _wheelhouse(
        layout, pins, parts, base_jit_cache, _Laps(), run, glibc_baseline, parts[0].record["host"]
    )
