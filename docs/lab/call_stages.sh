# Shared by the lab's session calls (s35_gpu.sh, s36_gpu.sh), sourced after they set $FINAL
# and $WORK: the start time, the card's name in $FINAL/summary.txt, the graphed-step option
# $G, the install (gpu_session.sh's own first lines), and `run NAME SECONDS LINES CMD...`,
# which runs a stage only where its timeout still fits $BUDGET_S (560) and puts its log's tail
# into the summary as it ends (a call cut short still returns what finished).
mkdir -p "$FINAL" "$WORK"
export XLA_PYTHON_CLIENT_PREALLOCATE=false
start=$(date +%s)
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "$gpu" > "$FINAL/summary.txt"
G="--xla-option xla_gpu_graph_min_graph_size=1"
note() {  # the tail of a log, into the summary
  { echo "== $1 at $(( $(date +%s) - start )) s"; grep -v host_offloader "$1" | tail -"$2"; } \
    >> "$FINAL/summary.txt" 2>&1
}
fits() { [ $(( $(date +%s) - start + $1 )) -le "${BUDGET_S:-560}" ]; }
run() {  # name, seconds, lines of its tail, then the command
  local name=$1 limit=$2 lines=$3
  shift 3
  fits "$limit" || { echo "== $name skipped: no time" >> "$FINAL/summary.txt"; return; }
  timeout "$limit" "$@" > "$WORK/$name.log" 2>&1
  echo "$name rc=$?" >> "$WORK/$name.log"
  note "$WORK/$name.log" "$lines"
}
OUT=$WORK/install timeout 120 bash benchmarks/gpu_session.sh none > "$WORK/install.log" 2>&1
note "$WORK/install.log" 6
export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
