"""tarfile with PEP 706's extraction filters, on every Python this package runs on.

The filters came to the standard library in 3.10.12, 3.11.4 and 3.12. Debian 12's own
Python is 3.11.2, which has none: there the module is backports.tarfile, CPython 3.12's
tarfile published for older Pythons, so an sdist is unpacked with the same `data` filter
everywhere (links out of the tree, device files, absolute paths and unsafe modes refused).
Looked up when first used, so that `--help` runs where only the standard library is.
"""

from __future__ import annotations

import tarfile as _standard
from types import ModuleType


def tarfile() -> ModuleType:
    """The tarfile module to use here."""
    if hasattr(_standard, "data_filter"):
        return _standard
    from backports import tarfile as backport  # pragma: no cover - old 3.10 and 3.11 only

    module: ModuleType = backport  # pragma: no cover
    return module  # pragma: no cover
