"""Which glibc a wheel's binaries need, and which of their symbols need it.

auditwheel gives a wheel its manylinux tag from the newest symbol versions its binaries use;
a build on a newer distribution can raise it silently (glibc 2.38's C23 strtol behind
std::stoi). This names the symbols behind the glibc part of the tag, and refuses a wheel
above the baseline a release promises.
"""

from __future__ import annotations

import io
import re
import zipfile
from pathlib import Path
from typing import Any

from .errors import UserError

_GLIBC = re.compile(r"^GLIBC_(\d+)\.(\d+)$")


def manylinux_platforms(arch: str, newest_glibc_minor: int) -> list[str]:
    """pip's --platform values for a machine of `arch` with glibc 2.<newest>: pip takes each
    tag literally, so every older manylinux a wheel may carry is listed (manylinux2014 is
    manylinux_2_17)."""
    tags = [f"manylinux_2_{minor}_{arch}" for minor in range(newest_glibc_minor, 4, -1)]
    legacy = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}
    older = [name for minor, name in legacy.items() if minor <= newest_glibc_minor]
    return tags + [f"{name}_{arch}" for name in older]


def glibc_symbols(data: bytes) -> dict[tuple[int, int], set[str]]:
    """glibc version -> the undefined symbols of one ELF binary that ask for it."""
    from elftools.elf.elffile import ELFFile

    elf = ELFFile(io.BytesIO(data))
    sections: list[Any] = [
        elf.get_section_by_name(name) for name in (".gnu.version", ".gnu.version_r", ".dynsym")
    ]
    versions, needs, symbols = sections
    if versions is None or needs is None or symbols is None:
        return {}
    names = {
        auxiliary["vna_other"]: auxiliary.name
        for _, auxiliaries in needs.iter_versions()
        for auxiliary in auxiliaries
    }
    found: dict[tuple[int, int], set[str]] = {}
    for index, symbol in enumerate(symbols.iter_symbols()):
        if symbol["st_shndx"] != "SHN_UNDEF":
            continue
        match = _GLIBC.match(names.get(versions.get_symbol(index)["ndx"], ""))
        if match:
            found.setdefault((int(match[1]), int(match[2])), set()).add(symbol.name)
    return found


def newest_glibc(wheel: Path) -> tuple[tuple[int, int], list[str]]:
    """The newest glibc any binary of the wheel needs, and 'symbol (file)' for each symbol
    that needs exactly it. ((0, 0), []) for a wheel without ELF binaries."""
    newest: tuple[int, int] = (0, 0)
    needing: list[str] = []
    with zipfile.ZipFile(wheel) as archive:
        for info in archive.infolist():
            data = archive.read(info) if info.filename.endswith(".so") else b""
            if not data.startswith(b"\x7fELF"):
                continue
            for version, names in glibc_symbols(data).items():
                where = [f"{name} ({Path(info.filename).name})" for name in sorted(names)]
                if version > newest:
                    newest, needing = version, where
                elif version == newest:
                    needing += where
    return newest, needing


def describe(tag: str, wheel: Path) -> str:
    version, needing = newest_glibc(wheel)
    if version == (0, 0):
        return f"platform tag {tag}"
    shown = ", ".join(needing[:3]) + (f" and {len(needing) - 3} more" if len(needing) > 3 else "")
    return f"platform tag {tag}: glibc {version[0]}.{version[1]}, needed by {shown}"


def _tag_glibc(tag: str) -> tuple[int, int] | None:
    match = re.match(r"^manylinux_(\d+)_(\d+)_", tag)
    return (int(match[1]), int(match[2])) if match else None


def check_baseline(wheel: Path, tag: str, versioned: dict[str, list[str]], baseline: str) -> None:
    """Refuse a wheel tagged for a newer glibc than `baseline` ("2.28"): the tag auditwheel
    gives, which the newest of every symbol version sets (GLIBC_, and GLIBCXX_, CXXABI_ and
    GCC_ of the libraries that come with a glibc), not glibc's own symbols alone."""
    match = re.fullmatch(r"(\d+)\.(\d+)", baseline)
    if match is None:
        raise UserError(f"--glibc-baseline {baseline!r}: expected MAJOR.MINOR, e.g. 2.28")
    promised = (int(match[1]), int(match[2]))
    tagged = _tag_glibc(tag)
    if tagged is not None and tagged <= promised:
        return
    version, needing = newest_glibc(wheel)
    glibc = (
        f"glibc {version[0]}.{version[1]} for {', '.join(needing[:5])}"
        if version > promised
        else "no glibc symbol above it"
    )
    others = ", ".join(
        f"{library} {versions[-1]}"
        for library, versions in sorted(versioned.items())
        if versions and not versions[-1].startswith("GLIBC_")
    )
    raise UserError(
        f"{wheel.name} is tagged {tag}, above the promised glibc {baseline}: {glibc}"
        + (f"; newest of the other libraries: {others}" if others else "")
        + f". Build where glibc is at most {baseline} (a manylinux_2_28 image, ci/docker/), "
        "or promise less."
    )
