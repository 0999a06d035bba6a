# Lab A/B of 2026-12-04 (session 13): the sorted-runs add reads its rows before summing.
#
# On the H200, from the repository root, with the tree of ecec8f0 exported to .old/ (as in
# load_order_ab.sh) and the working tree's kernels/scatter_add_pallas.scatter_add_sorted_runs
# loading the owners' rows right after finding the owners, before summing the runs:
#     bash docs/lab/sorted_runs_read_ab.sh   (logs under $OUT; the run's copy is beside this file)
#
# Prediction (written before the run): as in the one-launch add (load_order_ab.sh), the PCIe
# round trip of the read overlaps the summing: 2-5 us per step at 4096 x 512 B, as much on the
# sparse client's add (4096 Zipf ids, 256 B rows).
#
# Outcome (graphed loop, then the sparse client; new, old, new again in one call, 20:23-20:24
# UTC; GPU tests of add first: 220 passed, 46 skipped). Unpromised add, auto, us per
# step: 4096 x 512 B 91.1 / 91.4 / 91.6 (XLA 58.8 / 58.8 / 60.2); 16384 x 512 B
# 285.3 / 291.8 / 282.8 (XLA 220.7 / 221.2 / 217.4). Sparse client, ours: 72.9 / 69.8 / 65.6,
# with the device table at 20.0 / 23.0 / 22.3 (a noisy machine; every provider checked).
# The prediction failed at 4096 rows: there 512 programs keep PCIe busy, so the step is bound
# by throughput, not by one program's chain of accesses; at 16384 rows both new runs were
# 2 % under the old. Kept, as harmless and as the same order as the one-launch add's.
export XLA_PYTHON_CLIENT_PREALLOCATE=false
bash benchmarks/gpu_session.sh nostage > $OUT/install.log 2>&1
export PYTHONPATH=/tmp/site
timeout 90 python3 -m pytest tests -m gpu -k "add" -q -p no:cacheprovider -n 8 --timeout 60 2>&1 | tail -3 > $OUT/gpu_tests_add.log
ARGS="--rows 4096,16384 --row-bytes 512 --patterns none --providers baseline,xla_add,ours_add --backends pallas --xla-option xla_gpu_graph_min_graph_size=1 --time-budget-s 40 --no-plots"
run() { echo "== $1 $(date -u +%H:%M:%S)"; }
{ run new1; timeout 60 python3 -m benchmarks.loop $ARGS --out /tmp/n1; run sparse_new; timeout 45 python3 -m benchmarks.sparse_training --out /tmp/sn; } > $OUT/new1.log 2>&1
( run old; cd .old; export PYTHONPATH=/tmp/site:.; timeout 60 python3 -m benchmarks.loop $ARGS --out /tmp/o; run sparse_old; timeout 45 python3 -m benchmarks.sparse_training --out /tmp/so ) > $OUT/old.log 2>&1
{ run new2; timeout 60 python3 -m benchmarks.loop $ARGS --out /tmp/n2; run sparse_new2; timeout 45 python3 -m benchmarks.sparse_training --out /tmp/sn2; } > $OUT/new2.log 2>&1
