"""Run inside a fresh virtual environment holding the built wheels, flashinfer-cubin and CPU
torch, the way a node would: no nvcc on PATH and FLASHINFER_DISABLE_JIT=1. Writes its
findings as JSON to $NODE_CHECK_OUT.

Not a test module: tests/test_build_e2e.py runs it with that environment's interpreter.
"""

import json
import os
import shutil
import sys
from pathlib import Path

assert os.environ.get("FLASHINFER_DISABLE_JIT") == "1"
assert "FLASHINFER_DISABLE_VERSION_CHECK" not in os.environ
report = {"nvcc_on_path": shutil.which("nvcc")}

import flashinfer  # noqa: E402  (the version checks run at import)
import flashinfer_cubin  # noqa: E402
import flashinfer_jit_cache  # noqa: E402
from flashinfer.jit import env as jit_env  # noqa: E402
from flashinfer.jit.comm import gen_trtllm_comm_module  # noqa: E402

spec = gen_trtllm_comm_module()  # runs the arch filter on FLASHINFER_CUDA_ARCH_LIST
report.update(
    flashinfer=flashinfer.__version__,
    cubin=flashinfer_cubin.__version__,
    jit_cache=flashinfer_jit_cache.__version__,
    aot_dir=str(jit_env.FLASHINFER_AOT_DIR),
    jit_cache_dir=flashinfer_jit_cache.get_jit_cache_dir(),
    aot_path=str(spec.aot_path),
    is_aot=spec.is_aot,
    gencode=[f for f in spec.extra_cuda_cflags if f.startswith("-gencode")],
)
# Loading needs no CUDA library at all: cudart is static and libcuda is opened lazily.
module = spec.build_and_load()
report["loaded_functions"] = sorted(
    name
    for name in (
        "trtllm_allreduce_fusion",
        "trtllm_custom_all_reduce",
        "trtllm_moe_allreduce_fusion",
    )
    if hasattr(module, name)
)
if len(sys.argv) > 1 and sys.argv[1] == "--compile-commands":
    report["compile_commands"] = spec.get_compile_commands()
Path(os.environ["NODE_CHECK_OUT"]).write_text(json.dumps(report))
