"""Writes the table ``backend="auto"`` picks its implementation from, out of a loop run.

    python -m benchmarks.choose_backends [benchmarks/results/loop_h200.json]

For each op (set, add, gather), dtype and size class (the run's row counts:
a call of ``n`` entries falls in the smallest measured count ``>= n``), the
per-step times of the kernel rows (``ours_set`` / ``ours_add`` / ``ours_get``
measured with ``backend="pallas"`` and ``backend="triton"``, ``python -m
benchmarks.loop --backends pallas,triton`` on a GPU) and of XLA's own
formulation (``xla_set`` / ``xla_add`` / ``xla_get``) decide:

* between the two kernels, summed over the class's cases, Triton only where
  it is faster by more than :data:`NOISE` (a closer result keeps Pallas, the
  one with the one-launch path for small sets);
* for set, the kernel is kept only where it is no slower than XLA in
  **every** case of the class; anywhere else the class runs XLA's own path
  (``xla`` entries make ``auto`` run ``x.at[rows].set(y)`` itself, after our
  own de-duplication, so the last duplicate wins as everywhere). That path
  is not XLA's bare ``x.at[i].set``: it costs our de-duplication too. Where
  the source run measured it (``ours_set`` with ``backend="auto"`` in a class
  whose table entry was ``xla`` when the run was made) and it was not faster
  than the kernel by more than :data:`NOISE` in every case of the class, the
  kernel stays (2026-12-03: 1024 x 1 KiB took 50.9 us that way against the
  kernel's 27.7 and XLA's bare 24.5). Add and gather stay on the kernels whatever the
  loop says: the loop writes distinct rows and never reads them back, and in
  the sparse-training client (Zipf ids, ~1900 distinct of 4096 per step, each
  step reading what the last one added) XLA's own path took 748 µs per step
  against our kernels' 111 (benchmarks/results/sparse_training_h200.json,
  2026-12-03 15:17 UTC; an earlier run with our gather and XLA's add: 701),
  and XLA's gather lost in every loop case.

The table, with where it came from, goes to ``pallas_pinned/backend_table.json``,
which the package ships. An op the source has no rows for is listed under
``unmeasured`` (``auto`` then uses Pallas for it) and named in a warning.
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
PROVIDERS = {
    "ours_set": "set", "ours_add": "add", "ours_get": "gather",
    "xla_set": "set", "xla_add": "add", "xla_get": "gather",
}
OPS = ("set", "add", "gather")


def _usable(r: dict) -> bool:
    return r.get("us_per_step") is not None and r.get("correct") is not False


def choose(records: list[dict]) -> tuple[list[int], dict]:
    """``(size_classes, choices)`` from a loop run's records."""
    # (op, dtype, rows) -> (rows, row_bytes) -> {"pallas"|"triton"|"xla": us}
    times = defaultdict(lambda: defaultdict(dict))
    for r in records:
        op = PROVIDERS.get(r["provider"])
        if op is None or not _usable(r):
            continue
        name = "xla" if r["provider"].startswith("xla_") else r.get("backend")
        if name not in ("pallas", "triton", "xla", "auto"):
            continue
        times[(op, r["dtype"], r["rows"])][(r["rows"], r["row_bytes"])][name] = r["us_per_step"]
    classes = sorted({rows for (_, _, rows) in times})
    choices: dict = {}
    for (op, dtype, rows), cases in sorted(times.items()):
        full = [c for c in cases.values() if {"pallas", "triton", "xla"} <= set(c)]
        if not full:
            full = [c for c in cases.values() if {"pallas", "xla"} <= set(c)]
        if not full:
            continue
        totals = {k: round(sum(c[k] for c in full), 1) for k in full[0]}
        kernel = "pallas"
        if "triton" in totals and totals["triton"] < totals["pallas"] * (1 - NOISE):
            kernel = "triton"
        kernel_wins = op != "set" or all(c[kernel] <= c["xla"] for c in full)
        if not kernel_wins and all("auto" in c for c in full):
            # XLA's path as auto runs it (our de-duplication first), where measured.
            kernel_wins = not all(c["auto"] < c[kernel] * (1 - NOISE) for c in full)
        entry = {"backend": kernel if kernel_wins else "xla", "cases": len(full)}
        entry.update({f"{k}_us": v for k, v in totals.items()})
        choices.setdefault(op, {}).setdefault(dtype, {})[str(rows)] = entry
    return classes, choices


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", nargs="?", type=Path, default=DEFAULT_SOURCE)
    parser.add_argument("--out", type=Path, default=TABLE)
    args = parser.parse_args(argv)
    run = json.loads(args.source.read_text())
    meta = run["meta"]
    classes, choices = choose(run["records"])
    source = args.source.resolve()
    table = {
        "source": str(source.relative_to(REPO) if source.is_relative_to(REPO) else source),
        "measured": {k: meta.get(k) for k in ("date_utc", "gpu_name", "jax", "triton",
                                             "jax_triton")},
        "rule": (
            f"per size class: the kernel (triton only where faster than pallas by more than "
            f"{NOISE:.0%}); for set, xla where the kernel is slower than XLA in any case, "
            f"unless ours with auto (XLA's path with our de-duplication, where the run "
            f"measured it) was not faster than the kernel by more than {NOISE:.0%} in every "
            "case"
        ),
        "size_classes": classes,
        "choices": choices,
    }
    table["unmeasured"] = [op for op in OPS if op not in choices]
    args.out.write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")
    print(f"wrote {args.out} from {args.source}")
    for op in table["unmeasured"]:
        print(f"  warning: {args.source} has no {op} rows timed with pallas and XLA: no {op} "
              "entry (auto uses Pallas); run python -m benchmarks.loop --backends "
              "pallas,triton on a GPU")
    for op, dtypes in choices.items():
        for dtype, sizes in dtypes.items():
            for size, c in sizes.items():
                times = ", ".join(f"{k[:-3]} {v} us" for k, v in sorted(c.items())
                                  if k.endswith("_us"))
                print(f"  {op} {dtype} <= {size} rows: {c['backend']} ({times}, "
                      f"{c['cases']} cases)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
