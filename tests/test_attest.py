"""Signed build provenance (attest.py, node/provenance.py): envelopes written per wheel,
signed with an Ed25519 key in PEM, and every way a node must refuse one, each with its own
message and nothing installed."""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from sm120_build import attest
from sm120_build.cache import sha256_of
from sm120_build.errors import UserError
from sm120_build.layout import Layout
from sm120_build.node.provenance import check_lock, verified_wheels
from sm120_build.pins import load as load_pins
from sm120_build.static_index import LOCKS
from sm120_build.wheels import assemble_wheelhouse, requirement_lines

from .conftest import REPO, ed25519_key_pair, small_wheel


@pytest.fixture
def signed(tmp_path: Path) -> dict[str, Any]:
    """A project (this repo's pins and patches) whose wheelhouse holds two wheels named as
    ours, with envelopes signed by a fresh key; another key beside it."""
    root = tmp_path / "project"
    root.mkdir()
    shutil.copy(REPO / "pins.toml", root)
    shutil.copytree(REPO / "patches", root / "patches")
    (tmp_path / "keys").mkdir()
    (tmp_path / "other").mkdir()
    private, public = ed25519_key_pair(tmp_path / "keys")
    _, other_public = ed25519_key_pair(tmp_path / "other")
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    wheels = [
        small_wheel(scratch, "flashinfer_python", "0.6.3+sm120.p1"),
        small_wheel(scratch, "sglang", "0.5.9+sm120.p2"),
    ]
    layout = Layout(root=root, cache=tmp_path / "cache")
    run = attest.begin({"stack": "sglang-0.5.9", "profile": "comm"}, private)
    envelopes = attest.write_envelopes(
        layout, load_pins(root / "pins.toml"), run, wheels, {"version": "0.1.0", "toolkit": "x"}
    )
    assemble_wheelhouse(wheels, [], [], root / "wheelhouse", envelopes)
    return {
        "root": root,
        "wheelhouse": root / "wheelhouse",
        "public": public,
        "other": other_public,
        "private": private,
    }


def wheel(signed: dict[str, Any], project: str) -> Path:
    wheelhouse: Path = signed["wheelhouse"]
    (found,) = wheelhouse.glob(f"{project}-*.whl")
    return found


def payload(envelope: Path) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(
        base64.b64decode(json.loads(envelope.read_text())["payload"])
    )
    return loaded


def test_the_statement_is_slsa_provenance_of_the_wheel_with_every_input(
    signed: dict[str, Any],
) -> None:
    python = wheel(signed, "flashinfer_python")
    statement = payload(attest.envelope_path(python))
    assert statement["_type"] == "https://in-toto.io/Statement/v1"
    assert statement["predicateType"] == "https://slsa.dev/provenance/v1"
    assert statement["subject"] == [{"name": python.name, "digest": {"sha256": sha256_of(python)}}]
    definition = statement["predicate"]["buildDefinition"]
    assert definition["externalParameters"] == {"stack": "sglang-0.5.9", "profile": "comm"}
    dependencies = definition["resolvedDependencies"]
    pins = load_pins(REPO / "pins.toml")
    flashinfer = pins.upstream("flashinfer")
    assert {
        "uri": f"pkg:pypi/flashinfer-python@{flashinfer.version}",
        "name": flashinfer.sdist,
        "digest": {"sha256": flashinfer.sha256},
    } in dependencies
    first_patch = sorted((REPO / "patches" / "flashinfer").glob("0001-*.patch"))[0]
    assert {
        "name": f"patches/flashinfer/{first_patch.name}",
        "digest": {"sha256": sha256_of(first_patch)},
    } in dependencies
    cubin = pins.companions["flashinfer-cubin"]
    assert {
        "uri": f"pkg:pypi/flashinfer-cubin@{cubin.version}",
        "digest": {"sha256": cubin.sha256[0]},
    } in dependencies
    details = statement["predicate"]["runDetails"]
    assert details["metadata"]["startedOn"] <= details["metadata"]["finishedOn"]
    assert details["builder"]["version"]["sm120-build"] == "0.1.0"


