"""The options every command that compiles modules takes: which modules, archs, toolkit and
base wheel (cli.py's build-wheels, plan-shards and build-shard, and bench)."""

from __future__ import annotations

import argparse
from pathlib import Path

from . import attest, hosts, pins, profiles
from .errors import UserError
from .jit_cache import DEFAULT_ARCHS, Arch, KernelRequest
from .layout import Layout, stack_name


def kernel_request(layout: Layout, args: argparse.Namespace) -> KernelRequest:
    """--profile, --module, --arch, --cuda-home and --platform, checked before anything runs:
    another host's cross compilers and pinned runtime too."""
    recipes = profiles.load(layout.profiles_file).select(args.profile, args.module or [])
    archs = [Arch.parse(text) for text in args.arch or DEFAULT_ARCHS]
    target = hosts.parse(args.platform)
    if hosts.compilers(target) is not None:
        pins.load(layout.pins_file).cross_pins(target.name, layout.pins_file)
        if args.cuda_home is not None:
            raise UserError(
                f"--platform {target.name} cross-compiles with the pinned pip toolkit, whose "
                "cudart release the pinned aarch64 runtime matches; drop --cuda-home"
            )
    return KernelRequest(
        recipes,
        archs,
        args.cuda_home,
        args.base_jit_cache,
        getattr(args, "glibc_baseline", None),
        target.name,
    )


def add_sign_key(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--sign-key",
        type=Path,
        metavar="KEY",
        help="sign each wheel's provenance envelope (<wheel>.intoto.jsonl) with this Ed25519 "
        f"private key in PEM, as `openssl genpkey -algorithm ed25519` writes it (or "
        f"${attest.SIGN_KEY_ENV}); without one the envelopes are written unsigned",
    )


def build_parameters(layout: Layout, args: argparse.Namespace) -> dict[str, object]:
    """What the build was asked for, as its provenance records it (externalParameters)."""
    return {
        "stack": stack_name(layout.pins_file),
        "profile": getattr(args, "profile", None),
        "modules": getattr(args, "module", None) or [],
        "archs": getattr(args, "arch", None) or list(DEFAULT_ARCHS),
        "cuda_home": str(args.cuda_home) if getattr(args, "cuda_home", None) else None,
        "platform": getattr(args, "platform", None) or hosts.DEFAULT,
        "base_jit_cache": getattr(args, "base_jit_cache", None),
        "glibc_baseline": getattr(args, "glibc_baseline", None),
    }


def add_kernel_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--profile",
        metavar="NAME",
        help="the module set of the stack's profiles.toml to build (default: comm; an "
        "unknown name lists the stack's profiles)",
    )
    parser.add_argument(
        "--module",
        action="append",
        metavar="NAME",
        help="a module recipe of profiles.toml to build, e.g. norm; repeatable; alone it "
        "replaces the default profile, with --profile it adds to it",
    )
    parser.add_argument(
        "--arch",
        action="append",
        metavar="ARCH",
        help="target as FLASHINFER_CUDA_ARCH_LIST spells it, e.g. 12.0f or 9.0a; repeat "
        f"for a fat binary (default: {' '.join(DEFAULT_ARCHS)})",
    )
    parser.add_argument(
        "--cuda-home",
        type=Path,
        metavar="PATH",
        help="use this system CUDA toolkit instead of the pinned pip toolkit",
    )
    parser.add_argument(
        "--platform",
        default=hosts.DEFAULT,
        metavar="HOST",
        help=f"the nodes' host CPU, one of {', '.join(hosts.HOSTS)} (default: "
        f"{hosts.DEFAULT}); another than this machine's is cross-compiled, into "
        "wheelhouse-HOST/ (docs/aarch64.md)",
    )
    parser.add_argument(
        "--base-jit-cache",
        metavar="WHEEL",
        help="start the jit-cache wheel from this jit-cache wheel (a .whl path, or "
        "'flashinfer-jit-cache==VERSION --hash=sha256:HEX' fetched through pip): its "
        "modules are kept, except those built here",
    )


def add_glibc_baseline(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--glibc-baseline",
        metavar="X.Y",
        help="refuse a jit-cache wheel whose binaries need a newer glibc than this (e.g. "
        "2.28, the manylinux_2_28 promise), naming the symbols that need it",
    )
