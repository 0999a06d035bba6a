# Lab A/B of 2026-12-04 (session 13): the one-launch kernels' load order.
#
# On the H200, from the repository root, with the tree before the change exported to .old/
# (git archive bc4d639 pallas_pinned kernels benchmarks/*.py pyproject.toml | tar -x -C .old;
#  ln -s ../kernels .old/pallas_pinned/kernels) and jax-triton as a wheel in .whl/:
#     bash docs/lab/load_order_ab.sh      (logs under $OUT; the run's copy is beside this file)
#
# Change. The one-launch set and add (kernels/scatter_pallas.py, scatter_add_pallas.py) loaded
# their update rows only after the duplicate search had masked them, the search ran in a loop
# even for a batch of one chunk, and the add read the buffer's row (a PCIe round trip) last.
# Now the update load is masked by the batch's end only and goes out with the index loads, a
# one-chunk search is straight-line code (pallas_common.for_chunks), and the add reads its rows
# before the search. Prediction (written before the run): a tiny batch's time is its chain of
# dependent accesses, so about one device-memory latency (~0.5-1 us) off the set and more off
# the add, whose PCIe read no longer waits for the search.
#
# Outcome (graphed loop, 200-step scans, medians of 5 interleaved runs; new, old, new again in
# one call, 19:49-19:51 UTC; GPU suite before it: 907 passed, 57 skipped). us per step,
# unpromised, auto (the one-launch kernel for every add here) old / new / new again:
#   add 5 x 4 B 6.4 / 6.2 / 6.7; 64 x 1 KiB 10.7 / 9.1 / 9.9; 256 x 4 B 8.9 / 7.5 / 7.8;
#       256 x 1 KiB 17.0 / 14.9 / 15.8; 1024 x 1 KiB 46.7 / 41.2 / 42.8
#   XLA's add in the same runs 4.8 / 4.9 / 5.2; 7.4 / 6.6 / 7.4; 7.8 / 7.7 / 8.0;
#       12.9 / 12.2 / 13.5; 38.7 / 36.6 / 38.7
#   set, kernel forced: 5.4 / 5.2 / 5.5; 8.0 / 7.1 / 7.9; 7.5 / 6.9 / 6.7; 11.8 / 11.6 / 12.0;
#       29.0 / 28.3 / 28.5
# The add gained 0.8-5.5 us from 64 rows up (the PCIe read overlapped) and 256 x 4 B now ties
# XLA's add; the set gained up to 0.9 us, within the spread at 5 and 256 x 1 KiB. The kernels
# were kept.
export XLA_PYTHON_CLIENT_PREALLOCATE=false
bash benchmarks/gpu_session.sh nostage > $OUT/install.log 2>&1
export PYTHONPATH=/tmp/site
{ ls -a | tr '\n' ' '; echo; git log -1 --oneline 2>&1; } > $OUT/where.log
timeout 170 python3 -m pytest tests -m gpu -q -p no:cacheprovider -n 8 --timeout 150 2>&1 | tail -15 > $OUT/gpu_tests.log
ARGS="--quick --backends pallas --patterns none --providers baseline,floor_launch,xla_set,ours_set,ours_set_unique,xla_add,ours_add,ours_add_unique --xla-option xla_gpu_graph_min_graph_size=1 --time-budget-s 90 --no-plots"
run() { echo "== $1 $(date -u +%H:%M:%S)"; }
{ run new1; python3 -m benchmarks.loop $ARGS --out /tmp/new1; } > $OUT/loop_new1.log 2>&1
( run old; cd .old; python3 -c "import pallas_pinned.kernels as k; print(k.__file__)"; PYTHONPATH=/tmp/site:. python3 -c "import pallas_pinned.kernels as k; print(k.__file__)"; PYTHONPATH=/tmp/site:. python3 -m benchmarks.loop $ARGS --out /tmp/old ) > $OUT/loop_old.log 2>&1
{ run new2; python3 -m benchmarks.loop $ARGS --out /tmp/new2; } > $OUT/loop_new2.log 2>&1
