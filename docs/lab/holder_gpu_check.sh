#!/usr/bin/env bash
# Session 32's GPU check of the eager calls' holder, in one call of under 10 min: the GPU
# suite and the demo (gpu_session.sh), the fence probe, both race probes, the overhead probe
# and the examples (scripts that end right after eager calls must exit with rc 0), then the
# notebooks if fewer than 400 s have passed. Logs under $OUT.
#   bash docs/lab/holder_gpu_check.sh
set -u
OUT=${OUT:-/tmp/holder_out}
mkdir -p "$OUT"
export XLA_PYTHON_CLIENT_PREALLOCATE=false
start=$(date +%s)
git log --oneline -1 > "$OUT/commit.txt"
nvidia-smi --query-gpu=name --format=csv,noheader > "$OUT/gpu_name.txt"
PYTEST_ARGS="-n 8 --timeout 150" bash benchmarks/gpu_session.sh "tests demo" \
  > "$OUT/session.log" 2>&1
echo "session rc=$?" >> "$OUT/session.log"
export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}  # Where gpu_session.sh put jax-triton.
run() {
  local name=$1
  shift
  timeout "$@" > "$OUT/$name.log" 2>&1
  echo "$name rc=$?" >> "$OUT/$name.log"
}
run fence_probe 90 python3 docs/lab/holder_fence_probe.py
run freed_result 100 python3 docs/lab/freed_result_race_probe.py 50
run freed_input 100 python3 docs/lab/freed_input_race_probe.py 50
run holder_overhead 100 python3 docs/lab/holder_overhead_probe.py
run example_kv 120 python3 examples/kv_cache_offload.py
run example_replay 120 python3 examples/replay_buffer.py
run example_sharded 120 python3 examples/sharded_demo.py --devices 1
if [ $(( $(date +%s) - start )) -lt 400 ]; then
  bash benchmarks/gpu_session.sh notebooks > "$OUT/notebooks.log" 2>&1
  echo "notebooks rc=$?" >> "$OUT/notebooks.log"
fi
cat "$OUT/gpu_name.txt" "$OUT/commit.txt"
grep -hE "passed|failed|rc=|check|OK" "$OUT/session.log" | tail -n 8
grep -hE "fence (on|off)" "$OUT/fence_probe.log"
tail -n 6 "$OUT/freed_result.log" "$OUT/freed_input.log" "$OUT/holder_overhead.log"
tail -n 3 "$OUT"/example_*.log
[ -f "$OUT/notebooks.log" ] && grep -E "rc=" "$OUT/notebooks.log"
echo "elapsed $(( $(date +%s) - start )) s"