def test_a_signed_wheelhouse_verifies(signed: dict[str, Any]) -> None:
    statements = verified_wheels(signed["wheelhouse"], signed["public"])
    assert sorted(p.name for p in statements) == sorted(
        p.name for p in signed["wheelhouse"].glob("*.whl")
    )


def refusal(signed: dict[str, Any], key: str = "public") -> str:
    with pytest.raises(UserError) as raised:
        verified_wheels(signed["wheelhouse"], signed[key])
    return str(raised.value)


def test_a_wheel_swapped_after_signing_is_refused(signed: dict[str, Any]) -> None:
    python = wheel(signed, "flashinfer_python")
    replacement = small_wheel(signed["root"], "flashinfer_python", "0.6.3+sm120.p1", "x = 1\n")
    shutil.move(replacement, python)
    message = refusal(signed)
    assert f"{python.name}: the signed sha256 is " in message
    assert "the wheel was replaced after it was signed" in message
    assert "nothing was installed" in message


def test_an_envelope_from_another_build_is_refused(signed: dict[str, Any]) -> None:
    python, sglang = wheel(signed, "flashinfer_python"), wheel(signed, "sglang")
    shutil.copy(attest.envelope_path(sglang), attest.envelope_path(python))
    assert f"is the provenance of another file ({sglang.name!r})" in refusal(signed)


