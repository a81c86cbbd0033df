"""A bump's evaluation in process: the candidate fetched from where pip looks (never run),
its pin entry as it would become, its series classified on its own tree, the pins that
move with it, and its audit run on that tree."""

from __future__ import annotations

import hashlib
import io
import os
import tarfile
from dataclasses import replace
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from sm120_build.bump.candidate import Candidate, GateSummary, evaluate
from sm120_build.errors import UserError
from sm120_build.pins import Artifact, Pins, Upstream
from sm120_build.pins import load as load_pins

from .conftest import HEADER, sglang_wheel, wheel_in

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
def pins(tmp_path: Path) -> Pins:
    (tmp_path / "pins.toml").write_text(PINS)
    return load_pins(tmp_path / "pins.toml")


@pytest.fixture
def scratch(tmp_path: Path) -> Path:
    """Where evaluate fetches and unpacks each candidate."""
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    return scratch


def no_gates(tree: Path, name: str) -> GateSummary:
    """An audit that finds no gate."""
    return GateSummary([], {}, [])


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
    links: Path, patches: Path, pins: Pins, scratch: Path
) -> None:
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
    links: Path, patches: Path, pins: Pins, scratch: Path
) -> None:
    sdist(
        links,
        "flashinfer_python-0.6.4",
        {"PKG-INFO": "Name: flashinfer-python\n", "flashinfer/_build_meta.py": ""},
    )
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
        no_gates,
    )
    assert result == Candidate(result.upstream, [], result.related, GateSummary([], {}, []), {})
    assert result.upstream.git_commit == "" and result.upstream.git_tag == "v0.6.4"
    assert result.related == [
        "git_tag v0.6.4, git_commit (not recorded)",
        "the pinned sglang 0.5.9 requires flashinfer_python==0.6.3",
        "companion flashinfer-cubin (pinned 0.6.3): sglang 0.5.9 requires flashinfer_cubin==0.6.3",
    ]


def test_a_candidate_whose_file_differs_from_the_index_s_hash_is_never_unpacked(
    tmp_path: Path, patches: Path, monkeypatch: pytest.MonkeyPatch, pins: Pins, scratch: Path
) -> None:
    served = tmp_path / "simple" / "sglang"
    served.mkdir(parents=True)
    sdist(served, "sglang-0.5.10", {"PKG-INFO": "Name: sglang\n"})
    (served / "index.html").write_text(
        f'<a href="sglang-0.5.10.tar.gz#sha256={"f" * 64}">sglang-0.5.10.tar.gz</a>'
    )
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_INDEX_URL", (tmp_path / "simple").as_uri())
    with pytest.raises(UserError) as refused:
        evaluate(
            pins,
            patches,
            {},
            [(pins.upstream("sglang"), "0.5.10")],
            scratch,
            no_gates,
        )
    assert f"the index states sha256 {'f' * 64}, the download has " in str(refused.value)
    assert str(refused.value).endswith("nothing of it was unpacked or run")
    assert not (scratch / "sglang" / "tree").exists()


def test_related_pins_say_a_companion_sglang_no_longer_requires_is_dropped(
    links: Path, patches: Path, pins: Pins, scratch: Path
) -> None:
    sdist(links, "sglang-0.5.10", {"PKG-INFO": "Name: sglang\n", "sglang/gate.py": GATE})
    (result,) = evaluate(
        pins,
        patches,
        {},
        [(pins.upstream("sglang"), "0.5.10")],
        scratch,
        no_gates,
    )
    assert result.related == [
        "git_tag v0.5.10, git_commit (not recorded)",
        "companion flashinfer-cubin (pinned 0.6.3): sglang 0.5.10 requires none, so --write "
        "drops the pin",
    ]
    assert [p.verdict for p in result.patches] == ["clean"]


def test_a_wheel_only_candidate_pins_one_wheel_per_target_and_reads_the_first_s_metadata(
    links: Path, patches: Path, pins: Pins, scratch: Path
) -> None:
    pinned = replace(
        pins.upstream("sglang"),
        sdist="",
        sha256="",
        wheels=(
            Artifact("sglang-0.5.9-cp312-cp312-manylinux_2_34_x86_64.whl", "0" * 64),
            Artifact("sglang-0.5.9-cp312-cp312-manylinux_2_34_aarch64.whl", "0" * 64),
        ),
    )
    requires = b"Requires-Dist: flashinfer_python==0.7.2\nDescription: caf\xe9\n"
    gate = {"sglang/gate.py": GATE.encode()}
    x86 = sglang_wheel(links, "0.5.23", "cp312-cp312-manylinux_2_34_x86_64", requires, gate)
    arm = sglang_wheel(links, "0.5.23", "cp312-cp312-manylinux_2_34_aarch64", files=gate)
    sglang_wheel(links, "0.5.23", "cp311-cp311-manylinux_2_34_x86_64")  # no pinned target
    (result,) = evaluate(pins, patches, {}, [(pinned, "0.5.23")], scratch, no_gates)
    assert result.upstream == replace(
        pinned,
        version="0.5.23",
        git_tag="v0.5.23",
        git_commit="",
        wheels=tuple(
            Artifact(wheel.name, hashlib.sha256(wheel.read_bytes()).hexdigest())
            for wheel in (x86, arm)
        ),
    )
    assert result.requires == {"flashinfer-python": Requirement("flashinfer_python==0.7.2")}
    assert [p.verdict for p in result.patches] == ["clean"]  # vendored from the first wheel


