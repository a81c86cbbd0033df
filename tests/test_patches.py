import os
import shutil
import subprocess
from pathlib import Path

import pytest

from sm120_build.errors import UserError
from sm120_build.patches import dep3_problems, load_series, parse_dep3, series_names

from .conftest import REPO, make_patch, write_series


def test_header_without_required_fields_is_rejected(tmp_path: Path) -> None:
    patch = tmp_path / "0001-x.patch"
    patch.write_text(
        "Subject: fix it\n\ndiff --git a/f b/f\n--- a/f\n+++ b/f\n@@ -1 +1 @@\n-a\n+b\n"
    )
    write_series(tmp_path, patch)
    with pytest.raises(UserError) as caught:
        load_series(tmp_path)
    assert "Origin or Author" in str(caught.value)
    assert "Forwarded" in str(caught.value)
    assert "0001-x.patch" in str(caught.value)


def test_continuation_lines_fold_into_their_field() -> None:
    fields = parse_dep3("Description: short\n long text\n more\nOrigin: upstream\nForwarded: no\n")
    assert fields["Description"] == "short\nlong text\nmore"
    assert dep3_problems("Description: x\nOrigin: y\nForwarded: no\n") == []


def test_series_naming_a_missing_file_is_rejected(tmp_path: Path) -> None:
    (tmp_path / "series").write_text("# comment\n\n0001-gone.patch\n")
    with pytest.raises(UserError, match=r"names 0001-gone.patch, which does not exist"):
        load_series(tmp_path)


def test_series_options_other_than_p1_are_rejected(tmp_path: Path) -> None:
    (tmp_path / "series").write_text("0001-a.patch -p0\n")
    with pytest.raises(UserError, match=r"only '-p1'"):
        series_names(tmp_path)


def test_series_comments_and_p1_are_accepted(tmp_path: Path) -> None:
    make_patch(tmp_path / "0001-a.patch", "f", ["a"], 0, "b", "change a")
    (tmp_path / "series").write_text("# the series\n0001-a.patch -p1  # trailing comment\n")
    assert [p.path.name for p in load_series(tmp_path)] == ["0001-a.patch"]


@pytest.mark.parametrize("name", ["flashinfer", "sglang"])
def test_every_committed_patch_has_a_valid_dep3_header(name: str) -> None:
    patches = load_series(REPO / "patches" / name)
    assert patches
    for patch in patches:
        fields = patch.fields
        assert fields.get("Description") or fields.get("Subject"), patch.path
        assert fields.get("Forwarded"), patch.path


def test_patches_fixed_upstream_say_where() -> None:
    """Patches whose fix upstream later shipped name the release in Applied-Upstream."""
    applied = {
        p.path.name: p.fields.get("Applied-Upstream", "")
        for p in load_series(REPO / "patches" / "flashinfer")
    }
    expected = {
        "0001": "0.6.17",
        "0002": "0.6.17",
        "0003": "0.6.17",
        "0004": "0.6.17",
        "0005": "0.6.4",
    }
    for prefix, version in expected.items():
        (name,) = [n for n in applied if n.startswith(prefix)]
        assert applied[name].startswith(version), name


@pytest.mark.skipif(
    shutil.which("quilt") is None,
    reason="needs quilt (Debian's package `quilt`; .ci/run installs it)",
)
def test_quilt_needs_fuzz_0_to_refuse_what_git_apply_refuses(tmp_path: Path) -> None:
    """quilt's default fuzz (2) applies a patch whose context drifted; `--fuzz=0`, which
    README gives, refuses it exactly as `git apply` (and so `nox -s vendor`) does."""
    lines = [f"line {n}" for n in range(1, 21)]
    series = tmp_path / "patches"
    series.mkdir()
    make_patch(series / "0001-a.patch", "f.txt", lines, 9, "LINE 10", "change line 10")
    write_series(series, series / "0001-a.patch")
    drifted = list(lines)
    drifted[6] = "line 7, edited upstream"  # the hunk's first context line
    env = dict(os.environ, QUILT_PATCHES=str(series), QUILTRC="/dev/null")
    outcomes = {}
    for options in ([], ["--fuzz=0"]):
        tree = tmp_path / f"tree{len(options)}"
        tree.mkdir()
        (tree / "f.txt").write_text("\n".join(drifted) + "\n")
        result = subprocess.run(
            ["quilt", "push", "-a", *options], cwd=tree, env=env, capture_output=True, text=True
        )
        outcomes[tuple(options)] = result.returncode
    assert outcomes == {(): 0, ("--fuzz=0",): 1}
