"""Run inside a node's virtual environment (the built wheels, flashinfer-cubin, CPU torch)
with CUDA_HOME set and this project's src/ on PYTHONPATH: prints, as JSON, FlashInfer's own
compile commands (JitSpec.get_compile_commands) for every module of the recipes the
installed jit-cache wheel records. The flag-parity test compares them with what our build ran.

Not a test module: tests/test_build_e2e.py runs it with that environment's interpreter.
"""

import importlib.metadata
import json
import sys

from sm120_build.profiles import specs_of
from sm120_build.sglang_kernels import is_sglang_call

provenance = json.loads(
    importlib.metadata.distribution("flashinfer-jit-cache").read_text("sm120-build.json") or "{}"
)
commands = {}
for call in provenance["recipes"].values():
    if is_sglang_call(call):
        continue  # sglang's kernels: tvm-ffi's JIT, not FlashInfer's
    for spec in specs_of(call):
        commands[spec.name] = spec.get_compile_commands()
json.dump(commands, sys.stdout)