@pytest.mark.parametrize("damage", ["truncated", "not json", "empty"])
def test_a_damaged_envelope_is_refused(signed: dict[str, Any], damage: str) -> None:
    envelope = attest.envelope_path(wheel(signed, "sglang"))
    text = envelope.read_text()
    envelope.write_text(
        {"truncated": text[: len(text) // 2], "not json": "not an envelope\n", "empty": ""}[damage]
    )
    message = refusal(signed)
    if damage == "empty":
        assert "holds 0 envelopes, not one" in message
    else:
        assert "is not a DSSE envelope (truncated, or not JSON)" in message


def test_a_missing_envelope_is_refused(signed: dict[str, Any]) -> None:
    sglang = wheel(signed, "sglang")
    attest.envelope_path(sglang).unlink()
    assert f"{sglang.name}: no provenance envelope ({sglang.name}.intoto.jsonl)" in refusal(signed)


def test_a_signature_by_another_key_is_refused(signed: dict[str, Any]) -> None:
    message = refusal(signed, key="other")
    assert "is signed by key " in message and "not by the trusted key " in message


def test_an_unsigned_envelope_is_refused(signed: dict[str, Any], tmp_path: Path) -> None:
    sglang = wheel(signed, "sglang")
    data = json.loads(attest.envelope_path(sglang).read_text())
    data["signatures"] = []
    attest.envelope_path(sglang).write_text(json.dumps(data))
    assert "is unsigned (the build had no --sign-key)" in refusal(signed)


def test_an_altered_statement_fails_its_signature(signed: dict[str, Any]) -> None:
    """The subject rewritten to the file's new digest, the signature kept: it no longer
    verifies, so a swap cannot be hidden by editing the envelope."""
    python = wheel(signed, "flashinfer_python")
    shutil.move(small_wheel(signed["root"], "flashinfer_python", "0.6.3+sm120.p1", "y=2\n"), python)
    envelope = attest.envelope_path(python)
    data = json.loads(envelope.read_text())
    statement = json.loads(base64.b64decode(data["payload"]))
    statement["subject"][0]["digest"]["sha256"] = sha256_of(python)
    data["payload"] = base64.b64encode(json.dumps(statement).encode()).decode()
    envelope.write_text(json.dumps(data))
    assert "does not verify with the trusted key: the envelope was altered" in refusal(signed)


def test_without_a_key_the_envelopes_say_they_are_unsigned(tmp_path: Path) -> None:
    root = tmp_path / "project"
    root.mkdir()
    shutil.copy(REPO / "pins.toml", root)
    made = small_wheel(tmp_path, "sglang", "0.5.9+sm120.p2")
    run = attest.begin({}, None)
    (envelope,) = attest.write_envelopes(
        Layout(root=root, cache=tmp_path / "c"),
        load_pins(root / "pins.toml"),
        run,
        [made],
        {"version": "0", "toolkit": ""},
    )
    assert json.loads(envelope.read_text())["signatures"] == []


@pytest.mark.parametrize("kind", ["missing", "garbage", "rsa", "encrypted"])
def test_a_signing_key_that_is_not_an_ed25519_pem_is_refused(tmp_path: Path, kind: str) -> None:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed25519, rsa

    key = tmp_path / "key.pem"
    if kind == "garbage":
        key.write_text("not a key\n")
    elif kind == "rsa":
        key.write_bytes(
            rsa.generate_private_key(public_exponent=65537, key_size=2048).private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
    elif kind == "encrypted":
        key.write_bytes(
            ed25519.Ed25519PrivateKey.generate().private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.BestAvailableEncryption(b"secret"),
            )
        )
    expected = {
        "missing": "cannot read the signing key",
        "garbage": "is not a PEM private key",
        "rsa": "not an Ed25519 key",
        "encrypted": "is encrypted",
    }[kind]
    with pytest.raises(UserError, match=expected):
        attest.begin({}, key)


def test_a_key_made_by_openssl_signs_and_verifies(tmp_path: Path) -> None:
    """The security team's own tools: `openssl genpkey -algorithm ed25519` and
    `openssl pkey -pubout`, with nothing of ours in between."""
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("openssl is not installed")
    private, public = tmp_path / "k.pem", tmp_path / "k.pub"
    subprocess.run([openssl, "genpkey", "-algorithm", "ed25519", "-out", str(private)], check=True)
    subprocess.run(
        [openssl, "pkey", "-in", str(private), "-pubout", "-out", str(public)], check=True
    )
    root = tmp_path / "project"
    root.mkdir()
    shutil.copy(REPO / "pins.toml", root)
    made = small_wheel(tmp_path, "sglang", "0.5.9+sm120.p2")
    attest.write_envelopes(
        Layout(root=root, cache=tmp_path / "c"),
        load_pins(root / "pins.toml"),
        attest.begin({}, private),
        [made],
        {"version": "0", "toolkit": ""},
    )
    assert attest.verify(made, attest.trusted_key(public))["subject"][0]["name"] == made.name


def test_the_lock_must_pin_the_verified_files_and_signed_companions(
    signed: dict[str, Any],
) -> None:
    statements = verified_wheels(signed["wheelhouse"], signed["public"])
    wheels = sorted(signed["wheelhouse"].glob("*.whl"))
    cubin = load_pins(REPO / "pins.toml").companions["flashinfer-cubin"]
    lock = signed["root"] / "node-lock.txt"
    lock.write_text(requirement_lines(wheels, [cubin]))
    check_lock(lock, statements)  # as the build wrote it
    other = "f" * 64
    lock.write_text(requirement_lines(wheels, [cubin]).replace(cubin.sha256[0], other))
    with pytest.raises(
        UserError,
        match=f"pins flashinfer-cubin by a sha256 no signed statement records \\({other}\\)",
    ):
        check_lock(lock, statements)
    python = wheel(signed, "flashinfer_python")
    lock.write_text(requirement_lines(wheels, [cubin]).replace(sha256_of(python), other))
    with pytest.raises(UserError, match=f"pins flashinfer-python by {other}, not by the verified"):
        check_lock(lock, statements)


def test_verify_provenance_on_the_command_line(signed: dict[str, Any]) -> None:
    command = [
        sys.executable,
        "-m",
        "sm120_build.node.provenance",
        str(signed["wheelhouse"]),
        "--trust-key",
        str(signed["public"]),
        "--lock",
        str(signed["wheelhouse"] / "requirements.txt"),
    ]
    ok = subprocess.run(command, capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.count("verified: ") == 2
    command[command.index("--trust-key") + 1] = str(signed["other"])
    refused = subprocess.run(command, capture_output=True, text=True)
    assert refused.returncode == 1
    assert "not by the trusted key" in refused.stderr


def test_install_verifies_before_anything_is_installed(signed: dict[str, Any]) -> None:
    """--install DIR --trust-key: a refused wheel stops the install before pip runs."""
    from sm120_build.node.install import install_checked

    python = wheel(signed, "flashinfer_python")
    shutil.move(small_wheel(signed["root"], "flashinfer_python", "0.6.3+sm120.p1", "z=3\n"), python)
    sums = signed["wheelhouse"] / "SHA256SUMS"
    sums.write_text(
        "".join(f"{sha256_of(p)}  {p.name}\n" for p in sorted(signed["wheelhouse"].glob("*.whl")))
    )
    with pytest.raises(UserError, match="replaced after it was signed"):
        install_checked(signed["wheelhouse"], ("flashinfer-python",), signed["public"])
    import importlib.metadata

    assert not [
        d for d in importlib.metadata.distributions() if d.metadata["Name"] == "flashinfer_python"
    ]


def test_the_static_tree_holds_the_envelopes_beside_the_wheels_and_for_nodes(
    signed: dict[str, Any], tmp_path: Path
) -> None:
    from sm120_build.publish import write_static_index

    static = tmp_path / "static"
    lock_dir = write_static_index(signed["wheelhouse"], static)
    for made in signed["wheelhouse"].glob("*.whl"):
        envelope = attest.envelope_path(made)
        assert (static / "packages" / envelope.name).read_bytes() == envelope.read_bytes()
        assert (lock_dir / envelope.name).read_bytes() == envelope.read_bytes()
    assert (lock_dir / "SHA256SUMS").is_file() and lock_dir.parent.name == LOCKS
    # The same wheels signed again (another run, another time): the envelopes there stay.
    wheels = sorted(signed["wheelhouse"].glob("*.whl"))
    again = attest.write_envelopes(
        Layout(root=signed["root"], cache=tmp_path / "c"),
        load_pins(signed["root"] / "pins.toml"),
        attest.begin({"stack": "x"}, signed["private"]),
        wheels,
        {"version": "0.1.0", "toolkit": "x"},
    )
    before = {p.name: p.read_bytes() for p in (static / "packages").glob("*.intoto.jsonl")}
    write_static_index(signed["wheelhouse"], static)
    assert before == {p.name: p.read_bytes() for p in (static / "packages").glob("*.intoto.jsonl")}
    # One naming other bytes under a wheel's name is refused, and nothing is written.
    sglang = wheel(signed, "sglang")
    attest.envelope_path(sglang).write_bytes(again[0].read_bytes())
    with pytest.raises(UserError, match="attests other content"):
        write_static_index(signed["wheelhouse"], static)


def test_what_was_verified_at_install_is_reported_later(
    signed: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--install DIR --trust-key` keeps the verified envelopes in the environment; a later
    `sm120-node-check --trust-key` re-verifies them against the installed versions."""
    from sm120_build.node.provenance import installed_provenance, keep, store

    monkeypatch.setattr(sys, "prefix", str(tmp_path / "env"))
    statements = verified_wheels(signed["wheelhouse"], signed["public"])
    keep(statements)
    assert sorted(p.name for p in store().iterdir()) == sorted(
        attest.envelope_path(w).name for w in statements
    )
    versions = {"flashinfer-python": "0.6.3+sm120.p1", "sglang": "0.5.9+sm120.p2"}
    report = installed_provenance(signed["public"], versions)
    assert all(line.startswith("verified at install: ") for line in report.values()), report
    other_version = installed_provenance(signed["public"], {"sglang": "0.5.9+sm120.p9"})
    assert other_version["sglang"].startswith("no verified envelope")
    other_key = installed_provenance(signed["other"], versions)
    assert all(line.startswith("NOT VERIFIED: ") for line in other_key.values()), other_key


def test_the_environment_gives_the_key_as_a_path_or_as_pem(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SM120_SIGN_KEY: a path, or the PEM itself (a CI secret); empty means unsigned."""
    private, public = ed25519_key_pair(tmp_path)
    expected = attest.trusted_key(public).keyid
    for value in (str(private), private.read_text()):
        monkeypatch.setenv("SM120_SIGN_KEY", value)
        signer = attest.begin({}, None).signer
        assert signer is not None and attest.key_id(signer) == expected
    monkeypatch.setenv("SM120_SIGN_KEY", "")
    assert attest.begin({}, None).signer is None
    monkeypatch.setenv("SM120_SIGN_KEY", "-----BEGIN PRIVATE KEY-----\nnot base64\n")
    with pytest.raises(UserError, match=r"\$SM120_SIGN_KEY is not a PEM private key"):
        attest.begin({}, None)
