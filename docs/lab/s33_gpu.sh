#!/usr/bin/env bash
# Session 33's GPU call, within $BUDGET_S (420) seconds, that serves either card (with
# H200_ONLY=1 it stops at once on any other). Both: the sparse client graphed, with the
# hot-rows cache (benchmarks/sparse_hot.py). H200: then the same at XLA's defaults and with a
# cache of 2**20 rows, the GPU suite, and the quick loop grid graphed in the time left (the
# H200's first since session 25). H100 (the branch that ran, 15:23 UTC): the sparse
# client graphed with caches of 2**16 rows and of 1 row (the owner step, uncached), and at
# XLA's defaults. Each stage's tail goes to $OUT/summary.txt as it ends (a call cut short
# still returns what finished); the logs are in $OUT/s33.tgz at the end. Session 34: with
# H100_SUITE=1, an H100 runs the sparse client graphed, the GPU suite, and the client
# with caches of 2**20 and 2**21 rows and of every row.
#   bash docs/lab/s33_gpu.sh
set -u
FINAL=${OUT:-/tmp/s33_out}
WORK=/tmp/s33_work
mkdir -p "$FINAL" "$WORK"
export XLA_PYTHON_CLIENT_PREALLOCATE=false
start=$(date +%s)
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "$gpu" | tee "$WORK/gpu_name.txt" > "$FINAL/summary.txt"
if [ -n "${H200_ONLY:-}" ] && [[ $gpu != *H200* ]]; then
  echo "not an H200: nothing run" >> "$FINAL/summary.txt"
  exit 0
fi
G="--xla-option xla_gpu_graph_min_graph_size=1"
note() {  # the tail of a log, into the summary
  { echo "== $1 at $(( $(date +%s) - start )) s"; grep -v host_offloader "$1" | tail -"$2"; } \
    >> "$FINAL/summary.txt" 2>&1
}
sparse() {  # name, then arguments of benchmarks.sparse_training
  local name=$1
  shift
  timeout 150 python3 -m benchmarks.sparse_training "$@" --out "$WORK/$name" \
    > "$WORK/sparse_$name.log" 2>&1
  echo "$name rc=$?" >> "$WORK/sparse_$name.log"
  note "$WORK/sparse_$name.log" 26
}
# Installs the package and jax-triton (gpu_session.sh's own first lines), then the stages.
OUT=$WORK/install timeout 120 bash benchmarks/gpu_session.sh none > "$WORK/install.log" 2>&1
note "$WORK/install.log" 6
export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fits() { [ $(( $(date +%s) - start + $1 )) -le "${BUDGET_S:-420}" ]; }  # a stage's timeout fits
suite() {  # the GPU suite
  OUT=$WORK/session PYTEST_ARGS="-n 8 --timeout 150" timeout 250 \
    bash benchmarks/gpu_session.sh tests > "$WORK/tests.log" 2>&1
  echo "tests rc=$?" >> "$WORK/tests.log"
  note "$WORK/tests.log" 8
}
sparse graphs $G
if [[ $gpu == *H200* ]]; then
  fits 150 && sparse defaults
  fits 150 && sparse hot1048576 $G --hot-rows 1048576
  fits 250 && suite
  left=$(( ${BUDGET_S:-420} - ($(date +%s) - start) ))
  if [ "$left" -gt 180 ]; then  # the quick loop grid graphed, in what time is left
    OUT=$WORK/loop LOOP_ARGS="--quick --backends pallas --time-budget-s $(( left - 90 ))" \
      timeout "$left" bash benchmarks/gpu_session.sh loopgraphs > "$WORK/loop.log" 2>&1
    echo "loop rc=$?" >> "$WORK/loop.log"
    note "$WORK/loop.log" 50
  fi
elif [ -n "${H100_SUITE:-}" ]; then  # session 34: the holder's fence, and ours_hot_merged
  fits 250 && suite
  fits 150 && sparse hot1048576 $G --hot-rows 1048576
  fits 150 && sparse hot2097152 $G --hot-rows 2097152
  fits 150 && sparse hotall $G --hot-rows 8388608
else
  fits 150 && sparse hot1 $G --hot-rows 1
  fits 150 && sparse defaults
  fits 150 && sparse hot64k $G --hot-rows 65536
fi
tar czf "$FINAL/s33.tgz" -C "$WORK" .
echo "done at $(( $(date +%s) - start )) s" >> "$FINAL/summary.txt"
