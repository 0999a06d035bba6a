#!/usr/bin/env bash
# Session 33's GPU call, one of under 10 min that serves either card. Both: the sparse client
# graphed, with the hot-rows cache (benchmarks/sparse_hot.py) on a GPU for the first time.
# H200: then the GPU suite, and the quick loop grid graphed in the time left (the H200's first
# since session 25).
# H100 (where the suite ran at this library code, session 32): the sparse client at XLA's
# defaults and graphed with caches of 2**16 rows and of 1 row (the owner step, uncached).
# Everything lands in $OUT/s33.tgz, with summary.txt beside it.
#   bash docs/lab/s33_gpu.sh
set -u
FINAL=${OUT:-/tmp/s33_out}
WORK=/tmp/s33_work
mkdir -p "$FINAL" "$WORK"
export XLA_PYTHON_CLIENT_PREALLOCATE=false
start=$(date +%s)
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "$gpu" > "$WORK/gpu_name.txt"
G="--xla-option xla_gpu_graph_min_graph_size=1"
if [[ $gpu == *H200* ]]; then
  OUT=$WORK/session PYTEST_ARGS="-n 8 --timeout 150" SPARSE_ARGS="$G" \
    timeout 400 bash benchmarks/gpu_session.sh "sparse tests" > "$WORK/session.log" 2>&1
  echo "session rc=$?" >> "$WORK/session.log"
  left=$(( 520 - ($(date +%s) - start) ))
  if [ "$left" -gt 200 ]; then  # the quick loop grid graphed, in what time is left
    OUT=$WORK/loop LOOP_ARGS="--quick --backends pallas --time-budget-s $(( left - 90 ))" \
      timeout "$left" bash benchmarks/gpu_session.sh loopgraphs > "$WORK/loop.log" 2>&1
    echo "loop rc=$?" >> "$WORK/loop.log"
  fi
else
  OUT=$WORK/graphs SPARSE_ARGS="$G" timeout 260 bash benchmarks/gpu_session.sh sparse \
    > "$WORK/session.log" 2>&1
  echo "session rc=$?" >> "$WORK/session.log"
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
  timeout 150 python3 -m benchmarks.sparse_training --out "$WORK/defaults" \
    > "$WORK/sparse_defaults.log" 2>&1
  echo "defaults rc=$?" >> "$WORK/sparse_defaults.log"
  timeout 150 python3 -m benchmarks.sparse_training $G --hot-rows 65536 --out "$WORK/hot64k" \
    > "$WORK/sparse_hot64k.log" 2>&1
  echo "hot64k rc=$?" >> "$WORK/sparse_hot64k.log"
  timeout 150 python3 -m benchmarks.sparse_training $G --hot-rows 1 --out "$WORK/hot1" \
    > "$WORK/sparse_hot1.log" 2>&1
  echo "hot1 rc=$?" >> "$WORK/sparse_hot1.log"
fi
{
  echo "$gpu; $(( $(date +%s) - start )) s"
  grep -h "rc=\|passed\|failed" "$WORK"/*.log "$WORK"/*/*.log 2>/dev/null | grep -v "^ *$" | tail -30
  for f in $(ls "$WORK"/*/bench_sparse.log "$WORK"/sparse_*.log 2>/dev/null); do
    echo "== $f"; grep -v host_offloader "$f" | tail -24
  done
} > "$FINAL/summary.txt" 2>&1
tar czf "$FINAL/s33.tgz" -C "$WORK" .
