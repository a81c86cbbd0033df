#!/bin/bash
# Here, before the device call of tests/device/verify_sglang_kernels.sh: gather into
# .devcarry/ what the device image lacks to run sglang 0.5.23's own kernel wrappers
# (sglang.kernels.ops) against a jit-cache built here for 9.0a. The device reaches no index
# and takes 64 MiB per call, so sglang (its whole wheel is 39 MB) travels as its patched
# Python files, compressed; FlashInfer as the files its loader lookup imports
# (tests/device/stack_carry.py); the rest as the wheels of those distributions in sglang's
# import closure that the device image does not hold, at the versions sglang's own
# environment resolved (its derive environment, .cache/derive-env/). torchcodec (10 MB) is
# left out: sglang imports it only inside try blocks (srt/utils/video_decoder.py:11).
#
#   bash tests/device/sglang_kernels_carry.sh JIT_CACHE_WHEEL DERIVE_ENV_PYTHON
set -euo pipefail
jit_cache=$1 python=$2
stack=stacks/sglang-0.5.23
rm -rf .devcarry && mkdir -p .devcarry/whl
cp "$jit_cache" .devcarry/whl/
# sglang's import closure of the wrappers, less what the device image has (KINDS.md's list).
missing="apache-tvm-ffi cuda-tile dill flash-attn-4 ipython msgspec orjson pybase64 pydantic
 pydantic_core typing-inspection python-multipart pyzmq sniffio soundfile starlette
 traitlets zstandard transformers huggingface_hub tokenizers cffi pycparser
 decorator jedi parso matplotlib-inline prompt_toolkit wcwidth pexpect ptyprocess stack_data
 executing asttokens pure_eval ipython_pygments_lexers annotated-types"
pins=$("$python" - $missing <<'PY'
import importlib.metadata as md, sys
for name in sys.argv[1:]:
    try:
        print(f"{name}=={md.version(name)}")
    except md.PackageNotFoundError:
        pass
PY
)
# shellcheck disable=SC2086
"$python" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 \
    --platform manylinux_2_17_x86_64 --platform linux_x86_64 -d .devcarry/whl $pins
tar -C "$stack/vendor/sglang" -cJf .devcarry/sglang.tar.xz \
    --exclude='sglang/multimodal_gen' --exclude='sglang/test' --exclude='__pycache__' \
    --exclude='*.so' sglang sglang-0.5.23.dist-info
PYTHONPATH=$stack/vendor/flashinfer "$python" tests/device/stack_carry.py .devcarry
du -sh .devcarry .devcarry/* | sort -h | tail -5
