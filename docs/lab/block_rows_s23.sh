#!/usr/bin/env bash
# Session 23: contiguous block sets as rows at every size (strided blocks keep the copy).
# The GPU suite, the block probe graphed at 64-1024 rows x 1 KiB, and the loop's write
# patterns graphed (SKIP_TESTS=1: not the suite). Run on the GPU from the repository root;
# logs under $OUT.
set -uo pipefail
export XLA_PYTHON_CLIENT_PREALLOCATE=false
bash benchmarks/gpu_session.sh nostage > "$OUT/install.log" 2>&1
export PYTHONPATH=/tmp/site
[ -n "${SKIP_TESTS:-}" ] || { date -u; timeout 200 python3 -m pytest tests -m gpu -q -p no:cacheprovider -n 8 --timeout 150 2>&1 | tail -25; } > "$OUT/gpu_tests.log" 2>&1
{ date -u; timeout 150 python3 -m benchmarks.block_probe --rows 64,128,256,512,1024 --row-bytes 1024 \
    --xla-option xla_gpu_graph_min_graph_size=1 --out "$OUT/block_probe"; echo "rc=$?"; } > "$OUT/block_probe.log" 2>&1
{ date -u; timeout 100 python3 -m benchmarks.loop --patterns ring,ring_wrap,kv,decode,block,kv_block \
    --rows 64 --row-bytes 1024 --providers xla_set,ours_set --backends pallas --no-plots \
    --xla-option xla_gpu_graph_min_graph_size=1 --time-budget-s 80 --out "$OUT/patterns"; echo "rc=$?"; } > "$OUT/patterns.log" 2>&1
date -u
