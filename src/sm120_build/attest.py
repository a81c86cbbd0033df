"""Signed build provenance: for each wheel a build makes, an in-toto Statement v1 whose
subject is the wheel (name and sha256) and whose predicate is SLSA Provenance v1, in a DSSE
envelope written beside it as <wheel>.intoto.jsonl, signed with the operator's Ed25519 key.

The envelope and its signature are securesystemslib's (DSSE, and its CryptoSigner over
`cryptography`); keys are Ed25519 in PEM, as `openssl genpkey -algorithm ed25519` writes the
private one and `openssl pkey -pubout` the public one, so that a security team makes and
holds them with its own tools. Without a key the envelope is written unsigned, and says so
(no signatures); a node that trusts a key refuses it.

verify() is what a node runs before it installs a wheel: the envelope beside the wheel must
be one DSSE envelope of an in-toto statement, signed by the trusted key, whose one subject
is this file, by name and sha256.
"""

from __future__ import annotations

import binascii
import importlib.util
import json
import os
import socket
import subprocess
import uuid
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .cache import sha256_of
from .errors import UserError
from .layout import Layout
from .pins import Pins

if TYPE_CHECKING:
    from securesystemslib.signer import CryptoSigner, SSlibKey

ENVELOPE_SUFFIX = ".intoto.jsonl"
PAYLOAD_TYPE = "application/vnd.in-toto+json"
STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "https://slsa.dev/provenance/v1"
BUILD_TYPE = "urn:sm120-build:build-wheels:v1"
SIGN_KEY_ENV = "SM120_SIGN_KEY"


def envelope_path(wheel: Path) -> Path:
    return wheel.with_name(wheel.name + ENVELOPE_SUFFIX)


def now() -> str:
    """RFC 3339, UTC, as SLSA's timestamps are."""
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def signing_key(path: Path | None) -> CryptoSigner | None:
    """The Ed25519 private key at `path`, or in $SM120_SIGN_KEY (the key's path, or the PEM
    itself, as a CI secret gives it), as a signer; None without either. Loaded before
    anything is built, so that a bad key costs no compile."""
    from_environment = os.environ.get(SIGN_KEY_ENV, "")
    if path is None and not from_environment:
        return None
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from securesystemslib.signer import CryptoSigner

    if path is None and from_environment.lstrip().startswith("-----BEGIN"):
        path, data = Path(f"${SIGN_KEY_ENV}"), from_environment.encode()
    else:
        path = path or Path(from_environment)
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise UserError(f"cannot read the signing key {path}: {exc.strerror}") from None
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except TypeError:
        raise UserError(
            f"the signing key {path} is encrypted: give an unencrypted Ed25519 key "
            "(`openssl genpkey -algorithm ed25519 -out KEY`), kept where only the build can "
            "read it"
        ) from None
    except ValueError:
        raise UserError(
            f"{path} is not a PEM private key: make one with "
            "`openssl genpkey -algorithm ed25519 -out KEY`"
        ) from None
    if not isinstance(key, Ed25519PrivateKey):
        raise UserError(
            f"{path} is a {type(key).__name__.removeprefix('_')}, not an Ed25519 key: make one "
            "with `openssl genpkey -algorithm ed25519 -out KEY`"
        )
    return CryptoSigner(key)


def trusted_key(path: Path) -> SSlibKey:
    """The Ed25519 public key a node trusts, from PEM (`openssl pkey -pubout`)."""
    if importlib.util.find_spec("securesystemslib") is None:
        raise UserError(
            "checking signed provenance needs securesystemslib, which this environment "
            "lacks: install it from your index with `pip install 'sm120-build[provenance]'` "
            "(a node installed from node-lock.txt has it). Nothing was installed."
        )
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
    from securesystemslib.signer import SSlibKey

    try:
        data = path.read_bytes()
    except OSError as exc:
        raise UserError(f"cannot read the trusted key {path}: {exc.strerror}") from None
    try:
        key = serialization.load_pem_public_key(data)
    except ValueError:
        raise UserError(
            f"{path} is not a PEM public key: make it from the signing key with "
            "`openssl pkey -in KEY -pubout -out KEY.pub`"
        ) from None
    if not isinstance(key, Ed25519PublicKey):
        raise UserError(f"{path} is not an Ed25519 public key")
    return SSlibKey.from_crypto(key)


@dataclass(frozen=True)
class BuildRun:
    """What one build's statements share: the parameters it was asked for, what it
    resolved them to, when it started, and its signer (None: unsigned)."""

    parameters: dict[str, Any]
    started: str
    signer: CryptoSigner | None
    invocation: str


def resolved_dependencies(layout: Layout, pins: Pins) -> list[dict[str, Any]]:
    """Every input file by its sha256: each pinned upstream artifact, each patch of the
    series in order, and each companion file the wheelhouse pins."""
    found: list[dict[str, Any]] = []
    for name, upstream in sorted(pins.upstreams.items()):
        for artifact in upstream.files:
            found.append(
                {
                    "uri": f"pkg:pypi/{upstream.project}@{upstream.version}",
                    "name": artifact.file,
                    "digest": {"sha256": artifact.sha256},
                }
            )
        series = layout.patches / name / "series"
        if series.is_file():
            for line in series.read_text().splitlines():
                entry = line.split("#", 1)[0].strip()
                if entry:
                    patch = layout.patches / name / entry
                    found.append(
                        {
                            "name": str(patch.relative_to(layout.root)),
                            "digest": {"sha256": sha256_of(patch)},
                        }
                    )
    for companion in pins.companions.values():
        for digest in companion.sha256:
            found.append(
                {
                    "uri": f"pkg:pypi/{companion.name}@{companion.version}",
                    "digest": {"sha256": digest},
                }
            )
    return found


