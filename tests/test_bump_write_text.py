"""What `bump --write` makes of pins.toml and a series file, text for text: the keys it
sets, moves and drops, the companion tables it updates or removes with their comments, and
the series lines it rewrites. Through write() itself: tests/test_bump_write.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from sm120_build.bump.candidate import Candidate
from sm120_build.bump.classify import PatchVerdict
from sm120_build.bump.write import _pins_text, _series_text, _set_key, _toml_value
from sm120_build.errors import UserError
from sm120_build.pins import Artifact, Upstream

from .conftest import refusal

SDIST_PINS = """\
# The pinned upstream inputs.

[upstream.sglang]
project = "sglang"
version = "1.0"
sdist = "sglang-1.0.tar.gz"
sha256 = "aaaa"
git_url = ""
git_commit = "abc"

# The toolkit.
[toolkit]
requirement = "cuda-toolkit==13.0.2"

# The cubins FlashInfer loads at run time,
# installed beside our wheels.
[companions.flashinfer-cubin]
version = "0.6.3"
sha256 = ["1111"]

# Kept as it is.
[companions.other]
version = "2.0"
sha256 = ["2222"]
"""


def upstream(**changes: object) -> Upstream:
    fields: dict[str, object] = {
        "name": "sglang",
        "project": "sglang",
        "version": "1.1",
        "sdist": "sglang-1.1.tar.gz",
        "sha256": "bbbb",
        "git_url": "",
        "git_tag": "v1.1",
        "git_commit": "def",
    }
    fields.update(changes)
    return Upstream(**fields)  # type: ignore[arg-type]


def test_toml_values_inline_and_over_lines() -> None:
    assert _toml_value('a "quoted" \\ path') == '"a \\"quoted\\" \\\\ path"'
    assert _toml_value([]) == "[]"
    assert _toml_value(["x", "y"]) == '[\n  "x",\n  "y",\n]'
    assert _toml_value([{"file": "a.whl", "sha256": "cc"}]) == (
        '[\n  { file = "a.whl", sha256 = "cc" },\n]'
    )


def test_a_key_is_replaced_in_place_once_or_added_after_the_last_key() -> None:
    block = 'a = "1"\nb = [\n  "x",\n]\n# a comment that introduces the next table\n'
    assert _set_key(block, "b", ["y"]) == (
        'a = "1"\nb = [\n  "y",\n]\n# a comment that introduces the next table\n'
    )
    assert _set_key(block, "c", "2") == (
        'a = "1"\nb = [\n  "x",\n]\nc = "2"\n# a comment that introduces the next table\n'
    )
    # Only the key's own line, and only its first: a second one is not this tool's to fix.
    assert _set_key('v = "1"\nv = "2"\n', "v", "3") == 'v = "3"\nv = "2"\n'
    assert _set_key("\n# only a comment\n", "v", "3") == 'v = "3"\n\n# only a comment\n'


def test_pins_move_an_sdist_upstream_and_its_companions_text_for_text() -> None:
    # A companion pins.toml has no table for first: the ones after it are still moved.
    companions = {"absent": ("1", ("5",)), "flashinfer-cubin": ("0.6.4", ("3333", "4444"))}
    assert _pins_text(SDIST_PINS, [Candidate(upstream())], companions) == (
        """\
# The pinned upstream inputs.

[upstream.sglang]
project = "sglang"
version = "1.1"
git_url = ""
git_commit = "def"
git_tag = "v1.1"
sdist = "sglang-1.1.tar.gz"
sha256 = "bbbb"

# The toolkit.
[toolkit]
requirement = "cuda-toolkit==13.0.2"

# The cubins FlashInfer loads at run time,
# installed beside our wheels.
[companions.flashinfer-cubin]
version = "0.6.4"
sha256 = [
  "3333",
  "4444",
]

