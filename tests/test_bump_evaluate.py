"""A bump's evaluation in process: the candidate fetched from where pip looks (never run),
its pin entry as it would become, its series classified on its own tree, the pins that
move with it, and its audit run on that tree."""

from __future__ import annotations

import hashlib
import io
import os
import tarfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from sm120_build.bump.candidate import Candidate, GateSummary, evaluate
from sm120_build.errors import UserError
from sm120_build.pins import Upstream
from sm120_build.pins import load as load_pins

from .conftest import HEADER

PINS = """\
[upstream.flashinfer]
project = "flashinfer-python"
version = "0.6.3"
sdist = "flashinfer_python-0.6.3.tar.gz"
sha256 = "{zero}"
git_url = ""
git_tag = "v0.6.3"
git_commit = "aaa"

[upstream.sglang]
project = "sglang"
version = "0.5.9"
sdist = "sglang-0.5.9.tar.gz"
sha256 = "{zero}"
git_url = ""
git_tag = "v0.5.9"
git_commit = "bbb"

[toolkit]
requirement = "cuda-toolkit==13.0.2"

[companions.flashinfer-cubin]
version = "0.6.3"
sha256 = ["{zero}"]
""".format(zero="0" * 64)
GATE = "def allowed(major):\n    return major in (9, 10)\n"
PATCH = (
    HEADER.format(subject="lift the gate")
    + "\n--- a/sglang/gate.py\n+++ b/sglang/gate.py\n@@ -1,2 +1,2 @@\n def allowed(major):\n"
    "-    return major in (9, 10)\n+    return major in (9, 10, 12)\n"
)


def sdist(directory: Path, name: str, files: dict[str, str]) -> Path:
    """A small sdist of `name` (e.g. sglang-0.5.10), its members under name/."""
    path = directory / f"{name}.tar.gz"
    with tarfile.open(path, "w:gz") as archive:
        for member, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(f"{name}/{member}")
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return path


