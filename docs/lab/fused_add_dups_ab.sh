#!/usr/bin/env bash
# Session 24: the one-launch add on ids that repeat. The A/B of fused_max_adds=4096
# (docs/lab/fused_add_limit_ab.sh, H100) made the sparse client 5x slower (70 -> 350 us):
# the owner of a hot row sums its later duplicates sub-chunk by sub-chunk, serially. At 256
# Zipf ids per step the same client took 33-34 us on the one launch (the default up to 1024
# updates) against 20-22 with fused_max_adds=16 (the ordered runs); on uniform ids 16 against
# 20-22. Here A is the default (fused_max_adds=1024) and B fused_max_adds=64, in the order
# A B B A, then the GPU suite under B.
# Prediction, written before the run: B faster than A by >= 10 us on the Zipf client at 256
# and at 1024 ids; B slower by about 5 us on uniform ids at 256; on the loop's distinct rows
# (unpromised add of 256 x 4 B, 256 x 1 KiB, 1024 x 1 KiB) B slower by 2-8 us each. If the
# Zipf gains hold at both batch sizes and no loop case loses more than 10 us, the default
# becomes 64: the one launch's worst case grows with the batch (5x at 4096 ids), the ordered
# runs' cost on distinct rows only by a few us.
set -uo pipefail
export XLA_PYTHON_CLIENT_PREALLOCATE=false
bash benchmarks/gpu_session.sh nostage > "$OUT/install.log" 2>&1
export PYTHONPATH=/tmp/site
G="--xla-option xla_gpu_graph_min_graph_size=1"
for name in A1 B1 B2 A2; do
  case $name in A*) tuning="" ;; B*) tuning="fused_max_adds=64" ;; esac
  mkdir -p "$OUT/$name"
  { date -u; PALLAS_PINNED_TUNING=$tuning timeout 60 python3 -m benchmarks.loop --rows 256,1024 \
      --row-bytes 4,1024 --backends pallas --patterns none --providers baseline,xla_add,ours_add \
      $G --no-plots --time-budget-s 45 --out "$OUT/$name/loop"; echo "rc=$?"; } > "$OUT/$name/loop.log" 2>&1
  for run in "1024 1.1" "256 1.1" "256 0"; do
    set -- $run
    { date -u; PALLAS_PINNED_TUNING=$tuning timeout 45 python3 -m benchmarks.sparse_training $G \
        --batch $1 --zipf-s $2 --out "$OUT/$name/sparse_$1_$2"; echo "rc=$?"; } \
      > "$OUT/$name/sparse_$1_$2.log" 2>&1
  done
done
{ date -u; PALLAS_PINNED_TUNING="fused_max_adds=64" timeout 200 python3 -m pytest tests -m gpu -q \
    -p no:cacheprovider -n 8 --timeout 150 2>&1 | tail -8; } > "$OUT/gpu_tests_B.log" 2>&1
date -u
