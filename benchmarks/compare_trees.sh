#!/usr/bin/env bash
# Before and after in one GPU run: the loop grid and the training client, timed for an old
# tree and for this one, one after the other on the same machine, with the same settings.
#
#   bash benchmarks/compare_trees.sh OLD_TREE [LOOP_BUDGET_S]
#
# OLD_TREE is a checkout of the old commit (e.g. `git worktree add .old be68706`, carried to
# the GPU machine). Each tree runs as it would be installed: its pallas_pinned/ with kernels/
# inside, beside its own benchmarks/. Both run the quick loop grid, graphed, on the providers
# both trees have. The training client is `benchmarks.training` where the tree has it, else
# the older `benchmarks.sparse_training`; both at that client's size (8 Mi x 64 float32 rows,
# 4096 Zipf ids a step, s = 1.1). Logs and JSON go to $OUT/{old,new}_{loop,training}.*;
# TRAINING_ARGS or SPARSE_ARGS (e.g. "--steps 20 --repeats 3") go to the training runs.
set -uo pipefail
export PYTHONUNBUFFERED=1
old=$1
budget=${2:-120}
OUT=${OUT:-/tmp/compare_trees}
mkdir -p "$OUT"
new=$(cd "$(dirname "$0")/.." && pwd)
GRAPHED="--xla-option xla_gpu_graph_min_graph_size=1"
# The loop's rows both trees have (older trees also time ours_set_unique_sorted and the
# promised read-backs; left out, they would only spend the time budget).
PROVIDERS=baseline,floor_launch,xla_set,ours_set,ours_set_unique,xla_add,ours_add,ours_add_unique
PROVIDERS=$PROVIDERS,xla_get,ours_get,xla_add_read,ours_add_read,xla_set_read,ours_set_read
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
      --providers "$PROVIDERS" --no-plots --time-budget-s "$budget" $GRAPHED \
      --out "$OUT/${tree}_loop" > "$OUT/${tree}_loop.log" 2>&1) || failed=1
  tail -30 "$OUT/${tree}_loop.log"
  if [ -f "$dir/benchmarks/training.py" ]; then
    client="benchmarks.training --rows 8388608 --dim 64 --batch 4096 --zipf-s 1.1"
    client="$client --cache-fraction 0.05 ${TRAINING_ARGS:-}"
  else
    client="benchmarks.sparse_training ${SPARSE_ARGS:-}"
  fi
  (cd "$dir" && timeout 150 python3 -m $client $GRAPHED --out "$OUT/${tree}_training" \
      > "$OUT/${tree}_training.log" 2>&1) || failed=1
  tail -14 "$OUT/${tree}_training.log"
done
exit $failed
