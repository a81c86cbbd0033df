"""The fixed source path every build of the same inputs compiles from.

nvcc names each translation unit's internal namespace after a hash of the source file's
real path (_INTERNAL_<hash>_..., seen with CUDA 13.0; --frandom-seed does not change it).
So sources are compiled from a path that depends only on the build's inputs: the same on
every machine for the same inputs, different for different inputs. Literally /tmp, not
$TMPDIR, for that reason.
"""

from __future__ import annotations

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


# FlashInfer's JIT finds its headers and sources under flashinfer/data/, which its build
# backend links to the top-level directories (build_backend.py _create_data_dir).
_DATA_LINKS = {
    "cutlass": "3rdparty/cutlass",
    "spdlog": "3rdparty/spdlog",
    "csrc": "csrc",
    "include": "include",
}


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
            for leftover in (sources, workspace):
                if leftover.exists():
                    shutil.rmtree(leftover)
            export_tree(tree, sources)
            if tree.name == "flashinfer":
                data = sources / "flashinfer" / "data"
                data.mkdir()
                for name, target in _DATA_LINKS.items():
                    (data / name).symlink_to(Path("..", "..", target), target_is_directory=True)
            yield sources
        finally:
            shutil.rmtree(sources, ignore_errors=True)
            shutil.rmtree(workspace, ignore_errors=True)
