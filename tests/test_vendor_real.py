"""Integration: fetch the two real sdists through pip, vendor and patch them, and check the
effect of every patch on the resulting trees."""

from __future__ import annotations

import ast
import functools
import os
import re
import shutil
import subprocess
import zipfile
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from sm120_build.gitrepo import git
from sm120_build.patches import load_series, series_names
from sm120_build.vendor import export_patches

from .conftest import REPO

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def root(vendored_project: Path) -> Path:
    return vendored_project


def load_function(path: Path, name: str, namespace: dict[str, Any]) -> Any:
    """Execute one function definition from a source file in the given namespace."""
    tree = ast.parse(path.read_text())
    (node,) = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == name]
    exec(compile(ast.Module([node], []), str(path), "exec"), namespace)
    return namespace[name]


def test_sdists_are_cached_by_sha256(root: Path) -> None:
    sdists = sorted(p.name for p in (root / ".cache" / "sdists").glob("*/*.tar.gz"))
    assert sdists == ["flashinfer_python-0.6.3.tar.gz", "sglang-0.5.9.tar.gz"]


@pytest.mark.parametrize("name", ["flashinfer", "sglang"])
def test_log_is_pristine_base_then_one_commit_per_patch(root: Path, name: str) -> None:
    tree = root / "vendor" / name
    commits = git(tree, "rev-list", "--reverse", "HEAD").stdout.split()
    patches = load_series(root / "patches" / name)
    assert len(commits) == 1 + len(patches)
    assert "pristine sdist" in git(tree, "log", "-1", "--format=%B", commits[0]).stdout
    for commit, patch in zip(commits[1:], patches, strict=True):
        message = git(tree, "cat-file", "commit", commit).stdout.split("\n\n", 1)[1]
        assert message == patch.header.rstrip("\n") + "\n"


def test_no_cuda_arch_1200_bound_is_left(root: Path) -> None:
    header = root / "vendor/flashinfer/include/flashinfer/comm/trtllm_allreduce.cuh"
    text = header.read_text()
    assert "__CUDA_ARCH__ < 1200" not in text
    guards = re.findall(r"#if \(defined\(__CUDA_ARCH__\) && \(__CUDA_ARCH__ >= 900\)\)", text)
    assert len(guards) == 13


def test_lamport_pointers_use_the_kernel_stride(root: Path) -> None:
    source = (root / "vendor/flashinfer/csrc/trtllm_allreduce.cu").read_text()
    assert "lamport_peer_comm_buffer_ptrs[i + MAX_RANKS_PER_NODE]" in source
    assert "lamport_peer_comm_buffer_ptrs[i + MAX_RANKS_PER_NODE * 2]" in source
    assert "i + tp_size" not in source
    assert "tp_size <= static_cast<int64_t>(MAX_RANKS_PER_NODE)" in source


def test_cluster_sizes_are_clamped_by_the_driver(root: Path) -> None:
    """Patch 0004: each launcher asks the driver about the kernel and block size it launches
    (LaunchableClusterSize), whose answer is rounded down to a power of two and cached."""
    comm = root / "vendor/flashinfer/include/flashinfer/comm"
    calls = sum(
        len(re.findall(r"\bLaunchableClusterSize\(", path.read_text()))
        for path in comm.glob("trtllm_*.cuh")
    )
    assert calls == 4  # lamport launcher, fusion launcher, two MoE launchers
    assert "cluster_size = 8;" not in (comm / "trtllm_allreduce_fusion.cuh").read_text()
    utils = (root / "vendor/flashinfer/include/flashinfer/utils.cuh").read_text()
    assert "while (supported & (supported - 1))" in utils  # power of two
    assert "static std::map<std::tuple<const void*, int, int>, int> answers;" in utils


FP4_HARNESS = """
#include <cstdio>
#include <cstdlib>
#include <initializer_list>
// Host harness around the FP4 block/cluster selection of allreduce_fusion_kernel_launcher,
// pasted verbatim from the patched header. Prints block_size and cluster_size.
int main(int argc, char** argv) {
  int threads_per_token = std::atoi(argv[1]);
  int max_threads_per_block = std::atoi(argv[2]);
  int max_cluster_size = std::atoi(argv[3]);
  int block_size = -1, cluster_size = -1, threads_per_block = -1;  // "the baseline"
@SELECTION@
  std::printf("%d %d\\n", block_size, cluster_size);
  (void)threads_per_block;
  return 0;
}
"""