def _commit(root: Path) -> str:
    result = subprocess.run(
        ["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True
    )
    return result.stdout.strip() if result.returncode == 0 else ""


def statement(
    wheel: Path,
    run: BuildRun,
    dependencies: list[dict[str, Any]],
    tool: dict[str, str],
    finished: str,
) -> dict[str, Any]:
    return {
        "_type": STATEMENT_TYPE,
        "subject": [{"name": wheel.name, "digest": {"sha256": sha256_of(wheel)}}],
        "predicateType": PREDICATE_TYPE,
        "predicate": {
            "buildDefinition": {
                "buildType": BUILD_TYPE,
                "externalParameters": run.parameters,
                "internalParameters": {"toolkit": tool.get("toolkit", "")},
                "resolvedDependencies": dependencies,
            },
            "runDetails": {
                "builder": {
                    "id": f"urn:sm120-build:host:{socket.gethostname()}",
                    "version": {
                        "sm120-build": tool["version"],
                        "commit": tool["commit"],
                    },
                },
                "metadata": {
                    "invocationId": run.invocation,
                    "startedOn": run.started,
                    "finishedOn": finished,
                },
            },
        },
    }


def begin(parameters: dict[str, Any], sign_key: Path | None) -> BuildRun:
    """A build's provenance, started now; the key is read here, before anything runs."""
    return BuildRun(parameters, now(), signing_key(sign_key), uuid.uuid4().hex)


def write_envelopes(
    layout: Layout, pins: Pins, run: BuildRun, wheels: list[Path], tool: dict[str, str]
) -> list[Path]:
    """<wheel>.intoto.jsonl beside each wheel: its statement, signed if the run has a key."""
    from securesystemslib.dsse import Envelope

    dependencies = resolved_dependencies(layout, pins)
    tool = {**tool, "commit": _commit(layout.root)}
    finished = now()
    written = []
    for wheel in wheels:
        payload = json.dumps(
            statement(wheel, run, dependencies, tool, finished), sort_keys=True
        ).encode()
        envelope = Envelope(payload, PAYLOAD_TYPE, {})
        if run.signer is not None:
            envelope.sign(run.signer)
        path = envelope_path(wheel)
        path.write_text(json.dumps(envelope.to_dict()) + "\n")
        written.append(path)
    return written


def key_id(signer: CryptoSigner) -> str:
    return str(signer.public_key.keyid)


def signed_statement(path: Path, key: SSlibKey, label: str) -> dict[str, Any]:
    """The statement in the envelope at `path`, once it is proven to be one DSSE envelope
    of an in-toto statement of SLSA provenance with one subject, signed by `key`; UserError
    naming `label` and the reason otherwise."""
    from securesystemslib.dsse import Envelope
    from securesystemslib.exceptions import VerificationError

    if not path.is_file():
        raise UserError(f"{label}: no provenance envelope ({path.name})")
    lines = [line for line in path.read_bytes().splitlines() if line.strip()]
    if len(lines) != 1:
        raise UserError(f"{label}: {path.name} holds {len(lines)} envelopes, not one")
    try:
        envelope = Envelope.from_dict(json.loads(lines[0]))
    except (ValueError, KeyError, TypeError, AttributeError, binascii.Error):
        raise UserError(
            f"{label}: {path.name} is not a DSSE envelope (truncated, or not JSON)"
        ) from None
    if envelope.payload_type != PAYLOAD_TYPE:
        raise UserError(
            f"{label}: {path.name} carries {envelope.payload_type!r}, not an in-toto statement"
        )
    if not envelope.signatures:
        raise UserError(f"{label}: {path.name} is unsigned (the build had no --sign-key)")
    if key.keyid not in envelope.signatures:
        raise UserError(
            f"{label}: {path.name} is signed by key {', '.join(sorted(envelope.signatures))}, "
            f"not by the trusted key {key.keyid}"
        )
    try:
        envelope.verify([key], 1)
    except VerificationError:
        raise UserError(
            f"{label}: the signature of {path.name} does not verify with the trusted key: "
            "the envelope was altered after signing"
        ) from None
    try:
        found = json.loads(envelope.payload)
        subjects = found["subject"]
        types = (found["_type"], found["predicateType"])
    except (ValueError, KeyError, TypeError):
        raise UserError(f"{label}: {path.name} signs something that is not a statement") from None
    if types != (STATEMENT_TYPE, PREDICATE_TYPE):
        raise UserError(f"{label}: {path.name} is a {types[0]} of {types[1]}, not SLSA provenance")
    if not isinstance(subjects, list) or len(subjects) != 1 or not isinstance(subjects[0], dict):
        raise UserError(f"{label}: {path.name} must name exactly one subject")
    statement_found: dict[str, Any] = found
    return statement_found


def subject(statement_found: dict[str, Any]) -> tuple[str, str]:
    """The one subject's file name and sha256."""
    only = statement_found["subject"][0]
    return str(only.get("name")), str(only.get("digest", {}).get("sha256"))


def verify(wheel: Path, key: SSlibKey) -> dict[str, Any]:
    """The statement of the envelope beside `wheel`, once it is proven to be signed by
    `key` and to name this file by name and sha256; UserError naming the reason otherwise."""
    found = signed_statement(envelope_path(wheel), key, wheel.name)
    name, claimed = subject(found)
    if name != wheel.name:
        raise UserError(
            f"{wheel.name}: {envelope_path(wheel).name} is the provenance of another file "
            f"({name!r}): an envelope from another build"
        )
    actual = sha256_of(wheel)
    if claimed != actual:
        raise UserError(
            f"{wheel.name}: the signed sha256 is {claimed}, the file's is {actual}: the wheel "
            "was replaced after it was signed"
        )
    return found
