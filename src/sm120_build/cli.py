"""Command line: one sub-command per stage. noxfile.py calls these; so can a user."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from . import fetch, pins, vendor
from .console import say
from .errors import UserError
from .layout import Layout, repo_root


def _vendor(layout: Layout, args: argparse.Namespace) -> None:
    pinned = pins.load(layout.pins_file)
    for name in args.names or sorted(pinned.upstreams):
        upstream = pinned.upstream(name)
        sdist = fetch.fetch_sdist(upstream, layout.sdists)
        vendor.vendor_upstream(upstream, sdist, layout.patches / name, layout.vendor / name)


def _export_patches(layout: Layout, args: argparse.Namespace) -> None:
    pinned = pins.load(layout.pins_file)
    for name in args.names or sorted(pinned.upstreams):
        written = vendor.export_patches(
            pinned.upstream(name), layout.vendor / name, layout.patches / name
        )
        say(f"patches/{name}: {len(written)} patches exported")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sm120-build", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    sub = commands.add_parser("vendor", help="fetch, verify, unpack and patch the upstreams")
    sub.add_argument("names", nargs="*", help="upstreams to vendor (default: all in pins.toml)")
    sub.set_defaults(run=_vendor)

    sub = commands.add_parser(
        "export-patches", help="regenerate patches/<name>/ from the commits in vendor/<name>"
    )
    sub.add_argument("names", nargs="*", help="upstreams to export (default: all)")
    sub.set_defaults(run=_export_patches)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        args.run(Layout.from_root(repo_root()), args)
    except (UserError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0
