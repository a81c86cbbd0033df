"""pins.load refuses each malformed pins.toml with a message naming what is wrong."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from sm120_build.errors import UserError
from sm120_build.pins import load

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
        ('sdist = "flashinfer_python-0.6.3.tar.gz"\n', "", r"lacks sdist"),
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
