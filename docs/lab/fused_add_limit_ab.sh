#!/usr/bin/env bash
# Session 24: the one-launch add (duplicates found and summed inside the kernel) up to 4096
# updates instead of 1024 (tuning fused_max_adds), against the default path from 1025 updates
# (a stable order counted as ranks, then one launch over the runs). Arms in the order
# A B B A, each in its own process (the setting is read when an op is traced):
#   the loop at 2048 and 4096 x 512 B, graphed, inputs fused and materialized, unpromised add
#   and add-then-read against XLA's; the sparse-training client graphed (4096 Zipf ids).
# Prediction, written before the run (H200 figures of 17:47 UTC: auto's add of 4096 x 512 B
# 80.2 us, XLA's 58.6; read back 122.3; the client 70.5): the one-launch add takes about
# 70 us at 4096 x 512 B (set's one launch took 51.8 there; the atomic add costs ~13 more than
# a store, the search ~4), so ahead of the default by >= 5 us and still behind XLA's add;
# read back ahead by as much; the client within 3 us either way (its ids repeat, so the owners
# of hot rows sum long runs in the search loop). If the loop gains >= 5 us at 4096 rows in both
# A/B pairs and the client loses <= 3 us, fused_max_adds goes to 4096.
# Run on the GPU from the repository root; logs under $OUT.
set -uo pipefail
export XLA_PYTHON_CLIENT_PREALLOCATE=false
bash benchmarks/gpu_session.sh nostage > "$OUT/install.log" 2>&1
export PYTHONPATH=/tmp/site
G="--xla-option xla_gpu_graph_min_graph_size=1"
arm() {  # name, tuning
  local name=$1 tuning=$2
  for inputs in fused materialized; do
    { date -u; PALLAS_PINNED_TUNING=$tuning timeout 120 python3 -m benchmarks.loop --rows 2048,4096 \
        --row-bytes 512 --backends pallas --patterns none --inputs $inputs \
        --providers baseline,xla_add,ours_add,xla_add_read,ours_add_read $G --no-plots \
        --time-budget-s 90 --out "$OUT/$name/loop_$inputs"; echo "rc=$?"; } \
      > "$OUT/$name/loop_$inputs.log" 2>&1
  done
  { date -u; PALLAS_PINNED_TUNING=$tuning timeout 100 python3 -m benchmarks.sparse_training $G \
      --out "$OUT/$name/sparse"; echo "rc=$?"; } > "$OUT/$name/sparse.log" 2>&1
}
for name in A1 B1 B2 A2; do
  mkdir -p "$OUT/$name"
  # Run before fused_max_unpromised_adds existed (20b8ca2); to rerun arm B as it ran, raise it too.
  case $name in A*) arm $name "" ;; B*) arm $name "fused_max_adds=4096,fused_max_unpromised_adds=4096" ;; esac
done
date -u