def test_an_sdist_candidate_is_taken_as_tar_gz_before_zip(
    links: Path, patches: Path, pins: Pins, scratch: Path
) -> None:
    from sm120_build.bump.candidate import fetch_candidate

    (links / "sglang-0.5.10.zip").write_bytes(b"a zip sdist")
    (links / "sglang-0.5.10-not-a-file-name.whl").write_bytes(b"")  # skipped, not the end
    sdist(links, "sglang-0.5.10", {"PKG-INFO": "Name: sglang\n"})
    assert [p.name for p in fetch_candidate(pins.upstream("sglang"), "0.5.10", scratch)] == [
        "sglang-0.5.10.tar.gz"
    ]


def test_a_wheel_s_target_is_its_python_abi_and_cpu() -> None:
    from sm120_build.bump.candidate import _target

    assert _target("sglang-1-cp312-cp312-manylinux_2_34_aarch64.whl") == (
        "cp312",
        "cp312",
        "aarch64",
    )
    assert _target("x-1-py3-none-any.whl") == ("py3", "none", "any")
    assert _target("x-1-cp312-cp312-linux_riscv64.whl") == ("cp312", "cp312", "linux_riscv64")


def test_requirements_are_read_past_a_bad_line_and_a_url_is_kept_whole(tmp_path: Path) -> None:
    from sm120_build.bump.candidate import sdist_requires

    path = sdist(
        tmp_path,
        "sglang-0.5.10",
        {
            "docs/PKG-INFO": "Requires-Dist: wrong==1\n",  # not the top-level one
            "README": "Requires-Dist: wrong==2\n",
            "PKG-INFO": "Name: sglang\nRequires-Dist: not a requirement ((\n"
            "Requires-Dist: kernel @ https://files.example/kernel-1.0.whl\n"
            "Requires-Dist: Torch==2.9.1\n",
        },
    )
    assert sdist_requires(path) == {
        "kernel": Requirement("kernel @ https://files.example/kernel-1.0.whl"),
        "torch": Requirement("Torch==2.9.1"),
    }


def test_the_git_commit_of_a_monorepo_sglang_is_read_from_python_sglang(tmp_path: Path) -> None:
    from sm120_build.bump.candidate import _git_commit

    (tmp_path / "python" / "sglang").mkdir(parents=True)
    (tmp_path / "python" / "sglang" / "_version.py").write_text(
        "commit_id: str | None = 'g5a7b9c1'\n"
    )
    assert _git_commit(tmp_path) == "5a7b9c1"


def test_the_versions_the_index_has_are_read_from_pip(links: Path) -> None:
    from sm120_build.bump.candidate import _index_versions

    for version in ("0.6.4", "0.6.5"):
        wheel_in(links, "flashinfer_cubin", version)
    assert _index_versions("flashinfer-cubin") == ["0.6.5", "0.6.4"]
    assert _index_versions("absent-project") == []


def test_with_sglang_moving_too_a_flashinfer_candidate_leaves_the_companions_to_it(
    pins: Pins,
) -> None:
    from sm120_build.bump.candidate import related_pins

    flashinfer = replace(pins.upstream("flashinfer"), version="0.7.2", git_tag="v0.7.2")
    pinned = {"flashinfer-python": Requirement("flashinfer_python==0.6.3")}
    others = {"sglang": pins.upstream("sglang"), "flashinfer": flashinfer}
    assert related_pins(flashinfer, {}, pins, others, pinned) == ["git_tag v0.7.2, git_commit aaa"]


def test_a_prerelease_flashinfer_meets_a_range_that_admits_it(pins: Pins) -> None:
    from sm120_build.bump.candidate import pin_set_problems

    flashinfer = Candidate(replace(pins.upstream("flashinfer"), version="0.7.0rc1"))
    wants_range = {"flashinfer-python": Requirement("flashinfer_python>=0.6")}
    assert pin_set_problems([flashinfer], pins, wants_range) == []
    sglang = Candidate(
        replace(pins.upstream("sglang"), version="0.5.10"),
        requires={"flashinfer-python": Requirement("flashinfer_python>=0.8")},
    )
    (problem,) = pin_set_problems([sglang], pins, {})
    assert problem == (
        "sglang 0.5.10 requires flashinfer_python>=0.8, which flashinfer-python 0.6.3 does "
        "not meet; ask for: flashinfer_python>=0.8"
    )
