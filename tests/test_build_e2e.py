"""Integration: the whole main job, twice from clean, then the wheels on a simulated node.

Slow: two sm_120a compiles (about 3 minutes each on 2 cores) and a fresh virtual
environment with CPU torch, flashinfer-cubin and the built wheels.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename

from sm120_build.pins import load as load_pins

from .conftest import REPO, build_wheels, fresh_root, installed_versions

pytestmark = pytest.mark.slow
PINS = load_pins(REPO / "pins.toml")


def wheel_of(root: Path, project: str) -> Path:
    (found,) = (root / "wheelhouse").glob(f"{project}-*.whl")
    return found


@pytest.fixture(scope="module")
def builds(built_project: Path, module_tmp: Callable[[str], Path]) -> tuple[Path, Path]:
    """Two clean builds of the default configuration, in different directories."""
    second = fresh_root(module_tmp("second"))
    build_wheels(second)
    return built_project, second


@pytest.fixture(scope="module")
def provenance(builds: tuple[Path, Path]) -> dict[str, Any]:
    with zipfile.ZipFile(wheel_of(builds[0], "flashinfer_jit_cache")) as archive:
        (name,) = [n for n in archive.namelist() if n.endswith(".dist-info/sm120-build.json")]
        found: dict[str, Any] = json.loads(archive.read(name))
        return found


@pytest.fixture(scope="module")
def shared_object(builds: tuple[Path, Path], module_tmp: Callable[[str], Path]) -> Path:
    with zipfile.ZipFile(wheel_of(builds[0], "flashinfer_jit_cache")) as archive:
        target = module_tmp("so")
        return Path(
            archive.extract("flashinfer_jit_cache/jit_cache/trtllm_comm/trtllm_comm.so", target)
        )


def envelope_subject(path: Path) -> list[dict[str, Any]]:
    """The subject of a provenance envelope's statement (its payload is base64 JSON)."""
    payload = json.loads(base64.b64decode(json.loads(path.read_text())["payload"]))
    subject: list[dict[str, Any]] = payload["subject"]
    return subject


def test_wheelhouse_holds_our_four_wheels_the_cubin_and_their_hashes(builds: Any) -> None:
    root = builds[0]
    names = sorted(
        p.name for p in (root / "wheelhouse").iterdir() if not p.name.endswith(".intoto.jsonl")
    )
    envelopes = sorted(p.name for p in (root / "wheelhouse").glob("*.intoto.jsonl"))
    assert envelopes == sorted(
        f"{name}.intoto.jsonl"
        for name in names
        if name.endswith(".whl") and not name.startswith("flashinfer_cubin")
    )
    patterns = [
        r"SHA256SUMS",
        r"flashinfer_cubin-0\.6\.3-py3-none-any\.whl",
        r"flashinfer_jit_cache-0\.6\.3\+cu130\.sm120f\.p[0-9a-f]{8}\.c[0-9a-f]{8}-py3-none-"
        r"manylinux_2_\d+_x86_64\.whl",
        r"flashinfer_python-0\.6\.3\+sm120\.p[0-9a-f]{8}-py3-none-any\.whl",
        r"requirements\.txt",
        r"sglang-0\.5\.9\+sm120\.p[0-9a-f]{8}-py3-none-any\.whl",
        r"sm120_build-0\.1\.0\+c[0-9a-f]{8}-py3-none-any\.whl",
    ]
    assert len(names) == len(patterns), names
    for name, pattern in zip(names, patterns, strict=True):
        assert re.fullmatch(pattern, name), name
    for line in (root / "wheelhouse" / "SHA256SUMS").read_text().splitlines():
        digest, name = line.split("  ")
        assert hashlib.sha256((root / "wheelhouse" / name).read_bytes()).hexdigest() == digest
    # Our four wheels by their own hashes, and the flashinfer-cubin companion by its pin.
    requirements = (root / "wheelhouse" / "requirements.txt").read_text()
    sums = dict(
        reversed(line.split("  "))
        for line in (root / "wheelhouse" / "SHA256SUMS").read_text().splitlines()
    )
    expected = {sums[name] for name in names if name.endswith(".whl")}
    expected |= set(load_pins(root / "pins.toml").companions["flashinfer-cubin"].sha256)
    assert set(re.findall(r"--hash=sha256:([0-9a-f]{64})", requirements)) == expected
    assert len(expected) == 5


def test_two_clean_builds_are_byte_identical(builds: Any) -> None:
    first, second = builds
    for project in ("flashinfer_jit_cache", "flashinfer_python", "sglang", "sm120_build"):
        a, b = wheel_of(first, project), wheel_of(second, project)
        assert a.name == b.name
        assert (
            hashlib.sha256(a.read_bytes()).hexdigest() == hashlib.sha256(b.read_bytes()).hexdigest()
        ), project


