"""The fixed source path every build of the same inputs compiles from.

nvcc names each translation unit's internal namespace after a hash of the source file's
real path (_INTERNAL_<hash>_..., seen with CUDA 13.0; --frandom-seed does not change it).
So sources are compiled from a path that depends only on the build's inputs: the same on
every machine for the same inputs, different for different inputs. Literally /tmp, not
$TMPDIR, for that reason.
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import stat
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from ..cache import exclusive_lock
from ..errors import UserError
from ..gitrepo import export_tree

SOURCE_ROOT = Path("/tmp")

# What nvcc, CMake's module lists and the compile command lines cannot carry in a path:
# whitespace splits an nvcc option (a space in the cache path failed after 90 s of
# compiling, with an nvcc error that did not name it), ';' splits a CMake list, quotes
# and '$' are taken by the shell and CMake. Other characters, non-ASCII ones included, work.
_UNSAFE = re.compile(r"[\s;\"'$\\]")


def check_paths(paths: dict[str, Path]) -> None:
    """Refuse, before anything runs, a path the CUDA toolchain cannot take, naming it and
    the way around it. `paths`: what it is -> where."""
    for what, path in paths.items():
        if _UNSAFE.search(str(path)):
            raise UserError(
                f"{what} is {str(path)!r}, and the CUDA toolchain cannot take a path with "
                "whitespace, ';', quotes, '$' or '\\' in it (nvcc splits its options there). "
                "Use a path without them: for the cache, set SM120_CACHE_DIR; for the "
                "checkout (nox keeps its environments in .nox/ there), clone it elsewhere."
            )


def _private_directory(path: Path) -> None:
    """Create `path` mode 0700, or accept it only when it already is ours and private:
    /tmp is shared, and whoever owns the directory owns what gets compiled."""
    with suppress(FileExistsError):
        path.mkdir(mode=0o700)
    info = path.lstat()
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
        raise UserError(
            f"{path} exists but is not a private directory of this user (it must be a real "
            "directory, owned by you, mode 0700). Someone else may have made it: remove it, "
            "or investigate, before building."
        )


def data_links(tree: Path) -> dict[str, str]:
    """flashinfer/data/<name> -> the directory it stands for: FlashInfer's JIT finds its
    headers and sources under flashinfer/data/, which its build backend links to top-level
    directories, one ln("<directory>", "<name>") each in _create_data_dir()
    (build_backend.py). Read from that function, so a release that links more (0.7 adds
    cccl) gets them."""
    path = tree / "build_backend.py"
    try:
        module = ast.parse(path.read_text())
    except (OSError, SyntaxError) as exc:
        raise UserError(f"cannot read FlashInfer's {path.name}: {exc}") from None
    links = {}
    for node in ast.walk(module):
        if isinstance(node, ast.FunctionDef) and node.name == "_create_data_dir":
            for call in ast.walk(node):
                if (
                    isinstance(call, ast.Call)
                    and isinstance(call.func, ast.Name)
                    and call.func.id == "ln"
                    and len(call.args) == 2
                    and all(
                        isinstance(a, ast.Constant) and isinstance(a.value, str) for a in call.args
                    )
                ):
                    source, name = (str(a.value) for a in call.args)  # type: ignore[attr-defined]
                    links[name] = source
    if not links:
        raise UserError(
            f'{path} has no _create_data_dir() with ln("<directory>", "<name>") calls: '
            "FlashInfer changed how it lays out flashinfer/data/; see jit_cache/sources.py"
        )
    return links


@contextmanager
def at_fixed_path(tree: Path, inputs_digest: str) -> Iterator[Path]:
    """The committed vendor tree (flashinfer, or sglang for its own kernels), exported for
    the build's duration to a private directory named after the inputs; builds of the same
    inputs take turns. Generated sources are written beside it (workspace/), at a path as
    fixed as the tree's."""
    directory = SOURCE_ROOT / f"sm120-build-{inputs_digest[:16]}"
    _private_directory(directory)
    sources = directory / tree.name
    workspace = directory / "workspace"
    with exclusive_lock(directory / "lock", "another build of the same inputs"):
        try:
            for leftover in (sources, workspace, directory / "driver-stub"):
                if leftover.exists():
                    shutil.rmtree(leftover)
            export_tree(tree, sources)
            if tree.name == "flashinfer":
                data = sources / "flashinfer" / "data"
                data.mkdir()
                for name, target in data_links(sources).items():
                    (data / name).symlink_to(Path("..", "..", target), target_is_directory=True)
            yield sources
        finally:
            for made in (sources, workspace, directory / "driver-stub"):
                shutil.rmtree(made, ignore_errors=True)
