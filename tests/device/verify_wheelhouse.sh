#!/bin/bash
# On the device machine (an H200 or H100, sm_90, no package index): install a 9.0a wheelhouse
# built elsewhere (`nox -s build_wheels -- --arch 9.0a ...` on the build machine) over the
# image's torch (sglang too: its prebuilt kernels are checked through its own API), then run
# verify_gpu over every module of its jit-cache, compute-sanitizer's memcheck over the
# non-comm modules, and the wrong-result checks. For when the device time
# left is too short to build there (build_and_verify.sh builds there). Not a test of the
# suite (it needs a GPU).
#
# Carried: wheelhouse/ and .devwhl/ (apache-tvm-ffi, the one runtime requirement of FlashInfer
# the image lacks), made here with `pip download --no-deps --only-binary=:all:
# --python-version 3.12 --platform manylinux_2_28_x86_64 -d .devwhl apache-tvm-ffi==VERSION`.
#
#   bash tests/device/verify_wheelhouse.sh [extra verify_gpu arguments]
set -uo pipefail
out=${OUT:-/tmp/out}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
python=$(command -v python3)
"$python" -m pip install -q --no-index --no-deps --no-compile .devwhl/apache_tvm_ffi-*.whl \
    wheelhouse/flashinfer_python-*.whl wheelhouse/flashinfer_jit_cache-*.whl \
    wheelhouse/sglang-*.whl wheelhouse/sm120_build-*.whl || exit
export PATH=$(dirname "$(realpath -s "$python")"):$PATH
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
started=$(date +%s)
sm120-verify-gpu --json "$out/verify.json" "$@" >"$out/verify.log" 2>&1
status=$?
grep -v " PASS$" "$out/verify.log" | tail -n 40
echo "verify_gpu: exit $status in $(($(date +%s) - started)) s"
# memcheck over every module but trtllm_comm (its two ranks are checked without the tool).
serving=$("$python" -c 'import importlib.metadata as m, json
d = json.loads(m.distribution("flashinfer-jit-cache").read_text("sm120-build.json"))
print(" ".join(f"--module {n}" for n in sorted(set(d["modules"].values())) if n != "trtllm_comm"))')
started=$(date +%s)
# shellcheck disable=SC2086
timeout 150 /usr/local/cuda/bin/compute-sanitizer --tool memcheck sm120-verify-gpu $serving \
    >"$out/memcheck.log" 2>&1
echo "memcheck: exit $? in $(($(date +%s) - started)) s: $(grep "ERROR SUMMARY" "$out/memcheck.log")"
started=$(date +%s)
timeout 60 "$python" tests/device/checks_fail_on_wrong_results.py 2>&1 | tail -n 6
echo "wrong-result checks: exit ${PIPESTATUS[0]} in $(($(date +%s) - started)) s"
exit "$status"
