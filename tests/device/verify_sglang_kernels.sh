#!/bin/bash
# On the device machine (an H200 or H100, sm_90, no package index): sglang 0.5.23's own JIT
# kernels of the served profile that run on sm_90, from a jit-cache built here for 9.0a,
# through sglang's own wrappers (sglang.kernels.ops) against plain-torch references
# (node/serving/sglang_kernels.py), with every way to compile shut: FLASHINFER_DISABLE_JIT=1,
# SGLANG_CRASH_ON_JIT_COMPILE=1, no nvcc on PATH and CUDA_HOME pointing at nothing; then
# the same under compute-sanitizer's memcheck.
#
# Carried: .devcarry/ (tests/device/sglang_kernels_carry.sh).
#
#   bash tests/device/verify_sglang_kernels.sh
set -uo pipefail
out=${OUT:-/tmp/out}
mkdir -p "$out"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .devcarry/whl/*.whl || exit 1
tar -C /tmp/site -xJf .devcarry/sglang.tar.xz || exit 1
export PYTHONUNBUFFERED=1 FLASHINFER_DISABLE_JIT=1 SGLANG_CRASH_ON_JIT_COMPILE=1
export CUDA_HOME=/nonexistent PYTHONPATH=$PWD/.devcarry/site:/tmp/site:$PWD/src
PATH=$(echo "$PATH" | tr : '\n' | grep -v cuda | paste -sd:)
export PATH
command -v nvcc && { echo "nvcc is still on PATH"; exit 1; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -c "import torch, tvm_ffi; print('torch', torch.__version__, 'tvm-ffi', tvm_ffi.__version__)"
find /tmp/site/flashinfer_jit_cache -name "*.so" | sort | while read -r so; do
    echo "$(basename "$so"): $(/usr/local/cuda/bin/cuobjdump --list-elf "$so" | grep -o 'sm_[0-9a-z]*' | sort -u | xargs)"
done
started=$(date +%s)
timeout 300 python3 -m sm120_build.node.verify --json "$out/verify.json" 2>&1 \
    | tee "$out/verify.log" | grep -v "^  PASS"
status=${PIPESTATUS[0]}
echo "verify_gpu: exit $status in $(($(date +%s) - started)) s"
started=$(date +%s)
timeout 240 /usr/local/cuda/bin/compute-sanitizer --tool memcheck --print-limit 20 \
    python3 -m sm120_build.node.verify >"$out/memcheck.log" 2>&1
echo "memcheck: exit $? in $(($(date +%s) - started)) s"
grep -E "ERROR SUMMARY|passed, " "$out/memcheck.log" | tail -3
exit "$status"
