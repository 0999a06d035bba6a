"""Lab probe of 2026-12-03 (session 8): does reading a repeated row once pay for its search?

Not a benchmark of the project (no CPU test, no report): the A/B behind
``tuning.read_repeats_once_from``. On a GPU, from the repository root:

    PYTHONPATH=. python docs/lab/read_repeats_probe.py [--xla-option NAME=VALUE]

Prediction (written before the first run). The sparse client's gather reads
4096 Zipf rows of 256 B, about 1895 distinct, and took 36-40 us alone in the
session-5 probe (docs/lab/step_probe.py): about 31 GB/s, the rate of the
loop's unique 256-byte reads, so it is bound per row read, not by repeats
served from a cache. Reading each distinct row once should take about half,
~18 us, plus ~3-5 us for the search (a scatter-min into 4n slots and two
device gathers): the gather ~12-15 us faster, the whole step (69.7 us at
18:58 UTC) about as much. On unique rows the search is pure cost: +3-5 us on
the loop's 4096 x 512 B and 16384 x 256 B gets (51.9 and 143.9 us graphed).

Outcome (H200, jax 0.11.2, 2026-12-03 19:07 UTC, graphed steps,
read_repeats_probe_h200_1907.log beside this file; tree ``f67803d``), us per
step, the search on / off: the sparse gather 40.8 / 40.3, the whole step
74.4 / 75.1, unique gets of 4096 x 512 B 64.2 / 64.3 and of 16384 x 256 B
148.9 / 149.1. The prediction was wrong twice: skipping the 2200 repeated
reads bought nothing, and the search cost nothing measurable. Our inference:
the gather is bound by its programs, not by its row reads. The kernel's grid
still has one lane per entry (a repeat is a masked lane, not a program fewer),
and each program waits a PCIe round trip for its rows whatever their number;
a repeat of a row already on its way may also be served by the GPU's L2.
Compacting the distinct rows into fewer programs is the untested next step.
The change (``7d76aaf``) was reverted; its ``tuning`` field went with it, so
this script runs only on that tree.

Every pair is compiled once under each setting, run once and checked (the
gathers' sums agree exactly, the trained tables within 1e-6), then timed
interleaved in ``ROUNDS`` rounds of one scan each: medians of the per-step
time, min and max.
"""

from __future__ import annotations

import argparse
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import pallas_pinned as pp
from benchmarks import environment
from benchmarks.sparse_training import _sgd_scan, zipf_ids
from pallas_pinned import tuning

ROUNDS = 5
HOST = jax.sharding.SingleDeviceSharding(jax.devices()[0], memory_kind="pinned_host")
SETTINGS = {"once": {}, "every": {"read_repeats_once_from": 1 << 40}}


def _gathers(x, ids):
    """Every step's rows summed: the reads stay live, the table is not consumed."""
    return lax.scan(lambda c, i: (c + pp.gather_from_host(x, i).sum(0), None),
                    jnp.zeros(x.shape[1:], x.dtype), ids)[0]


def _compiled(fn, args, options, donate=False):
    jitted = jax.jit(fn, donate_argnums=0 if donate else ())
    return {name: _lower(jitted, args, options, setting) for name, setting in SETTINGS.items()}


def _lower(jitted, args, options, setting):
    with tuning.override(**setting):
        return jitted.lower(*args).compile(options)


def _report(label, results):
    for name, us in results.items():
        print(f"{label:34} {name:6} {statistics.median(us):8.1f} us/step "
              f"(min {min(us):.1f}, max {max(us):.1f})", flush=True)


def _interleaved(compiled, first_args, steps, check, chain=False):
    """One checked run of each from ``first_args()``, then ``ROUNDS`` rounds of one timed
    scan each; with ``chain`` each scan takes the buffer the last one returned (donated)."""
    outs = {name: jax.block_until_ready(fn(*first_args())) for name, fn in compiled.items()}
    check(*(np.asarray(o) for o in outs.values()))
    results = {name: [] for name in compiled}
    for _ in range(ROUNDS):
        for name, fn in compiled.items():
            args = (outs[name], *first_args(fresh=False)[1:]) if chain else first_args()
            t0 = time.perf_counter()
            out = jax.block_until_ready(fn(*args))
            results[name].append((time.perf_counter() - t0) / steps * 1e6)
            if chain:
                outs[name] = out
    return results


def sparse(options, rng, quick):
    rows, dim, batch, steps = (1 << 12, 16, 256, 4) if quick else (8 << 20, 64, 4096, 40)
    ids = jnp.asarray(zipf_ids(rng, rows, (steps, batch), 1.1))
    targets = jnp.asarray(rng.standard_normal((steps, batch, dim)).astype(np.float32))
    table0 = rng.standard_normal((rows, dim)).astype(np.float32) / 8
    host_table = jax.device_put(table0, HOST)

    def same(a, b):
        assert np.array_equal(a, b), "the gathers disagree"

    gathers = _compiled(_gathers, (host_table, ids), options)
    res = _interleaved(gathers, lambda fresh=True: (host_table, ids), steps, same)
    _report("sparse gather, 4096 Zipf x 256 B", res)

    def close(a, b):
        assert np.max(np.abs(a - b)) <= 1e-6, "the trainings disagree"

    def train_args(fresh=True):
        return (jax.device_put(table0, HOST) if fresh else None), ids, targets

    train = _sgd_scan(pp.gather_from_host, pp.scatter_add_to_host, 0.5)
    trains = _compiled(train, (host_table, ids, targets), options, donate=True)
    host_table.delete()
    res = _interleaved(trains, train_args, steps, close, chain=True)
    _report("sparse step (gather, grad, add)", res)


def unique_gets(options, rng, quick):
    steps = 4 if quick else 100
    for n, row_bytes in ((64, 64),) if quick else ((4096, 512), (16384, 256)):
        num_rows = (1 << (16 if quick else 30)) // row_bytes
        x = jax.device_put(np.ones((num_rows, row_bytes // 4), np.float32), HOST)
        ids = jnp.asarray(np.stack([rng.choice(num_rows, n, replace=False)
                                    for _ in range(steps)]).astype(np.int32))
        gets = _compiled(_gathers, (x, ids), options)
        res = _interleaved(gets, lambda fresh=True, x=x, ids=ids: (x, ids), steps,
                           lambda a, b: np.testing.assert_array_equal(a, b))
        _report(f"unique get, {n} x {row_bytes} B", res)
        x.delete()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    environment.add_xla_option(parser)
    parser.add_argument("--quick", action="store_true", help="tiny sizes (a CPU smoke test)")
    args = parser.parse_args()
    print(f"jax {jax.__version__}, {jax.devices()[0].device_kind}, options "
          f"{args.compiler_options}, {ROUNDS} rounds interleaved", flush=True)
    rng = np.random.default_rng(0)
    sparse(args.compiler_options or None, rng, args.quick)
    unique_gets(args.compiler_options or None, rng, args.quick)


if __name__ == "__main__":
    main()
