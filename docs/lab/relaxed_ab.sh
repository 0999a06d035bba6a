# Lab A/B written in session 16 (2026-12-05, no GPU lent): relaxed atomics for the owner write.
#
# On the H200, from the repository root, one call (about 6 min; its timeouts sum to 560 s after the install):
#     bash docs/lab/relaxed_ab.sh   (under $OUT: five logs, versions.log and two records)
# It runs the GPU suite on the tree (the first since ebdf8bb: the owner write's per-row choice,
# the relaxed option, the index fixes of session 15), then atomic_add_probe.py --part relaxed
# (the loop sizes; predictions in its docstring), then the one-shot gather/add benchmark with
# the code's defaults and again with PALLAS_PINNED_TUNING="relaxed_atomics=true" (the same
# atomic_add_from, 1024: the one-shot batches are all above it).
#
# Predictions (written before any run) for the one-shot add, throughput against set's in the
# same run (session 14, 21:09 UTC, acquire-release atomics: 4 Mi x 4 B 0.65x, 256 Ki x 512 B
# 0.78x, 64 Ki x 2 KiB 0.83x). An acquire-release atomic waits behind a MEMBAR.ALL.GPU for the
# thread's earlier accesses and returns the old value; the relaxed REDG does neither, so a
# thread keeps several atomics in flight:
#   * 4 Mi x 4 B (one 4-byte atomic per row, the case the barrier hurts most): 0.65x -> >= 0.72x,
#     which would meet the 0.7;
#   * 256 Ki x 512 B: 0.78x -> 0.80-0.88x;
#   * 64 Ki x 2 KiB: within noise (0.83x; 16-byte vector atomics, bus-bound).
# Both runs' records must be checked (the benchmark checks every provider against numpy).
# If the relaxed run wins here and in the probe's loop sizes, the library turns
# relaxed_atomics on (and atomic_add_from to where the probe says).
export XLA_PYTHON_CLIENT_PREALLOCATE=false
bash benchmarks/gpu_session.sh nostage > "$OUT/install.log" 2>&1
export PYTHONPATH=/tmp/site
stamp() { echo "== $1 $(date -u +%H:%M:%S)"; }
{ stamp gpu_suite; timeout 190 python3 -m pytest tests -m gpu -q -p no:cacheprovider -n 8 \
    --timeout 120 2>&1 | tail -15; } > "$OUT/gpu_tests.log" 2>&1
{ stamp probe; PYTHONPATH=/tmp/site:.:docs/lab timeout 170 python3 docs/lab/atomic_add_probe.py \
    --part relaxed --xla-option xla_gpu_graph_min_graph_size=1; } > "$OUT/relaxed_probe.log" 2>&1
{ stamp defaults; timeout 100 python3 -m benchmarks.gather_add --quick --out /tmp/ga_default; } \
  > "$OUT/gather_add_default.log" 2>&1
{ stamp relaxed; PALLAS_PINNED_TUNING="relaxed_atomics=true" timeout 100 \
    python3 -m benchmarks.gather_add --quick --out /tmp/ga_relaxed; } \
  > "$OUT/gather_add_relaxed.log" 2>&1
# The two records, for the commit (eight files come back: these, the five logs, versions.log).
cp /tmp/ga_default/gather_add.json "$OUT/gather_add_default.json" 2>/dev/null
cp /tmp/ga_relaxed/gather_add.json "$OUT/gather_add_relaxed.json" 2>/dev/null