def test_jit_cache_wheel_holds_only_the_module_and_its_api(builds: Any) -> None:
    with zipfile.ZipFile(wheel_of(builds[0], "flashinfer_jit_cache")) as archive:
        package = sorted(n for n in archive.namelist() if ".dist-info/" not in n)
        licenses = sorted(n.rsplit("/", 1)[1] for n in archive.namelist() if "/licenses/" in n)
        metadata = next(
            archive.read(n).decode() for n in archive.namelist() if n.endswith("/METADATA")
        )
    assert package == [
        "flashinfer_jit_cache/__init__.py",
        "flashinfer_jit_cache/_build_meta.py",
        "flashinfer_jit_cache/jit_cache/trtllm_comm/trtllm_comm.so",
    ]
    # PEP 639: the texts of everything compiled in, and the expression naming them.
    assert licenses == [
        "CUTLASS-LICENSE.txt",
        "FlashInfer-LICENSE.txt",
        "fmt-LICENSE.rst",
        "spdlog-LICENSE.txt",
        "tvm-ffi-LICENSE.txt",
        "tvm-ffi-NOTICE.txt",
    ]
    assert "License-Expression: Apache-2.0 AND BSD-3-Clause AND MIT" in metadata


def test_provenance_records_inputs_toolkit_archs_and_flags(builds: Any, provenance: Any) -> None:
    flashinfer = PINS.upstream("flashinfer")
    assert provenance["upstream"]["sha256"] == flashinfer.sha256
    assert [p["file"].rsplit("/", 1)[1] for p in provenance["patches"]] == (
        (REPO / "patches/flashinfer/series").read_text().split()
    )
    for patch in provenance["patches"]:
        assert patch["sha256"] == hashlib.sha256((REPO / patch["file"]).read_bytes()).hexdigest()
    assert provenance["toolkit"]["cuda"].startswith("13.0.")
    assert provenance["archs"] == ["12.0f"]
    assert provenance["recipes"] == {"trtllm_comm": "flashinfer.jit.comm:gen_trtllm_comm_module()"}
    assert provenance["modules"] == {"trtllm_comm": "trtllm_comm"}
    assert len(provenance["compile_commands"]) == 3
    for project in ("flashinfer_python", "sglang"):
        with zipfile.ZipFile(wheel_of(builds[0], project)) as archive:
            (name,) = [n for n in archive.namelist() if n.endswith("/sm120-build.json")]
            record = json.loads(archive.read(name))
        assert record["upstream"]["project"] in ("flashinfer-python", "sglang")
        assert record["patches"]


def test_needed_libraries_are_met_by_a_driver_only_node(shared_object: Path) -> None:
    dynamic = subprocess.run(
        ["readelf", "--dynamic", str(shared_object)], capture_output=True, text=True, check=True
    ).stdout
    needed = re.findall(r"\(NEEDED\)\s+Shared library: \[(.+?)\]", dynamic)
    print("NEEDED:", needed)
    assert not [lib for lib in needed if "cudart" in lib or lib.startswith("libcuda.")]
    assert set(needed) <= {
        "libstdc++.so.6",
        "libgcc_s.so.1",
        "libc.so.6",
        "libm.so.6",
        "ld-linux-x86-64.so.2",
        "libdl.so.2",
        "libpthread.so.0",
        "librt.so.1",
    }


