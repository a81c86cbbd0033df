"""The arch rules: which targets a build may ask for, and which a module must cover."""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import UserError
from ..toolkit import Toolkit

if TYPE_CHECKING:
    from .render import Module

# The default targets: docs/benchmarks.md ("Which arch") for the measurement behind the choice.
DEFAULT_ARCHS = ["12.0f"]
_ARCH = re.compile(r"^(\d+)\.(\d)([af]?)$")


@dataclass(frozen=True, order=True)
class Arch:
    """A target as FLASHINFER_CUDA_ARCH_LIST spells it, e.g. 12.0a."""

    major: int
    minor: int
    suffix: str

    @classmethod
    def parse(cls, text: str) -> Arch:
        match = _ARCH.match(text.strip())
        if match is None:
            raise UserError(
                f"--arch {text!r}: expected MAJOR.MINOR with an optional a/f, e.g. 12.0a or 9.0a"
            )
        return cls(int(match.group(1)), int(match.group(2)), match.group(3))

    def __str__(self) -> str:
        return f"{self.major}.{self.minor}{self.suffix}"

    @property
    def sm(self) -> str:
        return f"sm_{self.major}{self.minor}{self.suffix}"

    @property
    def label(self) -> str:
        return f"sm{self.major}{self.minor}{self.suffix}"

    @property
    def gencode(self) -> str:
        """As FlashInfer's CompilationContext writes it: machine code only, no PTX."""
        code = f"{self.major}{self.minor}{self.suffix}"
        return f"-gencode=arch=compute_{code},code=sm_{code}"


def check_archs(archs: list[Arch], toolkit: Toolkit) -> None:
    """Refuse, before compiling, any arch this toolkit cannot build or FP4 cannot use."""
    for arch in archs:
        if arch.major == 12 and not arch.suffix:
            raise UserError(
                f"--arch {arch}: plain sm_{arch.major}{arch.minor} lacks the FP4 instructions "
                f"FlashInfer's SM12x kernels use (ptxas rejects them); use {arch}a or {arch}f"
            )
        if arch.major >= 12 and toolkit.version < (12, 8):
            raise UserError(
                f"{arch} needs CUDA 12.8 or newer; {toolkit.home} is CUDA "
                f"{toolkit.full_version}. Use the default toolkit or a newer --cuda-home."
            )
        if f"sm_{arch.major}{arch.minor}" not in toolkit.gpu_codes:
            buildable = " ".join(sorted(toolkit.gpu_codes, key=lambda c: int(c[3:])))
            raise UserError(
                f"CUDA {toolkit.full_version} at {toolkit.home} cannot build {arch} "
                f"(it builds {buildable})."
            )
        # nvcc knows which a/f variants exist; --dryrun asks it without compiling.
        with tempfile.TemporaryDirectory() as scratch:
            empty = Path(scratch) / "empty.cu"
            empty.write_text("")
            result = subprocess.run(
                [str(toolkit.nvcc), "--dryrun", "-c", str(empty), "-o", os.devnull, arch.gencode],
                capture_output=True,
                text=True,
            )
        if result.returncode != 0:
            message = result.stderr.strip().splitlines()[-1] if result.stderr.strip() else ""
            raise UserError(
                f"--arch {arch}: CUDA {toolkit.full_version}'s nvcc rejects it: {message}"
            )


def check_modules_cover_archs(modules: list[Module], archs: list[Arch]) -> None:
    """Refuse a build in which FlashInfer filtered a requested arch out of a module: the
    module would ship without code for it. A module that names its own arch (fp4_quantization_121
    is sm_121a whatever the list) is FlashInfer's choice, and is kept as it is, unless no
    requested major runs it (aot.py's FA3 attention-sink variants are sm_90a whatever the list:
    dead weight in a 12.0f wheel)."""
    requested = {arch.gencode for arch in archs}
    requested_majors = {arch.major for arch in archs}
    for module in modules:
        gencodes = set(module.gencodes)
        majors = {int(re.search(r"compute_(\d+?)(\d)[af]?,", g).group(1)) for g in gencodes}  # type: ignore[union-attr]
        if not gencodes <= requested:
            if not majors & requested_majors:
                raise UserError(
                    f"FlashInfer builds {module.name} only for {', '.join(sorted(gencodes))}, "
                    f"which none of --arch {' '.join(str(a) for a in archs)} runs. Drop the "
                    "module, or add its arch."
                )
            continue  # the module picks its own arch
        dropped = [a for a in archs if a.gencode not in gencodes and a.major not in majors]
        if dropped:
            raise UserError(
                f"FlashInfer builds {module.name} only for "
                f"{', '.join(sorted(gencodes))}; it filters out "
                f"{', '.join(str(a) for a in dropped)}. Drop that --arch, or the module."
            )
