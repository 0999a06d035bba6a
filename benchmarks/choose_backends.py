"""Writes the table ``backend="auto"`` picks its kernel backend from, out of a loop run.

    python -m benchmarks.choose_backends [benchmarks/results/loop_h200.json]

For each op (set, add, gather), dtype and batch-size class, the per-step
times of the ``ours_set`` / ``ours_add`` / ``ours_get`` rows measured with
``backend="pallas"`` and with ``backend="triton"`` in the same run (``python
-m benchmarks.loop --backends pallas,triton`` on a GPU) are summed over the
cases both measured.
Triton is chosen only where it is faster by more than :data:`NOISE`; a closer
result keeps Pallas (the one with the one-launch path for small sets).
The table, with where it came from, goes to ``pallas_pinned/backend_table.json``,
which the package ships. An op the source has no pallas/triton pairs for is
listed under ``unmeasured`` (``auto`` then uses Pallas for it) and named in a
warning.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TABLE = REPO / "pallas_pinned" / "backend_table.json"
DEFAULT_SOURCE = REPO / "benchmarks" / "results" / "loop_h200.json"
# Repeated runs of one case spread by a few percent (benchmarks/results/loop_h200.json,
# min/max per record): a smaller difference is not a measurement of which is faster.
NOISE = 0.05
PROVIDERS = {"ours_set": "set", "ours_add": "add", "ours_get": "gather"}
OPS = tuple(PROVIDERS.values())


def size_class(rows: int, small_max: int) -> str:
    return "small" if rows <= small_max else "large"


def choose(records: list[dict], small_max: int) -> dict:
    times = defaultdict(lambda: defaultdict(dict))
    for r in records:
        if r.get("us_per_step") is None or r.get("backend") not in ("pallas", "triton"):
            continue
        op = PROVIDERS.get(r["provider"])
        if op is None or r.get("correct") is False:
            continue
        key = (op, r["dtype"], size_class(r["rows"], small_max))
        times[key][(r["rows"], r["row_bytes"])][r["backend"]] = r["us_per_step"]
    choices: dict = {}
    for (op, dtype, size), cases in sorted(times.items()):
        both = [c for c in cases.values() if "pallas" in c and "triton" in c]
        if not both:
            continue
        pallas = sum(c["pallas"] for c in both)
        triton = sum(c["triton"] for c in both)
        pick = "triton" if triton < pallas * (1 - NOISE) else "pallas"
        choices.setdefault(op, {}).setdefault(dtype, {})[size] = {
            "backend": pick,
            "pallas_us": round(pallas, 1),
            "triton_us": round(triton, 1),
            "cases": len(both),
        }
    return choices


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", nargs="?", type=Path, default=DEFAULT_SOURCE)
    parser.add_argument("--out", type=Path, default=TABLE)
    args = parser.parse_args(argv)
    run = json.loads(args.source.read_text())
    small_max = run["meta"]["thresholds"]["fused_max_updates"]
    meta = run["meta"]
    table = {
        "source": str(args.source.relative_to(REPO) if args.source.is_relative_to(REPO)
                      else args.source),
        "measured": {k: meta.get(k) for k in ("date_utc", "gpu_name", "jax", "triton",
                                             "jax_triton")},
        "rule": f"triton only where faster by more than {NOISE:.0%}; else pallas",
        "small_max_rows": small_max,
        "choices": choose(run["records"], small_max),
    }
    table["unmeasured"] = [op for op in OPS if op not in table["choices"]]
    args.out.write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")
    print(f"wrote {args.out} from {args.source}")
    for op in table["unmeasured"]:
        print(f"  warning: {args.source} has no {op} rows timed with both pallas and triton: "
              f"no {op} entry (auto uses Pallas); run python -m benchmarks.loop --backends "
              "pallas,triton on a GPU")
    for op, dtypes in table["choices"].items():
        for dtype, sizes in dtypes.items():
            for size, c in sizes.items():
                times = f"pallas {c['pallas_us']} us, triton {c['triton_us']} us"
                print(f"  {op} {dtype} {size}: {c['backend']} ({times}, {c['cases']} cases)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
