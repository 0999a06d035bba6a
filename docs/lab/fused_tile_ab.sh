# Lab A/B of 2026-12-04 (session 13): one row per program in the one-launch kernels.
#
# On the H200, from the repository root, with the tree of 7e2ec84 exported to .old/ (as in
# load_order_ab.sh) and the working tree giving one_launch_tiling 1 KiB tiles
# (choose_row_tiling(..., tile_bytes=1024): one row per program from 1 KiB rows, 4 warps)
# instead of 8 rows of the 16 KiB tiling:
#     bash docs/lab/fused_tile_ab.sh      (logs under $OUT; the run's copy is beside this file)
#
# Prediction (written before the run), from the session-9 tile probe
# (tile_probe_h200_2004.log: the 1024 x 1 KiB add 42.1 us with 1 KiB tiles against 47.1 with
# 16 KiB): with a row per program, a program's write follows its own read while others still
# read, so the add should gain ~5 us at 1024 x 1 KiB and ~0.5-1 us at 64 and 256 rows.
#
# Outcome (graphed loop, 20:01-20:03 UTC; GPU suite before it, tiles changed: 907 passed,
# 57 skipped). Kernel-forced add, 1 KiB tiles / 8-row tiles / 1 KiB tiles again, us per
# step: 64 x 1 KiB 11.2 / 9.5 / 9.3; 256 x 1 KiB 15.7 / 15.8 / 15.8; 1024 x 1 KiB
# 40.6 / 45.2 / 43.3, while XLA's add in the same runs went 38.6 / 40.3 / 42.9. Against
# XLA's add of the same run, 1024 rows: 1.05 / 1.12 / 1.01; 64 rows: 1.44 / 1.20 / 1.29.
# The kernel-forced set at 1024 rows: 28.5 / 28.9 / 31.5. A gain at 1024 rows about the size
# of the machine's drift within the call, and a loss at 64 rows: not kept (the tiles stayed
# 8 rows; the change was reverted before committing).
export XLA_PYTHON_CLIENT_PREALLOCATE=false
bash benchmarks/gpu_session.sh nostage > $OUT/install.log 2>&1
export PYTHONPATH=/tmp/site
timeout 170 python3 -m pytest tests -m gpu -q -p no:cacheprovider -n 8 --timeout 150 2>&1 | tail -4 > $OUT/gpu_tests.log
P="baseline,floor_launch,xla_set,ours_set,ours_set_unique,xla_add,ours_add,ours_add_unique"
ARGS="--quick --backends pallas --patterns none --providers $P --xla-option xla_gpu_graph_min_graph_size=1 --time-budget-s 80 --no-plots"
run() { echo "== $1 $(date -u +%H:%M:%S)"; }
{ run new1; python3 -m benchmarks.loop $ARGS --out /tmp/new1; } > $OUT/tile_new1.log 2>&1
( run old; cd .old; PYTHONPATH=/tmp/site:. python3 -m benchmarks.loop $ARGS --out /tmp/old ) > $OUT/tile_old.log 2>&1
{ run new2; python3 -m benchmarks.loop $ARGS --out /tmp/new2; } > $OUT/tile_new2.log 2>&1
# The same call then ran the graphed quick loop with --inputs materialized (the working
# tree, tiles changed) -> benchmarks/results/loop_quick_graphs_materialized_h200.*
{ run materialized; python3 -m benchmarks.loop $ARGS --inputs materialized --out /tmp/mat; } > $OUT/loop_materialized.log 2>&1
cp /tmp/mat/loop.json $OUT/loop_materialized.json
