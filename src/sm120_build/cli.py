"""Command line: one sub-command per stage. noxfile.py calls these; so can a user."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from contextlib import nullcontext
from pathlib import Path

from packaging.requirements import Requirement

from . import (
    attest,
    audit,
    bump,
    console,
    derive,
    fetch,
    hosts,
    jit_cache,
    node_lock,
    pins,
    pipeline,
    publish,
    pylock,
    toolkit,
    vendor,
)
from .cache import cache_lock, scratch_directory
from .console import say
from .errors import UserError, exit_status
from .layout import CACHE_ENV, Layout, repo_root, stack_name
from .options import (
    add_glibc_baseline,
    add_kernel_options,
    add_sign_key,
    build_parameters,
    kernel_request,
)


def _vendor(layout: Layout, args: argparse.Namespace) -> None:
    pinned = pins.load(layout.pins_file)
    if args.continue_:
        for name in args.names or sorted(pinned.upstreams):
            vendor.continue_series(
                pinned.upstream(name), layout.patches / name, layout.vendor / name
            )
        return
    pipeline.vendor_all(layout, pinned, args.names)


def _build_wheels(layout: Layout, args: argparse.Namespace) -> None:
    run = attest.begin(build_parameters(layout, args), args.sign_key)
    pipeline.build_wheels(layout, pins.load(layout.pins_file), kernel_request(layout, args), run)


def _shard_spec(text: str) -> jit_cache.ShardSpec:
    try:
        return jit_cache.ShardSpec.parse(text)
    except UserError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _plan_shards(layout: Layout, args: argparse.Namespace) -> None:
    if args.shards < 1:
        raise UserError("--shards must be at least 1")
    plan = pipeline.plan_shards(
        layout, pins.load(layout.pins_file), kernel_request(layout, args), args.shards
    )
    if args.github_output:
        # A GitHub Actions job output: the matrix of shard indices and their count.
        with args.github_output.open("a") as output:
            output.write(f"indices={json.dumps(list(range(1, len(plan) + 1)))}\n")
            output.write(f"count={len(plan)}\n")


def _shard_matrix(layout: Layout, args: argparse.Namespace) -> None:
    if args.shards < 1:
        raise UserError("--shards must be at least 1")
    indices = list(range(1, args.shards + 1))
    print(f"shards {indices}")
    if args.github_output:
        # A GitHub Actions job output: the matrix of shard indices and their count.
        with args.github_output.open("a") as output:
            output.write(f"indices={json.dumps(indices)}\ncount={args.shards}\n")


def _build_shard(layout: Layout, args: argparse.Namespace) -> None:
    pipeline.build_shard(
        layout, pins.load(layout.pins_file), kernel_request(layout, args), args.shard
    )


def _merge_shards(layout: Layout, args: argparse.Namespace) -> None:
    run = attest.begin(build_parameters(layout, args), args.sign_key)
    pipeline.merge_shards(
        layout, pins.load(layout.pins_file), args.base_jit_cache, run, args.glibc_baseline
    )


def _export_patches(layout: Layout, args: argparse.Namespace) -> None:
    pinned = pins.load(layout.pins_file)
    for name in args.names or sorted(pinned.upstreams):
        written = vendor.export_patches(
            pinned.upstream(name), layout.vendor / name, layout.patches / name
        )
        say(f"{layout.shown(layout.patches / name)}: {len(written)} patches exported")


def _audit_gates(layout: Layout, args: argparse.Namespace) -> None:
    pinned = pins.load(layout.pins_file)
    pipeline.vendor_all(layout, pinned)
    report = audit.audit(
        layout.vendor,
        layout.patches,
        audit.load_waivers(layout.waivers_file),
        audit.load_scope(layout.scope_file),
        toolkit.pip_toolkit(pinned.toolkit_requirement, layout.cache),
        pristine=args.pristine,
        whole_tree=args.scope == "all",
    )
    print(report.table())
    if args.json:
        args.json.write_text(json.dumps(report.as_json(), indent=2) + "\n")
    if report.missing_scope:
        raise UserError(
            f"scoped files are missing ({', '.join(report.missing_scope)}): the audit cannot "
            f"vouch for what it did not see; update {layout.shown(layout.scope_file)}"
        )
    if report.failing and args.scope != "all":
        raise UserError(
            f"{len(report.failing)} arch gate(s) in scope still exclude SM120: patch them "
            f"(patches/) or, if deliberate, waive them in {layout.waivers_file.name} with a reason"
        )


def _bump(layout: Layout, args: argparse.Namespace) -> int:
    """The report, then --write; the exit status is the verdict (bump/report.py)."""
    pinned = pins.load(layout.pins_file)
    with scratch_directory(layout.cache, "bump") as scratch:
        try:
            results, pinned_sglang = _bump_evaluate(layout, args, pinned, scratch)
        except UserError as exc:
            print(f"error: {exc}", file=sys.stderr)
            say("bump verdict (3): the candidate could not be evaluated; nothing was written")
            return 3
        hints = {
            p.patch: hint
            for r in results
            for p in r.patches
            if (layout.patches / r.upstream.name / p.patch).is_file()
            for hint in [bump.applied_upstream_hint(layout.patches / r.upstream.name / p.patch)]
            if hint
        }
        for result in results:
            print(bump.table(result, hints))
        problems = bump.pin_set_problems(results, pinned, pinned_sglang)
        for problem in problems:
            say(f"the pins would not hold together: {problem}")
        status = bump.verdict(results, problems)
        if args.write and not problems:
            status = _bump_write(layout, pinned, results, pinned_sglang, scratch) or status
        elif args.write:
            say("nothing was written: ask for the pair named above")
        if args.json:
            args.json.write_text(bump.as_json(results, status))
    say(f"bump verdict ({status[0]}): {status[1]}")
    return status[0]


def _bump_evaluate(
    layout: Layout, args: argparse.Namespace, pinned: pins.Pins, scratch: Path
) -> tuple[list[bump.Candidate], dict[str, Requirement]]:
    candidates = [bump.parse_candidate(text, pinned) for text in args.candidates]
    names = [upstream.name for upstream, _ in candidates]
    if len(set(names)) != len(names):
        raise UserError("give each upstream at most once")
    waivers = audit.load_waivers(layout.waivers_file)
    scope = audit.load_scope(layout.scope_file)
    cuda = toolkit.pip_toolkit(pinned.toolkit_requirement, layout.cache)

    def audit_candidate(tree: Path, name: str) -> bump.GateSummary:
        # With this stack's scope: a file the candidate moved is reported missing.
        device = cuda if audit.has_device_code(tree) else None
        findings = audit.audit_tree(tree.resolve(), name, device, whole_tree=True, scope=scope)
        return bump.audit_summary(
            audit.classify(findings, waivers, scope), audit.missing_scope(tree, name, scope)
        )

    # The pinned sglang's own metadata, from its pinned file: a fresh clone gives the same
    # report.
    sglang = pinned.upstream("sglang")
    source = fetch.fetch_sdist(sglang, layout.sdists)
    pinned_sglang = (
        bump.wheel_requires(source) if sglang.source.is_wheel else bump.sdist_requires(source)
    )
    results = bump.evaluate(
        pinned, layout.patches, pinned_sglang, candidates, scratch, audit_candidate
    )
    return results, pinned_sglang


def _bump_write(
    layout: Layout,
    pinned: pins.Pins,
    results: list[bump.Candidate],
    pinned_sglang: dict[str, Requirement],
    scratch: Path,
) -> tuple[int, str] | None:
    """--write, after refusing whatever it could lose; None when it was written."""
    in_the_way = bump.unsaved(layout, pinned)
    if in_the_way:
        for problem in in_the_way:
            say(f"unsaved: {problem}")
        say("nothing was written: commit or export the work named above first")
        return 2, f"{len(in_the_way)} unsaved change(s) in the way of --write"
    moved = {result.upstream.name: result.upstream for result in results}
    sglang = moved.get("sglang", pinned.upstream("sglang"))
    requires = next((r.requires for r in results if r.upstream.name == "sglang"), pinned_sglang)
    companions: dict[str, bump.write.Pinned] = {}
    try:
        for name, (old, new) in bump.companion_pins(pinned, requires, sglang.version).items():
            if new is None:
                companions[name] = None
            elif new != old:
                hashes = bump.companion_hashes(name, new, scratch / "companions" / name)
                companions[name] = (new, tuple(hashes))
        files = bump.new_files(results, layout.pins_file, layout.patches, companions)
    except UserError as exc:
        say(f"cannot write the bump: {exc}")
        return 2, str(exc)
    name = f"sglang-{sglang.version}"
    if name != stack_name(layout.pins_file):
        target = bump.write_new_stack(layout, name, files)
        where = f"the new stack {layout.shown(target)} (--stack {name})"
        option = f" -- --stack {name}"
    else:
        bump.write_in_place(layout, files)
        where = f"the stack in {layout.shown(layout.stack)}"
        option = ""
    for line in files.done:
        say(line)
    say(
        f"wrote {where}. next: `nox -s vendor{option}` stops at the first patch to refresh; "
        "make its change in the vendor tree, commit it with its header, `nox -s vendor -- "
        f"--continue NAME`, repeat, then `nox -s export_patches{option}` and `nox -s "
        f"derive_profiles{option}`"
    )
    return None


def _wheelhouse_of(layout: Layout, host: str) -> Path:
    """The wheelhouse of the nodes with `host` CPUs, which a build for them must have made."""
    wheelhouse = layout.wheelhouse_for(hosts.parse(host).name)
    if host != hosts.DEFAULT and not wheelhouse.is_dir():
        raise UserError(
            f"{layout.shown(wheelhouse)}/ does not exist: build it first (nox -s build_wheels -- "
            f"--platform {host})"
        )
    return wheelhouse


def _publish(layout: Layout, args: argparse.Namespace) -> None:
    if not args.static and not args.index_url:
        raise UserError("--index-url is required: the simple index to read the upload back from")
    wheelhouse = _wheelhouse_of(layout, args.platform)
    with publish.closure_wheels(wheelhouse, layout.cache, args.with_dependencies) as closure:
        if args.static:
            publish.write_static_index(wheelhouse, args.static.absolute(), closure)
            return
        publish.publish(
            wheelhouse,
            args.repository_url,
            args.repository,
            args.index_url,
            args.timeout,
            closure,
        )


def _derive_profiles(layout: Layout, args: argparse.Namespace) -> int:
    pinned = pins.load(layout.pins_file)
    pipeline.vendor_all(layout, pinned)  # the replay runs the patched trees
    return derive.derive_profiles(layout, pinned, args.check, args.config)


def _lock_node(layout: Layout, args: argparse.Namespace) -> None:
    if args.pylock_index:
        pylock.write_pylock(layout.wheelhouse, args.pylock_index)
        return
    # The wheelhouse of the platform's host CPU: wheelhouse-aarch64/ for aarch64-manylinux_2_Y.
    wheelhouse = layout.wheelhouse
    if args.platform:
        node_lock.Target(args.python_version, args.platform)  # a malformed one named first
        wheelhouse = _wheelhouse_of(layout, args.platform.split("-")[0])
    node_lock.lock_node(wheelhouse, args.python_version, args.platform)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sm120-build",
        description="Build SM120-enabled FlashInfer and sglang wheels from pinned, patched "
        "upstream sources. Usually run through nox (nox -l lists the sessions).",
    )
    # Every sub-command takes --verbose, so `nox -s NAME -- --verbose` works.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--verbose",
        action="store_true",
        help="show the cache keys, the compiler's output, and the traceback of an unexpected error",
    )
    common.add_argument(
        "--stack",
        nargs="?",
        const="",
        metavar="NAME",
        help="the stack (upstream pair) to work on, named after its sglang release, e.g. "
        "sglang-0.5.23 (default: the one at the top of the checkout); without a name, the "
        "stacks are listed",
    )
    common.add_argument(
        "--force",
        action="store_true",
        help=f"adopt a non-empty {CACHE_ENV} directory that is not marked as this tool's cache",
    )
    commands = parser.add_subparsers(dest="command", required=True)

    sub = commands.add_parser(
        "vendor", parents=[common], help="fetch, verify, unpack and patch the upstreams"
    )
    sub.add_argument("names", nargs="*", help="upstreams to vendor (default: all in pins.toml)")
    sub.add_argument(
        "--continue",
        dest="continue_",
        action="store_true",
        help="after a patch did not apply and its refresh is committed in vendor/NAME, "
        "apply the rest of the series",
    )
    sub.set_defaults(run=_vendor, locks_cache=True)

    sub = commands.add_parser(
        "export-patches",
        parents=[common],
        help="regenerate patches/<name>/ from the commits in vendor/<name>",
    )
    sub.add_argument("names", nargs="*", help="upstreams to export (default: all)")
    sub.set_defaults(run=_export_patches, locks_cache=True)

    sub = commands.add_parser(
        "build-wheels",
        parents=[common],
        help="vendor, compile FlashInfer modules ahead of time and write the wheels to wheelhouse/",
    )
    add_kernel_options(sub)
    add_glibc_baseline(sub)
    add_sign_key(sub)
    sub.set_defaults(run=_build_wheels, locks_cache=True)

    sub = commands.add_parser(
        "plan-shards",
        parents=[common],
        help="split the requested modules over N build machines, balanced by "
        "ci/module-costs.json, and print the plan",
    )
    add_kernel_options(sub)
    sub.add_argument("--shards", type=int, required=True, metavar="N", help="build machines")
    sub.add_argument(
        "--github-output",
        type=Path,
        metavar="FILE",
        help="append the shard indices and count as GitHub Actions outputs ($GITHUB_OUTPUT)",
    )
    sub.set_defaults(run=_plan_shards, locks_cache=True)

    sub = commands.add_parser(
        "shard-matrix",
        parents=[common],
        help="the shard indices 1..N for a CI matrix, without rendering or installing "
        "anything (each build-shard computes and checks the plan itself)",
    )
    sub.add_argument("--shards", type=int, required=True, metavar="N", help="build machines")
    sub.add_argument(
        "--github-output",
        type=Path,
        metavar="FILE",
        help="append the shard indices and count as GitHub Actions outputs ($GITHUB_OUTPUT)",
    )
    sub.set_defaults(run=_shard_matrix, locks_cache=False)

    sub = commands.add_parser(
        "build-shard",
        parents=[common],
        help="compile shard I of N of the requested modules into shards/I-of-N/",
    )
    add_kernel_options(sub)
    sub.add_argument(
        "--shard",
        type=_shard_spec,
        required=True,
        metavar="I/N",
        help="which shard, e.g. 2/4; every shard computes the same plan",
    )
    sub.set_defaults(run=_build_shard, locks_cache=True)

    sub = commands.add_parser(
        "merge-shards",
        parents=[common],
        help="assemble wheelhouse/ from every shard in shards/ (the same bytes as one "
        "machine's build)",
    )
    sub.add_argument(
        "--base-jit-cache",
        metavar="WHEEL",
        help="as for build-wheels: keep this jit-cache wheel's modules, except those built",
    )
    add_glibc_baseline(sub)
    add_sign_key(sub)
    sub.set_defaults(run=_merge_shards, locks_cache=True)

    sub = commands.add_parser(
        "audit-gates",
        parents=[common],
        help="find arch gates that exclude SM120 (device code and Python)",
    )
    sub.add_argument(
        "--pristine",
        action="store_true",
        help="audit the unpatched upstream trees, tracing each gate to its patch",
    )
    sub.add_argument("--json", type=Path, metavar="FILE", help="also write the report as JSON")
    sub.add_argument(
        "--scope",
        choices=("path", "all"),
        default="path",
        help="path: the allreduce-fusion path, fails on a gate (default); "
        "all: the whole trees, report only",
    )
    sub.set_defaults(run=_audit_gates, locks_cache=True)

    sub = commands.add_parser(
        "bump",
        parents=[common],
        help="report what an upstream release does to each patch (pins untouched)",
    )
    sub.add_argument(
        "candidates",
        nargs="+",
        metavar="PROJECT==VERSION",
        help="e.g. flashinfer-python==0.6.17 and/or sglang==0.5.10",
    )
    sub.add_argument("--json", type=Path, metavar="FILE", help="also write the report as JSON")
    sub.add_argument(
        "--write",
        action="store_true",
        help="update pins.toml and drop the patches upstream already carries",
    )
    sub.set_defaults(run=_bump, locks_cache=True)

    sub = commands.add_parser(
        "publish",
        parents=[common],
        help="upload wheelhouse/ with twine and verify it, or write a static index",
    )
    target = sub.add_mutually_exclusive_group(required=True)
    target.add_argument("--repository-url", metavar="URL", help="upload endpoint")
    target.add_argument("--repository", metavar="NAME", help="a ~/.pypirc section")
    target.add_argument(
        "--static",
        type=Path,
        metavar="DIR",
        help="write a PEP 503 static index (packages/ + simple/) instead",
    )
    sub.add_argument(
        "--index-url", metavar="URL", help="the index's simple API, read back after uploading"
    )
    sub.add_argument(
        "--timeout",
        type=float,
        default=publish.DEFAULT_TIMEOUT,
        metavar="SECONDS",
        help="give up on an index that does not answer a request or an upload in this time "
        f"(default {publish.DEFAULT_TIMEOUT})",
    )
    sub.add_argument(
        "--with-dependencies",
        action="store_true",
        help=f"also publish every file of wheelhouse/{node_lock.LOCK_FILE} for its target "
        "(nox -s lock_node): the closure a fresh node installs, gigabytes",
    )
    sub.add_argument(
        "--platform",
        default=hosts.DEFAULT,
        metavar="HOST",
        help=f"publish the wheelhouse of the nodes with these CPUs: one of "
        f"{', '.join(hosts.HOSTS)} (default {hosts.DEFAULT}: wheelhouse/; aarch64: "
        "wheelhouse-aarch64/). The pure-Python wheels both hold are uploaded once",
    )
    sub.set_defaults(run=_publish, locks_cache=True)  # the closure is fetched into the cache

    sub = commands.add_parser(
        "derive-profiles",
        parents=[common],
        help=f"derive {derive.DERIVED_FILE} from sglang's own code for every configuration "
        f"of {derive.SERVED_FILE}",
    )
    sub.add_argument(
        "--check",
        action="store_true",
        help=f"compare with {derive.DERIVED_FILE} instead of writing it; exit 1 if it differs",
    )
    sub.add_argument(
        "--config",
        action="append",
        default=[],
        metavar="NAME",
        help=f"derive only this configuration of {derive.SERVED_FILE} (repeatable); the "
        "others keep what the file holds. A configuration that fails or is not servable on "
        "its GPU is named, the others are derived, and the exit status is 1",
    )
    sub.set_defaults(run=_derive_profiles, locks_cache=True)

    sub = commands.add_parser(
        "lock-node",
        parents=[common],
        help=f"write wheelhouse/{node_lock.LOCK_FILE}: the hash-pinned closure a fresh node "
        "installs, resolved with uv for a target",
    )
    sub.add_argument(
        "--python-version",
        default=node_lock.DEFAULT_PYTHON,
        metavar="X.Y",
        help=f"the node's Python (default {node_lock.DEFAULT_PYTHON})",
    )
    sub.add_argument(
        "--platform",
        metavar="ARCH-manylinux_2_Y",
        help="the node's platform, by its glibc (default: the newest manylinux tag of the "
        f"wheelhouse's wheels, {node_lock.FALLBACK_PLATFORM} if all are pure Python)",
    )
    sub.add_argument(
        "--pylock-index",
        metavar="URL",
        help=f"instead, write wheelhouse/{pylock.PYLOCK_FILE} for {node_lock.LOCK_FILE}'s "
        "target, resolved from this index alone (the internal one, once `publish "
        "--with-dependencies` has put the closure there): it names each file's URL there",
    )
    sub.set_defaults(run=_lock_node, locks_cache=False)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    console.verbose = args.verbose

    def run() -> int:
        layout = Layout.from_root(repo_root(), args.stack)
        # Everything that writes into the cache or vendor/ takes the cache's lock first.
        # The default cache, inside the checkout and ignored by git, is this tool's by
        # construction; one set by SM120_CACHE_DIR must be marked, empty or --force'd.
        force = args.force or layout.cache == layout.root / ".cache"
        # A bump --write interrupted after its journal is finished before anything reads
        # the pins (bump/write.py).
        bump.finish_interrupted(layout)
        with cache_lock(layout.cache, force) if args.locks_cache else nullcontext():
            status: int | None = args.run(layout, args)
        return status or 0

    return exit_status(run, args.verbose)
