"""Integration: the whole main job, twice from clean, then the wheels on a simulated node.

Slow: two sm_120a compiles (about 3 minutes each on 2 cores) and a fresh virtual
environment with CPU torch, flashinfer-cubin and the built wheels.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename

from sm120_build.pins import load as load_pins

from .conftest import REPO, build_wheels, fresh_root

pytestmark = pytest.mark.slow
PINS = load_pins(REPO / "pins.toml")


def wheel_of(root: Path, project: str) -> Path:
    (found,) = (root / "wheelhouse").glob(f"{project}-*.whl")
    return found


@pytest.fixture(scope="module")
def builds(built_project: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Two clean builds of the default configuration, in different directories."""
    second = fresh_root(tmp_path_factory.mktemp("second"))
    build_wheels(second)
    return built_project, second


@pytest.fixture(scope="module")
def provenance(builds: tuple[Path, Path]) -> dict:
    with zipfile.ZipFile(wheel_of(builds[0], "flashinfer_jit_cache")) as archive:
        (name,) = [n for n in archive.namelist() if n.endswith(".dist-info/sm120-build.json")]
        return json.loads(archive.read(name))


@pytest.fixture(scope="module")
def shared_object(builds: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    with zipfile.ZipFile(wheel_of(builds[0], "flashinfer_jit_cache")) as archive:
        target = tmp_path_factory.mktemp("so")
        return Path(
            archive.extract("flashinfer_jit_cache/jit_cache/trtllm_comm/trtllm_comm.so", target)
        )


def test_wheelhouse_holds_exactly_three_wheels_and_their_hashes(builds) -> None:
    root = builds[0]
    names = sorted(p.name for p in (root / "wheelhouse").iterdir())
    patterns = [
        r"SHA256SUMS",
        r"flashinfer_jit_cache-0\.6\.3\+cu130\.sm120a\.p[0-9a-f]{8}-py3-none-"
        r"manylinux_2_\d+_x86_64\.whl",
        r"flashinfer_python-0\.6\.3\+sm120\.p[0-9a-f]{8}-py3-none-any\.whl",
        r"requirements\.txt",
        r"sglang-0\.5\.9\+sm120\.p[0-9a-f]{8}-py3-none-any\.whl",
    ]
    assert len(names) == len(patterns), names
    for name, pattern in zip(names, patterns, strict=True):
        assert re.fullmatch(pattern, name), name
    for line in (root / "wheelhouse" / "SHA256SUMS").read_text().splitlines():
        digest, name = line.split("  ")
        assert hashlib.sha256((root / "wheelhouse" / name).read_bytes()).hexdigest() == digest
    # Our three wheels by their own hashes, and the flashinfer-cubin companion by its pin.
    requirements = (root / "wheelhouse" / "requirements.txt").read_text()
    sums = dict(
        reversed(line.split("  "))
        for line in (root / "wheelhouse" / "SHA256SUMS").read_text().splitlines()
    )
    expected = {sums[name] for name in names if name.endswith(".whl")}
    expected |= set(load_pins(root / "pins.toml").companions["flashinfer-cubin"].sha256)
    assert set(re.findall(r"--hash=sha256:([0-9a-f]{64})", requirements)) == expected
    assert len(expected) == 4


def test_two_clean_builds_are_byte_identical(builds) -> None:
    first, second = builds
    for project in ("flashinfer_jit_cache", "flashinfer_python", "sglang"):
        a, b = wheel_of(first, project), wheel_of(second, project)
        assert a.name == b.name
        assert (
            hashlib.sha256(a.read_bytes()).hexdigest() == hashlib.sha256(b.read_bytes()).hexdigest()
        ), project


def test_jit_cache_wheel_holds_only_the_module_and_its_api(builds) -> None:
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


def test_provenance_records_inputs_toolkit_archs_and_flags(builds, provenance) -> None:
    flashinfer = PINS.upstream("flashinfer")
    assert provenance["upstream"]["sha256"] == flashinfer.sha256
    assert [p["file"].rsplit("/", 1)[1] for p in provenance["patches"]] == (
        (REPO / "patches/flashinfer/series").read_text().split()
    )
    for patch in provenance["patches"]:
        assert patch["sha256"] == hashlib.sha256((REPO / patch["file"]).read_bytes()).hexdigest()
    assert provenance["toolkit"]["cuda"].startswith("13.0.")
    assert provenance["archs"] == ["12.0a"]
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


def test_platform_tag_matches_the_binarys_glibc_needs(builds, shared_object: Path) -> None:
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


def test_one_sm_120a_elf_per_translation_unit(shared_object: Path) -> None:
    listing = subprocess.run(
        [cuda_tool("cuobjdump"), "--list-elf", str(shared_object)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    elves = re.findall(r"ELF file\s+\d+: (\S+)", listing)
    assert len(elves) == 3, listing
    assert all(elf.endswith(".sm_120a.cubin") for elf in elves), listing


def test_lifted_guards_put_the_grid_dependency_wait_into_the_sass(shared_object: Path) -> None:
    """cudaGridDependencySynchronize() is ACQBULK in sm_120a SASS. Unpatched 0.6.3 has it in
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


def test_sglang_pins_are_met_by_what_we_ship(builds) -> None:
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
    builds, tmp_path: Path
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
    assert "compiling trtllm_comm" not in result.stderr
    assert wheel_of(root, "flashinfer_jit_cache").read_bytes() == kernel_before
    assert wheel_of(root, "sglang").name != wheel_of(builds[1], "sglang").name


def node_check(venv: Path, out: Path, **extra: str) -> dict:
    env = {
        "PATH": f"{venv / 'bin'}:/usr/bin:/bin",  # no CUDA toolkit on PATH
        "HOME": str(out.parent),
        "FLASHINFER_DISABLE_JIT": "1",
        "FLASHINFER_CUDA_ARCH_LIST": "12.0a",
        "NODE_CHECK_OUT": str(out),
        **extra,
    }
    args = ["--compile-commands"] if "CUDA_HOME" in extra else []
    result = subprocess.run(
        [str(venv / "bin/python"), str(REPO / "tests/node_check.py"), *args],
        env=env,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def node(builds, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh virtual environment with the wheels, flashinfer-cubin and CPU torch."""
    venv = tmp_path_factory.mktemp("node") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    wheels = sorted(
        str(p) for p in (builds[0] / "wheelhouse").glob("*.whl") if not p.name.startswith("sglang")
    )
    subprocess.run(
        [
            str(venv / "bin/python"),
            "-m",
            "pip",
            "install",
            "--quiet",
            *wheels,
            f"flashinfer-cubin=={PINS.companions['flashinfer-cubin'].version}",
            "torch==2.13.0",
        ],
        check=True,
    )
    return venv


def test_node_loads_the_aot_module_without_nvcc_or_jit(node: Path, tmp_path: Path) -> None:
    report = node_check(node, tmp_path / "report.json")
    assert report["nvcc_on_path"] is None
    assert re.fullmatch(r"0\.6\.3\+sm120\.p[0-9a-f]{8}", report["flashinfer"])
    assert report["cubin"] == "0.6.3"
    assert report["aot_dir"] == report["jit_cache_dir"]
    assert report["is_aot"]
    assert Path(report["aot_path"]).is_relative_to(report["jit_cache_dir"])
    assert report["gencode"] == ["-gencode=arch=compute_120a,code=sm_120a"]
    assert report["loaded_functions"] == [
        "trtllm_allreduce_fusion",
        "trtllm_custom_all_reduce",
        "trtllm_moe_allreduce_fusion",
    ]


# Flags on one side only, each with the reason it is there.
OURS_ONLY = {
    "-forward-unknown-to-host-compiler": "CMake's nvcc driver flag",
    "-Dtrtllm_comm_EXPORTS": "CMake's shared-library export define, unused by the sources",
    "-x cu": "CMake names the language explicitly",
    "-Xcompiler=-ffile-prefix-map": "keeps build paths out of the binary (reproducibility)",
}
JIT_ONLY = {
    "-Wno-switch-bool": "host-only C++ flag for .cpp sources; trtllm_comm has none",
}


def canonical_flags(argv: list[str]) -> set[str]:
    """Flags, with include paths reduced to what they point at and spellings unified."""
    flags: set[str] = set()
    words = iter(argv[1:])
    for word in words:
        if word in ("-c", "-o"):
            next(words)
            continue
        if word.endswith(".cu"):
            continue
        if word == "-isystem" or word.startswith("-isystem "):
            path = next(words) if word == "-isystem" else word.split(" ", 1)[1]
            flags.add("-isystem " + canonical_include(path))
        elif word.startswith("--generate-code=arch="):
            arch, code = re.match(r"--generate-code=arch=(\w+),code=\[(\w+)\]", word).groups()
            flags.add(f"-gencode=arch={arch},code={code}")
        elif word == "-Xcompiler=-fPIC":
            flags.add("--compiler-options=-fPIC")
        elif word == "-x":
            flags.add("-x " + next(words))
        elif word.startswith("-Xcompiler=-ffile-prefix-map"):
            flags.add("-Xcompiler=-ffile-prefix-map")
        elif word.startswith("--threads="):
            flags.add("--threads")
        else:
            flags.add(word)
    return flags


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


def test_compile_flags_match_flashinfers_own_jit_build(
    node: Path, provenance: dict, builds, tmp_path: Path
) -> None:
    toolkit_home = next((builds[0] / ".cache" / "toolkits").glob("*/home"))
    report = node_check(node, tmp_path / "jit.json", CUDA_HOME=str(toolkit_home))
    jit = {
        Path(c["file"]).name: canonical_flags(c["command"].split(" "))
        for c in report["compile_commands"]
    }
    ours = {
        Path(argv[argv.index("-c") + 1]).name: canonical_flags(argv)
        for argv in provenance["compile_commands"]
    }
    assert (
        sorted(jit)
        == sorted(ours)
        == ["trtllm_allreduce.cu", "trtllm_allreduce_fusion.cu", "trtllm_moe_allreduce_fusion.cu"]
    )
    for source in jit:
        assert ours[source] - jit[source] == set(OURS_ONLY), source
        assert jit[source] - ours[source] <= set(JIT_ONLY), source


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
    assert "compiling trtllm_comm" not in result.stderr
    return result.stderr


def test_system_toolkit_that_cannot_build_the_arch_is_refused_before_compiling(
    builds, tmp_path: Path
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


def test_every_wheel_has_a_valid_record(builds) -> None:
    for project in ("flashinfer_jit_cache", "flashinfer_python", "sglang"):
        rows = record_rows(wheel_of(builds[0], project))
        if project == "sglang":  # sglang ships file names with commas; they must survive
            assert any("," in row[0] for row in rows)


def installed_versions(python: Path) -> dict[str, str]:
    listing = subprocess.run(
        [str(python), "-m", "pip", "list", "--format=freeze"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return {
        canonicalize_name(name): version
        for name, version in (line.split("==") for line in listing.split() if "==" in line)
    }


@pytest.mark.parametrize("installer", ["pip", "uv"])
def test_node_command_installs_from_the_wheelhouse_alone(
    builds, tmp_path: Path, installer: str
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
