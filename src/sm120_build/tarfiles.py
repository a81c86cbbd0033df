"""tarfile with PEP 706's extraction filters, on every Python this package runs on.

The filters came to the standard library in 3.10.12, 3.11.4 and 3.12. Debian 12's own
Python is 3.11.2, which has none: there `tarfile` is backports.tarfile, CPython 3.12's
tarfile published for older Pythons, so an sdist is unpacked with the same `data` filter
everywhere (links out of the tree, device files, absolute paths and unsafe modes refused).
"""

from __future__ import annotations

import tarfile as _standard

if hasattr(_standard, "data_filter"):
    tarfile = _standard
else:  # pragma: no cover - 3.10.0-3.10.11 and 3.11.0-3.11.3 only
    from backports import tarfile  # type: ignore[no-redef]

__all__ = ["tarfile"]
