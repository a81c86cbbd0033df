"""The gate audit: AST rules on fixture modules, waivers, and device gates that grep misses."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest

from sm120_build.audit import Finding, Waiver, classify, load_scope
from sm120_build.audit.device import (
    TRTLLM_COMM_SOURCES,
    device_findings,
    enclosing_condition,
    enclosing_function,
)
from sm120_build.audit.python_ast import python_findings
from sm120_build.cache import cache_lock
from sm120_build.errors import UserError
from sm120_build.layout import Layout

CHECKOUT = Path(__file__).resolve().parents[1]
SCOPE = load_scope(CHECKOUT / "audit-scope.toml")


def gates(tmp_path: Path, source: str) -> list[Finding]:
    path = tmp_path / "module.py"
    path.write_text(textwrap.dedent(source))
    return python_findings(tmp_path, "demo", [path])


def test_aliased_capability_function_is_caught(tmp_path: Path) -> None:
    found = gates(
        tmp_path,
        """
        from sglang.srt.utils import is_sm100_supported as datacenter_blackwell
        from sglang.srt.utils import is_sm90_supported

        def use_fusion():
            return is_sm90_supported() or datacenter_blackwell()
    """,
    )
    assert [(f.line, f.function) for f in found] == [(6, "use_fusion")]
    assert "datacenter_blackwell()" in found[0].condition


def test_cached_predicate_results_are_followed(tmp_path: Path) -> None:
    found = gates(
        tmp_path,
        """
        _hopper = _is_cuda and is_sm90_supported()
        _blackwell = is_sm100_supported()
        ok = (_hopper or _blackwell) and enabled
    """,
    )
    assert [f.line for f in found] == [4]


def test_major_in_a_literal_collection_is_caught(tmp_path: Path) -> None:
    found = gates(
        tmp_path,
        """
        import torch

        def pick():
            major, minor = torch.cuda.get_device_capability()
            if major in (9, 10):
                return "fused"
            if torch.cuda.get_device_capability()[0] in [9, 10, 12]:
                return "fine"
    """,
    )
    assert [(f.line, f.detail) for f in found] == [(6, "capability major must be one of [9, 10]")]


def test_equality_chains_and_upper_bounds_are_caught(tmp_path: Path) -> None:
    found = gates(
        tmp_path,
        """
        cap = get_compute_capability()
        major = cap[0]
        a = major == 9 or major == 10
        b = major < 12
        c = major >= 9
    """,
    )
    assert sorted(f.line for f in found) == [4, 5]


def test_arch_filters_and_arch_lists(tmp_path: Path) -> None:
    found = gates(
        tmp_path,
        """
        flags = ctx.get_nvcc_flags_list(supported_major_versions=[9, 10])
        fine = ctx.get_nvcc_flags_list(supported_major_versions=[9, 10, 12])
        if has_sm100:
            specs.append(gen_trtllm_comm_module())
        if has_sm90 or has_sm120:
            specs.append(gen_trtllm_comm_module())
    """,
    )
    assert sorted(f.line for f in found) == [2, 4]


def test_a_gate_that_admits_sm120_is_not_reported(tmp_path: Path) -> None:
    assert (
        gates(
            tmp_path,
            """
        _a = is_sm90_supported()
        ok = _a or is_sm100_supported() or is_sm120_supported()
    """,
        )
        == []
    )


def finding(file: str, condition: str) -> Finding:
    return Finding(
        kind="python",
        upstream="sglang",
        file=file,
        line=1,
        function="f",
        condition=condition,
        detail="",
        statement="enable_flashinfer_allreduce_fusion",
    )


def test_waivers_apply_and_stale_ones_are_reported() -> None:
    used = Waiver("sglang", "sglang/srt/server_args.py", "is_sm90_supported()", "on purpose")
    stale = Waiver("sglang", "sglang/srt/gone.py", "x", "no longer there")
    report = classify(
        [finding("sglang/srt/server_args.py", "is_sm90_supported() or is_sm100_supported()")],
        [used, stale],
        SCOPE,
    )
    assert report.findings[0].in_scope
    assert report.findings[0].waiver == "on purpose"
    assert report.failing == []
    assert report.stale_waivers == [stale]
    assert "stale waiver" in report.table()


def test_unwaived_in_scope_finding_fails() -> None:
    report = classify([finding("sglang/srt/server_args.py", "is_sm90_supported()")], [], SCOPE)
    assert len(report.failing) == 1
    out_of_scope = classify([finding("sglang/srt/other.py", "x")], [], SCOPE)
    assert out_of_scope.failing == []


def test_condition_and_function_of_a_region() -> None:
    source = textwrap.dedent("""\
        template <typename T>
        __global__ void __launch_bounds__(1024, 1)
            my_kernel(T* out) {
          if constexpr (sizeof(T) == 2) {
            out[0] = 1;
          }
        #if defined(FOO)
        #else
          out[1] = 2;
        #endif
        }
    """).splitlines()
    assert enclosing_function(source, 8) == "my_kernel"
    assert enclosing_condition(source, 8) == (8, "#else (of #if defined(FOO))")


@pytest.mark.slow
def test_device_gate_hidden_behind_a_macro_is_found(tmp_path: Path) -> None:
    """`#if PDL_SUPPORTED` names no arch: grep for 1200 at the use site finds nothing."""
    from sm120_build import toolkit

    from .conftest import PINS_TOOLKIT, REPO

    tree = tmp_path / "flashinfer"
    (tree / "include").mkdir(parents=True)
    (tree / "include" / "arch.h").write_text(
        textwrap.dedent("""\
        #pragma once
        #define ARCH_LIMIT 1200
        #if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < ARCH_LIMIT
        #define PDL_SUPPORTED 1
        #else
        #define PDL_SUPPORTED 0
        #endif
    """)
    )
    kernel = textwrap.dedent("""\
        #include "arch.h"
        __global__ void fused_kernel(int* out) {
          out[0] = 1;
        #if PDL_SUPPORTED
          out[1] = 2;
        #endif
        }
    """)
    for source in TRTLLM_COMM_SOURCES:
        (tree / source).parent.mkdir(parents=True, exist_ok=True)
        (tree / source).write_text(kernel if source.endswith("trtllm_allreduce.cu") else "")
    assert "1200" not in (tree / "csrc/trtllm_allreduce.cu").read_text()
    # The shared cache, taken as every command takes it: adopted (marked) and locked. Written
    # to unmarked, it would be refused by the next command that uses it.
    cache = Layout.from_root(REPO).cache
    with cache_lock(cache):
        cuda = toolkit.pip_toolkit(PINS_TOOLKIT, cache)
    found = device_findings(tree.resolve(), "flashinfer", cuda)
    assert [(f.file, f.line, f.function, f.condition) for f in found] == [
        ("csrc/trtllm_allreduce.cu", 4, "fused_kernel", "#if PDL_SUPPORTED")
    ]
    assert "lines 5-5 vanish for sm_120a" in found[0].detail


def test_scoped_files_that_moved_are_reported_missing(tmp_path: Path) -> None:
    from sm120_build.audit import missing_scope

    (tmp_path / "sglang/srt/layers").mkdir(parents=True)
    (tmp_path / "sglang/srt/layers/layernorm.py").write_text("")
    missing = missing_scope(tmp_path, "sglang", SCOPE)
    assert "sglang/sglang/srt/layers/communicator.py" in missing
    assert "sglang/sglang/srt/layers/layernorm.py" not in missing


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "no [[scope]] tables: the audit would vouch for nothing"),
        ('[[scope]]\nupstream = "x"\n', "scope 1 needs upstream and pattern"),
        ('[[scope]]\nupstream = "x"\npattern = "y"\nwhere = "z"\n', "scope 1 takes only"),
    ],
)
def test_a_malformed_scope_is_refused(tmp_path: Path, text: str, message: str) -> None:
    (tmp_path / "audit-scope.toml").write_text(text)
    with pytest.raises(UserError, match=re.escape(message)):
        load_scope(tmp_path / "audit-scope.toml")


def test_each_stack_has_a_scope_that_matches_its_trees_files() -> None:
    """The default stack's and every other stack's audit-scope.toml load."""
    stacks = sorted((CHECKOUT / "stacks").glob("*/pins.toml"))
    for pins in [CHECKOUT / "pins.toml", *stacks]:
        assert load_scope(pins.with_name("audit-scope.toml")), pins


def test_a_platform_attribute_gate_is_found(tmp_path: Path) -> None:
    """sglang 0.5.23 asks a platform object (`get_platform().is_sm90`), not a function."""
    found = gates(
        tmp_path,
        """
        def _resolve_backend(backend):
            if not (get_platform().is_sm90 or get_platform().is_sm100):
                raise ValueError("requires SM90 or SM10X")
            if get_platform().is_sm90 or get_platform().is_sm100 or get_platform().is_sm120:
                return backend
        """,
    )
    assert [(f.line, f.condition) for f in found] == [
        (3, "get_platform().is_sm90 or get_platform().is_sm100")
    ]
