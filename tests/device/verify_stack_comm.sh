#!/bin/bash
# On the device machine (an H200 or H100, sm_90, no package index): check a stack's
# all-reduces, trtllm_comm and pcie_ipc_comm, from a jit-cache built here for 9.0a
# (`nox -s build_wheels -- --stack STACK --arch 9.0a --profile verify-sm90`), through
# verify_gpu over two ranks on the one GPU, then each under compute-sanitizer's memcheck.
#
# Carried: .devcarry/whl/ (that jit-cache wheel, apache-tvm-ffi of the stack's pin, dill)
# and .devcarry/site/ (the FlashInfer files the all-reduces import, and a sitecustomize that
# enters flashinfer as a bare namespace: tests/device/stack_carry.py).
#
#   bash tests/device/verify_stack_comm.sh
set -uo pipefail
out=${OUT:-/tmp/out}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 FLASHINFER_DISABLE_JIT=1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .devcarry/whl/*.whl || exit 1
export PYTHONPATH=$PWD/.devcarry/site:/tmp/site:$PWD/src
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -c "import torch, tvm_ffi; print('torch', torch.__version__, 'tvm-ffi', tvm_ffi.__version__)"
started=$(date +%s)
timeout 300 python3 -m sm120_build.node.verify --world-size 2 --json "$out/verify.json" 2>&1 \
    | tee "$out/verify.log" | grep -v "^  PASS"
status=${PIPESTATUS[0]}
echo "verify_gpu: exit $status in $(($(date +%s) - started)) s"
started=$(date +%s)
timeout 240 compute-sanitizer --tool memcheck --target-processes all --print-limit 20 \
    python3 -m sm120_build.node.verify --world-size 2 --module pcie_ipc_comm \
    >"$out/memcheck-pcie.log" 2>&1
echo "memcheck pcie_ipc_comm: exit $? in $(($(date +%s) - started)) s"
grep -E "ERROR SUMMARY|passed, " "$out/memcheck-pcie.log" | tail -4
# trtllm_comm's workspace is FlashInfer 0.7's symmetric device memory through cuda-python,
# whose driver bindings probe entry points this driver lacks (cuGetProcAddress answers
# CUDA_ERROR_INVALID_VALUE, and cuda-python carries on): API errors, not the kernels'; only
# memory errors are counted here.
started=$(date +%s)
timeout 300 compute-sanitizer --tool memcheck --target-processes all --print-limit 20 \
    --report-api-errors no python3 -m sm120_build.node.verify --world-size 2 \
    --module trtllm_comm --pattern residual_rmsnorm --pattern moe_finalize \
    --pattern moe_reduction --pattern pdl_race >"$out/memcheck-trtllm.log" 2>&1
echo "memcheck trtllm_comm: exit $? in $(($(date +%s) - started)) s"
grep -E "ERROR SUMMARY|passed, " "$out/memcheck-trtllm.log" | tail -4
exit "$status"
