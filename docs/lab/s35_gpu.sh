#!/usr/bin/env bash
# Session 35's GPU call, within $BUDGET_S (560) seconds, on either card: the sparse client
# graphed with the new provider ours_hot_xla_add (benchmarks/sparse_hot.py) at the default
# cache (2**18 rows) and at 2**20, the interleaved A/B of the cached providers
# (docs/lab/hot_ab_probe.py, 7 rounds) and the kernel trace of the device table, merged and
# xla_add (docs/lab/step_kernels_probe.py); then, on an H200 with 250 s left, the GPU suite.
# Each stage's tail goes to $OUT/summary.txt as it ends; the logs are in $OUT/s35.tgz.
#
# The prediction, written before the first run: ours_hot_xla_add runs about 5 kernels a
# step where merged runs 8 (no owner codes, no ordering, no second read; its cold add is
# one XLA scatter kernel of atomics), so 3-5 us a step below merged at 2**18 and 2**20
# rows graphed, within 2x of the device table at 2**20 (merged: 2.02x on the H100 of
# session 34), and about the device table plus our gather's launch with every row cached.
# With SECOND=1 (the second call, after the first's H100 run at 18:36 UTC): the client
# back to back at 2**20 rows, the interleaved A/B with turns of two scans (hot_ab_probe.py
# --turn 2: whether the interleaved runs' extra time is a turn's first scan, coming back to
# a table after the others'), then the client at 2**18, 2**21 rows and every row, each
# stage only where its timeout still fits the budget.
#   BUDGET_S=560 [SECOND=1] bash docs/lab/s35_gpu.sh
set -u
FINAL=${OUT:-/tmp/s35_out}
WORK=/tmp/s35_work
source docs/lab/call_stages.sh
if [ "${SECOND:-0}" = 1 ]; then  # the second call: the client again, and a turn of two scans
  client() {
    run "sparse_hot$1" 60 30 python3 -m benchmarks.sparse_training $G --hot-rows "$1" \
      --out "$WORK/hot$1"
  }
  client 1048576
  run hot_ab_turn2 150 20 python3 docs/lab/hot_ab_probe.py --rounds 7 --turn 2 \
    --no-contention --hot-rows 262144 1048576
  for hot in 262144 2097152 8388608; do client "$hot"; done
else
  run sparse_graphs 120 30 python3 -m benchmarks.sparse_training $G --out "$WORK/graphs"
  run sparse_hot1048576 120 30 python3 -m benchmarks.sparse_training $G --hot-rows 1048576 \
    --out "$WORK/hot1048576"
  run hot_ab 150 40 python3 docs/lab/hot_ab_probe.py --rounds 7
  run step_kernels 120 60 python3 docs/lab/step_kernels_probe.py --providers device \
    ours_hot_merged ours_hot_xla_add
fi
if [[ $gpu == *H200* ]]; then
  OUT=$WORK/session PYTEST_ARGS="-n 8 --timeout 150" run tests 250 8 \
    bash benchmarks/gpu_session.sh tests
fi
tar czf "$FINAL/s35.tgz" -C "$WORK" .
echo "done at $(( $(date +%s) - start )) s" >> "$FINAL/summary.txt"