def test_platform_tag_matches_the_binarys_glibc_needs(builds: Any, shared_object: Path) -> None:
    versions = subprocess.run(
        ["readelf", "--version-info", "--wide", str(shared_object)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    newest = max(int(m) for m in re.findall(r"GLIBC_2\.(\d+)", versions))
    tag = parse_wheel_filename(wheel_of(builds[0], "flashinfer_jit_cache").name)[3]
    (platform,) = {t.platform for t in tag}
    # auditwheel's policy also weighs GLIBCXX/CXXABI, so the tag is at least the glibc need.
    major, minor = (int(part) for part in platform.split("_")[1:3])
    assert major == 2 and minor >= max(newest, 17), platform
    shown = subprocess.run(
        [
            sys.executable,
            "-m",
            "auditwheel",
            "show",
            str(wheel_of(builds[0], "flashinfer_jit_cache")),
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert f'"{platform}"' in shown


def cuda_tool(name: str) -> str:
    import nvidia

    for root in nvidia.__path__:
        for candidate in Path(root).glob(f"cu*/bin/{name}"):
            return str(candidate)
    pytest.fail(f"{name} is not installed (pins.toml [test] requirements)")


def elf_archs(shared_object: Path) -> list[str]:
    """The arch of each device ELF in a .so, as its cubin records it (sm_120f, sm_120a...)."""
    dump = subprocess.run(
        [cuda_tool("cuobjdump"), "--dump-elf", str(shared_object)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return re.findall(r"^arch = (\S+)$", dump, flags=re.MULTILINE)


def test_one_sm_120f_elf_per_translation_unit(shared_object: Path) -> None:
    """The default 12.0f: one family image that runs on 12.0 and 12.1 (README, "Which arch")."""
    assert elf_archs(shared_object) == ["sm_120f"] * 3


def test_lifted_guards_put_the_grid_dependency_wait_into_the_sass(shared_object: Path) -> None:
    """cudaGridDependencySynchronize() is ACQBULK in sm_120a/f SASS. Unpatched 0.6.3 has it in
    528 of its 1449 kernels (UPSTREAM-FACTS.md): every kernel of trtllm_allreduce.cuh's
    custom-allreduce path lacks it. With the bound lifted all kernels have it except the three
    lamport_initialize_kernel instances, which never wait on a predecessor."""
    env = dict(os.environ, PATH=f"{Path(cuda_tool('nvdisasm')).parent}:{os.environ['PATH']}")
    sass = subprocess.run(
        [cuda_tool("cuobjdump"), "--dump-sass", str(shared_object)],
        capture_output=True,
        text=True,
        check=True,
        env=env,
    ).stdout
    kernels = re.split(r"\n\s*Function : ", sass)[1:]
    names = {k.split("\n", 1)[0].strip(): k for k in kernels}
    without = sorted(name for name, body in names.items() if "ACQBULK" not in body)
    assert len(names) == 1449
    assert all("lamport_initialize_kernel" in name for name in without), without
    assert len(without) == 3
    lamport_norm = [n for n in names if "lamport_style_one_shot_all_reduce_norm_kernel" in n]
    assert lamport_norm and all("ACQBULK" in names[n] for n in lamport_norm)


def test_sglang_pins_are_met_by_what_we_ship(builds: Any) -> None:
    with zipfile.ZipFile(wheel_of(builds[0], "sglang")) as archive:
        (name,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        metadata = archive.read(name).decode()
    requirements = [
        Requirement(line.split(":", 1)[1].strip())
        for line in metadata.splitlines()
        if line.startswith("Requires-Dist:")
    ]
    by_name = {r.name.replace("_", "-"): r for r in requirements}
    ours = parse_wheel_filename(wheel_of(builds[0], "flashinfer_python").name)[1]
    assert by_name["flashinfer-python"].specifier.contains(ours)
    assert by_name["flashinfer-cubin"].specifier.contains(
        PINS.companions["flashinfer-cubin"].version
    )


def test_no_op_rebuild_takes_seconds_and_sglang_patch_does_not_recompile(
    builds: Any, tmp_path: Path
) -> None:
    # A copy of its own (cache included): the session's build stays as other tests see it.
    root = tmp_path / "project"
    shutil.copytree(builds[0], root, symlinks=True)
    started = time.monotonic()
    result = build_wheels(root)
    assert time.monotonic() - started < 60
    assert "reusing the cached build" in result.stderr
    kernel_before = wheel_of(root, "flashinfer_jit_cache").read_bytes()

    patch = root / "patches/sglang" / (root / "patches/sglang/series").read_text().split()[0]
    text = patch.read_text()
    patch.write_text(
        text.replace("Forwarded: not-needed", "Forwarded: not-needed\nLast-Update: 2026-12-02", 1)
    )
    started = time.monotonic()
    result = build_wheels(root)
    assert time.monotonic() - started < 60
    assert "reusing the cached build" in result.stderr
    assert "compiling" not in result.stderr
    assert wheel_of(root, "flashinfer_jit_cache").read_bytes() == kernel_before
    assert wheel_of(root, "sglang").name != wheel_of(builds[1], "sglang").name


def node_env(venv: Path, home: Path) -> dict[str, str]:
    return {
        "PATH": f"{venv / 'bin'}:/usr/bin:/bin",  # no CUDA toolkit on PATH
        "HOME": str(home),
        "PYTHONPATH": str(REPO / "src"),
        "FLASHINFER_DISABLE_JIT": "1",
    }


def node_check(
    venv: Path, tmp_path: Path, *args: str, cwd: Path | None = None
) -> tuple[int, str, dict[str, Any]]:
    """The node check as a node runs it: the venv's own `sm120-node-check` (from the
    wheelhouse's sm120-build wheel), no checkout on its path, no CUDA toolkit on PATH, JIT
    left for the tool to disable. Its exit status, output and JSON report."""
    out = tmp_path / "node_check.json"
    env = {"PATH": f"{venv / 'bin'}:/usr/bin:/bin", "HOME": str(tmp_path)}
    result = subprocess.run(
        [str(venv / "bin/sm120-node-check"), "--json", str(out), *args],
        env=env,
        cwd=cwd or tmp_path,
        capture_output=True,
        text=True,
    )
    report = json.loads(out.read_text()) if out.is_file() else {}
    return result.returncode, result.stdout + result.stderr, report


def jit_commands(venv: Path, tmp_path: Path, cuda_home: Path) -> dict[str, list[dict[str, Any]]]:
    """FlashInfer's own compile commands for every module the installed jit-cache records."""
    env = dict(node_env(venv, tmp_path), CUDA_HOME=str(cuda_home))
    env["FLASHINFER_CUDA_ARCH_LIST"] = "12.0f"
    result = subprocess.run(
        [str(venv / "bin/python"), str(REPO / "tests/jit_commands.py")],
        env=env,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    commands: dict[str, list[dict[str, Any]]] = json.loads(result.stdout)
    return commands


def make_node(wheelhouse: Path, venv: Path) -> Path:
    """A fresh virtual environment with the FlashInfer wheels (flashinfer-cubin among them),
    the node tools' wheel (sm120-build) and CPU torch."""
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    wheels = sorted(str(p) for p in wheelhouse.glob("flashinfer_*.whl"))
    wheels += sorted(str(p) for p in wheelhouse.glob("sm120_build-*.whl"))
    subprocess.run(
        [
            str(venv / "bin/python"),
            "-m",
            "pip",
            "install",
            "--quiet",
            *wheels,
            "torch==2.13.0",
        ],
        check=True,
    )
    return venv


@pytest.fixture(scope="module")
def node(builds: Any, module_tmp: Callable[[str], Path]) -> Path:
    return make_node(builds[0] / "wheelhouse", module_tmp("node") / "venv")


def test_node_loads_every_module_without_nvcc_or_jit(node: Path, tmp_path: Path) -> None:
    status, output, report = node_check(node, tmp_path, "--arch", "12.0")
    assert status == 0, output
    assert report["jit_compiles"] == 0
    assert [m["module"] for m in report["modules"]] == ["trtllm_comm"]
    assert all(m["aot"] and m["load_seconds"] < 30 for m in report["modules"])
    assert re.fullmatch(r"0\.6\.3\+sm120\.p[0-9a-f]{8}", report["versions"]["flashinfer-python"])
    assert report["archs"] == ["12.0f"]
    assert "sm_120 (--arch)" in output
    # DGX Spark (12.1) runs the 12.0f family image too.
    assert node_check(node, tmp_path, "--arch", "12.1")[0] == 0


def test_node_check_names_what_is_wrong(node: Path, tmp_path: Path) -> None:
    status, output, report = node_check(node, tmp_path, "--arch", "9.0")
    assert status == 1
    assert "has code for 12.0f, none of which runs on sm_90 (--arch)" in output
    # A profile the wheel does not carry: each missing module is named.
    status, output, report = node_check(
        node, tmp_path, "--arch", "12.0", "--profile", "sglang-sm120", cwd=REPO
    )
    assert status == 1
    assert "fused_moe_120 (fused_moe_120) would be JIT-compiled" in output
    assert report["jit_compiles"] == len(report["modules"]) - 1  # all but trtllm_comm


def test_flashinfer_refuses_a_jit_cache_of_another_patch_series(node: Path, tmp_path: Path) -> None:
    """Patch 0007: both versions carry our p<8 hex> label, and they differ."""
    (site,) = node.glob("lib/python3*/site-packages")
    meta = site / "flashinfer_jit_cache" / "_build_meta.py"
    original = meta.read_text()
    found = re.search(r'"(.+)"', original)
    assert found is not None
    version = found.group(1)
    try:
        meta.write_text(original.replace(version, re.sub(r"\.p[0-9a-f]{8}", ".p00000000", version)))
        status, output, _ = node_check(node, tmp_path, "--arch", "12.0")
    finally:
        meta.write_text(original)
    assert status == 1
    assert "were built from different patch series (p00000000, p" in output


# Flags on one side only, each with the reason it is there.
# (-D<module>_EXPORTS, CMake's shared-library export define, is unused by the sources.)
OURS_ONLY = {
    "-forward-unknown-to-host-compiler": "CMake's nvcc driver flag",
    "-x cu": "CMake names the language explicitly",
    "-Xcompiler=-ffile-prefix-map": "keeps build paths out of the binary (reproducibility)",
}
JIT_ONLY: dict[str, str] = {}  # nothing: every flag FlashInfer's JIT passes, we pass


def canonical_flags(argv: list[str]) -> set[str]:
    """Flags, with include paths reduced to what they point at and spellings unified."""
    flags: set[str] = set()
    words = iter(argv[1:])
    for word in words:
        if word in ("-c", "-o", "-MT", "-MF"):
            next(words)
            continue
        if word.endswith((".cu", ".cpp")) or word in ("-MD", "-MMD"):
            continue
        if word == "-isystem" or word.startswith("-isystem "):
            path = next(words) if word == "-isystem" else word.split(" ", 1)[1]
            flags.add("-isystem " + canonical_include(path))
        elif word.startswith("--generate-code=arch="):
            generate = re.match(r"--generate-code=arch=(\w+),code=\[(\w+)\]", word)
            assert generate is not None
            arch, code = generate.groups()
            flags.add(f"-gencode=arch={arch},code={code}")
        elif word.startswith("-I"):
            flags.add("-I " + canonical_tree_path(word[2:] or next(words)))
        elif word == "-Xcompiler=-fPIC":
            flags.add("--compiler-options=-fPIC")
        elif word == "-x":
            flags.add("-x " + next(words))
        elif word.startswith(("-Xcompiler=-ffile-prefix-map", "-ffile-prefix-map")):
            flags.add("-Xcompiler=-ffile-prefix-map")
        elif word.startswith("--threads="):
            flags.add("--threads")
        else:
            flags.add(word)
    return flags


# The FlashInfer trees a path can live in, reduced to one name: our build's sources
# ($FLASHINFER, 3rdparty/ at the top) and generated files, or an installed flashinfer's
# data/ links and its JIT workspace.
_TREES = (
    (re.compile(r"^\$FLASHINFER/3rdparty/"), "flashinfer:"),
    (re.compile(r"^\$FLASHINFER/"), "flashinfer:"),
    (re.compile(r"^.*/flashinfer/data/"), "flashinfer:"),
    (re.compile(r"^.*/\.cache/flashinfer/[^/]+/[^/]+/generated/"), "generated:"),
)


def canonical_tree_path(path: str) -> str:
    for pattern, name in _TREES:
        if pattern.match(path):
            return pattern.sub(name, path)
    return path


def canonical_include(path: str) -> str:
    for suffix, name in (
        ("include/cccl", "cuda/cccl"),
        ("cutlass/tools/util/include", "cutlass-util"),
        ("cutlass/include", "cutlass"),
        ("spdlog/include", "spdlog"),
        ("tvm_ffi/include", "tvm"),
        ("$TVM_FFI", "tvm"),
        ("csrc", "csrc"),
    ):
        if path.rstrip("/").endswith(suffix):
            return name
    if re.search(r"/include/python3\.\d+$", path) or path == "$PYTHON_INCLUDE":
        return "python"
    if path.endswith("/include") and ("CUDA_HOME" in path or "toolkits" in path or "/cuda" in path):
        return "cuda"
    if path.endswith("include"):
        return "flashinfer"
    return path


def module_of(argv: list[str]) -> str:
    """The CMake target (= FlashInfer module) a recorded compile command belongs to."""
    found = re.search(r"CMakeFiles/([^/]+?)\.dir", argv[argv.index("-o") + 1])
    assert found is not None
    return found.group(1)


def assert_flags_match_the_jit(
    provenance: dict[str, Any], jit: dict[str, list[dict[str, Any]]]
) -> None:
    """Every translation unit of every module: our command against FlashInfer's own."""
    ours: dict[tuple[str, str], set[str]] = {}
    for argv in provenance["compile_commands"]:
        source = next(
            a for a in argv if a.endswith((".cu", ".cpp")) and argv[argv.index(a) - 1] == "-c"
        )
        ours[(module_of(argv), Path(source).name)] = canonical_flags(argv)
    theirs = {
        (module, Path(command["file"]).name): canonical_flags(command["command"].split(" "))
        for module, commands in jit.items()
        for command in commands
    }
    assert sorted(ours) == sorted(theirs)
    for key, flags in theirs.items():
        assert ours[key] - flags <= set(OURS_ONLY) | {f"-D{key[0]}_EXPORTS"}, key
        assert flags - ours[key] <= set(JIT_ONLY), key


def test_compile_flags_match_flashinfers_own_jit_build(
    node: Path, provenance: dict[str, Any], builds: Any, tmp_path: Path
) -> None:
    toolkit_home = next((builds[0] / ".cache" / "toolkits").glob("*/home"))
    jit = jit_commands(node, tmp_path, toolkit_home)
    assert sorted(jit) == ["trtllm_comm"]
    assert_flags_match_the_jit(provenance, jit)


def refused_build(root: Path, *args: str) -> str:
    env = dict(os.environ, SM120_CACHE_DIR=str(root / ".cache"))
    result = subprocess.run(
        [sys.executable, "-m", "sm120_build", "build-wheels", *args],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 1, result.stderr
    assert "compiling" not in result.stderr
    return result.stderr


def test_system_toolkit_that_cannot_build_the_arch_is_refused_before_compiling(
    builds: Any, tmp_path: Path
) -> None:
    root = builds[0]
    before = sorted(p.name for p in (root / "wheelhouse").iterdir())
    toolkit_home = next((root / ".cache" / "toolkits").glob("*/home"))
    assert "cannot build 13.0a" in refused_build(
        root, "--arch", "13.0a", "--cuda-home", str(toolkit_home)
    )
    assert "does not exist" in refused_build(root, "--cuda-home", str(tmp_path / "no-cuda"))
    assert "expected MAJOR.MINOR" in refused_build(root, "--arch", "sm_120")
    assert sorted(p.name for p in (root / "wheelhouse").iterdir()) == before


def record_rows(wheel: Path) -> list[list[str]]:
    """RECORD parsed by the csv module on its own, checked against the archive."""
    import base64
    import csv
    import io

    with zipfile.ZipFile(wheel) as archive:
        (name,) = [n for n in archive.namelist() if n.endswith(".dist-info/RECORD")]
        rows = list(csv.reader(io.StringIO(archive.read(name).decode())))
        assert all(len(row) == 3 for row in rows), wheel.name
        assert sorted(row[0] for row in rows) == sorted(archive.namelist())
        for path, digest, size in rows:
            if path == name:
                continue
            data = archive.read(path)
            expected = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
            assert digest == f"sha256={expected.decode()}" and int(size) == len(data), path
    return rows


def test_every_wheel_has_a_valid_record(builds: Any) -> None:
    for project in ("flashinfer_jit_cache", "flashinfer_python", "sglang"):
        rows = record_rows(wheel_of(builds[0], project))
        if project == "sglang":  # sglang ships file names with commas; they must survive
            assert any("," in row[0] for row in rows)


@pytest.mark.parametrize("installer", ["pip", "uv"])
def test_node_command_installs_from_the_wheelhouse_alone(
    builds: Any, tmp_path: Path, installer: str
) -> None:
    """README's node command, as written: our wheels from the wheelhouse (--find-links),
    flashinfer-cubin from the index pip is configured with, every file hash-checked."""
    wheelhouse = builds[0] / "wheelhouse"
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = venv / "bin/python"
    requirements = str(wheelhouse / "requirements.txt")
    if installer == "pip":
        command = [str(python), "-m", "pip", "install", "--quiet"]
    else:
        command = [sys.executable, "-m", "uv", "pip", "install", "--python", str(python)]
    command += [
        "--require-hashes",
        "--no-deps",
        "--find-links",
        str(wheelhouse),
        "-r",
        requirements,
    ]
    result = subprocess.run(command, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "RECORD" not in result.stderr  # pip warns about a bad RECORD; uv refuses
    versions = installed_versions(python)
    for line in Path(requirements).read_text().splitlines():
        if "==" in line and not line.startswith("#"):
            name, version = line.split(" ")[0].split("==")
            assert versions[canonicalize_name(name)] == version, name


# --- small modules beyond trtllm_comm: norm and fp4_quantization_120 ----------------------

SMALL = ("--module", "norm", "--module", "fp4_quantization_120")


@dataclass(frozen=True)
class WarmRebuild:
    cold_wheel: bytes  # the jit-cache wheel of the cold build
    from_modules: str  # the output of a rebuild with the wheel cache dropped
    from_modules_wheel: bytes  # and its jit-cache wheel
    stderr: str  # the output of a rebuild with the module cache dropped too


@pytest.fixture(scope="module")
def small_with_rebuild(module_tmp: Callable[[str], Path]) -> tuple[Path, WarmRebuild]:
    """norm + fp4_quantization_120, built with a cache of their own; then in a fresh build
    tree with the wheel cache entry dropped (the modules come from the module cache); then
    with the module cache dropped too (every unit from the same, warm, sccache)."""
    root = fresh_root(module_tmp("small"))
    artifacts = root / ".cache" / "artifacts"
    build_wheels(root, *SMALL)
    cold = wheel_of(root, "flashinfer_jit_cache").read_bytes()
    shutil.rmtree(artifacts / "jit-cache")
    from_modules = build_wheels(root, *SMALL).stderr
    from_modules_wheel = wheel_of(root, "flashinfer_jit_cache").read_bytes()
    shutil.rmtree(artifacts / "jit-cache")
    shutil.rmtree(artifacts / "modules")
    stderr = build_wheels(root, *SMALL).stderr
    return root, WarmRebuild(cold, from_modules, from_modules_wheel, stderr)


@pytest.fixture(scope="module")
def small(small_with_rebuild: tuple[Path, WarmRebuild]) -> Path:
    return small_with_rebuild[0]


@pytest.fixture(scope="module")
def small_node(small: Path, module_tmp: Callable[[str], Path]) -> Path:
    return make_node(small / "wheelhouse", module_tmp("small-node") / "venv")


def provenance_of(wheel: Path) -> dict[str, Any]:
    with zipfile.ZipFile(wheel) as archive:
        (name,) = [n for n in archive.namelist() if n.endswith(".dist-info/sm120-build.json")]
        found: dict[str, Any] = json.loads(archive.read(name))
        return found


def extracted(wheel: Path, target: Path) -> dict[str, Path]:
    """module name -> its .so, unpacked under target."""
    with zipfile.ZipFile(wheel) as archive:
        names = [n for n in archive.namelist() if n.endswith(".so")]
        return {Path(n).stem: Path(archive.extract(n, target)) for n in names}


def test_small_modules_carry_the_archs_flashinfer_gives_them(small: Path, tmp_path: Path) -> None:
    modules = extracted(wheel_of(small, "flashinfer_jit_cache"), tmp_path)
    assert sorted(modules) == ["fp4_quantization_120", "norm"]
    assert elf_archs(modules["norm"]) == ["sm_120f"] * 2  # follows --arch
    assert elf_archs(modules["fp4_quantization_120"]) == ["sm_120a"]  # FlashInfer pins 120a
    for name, expected in (("norm", "RMSNorm"), ("fp4_quantization_120", "cvt_fp16_to_fp4")):
        sass = subprocess.run(
            [cuda_tool("cuobjdump"), "--dump-sass", str(modules[name])],
            capture_output=True,
            text=True,
            check=True,
            env=dict(os.environ, PATH=f"{Path(cuda_tool('nvdisasm')).parent}:{os.environ['PATH']}"),
        ).stdout
        kernels = re.findall(r"Function : (\S+)", sass)
        assert kernels and any(expected in k for k in kernels), (name, kernels[:5])
        assert all(re.search(r"\bEXIT\b", body) for body in re.split(r"Function : ", sass)[1:])


def test_small_modules_flags_match_flashinfers_own_jit_build(
    small: Path, small_node: Path, tmp_path: Path
) -> None:
    toolkit_home = next((small / ".cache" / "toolkits").glob("*/home"))
    jit = jit_commands(small_node, tmp_path, toolkit_home)
    assert sorted(jit) == ["fp4_quantization_120", "norm"]
    assert_flags_match_the_jit(provenance_of(wheel_of(small, "flashinfer_jit_cache")), jit)


def test_small_modules_load_on_the_node_without_jit(small_node: Path, tmp_path: Path) -> None:
    status, output, report = node_check(small_node, tmp_path, "--arch", "12.0")
    assert status == 0, output
    assert sorted(m["module"] for m in report["modules"]) == ["fp4_quantization_120", "norm"]
    assert report["jit_compiles"] == 0


def sccache_counts(stderr: str) -> tuple[int, int]:
    match = re.search(r"sccache: (\d+) hits, (\d+) misses", stderr)
    assert match, stderr[-3000:]
    return int(match.group(1)), int(match.group(2))


def test_a_fresh_build_tree_compiles_nothing_from_a_warm_sccache(
    small_with_rebuild: tuple[Path, WarmRebuild],
) -> None:
    """The wheel cache dropped and a new build tree, the same cache directory: every
    translation unit comes from sccache, and the wheel is the same bytes."""
    root, rebuild = small_with_rebuild
    hits, misses = sccache_counts(rebuild.stderr)
    units = len(provenance_of(wheel_of(root, "flashinfer_jit_cache"))["compile_commands"])
    # sccache caches nvcc's steps (host, PTX, cubin) one by one: at least one hit per unit.
    assert misses == 0 and hits >= units, (hits, misses, units)
    assert wheel_of(root, "flashinfer_jit_cache").read_bytes() == rebuild.cold_wheel


def test_modules_built_before_are_not_compiled_again(
    small_with_rebuild: tuple[Path, WarmRebuild],
) -> None:
    """The wheel cache dropped: both modules come from the module cache, nothing reaches
    the compiler, and the wheel is the same bytes."""
    _, rebuild = small_with_rebuild
    assert "2 of 2 module(s) built before from the same inputs" in rebuild.from_modules
    assert "no module to compile" in rebuild.from_modules
    assert "sccache:" not in rebuild.from_modules
    assert rebuild.from_modules_wheel == rebuild.cold_wheel


def test_overlay_keeps_base_modules_and_records_the_base(small: Path, tmp_path: Path) -> None:
    """A base wheel this pipeline built (norm + fp4_quantization_120) under a build of
    norm + rope: rope and norm are ours, fp4_quantization_120 comes from the base."""
    base = wheel_of(small, "flashinfer_jit_cache")
    root = fresh_root(tmp_path)
    env_cache = small / ".cache"  # shares the toolkit and sccache; builds nothing of small's
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "sm120_build",
            "build-wheels",
            "--module",
            "norm",
            "--module",
            "rope",
            "--base-jit-cache",
            str(base),
        ],
        cwd=root,
        env=dict(os.environ, SM120_CACHE_DIR=str(env_cache)),
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    merged = wheel_of(root, "flashinfer_jit_cache")
    assert sorted(extracted(merged, tmp_path / "x")) == ["fp4_quantization_120", "norm", "rope"]
    record = provenance_of(merged)
    assert record["base_jit_cache"] == {
        "wheel": base.name,
        "sha256": hashlib.sha256(base.read_bytes()).hexdigest(),
        "modules": ["fp4_quantization_120"],
    }
    assert record["modules"] == {"norm": "norm", "rope": "rope"}
    assert "kept 1 module(s) of" in result.stderr
    assert "1 of 2 module(s) built before" in result.stderr  # norm; rope is compiled
    record_rows(merged)  # RECORD still lists every file with its hash


# --- patch 0008 (FlashInfer PR 2780): CUTLASS grid-dependency control in the machine code ---

FP4_GEMM = ("--module", "fp4_gemm_cutlass_sm120")
GDC_PATCH = "0008-build-the-cutlass-gemm-modules-with-grid-dependenc.patch"


@dataclass(frozen=True)
class GridDependencyCounts:
    kernels: int
    waiting: int  # kernels with ACQBULK: cudaGridDependencySynchronize / griddepcontrol.wait
    triggering: int  # kernels with PREEXIT: griddepcontrol.launch_dependents


def grid_dependency_counts(shared_object: Path) -> GridDependencyCounts:
    sass = subprocess.run(
        [cuda_tool("cuobjdump"), "--dump-sass", str(shared_object)],
        capture_output=True,
        text=True,
        check=True,
        env=dict(os.environ, PATH=f"{Path(cuda_tool('nvdisasm')).parent}:{os.environ['PATH']}"),
    ).stdout
    kernels = re.split(r"\n\s*Function : ", sass)[1:]
    return GridDependencyCounts(
        len(kernels),
        sum("ACQBULK" in body for body in kernels),
        sum("PREEXIT" in body for body in kernels),
    )


@pytest.fixture(scope="module")
def fp4_gemm_both_ways(module_tmp: Callable[[str], Path]) -> dict[str, Path]:
    """fp4_gemm_cutlass_sm120 built from this series and from it without patch 0008, sharing
    one toolkit and compiler cache; their .so files by variant."""
    patched = fresh_root(module_tmp("fp4-gemm"))
    build_wheels(patched, *FP4_GEMM)
    unpatched = fresh_root(module_tmp("fp4-gemm-unpatched"))
    series = unpatched / "patches" / "flashinfer" / "series"
    names = series.read_text().splitlines()
    assert GDC_PATCH in names
    series.write_text("".join(f"{name}\n" for name in names if name != GDC_PATCH))
    result = subprocess.run(
        [sys.executable, "-m", "sm120_build", "build-wheels", *FP4_GEMM],
        cwd=unpatched,
        env=dict(os.environ, SM120_CACHE_DIR=str(patched / ".cache")),
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    target = module_tmp("fp4-gemm-so")
    return {
        variant: extracted(wheel_of(root, "flashinfer_jit_cache"), target / variant)[
            "fp4_gemm_cutlass_sm120"
        ]
        for variant, root in (("patched", patched), ("unpatched", unpatched))
    }


def test_fp4_gemm_kernels_wait_and_trigger_only_with_patch_0008(
    fp4_gemm_both_ways: dict[str, Path],
) -> None:
    """Without -DCUTLASS_ENABLE_GDC_FOR_SM100=1, CUTLASS compiles wait_on_dependent_grids()
    to nothing although the GEMMs launch with PDL (issue 2708): no kernel waits. With patch
    0008 every kernel of the module does (ACQBULK). Neither build has an explicit trigger
    (PREEXIT): these kernels call launch_dependent_grids() only under
    CUTLASS_ENABLE_GDC_FOR_SM90, which upstream leaves out because it breaks the sm120
    build, so dependents launch when the GEMM exits (later, never early)."""
    patched = grid_dependency_counts(fp4_gemm_both_ways["patched"])
    unpatched = grid_dependency_counts(fp4_gemm_both_ways["unpatched"])
    print(f"fp4_gemm_cutlass_sm120: patched {patched}, unpatched {unpatched}")
    assert patched.kernels == unpatched.kernels > 0
    assert unpatched.waiting == 0
    assert patched.waiting == patched.kernels
    assert patched.triggering == unpatched.triggering == 0


# --- sharded builds (ci/github/workflows/release.yml): N shards merge to the same bytes -----

THREE = ("--module", "norm", "--module", "cascade", "--module", "fp4_quantization_120")


def sm120_build(root: Path, cache: Path, *args: str) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [sys.executable, "-m", "sm120_build", *args],
        cwd=root,
        env=dict(os.environ, SM120_CACHE_DIR=str(cache)),
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result


@pytest.fixture(scope="module")
def three_modules(small: Path, module_tmp: Callable[[str], Path]) -> Path:
    """One machine's build of norm + cascade + fp4_quantization_120 (small's cache: norm
    and fp4_quantization_120 from the module cache, cascade compiled)."""
    root = fresh_root(module_tmp("three"))
    result = sm120_build(root, small / ".cache", "build-wheels", *THREE)
    assert "2 of 3 module(s) built before" in result.stderr
    return root


@pytest.mark.parametrize("count", [2, 3])
def test_shards_merge_to_the_single_machine_wheelhouse_byte_for_byte(
    three_modules: Path, small: Path, tmp_path: Path, count: int
) -> None:
    """Each shard in its own project copy (as on its own machine), shards/ gathered as CI's
    artifacts are, then merged: every file of wheelhouse/ is the same bytes."""
    merge_root = fresh_root(tmp_path / "merge")
    for index in range(1, count + 1):
        root = fresh_root(tmp_path / f"shard{index}")
        # Each shard compiles its modules, as on a machine of its own: only sccache is
        # shared (a module cache entry would make the merge compare stored copies).
        shutil.rmtree(small / ".cache" / "artifacts" / "modules", ignore_errors=True)
        result = sm120_build(
            root, small / ".cache", "build-shard", *THREE, "--shard", f"{index}/{count}"
        )
        assert f"shard {index}/{count}:" in result.stderr
        shutil.copytree(root / "shards", merge_root / "shards", dirs_exist_ok=True)
    records = [
        json.loads(p.read_text()) for p in sorted((merge_root / "shards").glob("*/shard.json"))
    ]
    built = [sorted(record["modules"]) for record in records]
    assert sorted(name for names in built for name in names) == [
        "cascade",
        "fp4_quantization_120",
        "norm",
    ]
    assert all(built)  # the plan leaves no shard empty
    sm120_build(merge_root, small / ".cache", "merge-shards")
    single = sorted((three_modules / "wheelhouse").iterdir())
    merged = sorted((merge_root / "wheelhouse").iterdir())
    assert [p.name for p in merged] == [p.name for p in single]
    for ours, theirs in zip(merged, single, strict=True):
        if ours.name.endswith(".intoto.jsonl"):  # provenance: each run's own times and id
            assert envelope_subject(ours) == envelope_subject(theirs), ours.name
            continue
        assert ours.read_bytes() == theirs.read_bytes(), ours.name


def test_plan_shards_gives_ci_its_matrix_and_the_plan_the_shards_follow(
    small: Path, tmp_path: Path
) -> None:
    root = fresh_root(tmp_path)
    output = tmp_path / "github-output"
    result = sm120_build(
        root,
        small / ".cache",
        "plan-shards",
        *THREE,
        "--shards",
        "2",
        "--github-output",
        str(output),
    )
    assert output.read_text() == "indices=[1, 2]\ncount=2\n"
    # ci/module-costs.json: fp4_quantization_120 (34.9 s) alone, norm (29.5) + cascade (14.7)
    table = result.stdout.splitlines()
    assert table[1].split()[:3] == ["1", "1", "7"] and "fp4_quantization_120" in table[1]
    assert table[2].split()[:3] == ["2", "2", "4"]


def test_the_sglang_profile_renders_only_modules_sm12x_gpus_run(
    small: Path, tmp_path: Path
) -> None:
    # Rendering refuses a module no requested arch runs; aot.py's FA3 attention-sink
    # variants (sm_90a whatever the list) would be such modules, so the profile leaves them out.
    root = fresh_root(tmp_path)
    result = sm120_build(
        root, small / ".cache", "plan-shards", "--profile", "sglang-sm120", "--shards", "1"
    )
    # Upstream's set (244 modules, 1459 units) less gemm_sm120, rope, the four sink modules
    # and the twelve mixed bf16/fp16 BatchAttention modules (wrong results), plus the MLA
    # ragged prefill and the quantization module.
    assert result.stdout.splitlines()[1].split()[:3] == ["1", "228", "1337"]


def test_merge_refuses_an_incomplete_set_and_writes_nothing(small: Path, tmp_path: Path) -> None:
    root = fresh_root(tmp_path)
    sm120_build(root, small / ".cache", "build-shard", *THREE, "--shard", "2/3")
    result = subprocess.run(
        [sys.executable, "-m", "sm120_build", "merge-shards"],
        cwd=root,
        env=dict(os.environ, SM120_CACHE_DIR=str(small / ".cache")),
        capture_output=True,
        text=True,
    )
    assert result.returncode == 1
    assert "shards 1, 3 of 3 are missing" in result.stderr
    assert not (root / "wheelhouse").exists()