@pytest.fixture(scope="module")
def fp4_selection(root: Path, module_tmp: Callable[[str], Path]) -> Path:
    """The real FP4 selection code of the patched launcher, compiled with g++ on the host."""
    text = (
        root / "vendor/flashinfer/include/flashinfer/comm/trtllm_allreduce_fusion.cuh"
    ).read_text()
    start = text.index(
        "if constexpr (GetQuantType<Pattern> == QuantType::kFP4) {",
        text.index("// FP4 optimization: apply BEFORE SM count check"),
    )
    body_start = text.index("{", start) + 1
    body_end = text.index("threads_per_block = block_size;", body_start)
    source = module_tmp("fp4") / "harness.cpp"
    source.write_text(FP4_HARNESS.replace("@SELECTION@", text[body_start:body_end]))
    binary = source.with_suffix("")
    subprocess.run(["g++", "-std=c++17", "-o", str(binary), str(source)], check=True)
    return binary


@pytest.mark.parametrize(
    ("threads_per_token", "expected"),
    [
        (896, (-1, -1)),  # hidden 7168 bf16: 896/128 = 7 is no power of two, keep the baseline
        (512, (128, 4)),  # 160 and 192 do not divide 512
        (640, (160, 4)),
        (768, (192, 4)),
        (2560, (-1, -1)),  # 160 x 16: over the cluster limit of 8
        (320, (160, 2)),
    ],
)
def test_fp4_launcher_picks_only_power_of_two_clusters(
    fp4_selection: Path, threads_per_token: int, expected: tuple[int, int]
) -> None:
    result = subprocess.run(
        [str(fp4_selection), str(threads_per_token), "1024", "8"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert tuple(int(x) for x in result.stdout.split()) == expected


def test_arch_filter_admits_major_12(root: Path) -> None:
    source = (root / "vendor/flashinfer/flashinfer/jit/comm.py").read_text()
    assert "supported_major_versions=[9, 10, 12]" in source


def test_aot_tool_builds_trtllm_comm_for_sm90_and_sm120(root: Path) -> None:
    source = (root / "vendor/flashinfer/flashinfer/aot.py").read_text()
    gate = source[: source.index("jit_specs.append(gen_trtllm_comm_module())")]
    assert gate.rstrip().endswith("if has_sm90 or has_sm100 or has_sm120:")


def test_version_checks_compare_public_versions(root: Path) -> None:
    from packaging.version import Version

    same_release = load_function(
        root / "vendor/flashinfer/flashinfer/jit/env.py", "_same_release", {"Version": Version}
    )
    assert same_release("0.6.3+sm120.p1234abcd", "0.6.3")
    assert same_release("0.6.3+cu130.sm120a.p1234abcd", "0.6.3+sm120.p1234abcd")
    assert not same_release("0.6.4", "0.6.3")
    text = (root / "vendor/flashinfer/flashinfer/jit/env.py").read_text()
    assert "startswith(flashinfer_version)" not in text
    assert "flashinfer_version != flashinfer_cubin_version" not in text


def module_level(source: str, keep: Callable[[ast.stmt], bool], namespace: dict[str, Any]) -> None:
    """Execute the module-level statements of `source` that `keep` selects."""
    tree = ast.parse(source)
    exec(compile(ast.Module([n for n in tree.body if keep(n)], []), "<wheel>", "exec"), namespace)


def sglang_gate(wheel: Path, major: int, enabled: bool) -> bool:
    """apply_flashinfer_allreduce_fusion() of the built sglang wheel, on a device of this
    capability major. The capability predicates and the module's own _is_sm* flags run from
    the wheel's code; only torch's view of the device is given (there is no GPU here)."""
    with zipfile.ZipFile(wheel) as archive:
        common = archive.read("sglang/srt/utils/common.py").decode()
        communicator = archive.read("sglang/srt/layers/communicator.py").decode()
    device = SimpleNamespace(
        cuda=SimpleNamespace(
            is_available=lambda: True, get_device_capability=lambda device=None: (major, 0)
        ),
        version=SimpleNamespace(cuda="12.8"),
    )
    utils: dict[str, Any] = {
        "torch": device,
        "lru_cache": functools.lru_cache,
        "partial": functools.partial,
    }
    module_level(
        common,
        lambda n: (
            (isinstance(n, ast.FunctionDef) and n.name in ("_check_cuda_device_version", "is_cuda"))
            or (
                isinstance(n, ast.Assign)
                and any(
                    isinstance(t, ast.Name) and re.fullmatch(r"is_sm\d+_supported", t.id)
                    for t in n.targets
                )
            )
        ),
        utils,
    )
    (imported,) = [
        n
        for n in ast.parse(communicator).body
        if isinstance(n, ast.ImportFrom) and n.module == "sglang.srt.utils"
    ]
    namespace = {alias.name: utils[alias.name] for alias in imported.names if alias.name in utils}
    namespace.update(
        is_flashinfer_available=lambda: True,
        is_dp_attention_enabled=lambda: False,
        get_global_server_args=lambda: SimpleNamespace(enable_flashinfer_allreduce_fusion=enabled),
    )
    module_level(
        communicator,
        lambda n: (
            (
                isinstance(n, ast.Assign)
                and isinstance(n.targets[0], ast.Name)
                and (
                    n.targets[0].id.startswith("_is_sm")
                    or n.targets[0].id
                    in ("_is_cuda", "_is_flashinfer_available", "FUSE_ALLREDUCE_MAX_BATCH_SIZE")
                )
            )
            or (isinstance(n, ast.FunctionDef) and n.name == "apply_flashinfer_allreduce_fusion")
        ),
        namespace,
    )
    return bool(namespace["apply_flashinfer_allreduce_fusion"](batch_size=64))


@pytest.fixture(scope="module")
def sglang_wheel(built_project: Path) -> Path:
    (wheel,) = (built_project / "wheelhouse").glob("sglang-*.whl")
    return wheel


def test_sglang_fusion_gate_admits_sm120_when_asked(sglang_wheel: Path) -> None:
    assert sglang_gate(sglang_wheel, major=12, enabled=True)
    assert not sglang_gate(sglang_wheel, major=12, enabled=False)
    assert not sglang_gate(sglang_wheel, major=8, enabled=True)
    assert sglang_gate(sglang_wheel, major=9, enabled=True)
    assert sglang_gate(sglang_wheel, major=10, enabled=True)


def test_sglang_auto_enable_is_untouched(root: Path) -> None:
    pristine = git(root / "vendor/sglang", "rev-list", "--max-parents=0", "HEAD").stdout.strip()
    changed = git(root / "vendor/sglang", "diff", "--name-only", pristine, "HEAD").stdout.split()
    assert "sglang/srt/server_args.py" not in changed


@pytest.mark.parametrize(
    ("major", "backend", "expected"),
    [
        (12, "flashinfer_cutlass", True),
        (9, "flashinfer_cutlass", False),
        (10, "flashinfer_cutlass", False),
        (12, "flashinfer_trtllm", True),
        (12, "triton", False),
    ],
)
def test_sglang_autotune_admits_cutlass_on_sm12x(
    root: Path, major: int, backend: str, expected: bool
) -> None:
    torch = SimpleNamespace(cuda=SimpleNamespace(get_device_capability=lambda: (major, 0)))
    should_run = load_function(
        root / "vendor/sglang/sglang/srt/model_executor/model_runner.py",
        "_should_run_flashinfer_autotune",
        {"torch": torch},
    )
    runner = SimpleNamespace(
        server_args=SimpleNamespace(disable_flashinfer_autotune=False, moe_runner_backend=backend),
        spec_algorithm=SimpleNamespace(
            is_eagle=lambda: False, is_standalone=lambda: False, is_ngram=lambda: False
        ),
        is_draft_worker=False,
    )
    assert should_run(runner) is expected


@pytest.mark.parametrize("name", ["flashinfer", "sglang"])
def test_export_reproduces_the_committed_patches_byte_for_byte(
    root: Path, name: str, tmp_path: Path
) -> None:
    series = tmp_path / name
    shutil.copytree(REPO / "patches" / name, series)
    pins = __import__("sm120_build.pins", fromlist=["load"]).load(root / "pins.toml")
    export_patches(pins.upstream(name), root / "vendor" / name, series)
    committed = REPO / "patches" / name
    assert sorted(p.name for p in series.iterdir()) == sorted(p.name for p in committed.iterdir())
    for path in series.iterdir():
        assert path.read_bytes() == (committed / path.name).read_bytes(), path.name


@pytest.mark.parametrize("name", ["flashinfer", "sglang"])
def test_quilt_applies_the_same_series(root: Path, name: str, tmp_path: Path) -> None:
    """With --fuzz=0, as README says: quilt's default fuzz would accept what we refuse."""
    assert shutil.which("quilt"), "quilt is not installed (.ci/run installs Debian's quilt)"
    tree = tmp_path / name
    pristine = git(root / "vendor" / name, "rev-list", "--max-parents=0", "HEAD").stdout.strip()
    git(root / "vendor" / name, "worktree", "add", "--detach", str(tree), pristine)
    env = dict(os.environ, QUILT_PATCHES=str(REPO / "patches" / name), QUILTRC="/dev/null")
    result = subprocess.run(
        ["quilt", "push", "-a", "--fuzz=0"], cwd=tree, env=env, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"Now at patch {series_names(REPO / 'patches' / name)[-1]}" in result.stdout
    shutil.rmtree(tree / ".pc")
    diff = subprocess.run(
        ["diff", "-r", "-x", ".git", str(tree), str(root / "vendor" / name)],
        capture_output=True,
        text=True,
    )
    assert diff.returncode == 0, diff.stdout
