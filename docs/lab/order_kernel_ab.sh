#!/usr/bin/env bash
# Kept as the record of the 19:18 UTC run (the kernel's first tiling, since replaced); a new A/B of
# the order kernel runs docs/lab/order_kernel_tiling_ab.sh, whose arms A_TUNING/B_TUNING set.
# Session 25: the stable order of the add's runs path formed by one Pallas kernel
# (kernels/order_pallas.py, tuning.order_kernel_max) instead of XLA's ops (the n x n rank
# count, the permutation's scatter, the sorted rows' gather, a copy). A is
# order_kernel_max=0 (XLA's ops, as before), B the kernel (the new default), in the order
# A B B A, after the GPU suite under B.
# Prediction, written before the run: the H100 loop grid of 19:05 UTC had the unpromised add
# (which takes the runs path from 65 updates) at 15.5 us per step for 256 x 4 B and 44.5 for
# 1024 x 1 KiB, against 9.0 and 35.4 for the same add promised distinct (no order): the order
# costs about 6 of its 8 launches. B should take about 4 us off each loop case (one launch in
# place of about five) and at least 5 us off the sparse client at 4096 Zipf ids (XLA's rank
# count of 4 Ki ids took about 15-20 us in the 2026-12-03 H200 probes; the kernel's 16 M
# comparisons should take a few). Rule: B stays the default if both B runs beat both A runs in
# every loop case and in the client at 4096 ids; where B loses by more than 1 us anywhere,
# the default goes back to 0 (or the limit down to where B wins).
set -uo pipefail
export XLA_PYTHON_CLIENT_PREALLOCATE=false
mkdir -p "$OUT"
bash benchmarks/gpu_session.sh nostage > "$OUT/install.log" 2>&1
export PYTHONPATH=/tmp/site
{ date -u; timeout 200 python3 -m pytest tests -m gpu -q -p no:cacheprovider -n 8 --timeout 150 \
    2>&1 | tail -8; } > "$OUT/gpu_tests.log" 2>&1
G="--xla-option xla_gpu_graph_min_graph_size=1"
for name in A1 B1 B2 A2; do
  case $name in A*) tuning="order_kernel_max=0" ;; B*) tuning="" ;; esac
  mkdir -p "$OUT/$name"
  { date -u; PALLAS_PINNED_TUNING=$tuning timeout 50 python3 -m benchmarks.loop --rows 256,1024,4096 \
      --row-bytes 4,1024 --backends pallas --patterns none --providers baseline,xla_add,ours_add \
      $G --no-plots --time-budget-s 40 --out "$OUT/$name/loop"; echo "rc=$?"; } > "$OUT/$name/loop.log" 2>&1
  for run in "4096 1.1" "1024 1.1" "256 0"; do
    set -- $run
    { date -u; PALLAS_PINNED_TUNING=$tuning timeout 40 python3 -m benchmarks.sparse_training $G \
        --batch $1 --zipf-s $2 --out "$OUT/$name/sparse_$1_$2"; echo "rc=$?"; } \
      > "$OUT/$name/sparse_$1_$2.log" 2>&1
  done
done
date -u
