#!/usr/bin/env bash
# Before and after in one GPU run: the loop grid and the sparse client, timed for an old tree
# and for this one, one after the other on the same machine, with the same settings.
#
#   bash benchmarks/compare_trees.sh OLD_TREE [LOOP_BUDGET_S]
#
# OLD_TREE is a checkout of the old commit (e.g. `git worktree add .old be68706`, carried to
# the GPU machine). Each tree runs as it would be installed: its pallas_pinned/ with kernels/
# inside, beside its own benchmarks/. Logs and JSON go to $OUT/{old,new}_{loop,sparse}.*;
# SPARSE_ARGS (e.g. "--steps 20 --repeats 3") goes to both sparse runs.
set -uo pipefail
export PYTHONUNBUFFERED=1
old=$1
budget=${2:-120}
OUT=${OUT:-/tmp/compare_trees}
mkdir -p "$OUT"
new=$(cd "$(dirname "$0")/.." && pwd)
stage() {  # stage NAME TREE: a run directory holding the tree as installed.
  local dir=/tmp/compare_$1
  rm -rf "$dir" && mkdir -p "$dir"
  cp -r "$2/pallas_pinned" "$dir/" && cp -r "$2/kernels" "$dir/pallas_pinned/kernels"
  cp -r "$2/benchmarks" "$dir/" && rm -rf "$dir/benchmarks/results"
  echo "$dir"
}
failed=0
for tree in old new; do
  src=$([ $tree = old ] && echo "$old" || echo "$new")
  dir=$(stage $tree "$src")
  echo "== $tree: $src ($(date -u +%H:%M:%S))"
  (cd "$dir" && timeout $((budget + 90)) python3 -m benchmarks.loop --quick --patterns none \
      --no-plots --time-budget-s "$budget" --xla-option xla_gpu_graph_min_graph_size=1 \
      --out "$OUT/${tree}_loop" > "$OUT/${tree}_loop.log" 2>&1) || failed=1
  tail -30 "$OUT/${tree}_loop.log"
  (cd "$dir" && timeout 150 python3 -m benchmarks.sparse_training ${SPARSE_ARGS:-} \
      --xla-option xla_gpu_graph_min_graph_size=1 --out "$OUT/${tree}_sparse" \
      > "$OUT/${tree}_sparse.log" 2>&1) || failed=1
  grep -E "^(device|ours|ours_sorted|ours_hot\S*|xla|transfer) " "$OUT/${tree}_sparse.log"
done
exit $failed
