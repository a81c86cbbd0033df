"""What the compile stage refuses, word for word, in process: archs a toolkit or FlashInfer
cannot serve, a shared directory someone else may own, a FlashInfer whose layout cannot be
read, and a --base-jit-cache that is not this release's."""

from __future__ import annotations

from pathlib import Path

import pytest

from sm120_build.jit_cache import sources
from sm120_build.jit_cache.arch import Arch, check_archs, check_modules_cover_archs
from sm120_build.jit_cache.overlay import base_member_problem, check_base
from sm120_build.jit_cache.render import Module
from sm120_build.toolkit import Toolkit

from .conftest import refusal


def module(name: str, *codes: str) -> Module:
    flags = [f"-gencode=arch=compute_{code},code=sm_{code}" for code in codes]
    return Module(name, name, [f"{name}.cu"], [], flags, [], [], False)


def test_a_module_for_no_requested_major_is_refused_naming_its_arch_and_the_request() -> None:
    archs = [Arch.parse("12.0f"), Arch.parse("12.1a")]
    assert refusal(check_modules_cover_archs, [module("fa3", "90a", "100a")], archs) == (
        "FlashInfer builds fa3 only for -gencode=arch=compute_100a,code=sm_100a, "
        "-gencode=arch=compute_90a,code=sm_90a, which none of --arch 12.0f 12.1a runs. Drop "
        "the module, or add its arch."
    )


def test_a_module_that_picks_its_own_arch_does_not_end_the_check_of_the_rest() -> None:
    archs = [Arch.parse("12.0f"), Arch.parse("9.0a")]
    modules = [module("fp4_121", "121a"), module("norm", "120f")]
    assert refusal(check_modules_cover_archs, modules, archs) == (
        "FlashInfer builds norm only for -gencode=arch=compute_120f,code=sm_120f; it filters "
        "out 9.0a. Drop that --arch, or the module."
    )
    check_modules_cover_archs([module("norm", "120f", "90a")], archs)  # exactly the request


def toolkit(version: tuple[int, int], codes: set[str], home: Path = Path("/opt/cuda")) -> Toolkit:
    return Toolkit(home, version, f"{version[0]}.{version[1]}.1", frozenset(codes))


def test_an_sm12x_arch_needs_cuda_12_8_exactly_or_newer() -> None:
    assert refusal(check_archs, [Arch.parse("12.0a")], toolkit((12, 6), {"sm_120"})) == (
        "12.0a needs CUDA 12.8 or newer; /opt/cuda is CUDA 12.6.1. Use the default toolkit or "
        "a newer --cuda-home."
    )
    # 12.8 itself passes that check (and then meets the next: this toolkit builds no sm_120).
    assert refusal(check_archs, [Arch.parse("12.0a")], toolkit((12, 8), {"sm_90"})).startswith(
        "CUDA 12.8.1 at /opt/cuda cannot build 12.0a"
    )


def test_an_arch_the_toolkit_cannot_build_is_refused_with_what_it_builds_in_order() -> None:
    codes = {"sm_100", "sm_90", "sm_120", "sm_89"}
    assert refusal(check_archs, [Arch.parse("12.1a")], toolkit((13, 0), codes)) == (
        "CUDA 13.0.1 at /opt/cuda cannot build 12.1a (it builds sm_89 sm_90 sm_100 sm_120)."
    )


def test_an_arch_variant_nvcc_rejects_is_refused_with_nvcc_s_last_words(tmp_path: Path) -> None:
    nvcc = tmp_path / "bin" / "nvcc"
    nvcc.parent.mkdir()
    nvcc.write_text(
        '#!/bin/sh\n[ -f "$3" ] && [ ! -s "$3" ] || exit 9\n'  # an empty .cu, as asked
        'echo "nvcc warning : something first" >&2\n'
        "echo \"nvcc fatal   : Unsupported gpu architecture 'compute_120x'\" >&2\nexit 1\n"
    )
    nvcc.chmod(0o755)
    cuda = toolkit((13, 0), {"sm_120"}, tmp_path)
    assert refusal(check_archs, [Arch.parse("12.0f")], cuda) == (
        "--arch 12.0f: CUDA 13.0.1's nvcc rejects it: nvcc fatal   : Unsupported gpu "
        "architecture 'compute_120x'"
    )
    nvcc.write_text("#!/bin/sh\nexit 1\n")  # says nothing
    assert refusal(check_archs, [Arch.parse("12.0f")], cuda) == (
        "--arch 12.0f: CUDA 13.0.1's nvcc rejects it: "
    )


def test_a_shared_directory_that_is_not_ours_and_private_is_refused(tmp_path: Path) -> None:
    private = tmp_path / "private"
    sources._private_directory(private)
    assert private.stat().st_mode & 0o777 == 0o700
    sources._private_directory(private)  # ours already: accepted
    private.chmod(0o755)
    message = refusal(sources._private_directory, private)
    assert message == (
        f"{private} exists but is not a private directory of this user (it must be a real "
        "directory, owned by you, mode 0700). Someone else may have made it: remove it, or "
        "investigate, before building."
    )
    link = tmp_path / "link"
    link.symlink_to(private)
    private.chmod(0o700)
    assert refusal(sources._private_directory, link).startswith(f"{link} exists but is not")


def test_a_flashinfer_whose_build_backend_cannot_be_read_is_refused(tmp_path: Path) -> None:
    assert refusal(sources.data_links, tmp_path) == (
        "cannot read FlashInfer's build_backend.py: [Errno 2] No such file or directory: "
        f"'{tmp_path / 'build_backend.py'}'"
    )
    (tmp_path / "build_backend.py").write_text(
        "def _create_data_dir():\n    ln(CUTLASS, 'cutlass')\n    ln('csrc', 'csrc')\n"
    )
    assert sources.data_links(tmp_path) == {"csrc": "csrc"}  # only literal names are links


@pytest.mark.parametrize(
    ("name", "problem"),
    [
        ("flashinfer_jit_cache/jit_cache/norm/norm.so", None),
        ("flashinfer_jit_cache/jit_cache/norm/sub/dir/x.so", None),
        ("flashinfer_jit_cache/__init__.py", None),
        ("flashinfer_jit_cache-0.6.3.dist-info/licenses/LICENSE", None),
        (
            "flashinfer_jit_cache/jit_cache/norm.so",
            "lies in flashinfer_jit_cache/jit_cache/ but not inside a module's directory",
        ),
        ("elsewhere/x.so", "lies outside flashinfer_jit_cache/ and its .dist-info/"),
    ],
)
def test_a_base_jit_cache_member_lies_where_a_jit_cache_keeps_it(
    name: str, problem: str | None
) -> None:
    found = base_member_problem(name)
    if problem is None:
        assert found is None
    else:
        assert found is not None and found.endswith(problem)


def test_a_base_jit_cache_that_is_not_a_wheel_or_not_this_release_is_refused(
    tmp_path: Path,
) -> None:
    assert refusal(check_base, tmp_path / "base.zip", "0.6.3") == (
        "--base-jit-cache base.zip: not a wheel (Invalid wheel filename (extension must be "
        "'.whl'): 'base.zip')"
    )
    assert refusal(
        check_base, tmp_path / "flashinfer_jit_cache-0.6.4+cu130-py3-none-any.whl", "0.6.3"
    ) == (
        "--base-jit-cache flashinfer_jit_cache-0.6.4+cu130-py3-none-any.whl is not a "
        "flashinfer-jit-cache 0.6.3 wheel: its modules would not match this FlashInfer"
    )
    assert list(tmp_path.iterdir()) == []  # refused before anything was read or written
