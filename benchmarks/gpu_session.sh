#!/usr/bin/env bash
# One batched GPU session: install, GPU tests, benchmarks, notebooks; logs to $OUT.
# Usage (on the H200, from the repository root, so that `python3 -m benchmarks.*` resolves):
#   bash benchmarks/gpu_session.sh "tests loop sparse"      # or "tests quick full notebooks"
# Stages: tests quick full demo gatheradd loop loopgraphs loopmat xlapath sparse sparsesizes tune notebooks cached larger compare
# Rough times (each stage's timeout in brackets): tests <= 5.5 min [330 s], quick ~2 [420 s],
# full ~6 [420 s], demo < 1 [200 s], gatheradd ~1 [200 s], loop ~5 [420 s],
# loopgraphs ~3 [420 s], loopmat ~2 [300 s], xlapath ~3 [570 s], sparse ~1 [240 s],
# sparsesizes ~3 [6 x 60 s],
# tune ~3 [360 s], notebooks ~2 [200 s each], cached ~1 [150 s], larger ~2 [240 s],
# compare ~5 [2 x (LOOP budget + 240 s)]. The sum of the timeouts of "tests loop sparse"
# is 16.5 min; of every stage ~81 min (more than one 30-minute lease).
# "loop" with its default LOOP_ARGS is the whole grid, about 50 min (its estimate: 2989 s):
# its time budget (240 s) is checked between cases, so a large case started inside the budget
# can outrun the stage's 420 s (the cases before it are in loop.json). Split it with
# LOOP_ARGS (--rows, --dtypes, --providers), or run --quick.
# Where one command may run 10 min at most, split the stages over calls whose timeouts fit:
#   "tests sparse" (9.5 min), "loop" (7), "loopgraphs" (7), "loopmat sparse" (9), "full" (7),
#   "quick" (7), "gatheradd demo" (6.7), "xlapath" (9.5), "sparsesizes" (6), "tune" (6),
#   "notebooks" (10).
# LOOP_ARGS (default "--backends pallas,triton", gather included) is passed to the loop stage
# and to loopgraphs, which also gives every scan xla_gpu_graph_min_graph_size=1 (the step's
# kernels as one CUDA graph, as a real step's are: the run benchmarks.choose_backends
# reads); SPARSE_ARGS to the sparse stage. xlapath measures XLA's own set and add path as auto
# runs it (a table with it for every set and add class, graphed, read-back rows included), then
# the sparse-training client under that table on Zipf and on uniform ids: the evidence
# choose_backends reads with --xla-path-from, --add-client-from and --distinct-client-from.
# loopmat runs the quick grid graphed with each step's inputs materialized: the run
# choose_backends also judges XLA's path on (--materialized-from).
# jax-triton is carried as a wheel in .whl/ (the machine has no registry).
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/pallas_pinned_out}
# jax-triton deletes TRITON_CACHE_DIR on import; the raw Triton peer of the sweep
# (benchmarks/triton_peer.py) compiles into this directory instead.
export PALLAS_PINNED_TRITON_CACHE=${PALLAS_PINNED_TRITON_CACHE:-/tmp/triton_cache}
mkdir -p "$OUT"
stages=${1:-"tests quick"}
log() { echo "== $* ($(date -u +%H:%M:%S))"; }
# Every command a stage runs ends in `ended NAME $?`: it prints `NAME rc=N` (124: its timeout
# ran out) and remembers a failure; the later stages still run, and the session exits 1.
failed=""
ended() {
  local why=""
  [ "$2" -eq 124 ] && why=" (timed out)"
  echo "$1 rc=$2$why"
  [ "$2" -eq 0 ] || failed="$failed $1"
}

python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || exit 1
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
{
  log versions
  python3 -c "import sys, jax, jaxlib, triton; print('python', sys.version.split()[0], 'jax', jax.__version__, 'jaxlib', jaxlib.__version__, 'triton', triton.__version__); import jax_triton; print('jax_triton', jax_triton.__version__)"
  nvidia-smi --query-gpu=name,driver_version,pcie.link.gen.current,pcie.link.width.current --format=csv,noheader
} 2>&1 | tee "$OUT/versions.log"

