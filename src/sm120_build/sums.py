"""wheelhouse/SHA256SUMS: what the build wrote, read back strictly. The node side installs
only wheels that match it, and publish uploads only those."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

from .errors import UserError

SUMS_FILE = "SHA256SUMS"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        for block in iter(lambda: stream.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def checked_wheels(wheelhouse: Path) -> dict[Path, str]:
    """Every wheel of the wheelhouse -> its sha256, each listed in SHA256SUMS and matching
    it; anything else (a file changed, or added beside them) is refused."""
    sums_file = wheelhouse / SUMS_FILE
    if not sums_file.is_file():
        raise UserError(f"{sums_file} is missing: run `nox -s build_wheels` first")
    sums: dict[str, str] = {}
    for number, line in enumerate(sums_file.read_text().splitlines(), start=1):
        match = re.fullmatch(r"([0-9a-f]{64})  ([^/\s]+\.whl)", line)
        if match is None:
            raise UserError(
                f"{sums_file}:{number} is not '<sha256>  <wheel file name>': {line[:80]!r}. "
                "Rebuild the wheelhouse with `nox -s build_wheels`."
            )
        sums[match.group(2)] = match.group(1)
    wheels: dict[Path, str] = {}
    for path in sorted(wheelhouse.glob("*.whl")):
        digest = _sha256(path)
        if path.name not in sums:
            raise UserError(
                f"{path} is not listed in {SUMS_FILE}: it was not built with this wheelhouse. "
                "Remove it, or rebuild with `nox -s build_wheels`."
            )
        if sums[path.name] != digest:
            raise UserError(
                f"{path} does not match {SUMS_FILE} (sha256 {digest}, listed "
                f"{sums[path.name]}): it changed after the build. Rebuild with "
                "`nox -s build_wheels`, or copy the wheelhouse again."
            )
        wheels[path] = digest
    missing = sorted(set(sums) - {path.name for path in wheels})
    if missing:
        raise UserError(f"{wheelhouse} lacks {', '.join(missing)}, which {SUMS_FILE} lists")
    if not wheels:
        raise UserError(f"{wheelhouse} holds no wheels: run `nox -s build_wheels` first")
    return wheels
