#!/usr/bin/env bash
# Session 33's second GPU call: on an H200 only (on any other card it stops at once), the
# sparse client graphed (caches of 2**18 and 2**20 rows) and at XLA's defaults, then the GPU
# suite if BUDGET_S (300) leaves room. Each stage's tail goes to $OUT/summary.txt as it ends.
#   bash docs/lab/s33_h200.sh
set -u
FINAL=${OUT:-/tmp/s33_out}
WORK=/tmp/s33_work
mkdir -p "$FINAL" "$WORK"
export XLA_PYTHON_CLIENT_PREALLOCATE=false
start=$(date +%s)
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "$gpu" > "$FINAL/summary.txt"
[[ $gpu == *H200* ]] || { echo "not an H200: nothing run" >> "$FINAL/summary.txt"; exit 0; }
G="--xla-option xla_gpu_graph_min_graph_size=1"
note() {
  { echo "== $1 at $(( $(date +%s) - start )) s"; grep -v host_offloader "$1" | tail -"$2"; } \
    >> "$FINAL/summary.txt" 2>&1
}
sparse() {
  local name=$1
  shift
  timeout 120 python3 -m benchmarks.sparse_training "$@" --out "$WORK/$name" \
    > "$WORK/sparse_$name.log" 2>&1
  echo "$name rc=$?" >> "$WORK/sparse_$name.log"
  note "$WORK/sparse_$name.log" 26
  cp "$WORK/sparse_$name.log" "$FINAL/"
  cp "$WORK/$name/sparse_training.json" "$FINAL/sparse_$name.json" 2>/dev/null
}
OUT=$WORK/install timeout 120 bash benchmarks/gpu_session.sh none > "$WORK/install.log" 2>&1
note "$WORK/install.log" 6
export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
sparse graphs $G
sparse defaults
sparse hot1048576 $G --hot-rows 1048576
if [ $(( $(date +%s) - start + 200 )) -le "${BUDGET_S:-300}" ]; then
  OUT=$WORK/session PYTEST_ARGS="-n 8 --timeout 150" timeout 200 \
    bash benchmarks/gpu_session.sh tests > "$WORK/tests.log" 2>&1
  echo "tests rc=$?" >> "$WORK/tests.log"
  note "$WORK/tests.log" 6
fi
echo "done at $(( $(date +%s) - start )) s" >> "$FINAL/summary.txt"