for stage in $stages; do
  case "$stage" in
    tests)
      log "pytest -m gpu"
      # pipefail: the pipeline's status is pytest's (or timeout's), not tee's.
      timeout 330 python3 -m pytest tests -m gpu -q -p no:cacheprovider ${PYTEST_ARGS:-} 2>&1 \
        | tail -60 | tee "$OUT/gpu_tests.log"
      ended tests $? ;;
    quick|full)
      log "bench $stage"
      flags=$([ "$stage" = quick ] && echo "--quick --big-buffer-gib 32" || echo "")
      timeout 420 python3 -m benchmarks.sweep $flags --out /tmp/bench_$stage \
        > "$OUT/bench_$stage.log" 2>&1; ended "bench_$stage" $?
      tail -40 "$OUT/bench_$stage.log"
      tar czf "$OUT/bench_$stage.tgz" -C /tmp/bench_$stage . ;;
    demo)
      log "python -m pallas_pinned"
      timeout 200 python3 -m pallas_pinned 2>&1 | tee "$OUT/demo.log"; ended demo $? ;;
    gatheradd)
      log "bench gather/add"
      timeout 200 python3 -m benchmarks.gather_add --out "$OUT" > "$OUT/bench_gather_add.log" 2>&1
      ended gatheradd $?; tail -30 "$OUT/bench_gather_add.log" ;;
    loop)
      loop_args=${LOOP_ARGS-"--backends pallas,triton"}
      log "bench loop $loop_args"
      timeout 420 python3 -m benchmarks.loop $loop_args --out /tmp/bench_loop \
        > "$OUT/bench_loop.log" 2>&1; ended loop $?
      tail -45 "$OUT/bench_loop.log"
      tar czf "$OUT/bench_loop.tgz" -C /tmp/bench_loop . ;;
    loopgraphs)
      loop_args=${LOOP_ARGS-"--backends pallas,triton"}
      log "bench loop, command buffers, $loop_args"
      timeout 420 python3 -m benchmarks.loop $loop_args \
        --xla-option xla_gpu_graph_min_graph_size=1 --out /tmp/bench_loop_graphs \
        > "$OUT/bench_loop_graphs.log" 2>&1; ended loopgraphs $?
      tail -45 "$OUT/bench_loop_graphs.log"
      tar czf "$OUT/bench_loop_graphs.tgz" -C /tmp/bench_loop_graphs . ;;
    loopmat)
      log "bench loop, command buffers, inputs materialized"
      timeout 300 python3 -m benchmarks.loop --quick --backends pallas --patterns none \
        --xla-option xla_gpu_graph_min_graph_size=1 --inputs materialized --time-budget-s 150 \
        --no-plots --out /tmp/bench_loop_materialized \
        > "$OUT/bench_loop_materialized.log" 2>&1; ended loopmat $?
      tail -25 "$OUT/bench_loop_materialized.log"
      tar czf "$OUT/bench_loop_materialized.tgz" -C /tmp/bench_loop_materialized . ;;
    xlapath)
      log "bench loop, XLA's set and add path as auto, command buffers"
      python3 -m benchmarks.choose_backends --xla-path-table /tmp/xla_path_table.json
      ended xlapath_table $?
      PALLAS_PINNED_BACKEND_TABLE=/tmp/xla_path_table.json timeout 270 python3 -m benchmarks.loop \
        --quick --backends pallas --patterns none \
        --providers baseline,floor_launch,xla_set,ours_set,xla_set_read,ours_set_read,xla_add,ours_add,xla_add_read,ours_add_read,ours_set_unique,ours_set_unique_read,ours_add_unique,ours_add_unique_read \
        --xla-option xla_gpu_graph_min_graph_size=1 --out /tmp/bench_xla_path \
        > "$OUT/bench_xla_path.log" 2>&1; ended xlapath $?
      tail -35 "$OUT/bench_xla_path.log"
      cp /tmp/xla_path_table.json /tmp/bench_xla_path/
      # The clients' verdicts (choose_backends --add-client-from, graphed, Zipf ids; and
      # --distinct-client-from, uniform ids).
      for ids in zipf uniform; do
        log "bench sparse training ($ids ids), XLA's set and add path as auto, command buffers"
        zipf_s=$([ $ids = uniform ] && echo "--zipf-s 0")
        PALLAS_PINNED_BACKEND_TABLE=/tmp/xla_path_table.json timeout 150 \
          python3 -m benchmarks.sparse_training --xla-option xla_gpu_graph_min_graph_size=1 \
          $zipf_s ${SPARSE_ARGS:-} --out /tmp/bench_xla_path/sparse_$ids \
          > "$OUT/sparse_xla_path_$ids.log" 2>&1
        ended "sparse_xlapath_$ids" $?; grep -v host_offloader "$OUT/sparse_xla_path_$ids.log" | tail -14
      done
      tar czf "$OUT/bench_xla_path.tgz" -C /tmp/bench_xla_path . ;;
    sparse)
      log "bench sparse training ${SPARSE_ARGS:-}"
      timeout 240 python3 -m benchmarks.sparse_training ${SPARSE_ARGS:-} --out "$OUT" \
        > "$OUT/bench_sparse.log" 2>&1; ended sparse $?
      tail -12 "$OUT/bench_sparse.log" ;;
    sparsesizes)
      # The sparse client graphed at smaller batches, on Zipf ids (they repeat) and on uniform
      # ones: the loop grid's rows never repeat, so only these show what repeated ids cost a
      # path (docs/PERFORMANCE.md "The one launch on repeated ids").
      for batch in 64 256 1024; do
        for zipf in 1.1 0; do
          log "bench sparse training graphed, $batch ids a step, zipf $zipf"
          timeout 60 python3 -m benchmarks.sparse_training --batch $batch --zipf-s $zipf \
            --xla-option xla_gpu_graph_min_graph_size=1 --out "$OUT/sparse_${batch}_$zipf" \
            > "$OUT/sparse_${batch}_$zipf.log" 2>&1; ended "sparse_${batch}_$zipf" $?
          grep -E "^(device|ours|ours_sorted|xla|transfer) " "$OUT/sparse_${batch}_$zipf.log"
        done
      done ;;
    tune)
      log "bench tune"
      timeout 360 python3 -m benchmarks.tune --out /tmp/bench_tune \
        > "$OUT/bench_tune.log" 2>&1; ended tune $?
      tail -20 "$OUT/bench_tune.log"
      tar czf "$OUT/bench_tune.tgz" -C /tmp/bench_tune . ;;
    notebooks)
      mkdir -p /tmp/figs
      for nb in notebooks/0*.ipynb; do
        b=$(basename "$nb" .ipynb); log "notebook $b"
        timeout 200 python3 notebooks/run_as_script.py "$nb" --figures /tmp/figs > "/tmp/figs/$b.log" 2>&1
        ended "$b" $?; tail -n 1 "/tmp/figs/$b.log"
      done
      grep -hE "triton custom calls|S\(5\)|copies|matches numpy|LIVE|update loop|Triton kernels|final buffer|median step" /tmp/figs/*.log | head -30
      tar czf "$OUT/notebooks.tgz" -C /tmp/figs . ;;
    cached)
      log "bench cached table"
      XLA_FLAGS=--xla_gpu_graph_min_graph_size=1 timeout 150 python3 -m benchmarks.cached_table \
        ${CACHED_ARGS:-} --out "$OUT" > "$OUT/bench_cached_table.log" 2>&1; ended cached $?
      tail -14 "$OUT/bench_cached_table.log" ;;
    larger)
      # A 16 GiB table (and its accumulators) trained with less GPU memory free than that.
      log "examples/larger_than_device.py --fill-gpu"
      XLA_PYTHON_CLIENT_MEM_FRACTION=0.95 timeout 240 python3 examples/larger_than_device.py \
        --rows 67108864 --dim 64 --cache-rows 3355443 --samples 1024 --steps 200 \
        --refresh-every 50 --fill-gpu 2>&1 | tee "$OUT/larger_than_device.log"; ended larger $? ;;
    compare)
      # Before and after: OLD_TREE is a checkout of the old commit, carried to the machine.
      log "compare_trees ${OLD_TREE:-(OLD_TREE unset)}"
      if [ -z "${OLD_TREE:-}" ]; then echo "compare needs OLD_TREE"; ended compare 2; continue; fi
      OUT="$OUT" timeout $((2 * (${LOOP_BUDGET_S:-60} + 240))) bash benchmarks/compare_trees.sh \
        "$OLD_TREE" "${LOOP_BUDGET_S:-60}" 2>&1 | tee "$OUT/compare.log"
      ended compare $? ;;
    *)
      # Not a failure: `gpu_session.sh nostage` is the install alone (docs/GPU_RUNS.md).
      echo "unknown stage: $stage (nothing run)" ;;
  esac
done
log done
if [ -n "$failed" ]; then
  echo "FAILED:$failed"
  exit 1
fi
