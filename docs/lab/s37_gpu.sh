#!/usr/bin/env bash
# Session 37's GPU calls, within $BUDGET_S (560) seconds each. The first: the GPU suite (an
# eager int's block now takes its static int's path: dispatch changed), the fresh-ids probe
# (docs/lab/fresh_ids_probe.py, its prediction in its header) at 2**18 hot rows, the client
# as it now runs by default (fresh ids) at 2**18 and 2**20, and the probe at 2**20. With
# XLAPATH=1: on an H200, session 36's FRESH=1 runs (the client repeating its ids, then with
# fresh ids, at both cache sizes; they ran on an H100 at 22:26 UTC), then
# gpu_session.sh xlapath, the evidence benchmarks.choose_backends reads (last taken
# 2026-12-04, H200).
#   BUDGET_S=560 [XLAPATH=1] bash docs/lab/s37_gpu.sh
set -u
FINAL=${OUT:-/tmp/s37_out}
WORK=/tmp/s37_work
source docs/lab/call_stages.sh
if [ "${XLAPATH:-0}" = 1 ]; then
  if [[ $gpu == *H200* ]]; then
    for hot in 262144 1048576; do
      for ids in repeated fresh; do
        flag=$([ $ids = repeated ] && echo --repeated-ids)  # fresh: the default since 37
        run "sparse_${ids}_$hot" 90 30 python3 -m benchmarks.sparse_training $G \
          --hot-rows "$hot" $flag --out "$WORK/${ids}_$hot"
      done
    done
  fi
  OUT=$WORK/xlapath run xlapath 400 60 bash benchmarks/gpu_session.sh xlapath
else
  OUT=$WORK/session PYTEST_ARGS="-n 8 --timeout 150" run tests 250 8 \
    bash benchmarks/gpu_session.sh tests
  run probe_262144 120 12 python3 docs/lab/fresh_ids_probe.py --hot-rows 262144
  # The client as it now runs by default (fresh ids), at both cache sizes, where time is left.
  for hot in 262144 1048576; do
    run "sparse_fresh_$hot" 90 30 python3 -m benchmarks.sparse_training $G --hot-rows "$hot" \
      --out "$WORK/fresh_$hot"
  done
  run probe_1048576 120 12 python3 docs/lab/fresh_ids_probe.py --hot-rows 1048576
fi
tar czf "$FINAL/s37.tgz" -C "$WORK" .
echo "done at $(( $(date +%s) - start )) s" >> "$FINAL/summary.txt"
