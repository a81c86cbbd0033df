#!/bin/bash
# On the device machine (an H200, sm_90, no package index): build a 9.0a jit-cache of PROFILE
# with this project's own build, then check it as verify_wheelhouse.sh does (verify_gpu over
# every module, memcheck, the wrong-result checks). Not a test of the suite (it needs a GPU).
#
# Carried: .devwhl/ (pins.toml's [build] and [render] requirements as wheels, less torch,
# numpy, filelock, jinja2 and requests, which the image has, plus their own requirements:
# pyelftools, pathspec, typing-extensions, zipp, jaraco.functools, jaraco.context,
# autocommand, more-itertools, vcs-versioning), made here with `pip download --no-deps
# --only-binary=:all: --python-version 3.12 --platform manylinux_2_28_x86_64 ... -d .devwhl`
# and ignored through .git/info/exclude; .cache/sdists and .cache/.sm120-build-cache (the
# pinned sdists and the cache's marker).
#
#   bash tests/device/build_and_verify.sh PROFILE [extra verify_gpu arguments]
set -uo pipefail
profile=$1
shift
out=${OUT:-/tmp/out}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
# Into the image's own Python (itself a venv, the one with torch): a venv made from it would
# not see torch. The machine is thrown away after the run.
python=$(command -v python3)
"$python" -m pip install -q --no-index --no-deps --no-compile .devwhl/*.whl
"$python" -m pip install -q --no-index --no-deps --no-build-isolation .
export PATH=$(dirname "$(realpath -s "$python")"):$PATH
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
echo "cores: $(nproc)"
started=$(date +%s)
sm120-build build-wheels --arch 9.0a --cuda-home /usr/local/cuda --profile "$profile" \
    >"$out/build.log" 2>&1
status=$?
tail -n 25 "$out/build.log"
echo "build: exit $status in $(($(date +%s) - started)) s"
[ "$status" = 0 ] || exit "$status"
ls -l wheelhouse/
# The same checks as for a wheelhouse built elsewhere: verify_gpu, memcheck, wrong results.
exec bash tests/device/verify_wheelhouse.sh "$@"
