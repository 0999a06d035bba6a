#!/usr/bin/env bash
# Session 36's GPU call, within $BUDGET_S (560) seconds, on either card. On an H200 (the
# first since session 25): the GPU suite, the quick loop grid graphed (Pallas and Triton,
# the run the README's loop table and the done-when read), the sparse client graphed
# at the default cache (2**18 rows, every provider, ours_hot_xla_add's first H200 run) and
# at 2**20 rows. On an H100: the interleaved A/B of the cached providers at 2**21 rows
# (ours_hot_xla_add there never ran; the probe's bea81fe refactor never ran on a GPU).
# With SECOND=1 (the second call, either card): the quick grid graphed with each step's inputs
# materialized (gpu_session.sh loopmat: whether the float32 misses of the first call are XLA
# fusing the toy step's inputs on this card too), then session 32's holder probes (fence,
# both races, overhead), the sharded example on one device and the notebooks, none of which
# has run since 0339b4e (H100, session 32). Each stage runs only where its timeout still
# fits; its tail goes to $OUT/summary.txt as it ends; the logs are in $OUT/s36.tgz.
# With FRESH=1 (the third call, either card): the sparse client graphed at 2**18 and 2**20
# hot rows, each run twice in turn, repeating the checked scan's ids (as every run before)
# and with --fresh-ids (each timed scan draws ids of its own). The prediction, written before
# it ran: the device table within its noise either way; the pinned steps 0-10 us a step
# slower with fresh ids, if part of the repeated runs' speed is address translation or
# caches warmed by the same rows (a turn's first scan paid 7-10 us, session 35), and level
# if not; the verdicts within 2x unchanged on an H200 (1.38x and 1.50x with repeated ids).
#   BUDGET_S=560 [SECOND=1 | FRESH=1] bash docs/lab/s36_gpu.sh
set -u
FINAL=${OUT:-/tmp/s36_out}
WORK=/tmp/s36_work
source docs/lab/call_stages.sh
if [ "${FRESH:-0}" = 1 ]; then  # the third call: repeated against fresh ids, in turn
  for hot in 262144 1048576; do
    for ids in repeated fresh; do
      # As it ran (22:26 UTC) repeated ids were the default; since session 37 fresh ids are,
      # so each arm names its own (--fresh-ids is still accepted).
      flag=$([ $ids = fresh ] && echo --fresh-ids || echo --repeated-ids)
      run "sparse_${ids}_$hot" 90 30 python3 -m benchmarks.sparse_training $G --hot-rows "$hot" \
        $flag --out "$WORK/${ids}_$hot"
    done
  done
elif [ "${SECOND:-0}" = 1 ]; then  # the second call: the materialized grid, then the probes
  OUT=$WORK/loopmat run loopmat 300 30 bash benchmarks/gpu_session.sh loopmat
  run fence_probe 90 6 python3 docs/lab/holder_fence_probe.py
  run freed_result 100 6 python3 docs/lab/freed_result_race_probe.py 50
  run freed_input 100 6 python3 docs/lab/freed_input_race_probe.py 50
  run holder_overhead 100 8 python3 docs/lab/holder_overhead_probe.py
  run example_sharded 120 6 python3 examples/sharded_demo.py --devices 1
  OUT=$WORK/notebooks run notebooks 240 12 bash benchmarks/gpu_session.sh notebooks
elif [[ $gpu == *H200* ]]; then
  OUT=$WORK/session PYTEST_ARGS="-n 8 --timeout 150" run tests 250 8 \
    bash benchmarks/gpu_session.sh tests
  OUT=$WORK/loop LOOP_ARGS="--quick --backends pallas,triton --time-budget-s 190" \
    run loop 300 60 bash benchmarks/gpu_session.sh loopgraphs
  run sparse_graphs 120 30 python3 -m benchmarks.sparse_training $G --out "$WORK/graphs"
  run sparse_hot1048576 90 30 python3 -m benchmarks.sparse_training $G --hot-rows 1048576 \
    --out "$WORK/hot1048576"
else
  run hot_ab 200 40 python3 docs/lab/hot_ab_probe.py --rounds 5 --hot-rows 2097152
fi
tar czf "$FINAL/s36.tgz" -C "$WORK" .
echo "done at $(( $(date +%s) - start )) s" >> "$FINAL/summary.txt"
