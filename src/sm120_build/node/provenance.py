"""What a node checks of the wheels' signed provenance (attest.py), before it installs them.

    sm120-verify-provenance DIR --trust-key KEY.pub [--lock FILE]

DIR holds the files a node is about to install (the wheelhouse as built, or what `pip
download` fetched beside the envelopes). Every wheel of ours in it must have its envelope,
signed by the trusted key, naming that file by name and sha256. With --lock (requirements.txt,
node-lock.txt), the lock must pin each of those projects by exactly the verified file, and a
companion (flashinfer-cubin) only by a sha256 a verified statement records: pip's
--require-hashes then installs nothing else. Needs no torch and installs nothing; exits 0
when all of it holds, 1 naming each wheel and its reason otherwise.

`sm120-node-check --install DIR --trust-key KEY.pub` runs the same check before it installs,
and keeps the verified envelopes in the environment (share/sm120-build/provenance/), which a
later `sm120-node-check --trust-key KEY.pub` reports on.
"""

from __future__ import annotations

import argparse
import re
import shutil
import sys
from pathlib import Path
from typing import Any

from .. import attest
from ..errors import UserError, exit_status

# What a build of this project makes and signs: the wheels a node checks envelopes for.
BUILT = ("flashinfer-python", "flashinfer-jit-cache", "sglang", "sm120-build")


def _project(file_name: str) -> tuple[str, str]:
    """A wheel file's project (canonical, PEP 503) and version (a node may lack packaging)."""
    name, version = file_name.split("-")[:2]
    return re.sub(r"[-_.]+", "-", name).lower(), version


def verified_wheels(directory: Path, key_path: Path) -> dict[Path, dict[str, Any]]:
    """Every wheel of ours in `directory` -> its verified statement; UserError naming each
    wheel that fails and why (all of them, not the first)."""
    key = attest.trusted_key(key_path)
    ours = [p for p in sorted(directory.glob("*.whl")) if _project(p.name)[0] in BUILT]
    if not ours:
        raise UserError(f"{directory} holds no wheel of ours ({', '.join(BUILT)})")
    statements: dict[Path, dict[str, Any]] = {}
    failures = []
    for wheel in ours:
        try:
            statements[wheel] = attest.verify(wheel, key)
        except UserError as error:
            failures.append(str(error))
    if failures:
        raise UserError(
            "provenance does not hold; nothing was installed:\n  " + "\n  ".join(failures)
        )
    return statements


def check_lock(lock: Path, statements: dict[Path, dict[str, Any]]) -> None:
    """The lock pins each verified project by its verified file, and each project a
    statement records as a resolved dependency (a companion) only by a recorded sha256."""
    from ..node_lock import parse_pins

    verified = {
        _project(wheel.name)[0]: attest.subject(found)[1] for wheel, found in statements.items()
    }
    recorded: dict[str, set[str]] = {}
    for found in statements.values():
        for dependency in found["predicate"]["buildDefinition"]["resolvedDependencies"]:
            match = re.fullmatch(r"pkg:pypi/([^@]+)@.+", str(dependency.get("uri", "")))
            if match and "sha256" in dependency.get("digest", {}):
                name = re.sub(r"[-_.]+", "-", match[1]).lower()
                recorded.setdefault(name, set()).add(dependency["digest"]["sha256"])
    problems = []
    for pin in parse_pins(lock.read_text()):
        if pin.name in verified:
            if set(pin.hashes) != {verified[pin.name]}:
                problems.append(
                    f"{lock.name} pins {pin.name} by {', '.join(pin.hashes) or 'no hash'}, "
                    f"not by the verified file's sha256 {verified[pin.name]}"
                )
        elif pin.name in recorded and not set(pin.hashes) <= recorded[pin.name]:
            problems.append(
                f"{lock.name} pins {pin.name} by a sha256 no signed statement records "
                f"({', '.join(sorted(set(pin.hashes) - recorded[pin.name]))})"
            )
    if problems:
        raise UserError(
            "the lock does not hold to the signed provenance; nothing was installed:\n  "
            + "\n  ".join(problems)
        )


def store() -> Path:
    """Where an environment keeps the envelopes it verified at install."""
    return Path(sys.prefix) / "share" / "sm120-build" / "provenance"


def keep(statements: dict[Path, dict[str, Any]]) -> None:
    """Copy the verified envelopes into this environment, one per project (the last install
    replaces the one before)."""
    kept = store()
    kept.mkdir(parents=True, exist_ok=True)
    for wheel in statements:
        for old in kept.glob(f"{wheel.name.split('-')[0]}-*{attest.ENVELOPE_SUFFIX}"):
            old.unlink()
        shutil.copyfile(attest.envelope_path(wheel), kept / attest.envelope_path(wheel).name)


def installed_provenance(key_path: Path, installed: dict[str, str]) -> dict[str, str]:
    """project -> what the envelopes kept at install say of the installed version: each
    re-verified against the trusted key, and naming the installed project and version."""
    key = attest.trusted_key(key_path)
    envelopes = sorted(store().glob(f"*{attest.ENVELOPE_SUFFIX}")) if store().is_dir() else []
    report = {}
    for project, version in installed.items():
        found = "no verified envelope: installed without --install DIR --trust-key"
        for envelope in envelopes:
            name = envelope.name.removesuffix(attest.ENVELOPE_SUFFIX)
            if _project(name) != (project, version):
                continue
            try:
                statement = attest.signed_statement(envelope, key, name)
            except UserError as error:
                found = f"NOT VERIFIED: {error}"
                break
            subject_name, digest = attest.subject(statement)
            if subject_name != name:
                found = f"NOT VERIFIED: {envelope.name} names {subject_name!r}"
                break
            found = f"verified at install: {name} (sha256 {digest}), key {key.keyid}"
            break
        report[project] = found
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="sm120-verify-provenance",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("directory", type=Path, metavar="DIR", help="the wheels to install")
    parser.add_argument(
        "--trust-key",
        type=Path,
        required=True,
        metavar="KEY.pub",
        help="the Ed25519 public key (PEM) the wheels' envelopes must be signed with",
    )
    parser.add_argument(
        "--lock",
        type=Path,
        metavar="FILE",
        help="the requirements file pip will install from (requirements.txt, node-lock.txt)",
    )
    parser.add_argument(
        "--verbose", action="store_true", help="show the traceback of an unexpected error"
    )
    args = parser.parse_args(argv)
    return exit_status(lambda: _verify(args), args.verbose)


def _verify(args: argparse.Namespace) -> int:
    statements = verified_wheels(args.directory, args.trust_key)
    if args.lock is not None:
        check_lock(args.lock, statements)
    for wheel in statements:
        print(f"verified: {wheel.name} (signed by {attest.trusted_key(args.trust_key).keyid})")
    if args.lock is not None:
        print(f"{args.lock.name} pins exactly these files, and only signed companions")
    return 0


if __name__ == "__main__":
    sys.exit(main())
