"""pins.load refuses each malformed pins.toml with a message naming what is wrong."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from sm120_build.errors import UserError
from sm120_build.pins import Companion, Pins, Upstream, load

ROOT = Path(__file__).resolve().parent.parent
REAL = (ROOT / "pins.toml").read_text()
GOOD_SHA = "84a762538247a86bc52ff31d9505d161ce1ec059174c1821c87c3ed1e44670fc"
CUBIN_SHA = "64ecd1e3084c78bfc958e90132d5dffcaf9d2cb4d52bfecde4c1b040e5b024d6"


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "pins.toml"
    path.write_text(text)
    return path


def test_the_committed_pins_load() -> None:
    pins = load(ROOT / "pins.toml")
    assert set(pins.upstreams) == {"flashinfer", "sglang"}
    assert pins.upstream("flashinfer").sha256 == GOOD_SHA
    assert pins.companions["flashinfer-cubin"].sha256 == (CUBIN_SHA,)
    assert "torch==2.13.0" in pins.build_requirements  # [render] joins [build]
    assert "cmake==4.4.5" in pins.build_requirements


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        # The sdist hash: uppercase, short, or not a string.
        (GOOD_SHA, GOOD_SHA.upper(), r"\[upstream.flashinfer\] sha256 is not 64 lowercase hex"),
        (GOOD_SHA, GOOD_SHA[:63], r"sha256 is not 64 lowercase hex"),
        (GOOD_SHA, GOOD_SHA[:63] + "g", r"sha256 is not 64 lowercase hex"),
        (GOOD_SHA, GOOD_SHA[:63] + "X", r"sha256 is not 64 lowercase hex"),
        (f'sha256 = "{GOOD_SHA}"', "sha256 = 1", r"\[upstream.flashinfer\] sha256 must be strings"),
        (f'sha256 = "{GOOD_SHA}"\n', "", r"\[upstream.flashinfer\] lacks sha256"),
        (
            'sdist = "flashinfer_python-0.6.3.tar.gz"\n',
            "",
            r"needs either sdist and sha256, or wheels",
        ),
        # The companion's hashes: missing, empty, malformed, not a list of strings.
        (f'sha256 = ["{CUBIN_SHA}"]', "sha256 = []", r"\[companions.flashinfer-cubin\] sha256"),
        (f'sha256 = ["{CUBIN_SHA}"]', f'sha256 = ["{CUBIN_SHA[:-1]}"]', r"companions.*64 lower"),
        (f'sha256 = ["{CUBIN_SHA}"]', "sha256 = [1]", r"must be a list of strings"),
        (f'sha256 = ["{CUBIN_SHA}"]', "", r"\[companions.flashinfer-cubin\] sha256"),
        ('version = "0.6.3"\nsha256 = [', "version = 63\nsha256 = [", r"needs version"),
        ('requirement = "cuda-toolkit', 'requirementx = "cuda-toolkit', r"\[toolkit\] requirement"),
        ('requirements = [\n  "apache', 'requirements = [\n  1,\n  "apache', r"\[build\] requi"),
    ],
)
def test_malformed_pins_are_refused(tmp_path: Path, old: str, new: str, message: str) -> None:
    assert old in REAL
    with pytest.raises(UserError, match=message):
        load(_write(tmp_path, REAL.replace(old, new, 1)))


def test_pins_without_an_upstream_are_refused(tmp_path: Path) -> None:
    without = re.sub(r"\[upstream\.\w+\][^\[]*", "", REAL)
    with pytest.raises(UserError, match=r"no \[upstream\.\*\] tables"):
        load(_write(tmp_path, without))


def test_an_upstream_that_is_not_a_table_is_refused(tmp_path: Path) -> None:
    with pytest.raises(UserError, match=r"upstream.flashinfer must be a table"):
        load(_write(tmp_path, 'upstream = { flashinfer = "0.6.3" }\n'))


def test_an_unknown_upstream_names_the_known_ones() -> None:
    with pytest.raises(UserError, match=r"no upstream named 'vllm'.*flashinfer"):
        load(ROOT / "pins.toml").upstream("vllm")


UPSTREAM_A = f"""[upstream.a]
project = "a"
version = "1"
sdist = "a-1.tar.gz"
sha256 = "{GOOD_SHA}"
git_url = ""
git_tag = ""
git_commit = ""
"""
TOOLKIT = '[toolkit]\nrequirement = "cuda-toolkit==13.0.88"\n'
COMPANION = f'[companions.c]\nversion = "1.0"\nsha256 = ["{CUBIN_SHA}"]\n'
BUILD = '[build]\nrequirements = ["b==1"]\n'
RENDER = '[render]\nrequirements = ["r==2"]\n'


def test_a_small_pins_file_loads_whole(tmp_path: Path) -> None:
    pins = load(_write(tmp_path, "\n".join([UPSTREAM_A, TOOLKIT, COMPANION, BUILD, RENDER])))
    assert pins == Pins(
        upstreams={"a": Upstream("a", "a", "1", "a-1.tar.gz", GOOD_SHA, "", "", "")},
        toolkit_requirement="cuda-toolkit==13.0.88",
        companions={"c": Companion("c", "1.0", (CUBIN_SHA,))},
        build_requirements=["b==1", "r==2"],
    )


@pytest.mark.parametrize(
    ("sections", "message"),
    [
        (["upstream = 3", TOOLKIT], "[upstream] must be a table"),
        (["toolkit = 3", UPSTREAM_A], "[toolkit] must be a table"),
        (["companions = 3", UPSTREAM_A, TOOLKIT], "[companions] must be a table"),
        (["build = 3", UPSTREAM_A, TOOLKIT], "[build] must be a table"),
        (["render = 3", UPSTREAM_A, TOOLKIT], "[render] must be a table"),
        (
            [UPSTREAM_A, TOOLKIT, '[companions.c]\nversion = "1.0"\nsha256 = 3'],
            "[companions.c] sha256 must be a list of strings",
        ),
        (
            [UPSTREAM_A, TOOLKIT, '[companions.c]\nversion = "1.0"'],
            "[companions.c] sha256 must list the sha256 of each of its wheels "
            "(64 lowercase hex digits each)",
        ),
        (
            [UPSTREAM_A, TOOLKIT, "[build]\nrequirements = 3"],
            "[build] requirements must be a list of strings",
        ),
        (
            [UPSTREAM_A, TOOLKIT, "[render]\nrequirements = [3]"],
            "[render] requirements must be a list of strings",
        ),
        (
            [
                UPSTREAM_A.replace('version = "1"\n', "").replace('sdist = "a-1.tar.gz"\n', ""),
                TOOLKIT,
            ],
            "[upstream.a] lacks version",
        ),
        (
            [
                UPSTREAM_A.replace('version = "1"', "version = 1").replace(
                    'sdist = "a-1.tar.gz"', "sdist = 2"
                ),
                TOOLKIT,
            ],
            "[upstream.a] version must be strings",
        ),
    ],
)
def test_each_refusal_names_the_file_and_the_table(
    tmp_path: Path, sections: list[str], message: str
) -> None:
    path = _write(tmp_path, "\n".join(sections) + "\n")
    with pytest.raises(UserError) as caught:
        load(path)
    assert str(caught.value) == f"{path}: {message}"


def test_unreadable_pins_and_unknown_upstreams_are_named(tmp_path: Path) -> None:
    with pytest.raises(UserError) as caught:
        load(tmp_path / "nowhere.toml")
    assert (
        str(caught.value) == f"cannot read {tmp_path / 'nowhere.toml'}: No such file or directory"
    )
    pins = load(ROOT / "pins.toml")
    with pytest.raises(UserError) as caught:
        pins.upstream("vllm")
    assert str(caught.value) == "no upstream named 'vllm' in pins.toml (known: flashinfer, sglang)"