# Kept as it is.
[companions.other]
version = "2.0"
sha256 = ["2222"]
"""
    )


def test_a_dropped_companion_goes_with_the_comment_lines_above_it_and_no_others() -> None:
    text = _pins_text(SDIST_PINS, [], {"flashinfer-cubin": None})
    assert text == SDIST_PINS.replace(
        "# The cubins FlashInfer loads at run time,\n# installed beside our wheels.\n"
        '[companions.flashinfer-cubin]\nversion = "0.6.3"\nsha256 = ["1111"]\n\n',
        "",
    )
    # The first table of a file that opens with its comment: the comment goes too.
    first = '# Its comment.\n[companions.x]\nversion = "1"\n[toolkit]\nrequirement = "t"\n'
    assert _pins_text(first, [], {"x": None}) == '[toolkit]\nrequirement = "t"\n'
    # The file's very first line is the table's; a comment elsewhere that names it is kept.
    named = '[companions.x]\nversion = "1"\n# unlike [companions.x] above\n[toolkit]\n'
    assert _pins_text(named, [], {"x": None}) == "# unlike [companions.x] above\n[toolkit]\n"
    earlier = '# [companions.x] is below.\n\n[toolkit]\n\n[companions.x]\nversion = "1"\n'
    assert _pins_text(earlier, [], {"x": None}) == "# [companions.x] is below.\n\n[toolkit]\n\n"


def test_a_wheel_only_candidate_replaces_the_sdist_pin_by_its_wheels_and_back() -> None:
    wheels = (Artifact("sglang-1.1-cp312.whl", "cccc"), Artifact("sglang-1.1-cp313.whl", "dddd"))
    moved = _pins_text(SDIST_PINS, [Candidate(upstream(sdist="", sha256="", wheels=wheels))], {})
    block = moved.split("[upstream.sglang]\n", 1)[1].split("\n\n", 1)[0]
    assert block == (
        'project = "sglang"\nversion = "1.1"\ngit_url = ""\ngit_commit = "def"\n'
        'git_tag = "v1.1"\nwheels = [\n'
        '  { file = "sglang-1.1-cp312.whl", sha256 = "cccc" },\n'
        '  { file = "sglang-1.1-cp313.whl", sha256 = "dddd" },\n]'
    )
    back = _pins_text(moved, [Candidate(upstream(version="1.2", sdist="s-1.2.tar.gz"))], {})
    block = back.split("[upstream.sglang]\n", 1)[1].split("\n\n", 1)[0]
    assert "wheels" not in block
    assert block.endswith('sdist = "s-1.2.tar.gz"\nsha256 = "bbbb"')


def test_an_upstream_pins_toml_lacks_is_refused_by_name() -> None:
    assert refusal(_pins_text, SDIST_PINS, [Candidate(upstream(name="flashinfer"))], {}) == (
        "pins.toml has no [upstream.flashinfer] table to update"
    )


def verdicts(*pairs: tuple[str, str, str]) -> Candidate:
    return Candidate(upstream(), [PatchVerdict(p, v, a, []) for p, v, a in pairs])


SERIES = """\
# The sglang series.
0001-first.patch
0002-gone.patch  # a comment # with a second mark
0003-other-form.patch
0004-kept.patch
"""


def test_the_series_drops_only_what_upstream_carries_whole_and_flags_the_rest(
    tmp_path: Path,
) -> None:
    series = tmp_path / "series"
    series.write_text(SERIES)
    candidate = verdicts(
        ("0002-gone.patch", "upstream", "drop"),
        ("0003-other-form.patch", "upstream in another form", "review"),
        ("0004-kept.patch", "conflict", "refresh"),
        ("0009-not-in-the-series.patch", "upstream", "drop"),
    )
    text, dropped = _series_text(series, candidate, upstream())
    assert dropped == ["0002-gone.patch"]  # not the patch the series does not list
    review = (
        "# REVIEW 0003-other-form.patch: upstream in another form in sglang 1.1 (nox -s "
        "bump); kept until it is proven equivalent"
    )
    assert text.splitlines() == [
        "# The sglang series.",
        "0001-first.patch",
        "# 0002-gone.patch: dropped, upstream in sglang 1.1 (nox -s bump: the whole patch "
        "reverse-applies)",
        review,
        "0003-other-form.patch",
        "0004-kept.patch",
    ]
    series.write_text(text)
    assert _series_text(series, candidate, upstream())[0] == text  # a rerun adds nothing


def test_a_review_line_goes_above_a_patch_on_the_series_first_line(tmp_path: Path) -> None:
    series = tmp_path / "series"
    series.write_text("0003-other-form.patch\n")
    candidate = verdicts(("0003-other-form.patch", "upstream in another form", "review"))
    text = _series_text(series, candidate, upstream())[0]
    assert text.splitlines()[1:] == ["0003-other-form.patch"]
    assert text.startswith("# REVIEW 0003-other-form.patch: ")
    # A REVIEW line the series ends with is not the one above the first line.
    series.write_text("0003-other-form.patch\n# REVIEW 0003-other-form.patch: stale\n")
    text = _series_text(series, candidate, upstream())[0]
    assert text.splitlines()[1:] == [
        "0003-other-form.patch",
        "# REVIEW 0003-other-form.patch: stale",
    ]


@pytest.mark.parametrize(
    "line", ["0002-gone.patch # why", "0002-gone.patch\t-p1", "0002-gone.patch#why#more"]
)
def test_a_series_line_is_its_first_word_before_any_comment(tmp_path: Path, line: str) -> None:
    series = tmp_path / "series"
    series.write_text(f"{line}\n")
    candidate = verdicts(("0002-gone.patch", "upstream", "drop"))
    assert _series_text(series, candidate, upstream())[1] == ["0002-gone.patch"]


def test_a_patch_named_only_in_a_comment_is_not_in_the_series(tmp_path: Path) -> None:
    series = tmp_path / "series"
    series.write_text("# 0002-gone.patch was dropped before\n")
    candidate = verdicts(("0002-gone.patch", "upstream", "drop"))
    assert _series_text(series, candidate, upstream()) == (
        "# 0002-gone.patch was dropped before\n",
        [],
    )


def test_refusals_are_user_errors() -> None:
    with pytest.raises(UserError):
        _pins_text("", [Candidate(upstream())], {})
