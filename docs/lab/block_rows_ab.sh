#!/usr/bin/env bash
# A/B for issue 20's block lead: does auto's contiguous-block copy lose to kernel rows?
# Prediction (session 22): rows win the 64-row contiguous block by >= 4 us per step;
# the strided KV block stays faster as a copy. Run on the GPU from the repository root.
set -uo pipefail
OUT=${OUT:-/tmp/block_ab}; mkdir -p "$OUT"
common="--patterns block,kv_block --rows 64 --row-bytes 1024 --providers xla_set,ours_set \
  --backends pallas --xla-option xla_gpu_graph_min_graph_size=1 --time-budget-s 50 --no-plots"
for arm in default rows; do
  tuning=""; [ "$arm" = rows ] && tuning="block_rows_from=0"
  { date -u; echo "arm $arm PALLAS_PINNED_TUNING=$tuning";
    PALLAS_PINNED_TUNING=$tuning timeout 75 python3 -m benchmarks.loop $common \
      --out "$OUT/block_$arm"; echo "rc=$?"; } > "$OUT/block_$arm.log" 2>&1
done
