#!/usr/bin/env bash
# One batched GPU session: install, GPU tests, benchmarks, notebooks; logs to $OUT.
# Usage (on the GPU machine, from the repository root, so that `python3 -m benchmarks.*` resolves):
#   bash benchmarks/gpu_session.sh "tests quick loop training"
# Stages: tests quick loop training larger notebooks compare demo
# Rough times (each stage's timeout in brackets): tests <= 5.5 min [330 s], quick ~2 [420 s],
# loop ~5 [420 s], training ~5 [420 s], larger ~2 [240 s], notebooks ~2 [200 s each],
# compare ~5 [2 x (LOOP_BUDGET_S + 240 s)], demo < 1 [200 s].
# Where one command may run 10 min at most, split the stages over calls whose timeouts fit:
#   "tests demo" (9), "quick" (7), "loop" (7), "training" (7), "larger" (4), "notebooks" (10),
#   "compare" (10 with the default LOOP_BUDGET_S of 60).
# LOOP_ARGS (default: the quick grid, Pallas and Triton rows, graphed) goes to the loop stage:
# xla_gpu_graph_min_graph_size=1 runs the step's kernels as one CUDA graph, as a real step's
# are (docs/PERFORMANCE.md, "Graphed steps"). TRAINING_ARGS goes to the training stage.
# compare needs OLD_TREE, a checkout of the old commit carried to the machine
# (benchmarks/compare_trees.sh).
# jax-triton is carried as a wheel in .whl/ (the machine has no registry).
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/pallas_pinned_out}
# jax-triton deletes TRITON_CACHE_DIR on import; the raw Triton peer of one_call
# (benchmarks/triton_peer.py) compiles into this directory instead.
export PALLAS_PINNED_TRITON_CACHE=${PALLAS_PINNED_TRITON_CACHE:-/tmp/triton_cache}
GRAPHED="--xla-option xla_gpu_graph_min_graph_size=1"
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
    quick)
      log "one_call --quick"
      timeout 420 python3 -m benchmarks.one_call --quick --out /tmp/one_call_quick \
        > "$OUT/one_call_quick.log" 2>&1; ended quick $?
      tail -40 "$OUT/one_call_quick.log"
      tar czf "$OUT/one_call_quick.tgz" -C /tmp/one_call_quick . ;;
    loop)
      loop_args=${LOOP_ARGS-"--quick --backends pallas,triton $GRAPHED"}
      log "loop $loop_args"
      timeout 420 python3 -m benchmarks.loop $loop_args --out /tmp/loop \
        > "$OUT/loop.log" 2>&1; ended loop $?
      tail -45 "$OUT/loop.log"
      tar czf "$OUT/loop.tgz" -C /tmp/loop . ;;
    training)
      log "training ${TRAINING_ARGS:-}"
      timeout 420 python3 -m benchmarks.training $GRAPHED ${TRAINING_ARGS:-} --out /tmp/training \
        > "$OUT/training.log" 2>&1; ended training $?
      tail -30 "$OUT/training.log"
      tar czf "$OUT/training.tgz" -C /tmp/training . ;;
    larger)
      # A 16 GiB table (and its accumulators) trained with less GPU memory free than that.
      log "examples/larger_than_device.py --fill-gpu"
      XLA_PYTHON_CLIENT_MEM_FRACTION=0.95 timeout 240 python3 examples/larger_than_device.py \
        --rows 67108864 --dim 64 --cache-rows 3355443 --samples 1024 --steps 200 \
        --refresh-every 50 --fill-gpu 2>&1 | tee "$OUT/larger_than_device.log"; ended larger $? ;;
    notebooks)
      mkdir -p /tmp/figs
      for nb in notebooks/0*.ipynb; do
        b=$(basename "$nb" .ipynb); log "notebook $b"
        timeout 200 python3 notebooks/run_as_script.py "$nb" --figures /tmp/figs > "/tmp/figs/$b.log" 2>&1
        ended "$b" $?; tail -n 1 "/tmp/figs/$b.log"
      done
      grep -hE "triton custom calls|S\(5\)|copies|matches numpy|LIVE|update loop|Triton kernels|final buffer|median step" /tmp/figs/*.log | head -30
      tar czf "$OUT/notebooks.tgz" -C /tmp/figs . ;;
    compare)
      # Before and after: OLD_TREE is a checkout of the old commit, carried to the machine.
      log "compare_trees ${OLD_TREE:-(OLD_TREE unset)}"
      if [ -z "${OLD_TREE:-}" ]; then echo "compare needs OLD_TREE"; ended compare 2; continue; fi
      OUT="$OUT" timeout $((2 * (${LOOP_BUDGET_S:-60} + 240))) bash benchmarks/compare_trees.sh \
        "$OLD_TREE" "${LOOP_BUDGET_S:-60}" 2>&1 | tee "$OUT/compare.log"
      ended compare $? ;;
    demo)
      log "python -m pallas_pinned"
      timeout 200 python3 -m pallas_pinned 2>&1 | tee "$OUT/demo.log"; ended demo $? ;;
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
