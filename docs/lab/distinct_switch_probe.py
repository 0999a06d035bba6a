"""Lab probe of 2026-12-04 (session 12): switch an unpromised add at run time on "rows distinct".

Not a benchmark of the project (no CPU test, no report). On a GPU, from the repository root:

    PYTHONPATH=.:docs/lab python docs/lab/distinct_switch_probe.py [--xla-option NAME=VALUE]

Question. ``auto`` keeps unpromised float32 adds on the kernels (10.4 us per step at
64 x 1 KiB, graphed, against XLA's 7.0), because XLA's add, a GPU scatter-add with no
combining, took 705 against 73 us per step on the Zipf client's repeated ids. Promised
distinct rows take XLA's path and tie it (7.1). A step can test distinctness itself: an
``n x n`` comparison, then ``lax.cond`` to XLA's add when no row repeats, else to the
kernels. Distinct rows give the same sums either way (no rounding order to differ).

Predictions (written before the run): the comparison and the conditional cost what the set's
``n x n`` check cost in front of XLA's set (1.6 us at 64 rows, 3.3 at 256): distinct rows at
~8.5 / ~16 us at 64 / 256 x 1 KiB, between XLA (7.0 / 12.5) and ``auto`` (10.4 / 16.8); rows
that repeat at ``auto``'s time plus the same cost. Risk: the pinned buffer as an operand of a
conditional may lose its aliasing, and XLA would then copy the whole buffer each step.

Outcome (H200, jax 0.11.2, 2026-12-04 19:19 UTC, graphed, tree ``d8cfd63``;
``distinct_switch_probe_h200_1919.log`` beside this file). The prediction failed: the switch is
slower than both paths. Every check agreed, and no variant copied the buffer (the conditional
kept the aliasing). In us per step (``auto`` / XLA's add / switched):

| case | ``auto`` | XLA's add | switched |
|---|---|---|---|
| 64 x 1 KiB, distinct | 19.1 | 8.9 | 21.9 |
| 64 x 1 KiB, half repeated | 15.4 | 11.1 | 26.2 |
| 256 x 1 KiB, distinct | 17.6 | 13.5 | 26.5 |
| 256 x 1 KiB, half repeated | 27.2 | 18.4 | 38.2 |

The conditional costs 11-13 us over the branch it took, more than the whole gap it was meant
to close. (This probe feeds ids and updates as scanned inputs, and ``auto``'s 64-row
median is noisy: min 12.2, against the loop table's 10.4.) XLA's add also stayed fast on rows
repeated once (11.1 us); the tenfold slowdown needs the Zipf client's heavy repeats. Nothing in
the library changed.
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from xla_path_dedup_probe import HOST, _scan, check_rows, compile_and_time

import pallas_pinned as pp
from benchmarks import environment

FULL = {"steps": 100, "buffer": 1 << 30, "cases": ((64, 1024), (256, 1024))}
QUICK = {"steps": 4, "buffer": 1 << 20, "cases": ((64, 1024),)}


def switched_add(x, r, u):
    """XLA's add when no row repeats in this batch, else the kernels."""
    n = r.shape[0]
    repeats = jnp.any((r[:, None] == r[None, :]) & ~jnp.eye(n, dtype=bool))
    return lax.cond(repeats,
                    lambda x: pp.scatter_add_to_host(x, r, u),
                    lambda x: x.at[r].add(u, mode="drop", unique_indices=True), x)


VARIANTS = {
    "ours_auto": pp.scatter_add_to_host,
    "xla_raw": lambda x, r, u: x.at[r].add(u, mode="drop"),
    "switched": switched_add,
}


def run(options, rng, sizes):
    steps = sizes["steps"]
    for n, row_bytes in sizes["cases"]:
        d = row_bytes // 4
        num_rows = sizes["buffer"] // row_bytes
        for repeat in (False, True):
            ids = np.stack([rng.choice(num_rows, n, replace=False) for _ in range(steps)])
            if repeat:  # the second half repeats the first half's rows
                ids[:, n // 2:] = ids[:, :n - n // 2][:, :n // 2]
            ids = jnp.asarray(ids.astype(np.int32))
            upd = jnp.asarray(rng.standard_normal((steps, n, d), dtype=np.float32))
            zeros = np.zeros((num_rows, d), np.float32)

            def make_args(fresh, ids=ids, upd=upd, zeros=zeros):
                return (jax.device_put(zeros, HOST) if fresh else None), ids, upd

            flat = ids.reshape(-1)

            def check(outs, flat=flat):
                check_rows(outs, flat, tol=1e-4)

            label = f"add {n} x {row_bytes} B {'repeats' if repeat else 'distinct'}"

            def inspect(compiled, label=label, shape=f"f32[{num_rows},{d}]"):
                for name, exe in compiled.items():
                    lines = exe.as_text().splitlines()
                    copies = sum(shape in line and (" copy(" in line or " copy-start(" in line)
                                 for line in lines)
                    print(f"{label:34} {name:10} whole-buffer copies: {copies}, conditional: "
                          f"{any(' conditional(' in line for line in lines)}", flush=True)

            compile_and_time({k: _scan(f) for k, f in VARIANTS.items()}, make_args, steps,
                             check, options, None, label, inspect)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    environment.add_xla_option(parser)
    parser.add_argument("--quick", action="store_true", help="tiny sizes (a CPU smoke test)")
    args = parser.parse_args()
    sizes = QUICK if args.quick else FULL
    print(f"jax {jax.__version__}, {jax.devices()[0].device_kind}, options "
          f"{args.compiler_options}, {sizes}", flush=True)
    run(args.compiler_options or None, np.random.default_rng(0), sizes)


if __name__ == "__main__":
    main()
