"""The host CPUs a build can target (hosts.py), and what --platform is refused for before
anything is fetched: an unknown host, missing cross compilers, a stack without the host's
pinned runtime, a system toolkit. The cross-build itself: test_cross_aarch64.py."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from sm120_build import hosts, pins
from sm120_build.glibc import manylinux_platforms
from sm120_build.toolkit import cross_toolkit, probe

from .conftest import REPO, fresh_root, refusal

CROSS = shutil.which("aarch64-linux-gnu-gcc")
needs_cross = pytest.mark.skipif(
    CROSS is None, reason="needs the aarch64 cross compiler (Debian: g++-aarch64-linux-gnu)"
)


def shared_object(tmp_path: Path, compiler: str) -> Path:
    source = tmp_path / "one.c"
    source.write_text("int one(void) { return 1; }\n")
    out = tmp_path / f"one-{Path(compiler).name}.so"
    subprocess.run([compiler, "-shared", "-fPIC", "-o", str(out), str(source)], check=True)
    return out


def test_a_known_host_parses_and_an_unknown_one_is_refused_with_the_list() -> None:
    assert hosts.parse("aarch64").elf_machine == 183
    assert hosts.parse("x86_64").cross_package == "g++-x86-64-linux-gnu"
    message = refusal(hosts.parse, "ppc64le")
    assert message == (
        "--platform 'ppc64le': the build can target x86_64, aarch64 hosts; give one of them"
    )


def test_elf_machine_reads_the_header_of_a_real_shared_object(tmp_path: Path) -> None:
    native = shared_object(tmp_path, "gcc")
    assert hosts.named_machine(hosts.elf_machine(native)) == os.uname().machine
    text = tmp_path / "notes.so"
    text.write_text("not an ELF file at all\n")
    assert hosts.elf_machine(text) is None
    assert hosts.named_machine(None) == "not ELF"
    assert hosts.named_machine(8) == "ELF machine 8"


@needs_cross
def test_the_cross_compiler_s_output_is_aarch64(tmp_path: Path) -> None:
    assert CROSS is not None
    made = shared_object(tmp_path, CROSS)
    assert hosts.elf_machine(made) == 183
    assert hosts.named_machine(183) == "aarch64"


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="an x86_64 build machine's view")
def test_the_machine_s_own_host_needs_no_cross_compiler(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert hosts.compilers(hosts.parse("x86_64")) is None
    # Another host without its cross compilers on PATH: refused, naming the package.
    monkeypatch.setenv("PATH", str(tmp_path))
    message = refusal(hosts.compilers, hosts.parse("aarch64"))
    assert message == (
        "building for aarch64 hosts needs the cross compilers aarch64-linux-gnu-g++ and "
        "aarch64-linux-gnu-gcc, which are not on PATH: install them (Debian: apt-get install "
        "g++-aarch64-linux-gnu). Nothing was fetched."
    )


@needs_cross
@pytest.mark.skipif(os.uname().machine != "x86_64", reason="an x86_64 build machine's view")
def test_another_host_s_compilers_tell_cmake_it_cross_compiles() -> None:
    cross = hosts.compilers(hosts.parse("aarch64"))
    assert cross is not None
    assert Path(cross.cxx).name == "aarch64-linux-gnu-g++"
    assert Path(cross.cc).name == "aarch64-linux-gnu-gcc"
    assert cross.cmake_defines() == {
        "CMAKE_SYSTEM_NAME": "Linux",
        "CMAKE_SYSTEM_PROCESSOR": "aarch64",
        "CMAKE_CXX_COMPILER": cross.cxx,
        "CMAKE_CUDA_HOST_COMPILER": cross.cxx,
    }


def test_manylinux_platforms_list_every_older_tag_and_none_newer() -> None:
    tags = manylinux_platforms("aarch64", 28)
    assert tags[0] == "manylinux_2_28_aarch64" and "manylinux_2_17_aarch64" in tags
    assert "manylinux2014_aarch64" in tags and "manylinux_2_29_aarch64" not in tags
    assert "manylinux1_aarch64" in tags and not any("x86_64" in tag for tag in tags)


def test_the_default_stack_pins_the_aarch64_runtime_and_tvm_ffi() -> None:
    pinned = pins.load(REPO / "pins.toml")
    cross = pinned.cross_pins("aarch64", REPO / "pins.toml")
    assert cross.cuda_runtime.startswith("nvidia-cuda-runtime==13.0.96 --hash=sha256:")
    # The same tvm-ffi release as the build's own.
    build_tvm_ffi = [r for r in pinned.build_requirements if r.startswith("apache-tvm-ffi==")]
    assert cross.tvm_ffi.split()[0] == build_tvm_ffi[0]


def test_a_stack_without_the_host_s_pins_is_refused_naming_what_to_add(tmp_path: Path) -> None:
    current = REPO / "stacks" / "sglang-0.5.23" / "pins.toml"
    message = refusal(pins.load(current).cross_pins, "aarch64", current)
    assert message.startswith(
        f"{current} pins no CUDA runtime for aarch64 hosts: add [cross.aarch64]"
    )
    assert "Nothing was fetched." in message


@pytest.mark.parametrize(
    ("table", "problem"),
    [
        (
            'cuda_runtime = "nvidia-cuda-runtime==13.0.96"\ntvm_ffi = "a==1 --hash=sha256:'
            + "0" * 64
            + '"',
            "cuda_runtime",
        ),
        ('cuda_runtime = "a==1 --hash=sha256:' + "0" * 64 + '"', "tvm_ffi"),
        (
            'cuda_runtime = "a==1 --hash=sha256:abc"\ntvm_ffi = "b==1 --hash=sha256:'
            + "0" * 64
            + '"',
            "cuda_runtime",
        ),
    ],
)
def test_malformed_cross_pins_are_refused(tmp_path: Path, table: str, problem: str) -> None:
    path = tmp_path / "pins.toml"
    path.write_text(
        (REPO / "pins.toml").read_text().split("[cross.aarch64]")[0] + f"[cross.aarch64]\n{table}\n"
    )
    message = refusal(pins.load, path)
    assert message.startswith(f"{path}: [cross.aarch64] {problem} must be")


def test_a_system_toolkit_is_refused_for_another_host(tmp_path: Path) -> None:
    """Only the pinned pip toolkit's cudart release is known to match the pinned runtime."""
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("needs an nvcc")
    system = probe(Path(nvcc).resolve().parent.parent)
    wheel = tmp_path / "nvidia_cuda_runtime-13.0.96-py3-none-manylinux2014_aarch64.whl"
    zipfile.ZipFile(wheel, "w").close()
    message = refusal(cross_toolkit, system, "aarch64", wheel)
    assert message.endswith("is a system toolkit. Drop --cuda-home.")
    assert not list(system.home.parent.glob("*-aarch64"))


