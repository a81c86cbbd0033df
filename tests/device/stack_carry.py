"""Here, before a device call for a stack whose FlashInfer is too large to carry whole
(FlashInfer 0.7: its Python package alone is 125 MB, the call's working tree 64 MiB): copy
into DEST/site the FlashInfer files that its all-reduces import, found by importing them
with `flashinfer` and `flashinfer.comm` entered as bare namespaces (their __init__ imports
every kernel family, CUTLASS DSL included, which the device image lacks), and a
sitecustomize.py that enters them so on the device, in every process (the ranks too).

    PYTHON=/path/to/a/venv/with/the/stacks/wheels/bin/python
    $PYTHON tests/device/stack_carry.py DEST
"""

from __future__ import annotations

import importlib
import importlib.util
import shutil
import sys
import types
from pathlib import Path

SITECUSTOMIZE = '''"""flashinfer, flashinfer.comm: bare namespaces (tests/device/stack_carry.py)."""
import sys
import types
from pathlib import Path

root = Path(__file__).parent / "flashinfer"
for name, directory in (("flashinfer", root), ("flashinfer.comm", root / "comm")):
    package = types.ModuleType(name)
    package.__path__ = [str(directory)]
    sys.modules[name] = package
'''
MODULES = (
    "flashinfer.comm.trtllm_ar",
    "flashinfer.comm.allreduce",
    "flashinfer.comm.pcie_ipc_ar",
    "flashinfer.jit.env",
)


def main() -> None:
    destination = Path(sys.argv[1]) / "site"
    spec = importlib.util.find_spec("flashinfer")
    assert spec is not None and spec.submodule_search_locations
    root = Path(next(iter(spec.submodule_search_locations)))
    for name, directory in (("flashinfer", root), ("flashinfer.comm", root / "comm")):
        package = types.ModuleType(name)
        package.__path__ = [str(directory)]
        sys.modules[name] = package
    for module in MODULES:
        importlib.import_module(module)
    files = {
        Path(str(getattr(module, "__file__", "")))
        for name, module in list(sys.modules.items())
        if (name == "flashinfer" or name.startswith("flashinfer."))
        and getattr(module, "__file__", None)
    }
    # Whole packages that the all-reduces import from inside functions, lazily.
    for subpackage in ("comm", "jit", "autotuner", "trace"):
        if (root / subpackage).is_dir():
            files |= set((root / subpackage).rglob("*.py"))
    files |= set(root.glob("*.py"))
    if destination.exists():
        shutil.rmtree(destination)
    for path in sorted(files):
        target = destination / "flashinfer" / path.relative_to(root)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, target)
    (destination / "sitecustomize.py").write_text(SITECUSTOMIZE)
    size = sum(p.stat().st_size for p in destination.rglob("*") if p.is_file())
    print(f"{len(files)} files of {root}, {size / 1e6:.1f} MB, in {destination}")


if __name__ == "__main__":
    main()
