"""Writing the project's own files whole: a new file beside the old one, renamed over it.

An interrupt leaves the old file or the new one, never half of either; and the rename
replaces whatever is at the name (a planted link included) instead of writing through it.
"""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path


def replace_text(path: Path, text: str) -> None:
    """Write `text` to `path` whole, keeping the mode of the file it replaces (0644 for a
    new one)."""
    try:
        info = path.lstat()
        mode = stat.S_IMODE(info.st_mode) if stat.S_ISREG(info.st_mode) else 0o644
    except FileNotFoundError:
        mode = 0o644
    descriptor, partial = tempfile.mkstemp(
        prefix=f".{path.name}.", suffix=".partial", dir=path.parent
    )
    try:
        with os.fdopen(descriptor, "w") as stream:
            stream.write(text)
        os.chmod(partial, mode)
        os.replace(partial, path)
    except BaseException:
        Path(partial).unlink(missing_ok=True)
        raise