@pytest.fixture
def links(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """pip's only source: a find-links directory."""
    links = tmp_path / "links"
    links.mkdir()
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_FIND_LINKS", str(links))
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    return links


@pytest.fixture
def patches(tmp_path: Path) -> Path:
    root = tmp_path / "patches"
    (root / "sglang").mkdir(parents=True)
    (root / "sglang" / "0001-lift-the-gate.patch").write_text(PATCH)
    (root / "sglang" / "series").write_text("0001-lift-the-gate.patch\n")
    (root / "flashinfer").mkdir()
    (root / "flashinfer" / "series").write_text("")
    return root


def test_a_candidate_is_evaluated_on_its_own_tree_with_its_own_metadata(
    links: Path, patches: Path, tmp_path: Path
) -> None:
    (tmp_path / "pins.toml").write_text(PINS)
    pins = load_pins(tmp_path / "pins.toml")
    candidate = sdist(
        links,
        "sglang-0.5.10",
        {
            "PKG-INFO": "Name: sglang\nVersion: 0.5.10\nRequires-Dist: flashinfer_python==0.6.3\n"
            "Requires-Dist: flashinfer_cubin==0.6.3\n",
            "sglang/gate.py": GATE,
            "sglang/_version.py": "commit_id = 'g0123abc'\n",
        },
    )
    sdist(links, "sglang-0.5.11", {"PKG-INFO": "Name: sglang\n"})  # another version: not taken
    audited: list[tuple[str, str]] = []

    def audit(tree: Path, name: str) -> GateSummary:
        audited.append(((tree / "sglang" / "gate.py").read_text(), name))
        return GateSummary(["0 gate(s) in scope still exclude SM120"], {}, [])

    scratch = tmp_path / "scratch"
    scratch.mkdir()
    pinned_sglang = {"flashinfer-python": Requirement("flashinfer_python==0.6.3")}
    (result,) = evaluate(
        pins, patches, pinned_sglang, [(pins.upstream("sglang"), "0.5.10")], scratch, audit
    )
    sha = hashlib.sha256(candidate.read_bytes()).hexdigest()
    assert result.upstream == Upstream(
        name="sglang",
        project="sglang",
        version="0.5.10",
        sdist="sglang-0.5.10.tar.gz",
        sha256=sha,
        git_url="",
        git_tag="v0.5.10",
        git_commit="0123abc",
        wheels=(),
    )
    assert [(p.patch, p.verdict, p.action) for p in result.patches] == [
        ("0001-lift-the-gate.patch", "clean", "keep")
    ]
    assert result.requires == {
        "flashinfer-python": Requirement("flashinfer_python==0.6.3"),
        "flashinfer-cubin": Requirement("flashinfer_cubin==0.6.3"),
    }
    assert result.related == [
        "git_tag v0.5.10, git_commit 0123abc",
        "sglang 0.5.10 requires flashinfer_python==0.6.3",
        "companion flashinfer-cubin (pinned 0.6.3): sglang 0.5.10 requires flashinfer_cubin==0.6.3",
    ]
    assert result.audit == GateSummary(["0 gate(s) in scope still exclude SM120"], {}, [])
    # The audit reads the candidate's tree as it came, the series applied as far as it goes.
    assert audited == [(GATE.replace("(9, 10)", "(9, 10, 12)"), "sglang")]
    assert (scratch / "sglang" / "sglang-0.5.10.tar.gz").read_bytes() == candidate.read_bytes()


def test_a_flashinfer_candidate_says_what_the_pinned_sglang_requires(
    links: Path, patches: Path, tmp_path: Path
) -> None:
    (tmp_path / "pins.toml").write_text(PINS)
    pins = load_pins(tmp_path / "pins.toml")
    sdist(
        links,
        "flashinfer_python-0.6.4",
        {"PKG-INFO": "Name: flashinfer-python\n", "flashinfer/_build_meta.py": ""},
    )
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    pinned_sglang = {
        "flashinfer-python": Requirement("flashinfer_python==0.6.3"),
        "flashinfer-cubin": Requirement("flashinfer_cubin==0.6.3"),
    }
    (result,) = evaluate(
        pins,
        patches,
        pinned_sglang,
        [(pins.upstream("flashinfer"), "0.6.4")],
        scratch,
        lambda tree, name: GateSummary([], {}, []),
    )
    assert result == Candidate(result.upstream, [], result.related, GateSummary([], {}, []), {})
    assert result.upstream.git_commit == "" and result.upstream.git_tag == "v0.6.4"
    assert result.related == [
        "git_tag v0.6.4, git_commit (not recorded)",
        "the pinned sglang 0.5.9 requires flashinfer_python==0.6.3",
        "companion flashinfer-cubin (pinned 0.6.3): sglang 0.5.9 requires flashinfer_cubin==0.6.3",
    ]


def test_a_candidate_whose_file_differs_from_the_index_s_hash_is_never_unpacked(
    tmp_path: Path, patches: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "pins.toml").write_text(PINS)
    pins = load_pins(tmp_path / "pins.toml")
    served = tmp_path / "simple" / "sglang"
    served.mkdir(parents=True)
    sdist(served, "sglang-0.5.10", {"PKG-INFO": "Name: sglang\n"})
    (served / "index.html").write_text(
        f'<a href="sglang-0.5.10.tar.gz#sha256={"f" * 64}">sglang-0.5.10.tar.gz</a>'
    )
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_INDEX_URL", (tmp_path / "simple").as_uri())
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    with pytest.raises(UserError) as refused:
        evaluate(
            pins,
            patches,
            {},
            [(pins.upstream("sglang"), "0.5.10")],
            scratch,
            lambda t, n: GateSummary([], {}, []),
        )
    assert f"the index states sha256 {'f' * 64}, the download has " in str(refused.value)
    assert str(refused.value).endswith("nothing of it was unpacked or run")
    assert not (scratch / "sglang" / "tree").exists()


def test_related_pins_say_a_companion_sglang_no_longer_requires_is_dropped(
    links: Path, patches: Path, tmp_path: Path
) -> None:
    (tmp_path / "pins.toml").write_text(PINS)
    pins = load_pins(tmp_path / "pins.toml")
    sdist(links, "sglang-0.5.10", {"PKG-INFO": "Name: sglang\n", "sglang/gate.py": GATE})
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    (result,) = evaluate(
        pins,
        patches,
        {},
        [(pins.upstream("sglang"), "0.5.10")],
        scratch,
        lambda t, n: GateSummary([], {}, []),
    )
    assert result.related == [
        "git_tag v0.5.10, git_commit (not recorded)",
        "companion flashinfer-cubin (pinned 0.6.3): sglang 0.5.10 requires none, so --write "
        "drops the pin",
    ]
    assert [p.verdict for p in result.patches] == ["clean"]
