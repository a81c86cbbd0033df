"""Take the device run's verdicts (tests/device/mutants.sh collect) into this machine's
mutmut state: for each mutant named in names.txt that the device decided and this state
has not, its exit code and duration. Run with this machine's mutmut stopped (it rewrites a
file's state whole as each mutant ends), from the run's directory:

    python tests/device/mutants_merge.py DEVICE_META_TGZ NAMES_TXT
"""

from __future__ import annotations

import json
import os
import sys
import tarfile
import tempfile
from pathlib import Path


def merge(device_tgz: Path, names: set[str]) -> int:
    taken = 0
    with tempfile.TemporaryDirectory() as scratch:
        with tarfile.open(device_tgz) as archive:
            archive.extractall(scratch, filter="data")
        for device_meta in sorted(Path(scratch).rglob("*.meta")):
            local_meta = Path(device_meta.relative_to(scratch))
            local = json.loads(local_meta.read_text())
            device = json.loads(device_meta.read_text())
            for name, code in device["exit_code_by_key"].items():
                if name in names and code is not None and local["exit_code_by_key"][name] is None:
                    local["exit_code_by_key"][name] = code
                    local["durations_by_key"][name] = device["durations_by_key"].get(name)
                    taken += 1
            partial = local_meta.with_name(local_meta.name + ".partial")
            partial.write_text(json.dumps(local))
            os.replace(partial, local_meta)
    return taken


if __name__ == "__main__":
    tgz, names_file = sys.argv[1:]
    print(f"{merge(Path(tgz), set(Path(names_file).read_text().split()))} verdicts taken")
