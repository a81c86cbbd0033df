"""Integration: `bump` on real releases, checked by hand against upstream (docs/bumps.md)."""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.slow


def snapshot(root: Path) -> dict[str, str]:
    """sha256 of every file bump must leave alone: pins.toml, patches/, vendor/ (no .git)."""
    paths = [root / "pins.toml", *(root / "patches").rglob("*")]
    paths += [p for p in (root / "vendor").rglob("*") if ".git" not in p.parts]
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in paths
        if p.is_file()
    }


def bump(root: Path, *candidates: str) -> tuple[int, dict[str, Any]]:
    """The exit status and the JSON report of `nox -s bump -- CANDIDATES`."""
    out = root / "bump.json"
    result = subprocess.run(
        [sys.executable, "-m", "sm120_build", "bump", *candidates, "--json", str(out)],
        cwd=root,
        env=dict(os.environ, SM120_CACHE_DIR=str(root / ".cache")),
        capture_output=True,
        text=True,
    )
    assert out.is_file(), result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["exit_status"] == result.returncode, result.stderr[-3000:]
    return result.returncode, report


def by_patch(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {p["patch"][:4]: p for p in report["patches"]}


def test_flashinfer_0_6_4(vendored_project: Path) -> None:
    before = snapshot(vendored_project)
    status, whole = bump(vendored_project, "flashinfer-python==0.6.4")
    assert snapshot(vendored_project) == before
    # The pinned sglang 0.5.9 requires flashinfer_python==0.6.3, read from its own sdist
    # (a fresh clone has no vendor/sglang to read): this pin set cannot be written.
    assert status == 2 and "sglang 0.5.9 requires flashinfer_python==0.6.3" in whole["verdict"]
    (report,) = whole["candidates"]
    patches = by_patch(report)
    # 0.6.4 carries PR 2557, which rewrote the FP4 launcher 0005 fixes: the lines 0005
    # removes are gone and the lines it adds are not there, so it is no proof of "upstream in
    # another form" but a conflict to refresh by hand, said to be a rewrite.
    assert (patches["0005"]["verdict"], patches["0005"]["action"]) == ("conflict", "refresh")
    (rewritten,) = patches["0005"]["hunks"]
    assert "the code was rewritten" in rewritten["detail"]
    # 0004's cluster clamp is not upstream until 0.6.17, but PR 2557 rewrote the FP4 block
    # two of its hunks edit or follow: named, to refresh.
    assert patches["0004"]["action"] == "refresh"
    fusion = "include/flashinfer/comm/trtllm_allreduce_fusion.cuh"
    failing = [(h["file"], h["hunk"]) for h in patches["0004"]["hunks"] if h["verdict"] != "clean"]
    assert (fusion, "@@ -1435,17 +1433,17 @@") in failing
    assert {patches[n]["verdict"] for n in ("0001", "0002", "0003", "0007")} == {"clean"}
    # The cubin follows what the chosen sglang requires, and the pinned 0.5.9 holds it at 0.6.3.
    assert (
        "companion flashinfer-cubin (pinned 0.6.3): sglang 0.5.9 requires flashinfer_cubin==0.6.3"
        in report["related"]
    )


def sglang_without_communicator(root: Path, links: Path, version: str) -> None:
    """The pinned sglang sdist re-released as `version` with layers/communicator.py gone,
    as upstream did by 0.5.23 (whose sdist the index does not carry)."""
    (pinned,) = (root / ".cache" / "sdists").glob("*/sglang-0.5.9.tar.gz")
    old_top, new_top = "sglang-0.5.9/", f"sglang-{version}/"
    links.mkdir()
    with (
        tarfile.open(pinned) as source,
        tarfile.open(links / f"sglang-{version}.tar.gz", "w:gz") as target,
    ):
        for member in source.getmembers():
            if member.name == old_top + "sglang/srt/layers/communicator.py":
                continue
            data = source.extractfile(member) if member.isfile() else None
            path = member.name + ("/" if member.isdir() else "")
            assert path.startswith(old_top), member.name
            member.name = (new_top + path.removeprefix(old_top)).rstrip("/")
            member.pax_headers = {k: v for k, v in member.pax_headers.items() if k != "path"}
            if member.name == new_top + "PKG-INFO" and data is not None:
                text = data.read().decode().replace("Version: 0.5.9\n", f"Version: {version}\n", 1)
                assert f"Version: {version}" in text
                data = io.BytesIO(text.encode())
                member.size = len(text.encode())
            target.addfile(member, data)


def test_a_candidate_whose_scoped_files_moved_is_reported(
    vendored_project: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    links = tmp_path / "links"
    sglang_without_communicator(vendored_project, links, "0.5.9.post99")
    monkeypatch.setenv("PIP_FIND_LINKS", str(links))
    status, whole = bump(vendored_project, "sglang==0.5.9.post99")
    assert status == 1  # coherent pins, but the audit cannot vouch for a missing file
    (report,) = whole["candidates"]
    assert report["upstream"]["version"] == "0.5.9.post99"
    assert "sglang/sglang/srt/layers/communicator.py" in report["audit"]["missing_scope"]
    assert any("MISSING" in line for line in report["audit"]["lines"])