def build(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sm120_build", "build-wheels", *args],
        cwd=root,
        env=dict(os.environ, SM120_CACHE_DIR=str(root / ".cache")),
        capture_output=True,
        text=True,
    )


def test_an_unknown_platform_is_refused_before_anything_is_fetched(tmp_path: Path) -> None:
    root = fresh_root(tmp_path)
    result = build(root, "--platform", "riscv64")
    assert result.returncode == 1
    assert (
        "--platform 'riscv64': the build can target x86_64, aarch64 hosts; give one of them"
        in result.stderr
    )
    assert not (root / "vendor").exists()
    assert not list((root / ".cache").glob("sdists/*"))


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="an x86_64 build machine's view")
def test_a_cross_build_with_a_system_toolkit_is_refused_before_anything_is_fetched(
    tmp_path: Path,
) -> None:
    root = fresh_root(tmp_path)
    result = build(root, "--platform", "aarch64", "--cuda-home", "/usr/local/cuda")
    if CROSS is None:
        assert "apt-get install g++-aarch64-linux-gnu" in result.stderr
    else:
        assert "--platform aarch64 cross-compiles with the pinned pip toolkit" in result.stderr
    assert result.returncode == 1
    assert not (root / "vendor").exists()


def test_the_node_lock_for_aarch64_asks_for_the_aarch64_wheelhouse(tmp_path: Path) -> None:
    root = fresh_root(tmp_path)
    (root / "wheelhouse").mkdir()  # an x86_64 build's: not what an aarch64 node installs
    result = subprocess.run(
        [sys.executable, "-m", "sm120_build", "lock-node", "--platform", "aarch64-manylinux_2_34"],
        cwd=root,
        env=dict(os.environ, SM120_CACHE_DIR=str(root / ".cache")),
        capture_output=True,
        text=True,
    )
    assert result.returncode == 1
    assert (
        "wheelhouse-aarch64/ does not exist: build it first (nox -s build_wheels -- "
        "--platform aarch64)"
    ) in result.stderr


def test_the_build_s_tvm_ffi_headers_must_be_those_of_the_host_s_wheel(tmp_path: Path) -> None:
    """A wheel of the same headers passes; one header changed is refused by name."""
    tvm_ffi = pytest.importorskip("tvm_ffi", reason="the build's tvm-ffi (pins.toml [build])")
    from sm120_build.jit_cache.cmake import check_tvm_ffi_headers

    package = Path(tvm_ffi.__file__).parent
    headers = sorted(p for p in (package / "include").rglob("*") if p.is_file())
    assert headers

    def wheel(changed: Path | None, left_out: Path | None = None) -> Path:
        path = (
            tmp_path
            / f"apache_tvm_ffi-{len(list(tmp_path.iterdir()))}-cp311-cp311-linux_aarch64.whl"
        )
        with zipfile.ZipFile(path, "w") as archive:
            for header in headers:
                if header == left_out:
                    continue
                data = header.read_bytes() + (b"// changed\n" if header == changed else b"")
                archive.writestr(f"tvm_ffi/{header.relative_to(package).as_posix()}", data)
        return path

    check_tvm_ffi_headers(wheel(None))
    changed = headers[len(headers) // 2]
    message = refusal(check_tvm_ffi_headers, wheel(changed))
    assert message.startswith(f"tvm_ffi/{changed.relative_to(package).as_posix()} of this ")
    assert "pin the same release in pins.toml's [build] and [cross.*]" in message
    # A header the wheel does not ship at all: refused the same way.
    message = refusal(check_tvm_ffi_headers, wheel(None, left_out=changed))
    assert message.startswith(f"tvm_ffi/{changed.relative_to(package).as_posix()} of this ")
