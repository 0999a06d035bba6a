"""Lab probe, session 9 (2026-12-03): the gather's ranks order, on and off, before it ships.

Not a benchmark of the project. On a GPU, from the repository root:

    PYTHONPATH=. python docs/lab/gather_order_ab.py [--xla-option NAME=VALUE] [--quick]

``docs/lab/gather_order_probe.py`` (20:08 UTC) found the sparse gather ~30 % faster on ids in
ascending order, and the client's step 18 % faster when its gather and add share one order.
The library now orders a gather of ``tuning.rank_order_min_gathers`` (4096) to
``runs_rank_max`` (8192) entries by the add's own ranks (``_rows.stable_order``), so that
XLA computes the order once in a step that reads rows and then adds to them. This probe
times it against the same tree with the path off, and with it from 1024 entries, on what it
touches: uniform random distinct rows of a 1 GiB pinned buffer (the loop benchmark's
``get`` grid), the sparse client's gather of 4096 Zipf ids, and its whole step (the table
of each setting checked against the path-off table); and prints the kernels each step
launches (``benchmarks.hlo``): an order shared by XLA leaves the step with no more launches
than the gather's own ordering adds once.

Prediction: the sparse step ~72 -> ~60 us and its gather ~49 -> ~45; uniform random reads
of 4096 x 512 B unchanged or a little faster; at 1024-2048 entries the ranks (~10-15 us) may
cost more than the order saves (hence 4096).

Result (H200, 2026-12-03 20:28 UTC, graphed, tree ``9cb946b`` + the change;
``gather_order_ab_h200_2028.log``), us per step off / from 4096 / from 1024: sparse step
78.2 / 77.2 / 71.9, its gather 48.0 / 50.8 / 49.9; uniform random gets 1024 x 1 KiB 33.5 /
32.8 / 37.6, 2048 x 512 B 35.1 / 35.3 / 42.6, 4096 x 512 B 58.9 / 68.7 / 68.3, 8192 x 256 B
89.1 / 90.4 / 92.1. The step launched 10 kernels off and 14 with the order on: XLA did not
merge the two orders, so the add still ordered the ids itself, and uniform reads lost up to
10 us. The change was reverted; this script runs only on that tree (it sets
``tuning.rank_order_min_gathers``, which no longer exists). A step that shares one order
explicitly kept its gain (``gather_order_probe.py``).
"""

from __future__ import annotations

import functools
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from tile_probe import print_table, probe_args  # this directory's (run as a script)

import pallas_pinned as pp
from benchmarks import hlo
from benchmarks import sparse_training as st
from pallas_pinned import tuning

ROUNDS = 5
SETTINGS = {"off": {"rank_order_min_gathers": 1 << 30}, "from_4096": {},
            "from_1024": {"rank_order_min_gathers": 1024}}
HOST = jax.sharding.SingleDeviceSharding(jax.devices()[0], memory_kind="pinned_host")
KERNELS = "pallas" if jax.default_backend() == "gpu" else "interpret"


def _get(settings, x, rows):
    def step(total, r):
        with tuning.override(**settings):
            return total + pp.gather_from_host(x, r, backend=KERNELS).sum(0), None
    return lax.scan(step, jnp.zeros(x.shape[1:], x.dtype), rows)[0]


def _train(settings, table, ids, targets):
    def read(x, i):
        with tuning.override(**settings):
            return pp.gather_from_host(x, i, backend=KERNELS)

    def add(x, i, u):
        with tuning.override(**settings):
            return pp.scatter_add_to_host(x, i, u, backend=KERNELS)
    return st._sgd_scan(read, add, 0.5)(table, ids, targets)


def main():
    args = probe_args(__doc__)
    opts = args.compiler_options or None
    rng = np.random.default_rng(0)
    if args.quick:
        cases, steps, buffer_bytes = [(1024, 64), (4096, 16)], 4, 1 << 20
        sparse = dict(rows=1 << 14, dim=16, batch=4096, steps=4)
    else:
        cases = [(1024, 1024), (2048, 512), (4096, 512), (8192, 256)]
        steps, buffer_bytes = 100, 1 << 30
        sparse = dict(rows=8 << 20, dim=64, batch=4096, steps=40)
    grid = {}
    for num, row_bytes in cases:
        num_rows = buffer_bytes // row_bytes
        rows = np.stack([rng.choice(num_rows, num, replace=False) for _ in range(steps)])
        x0 = rng.standard_normal((num_rows, row_bytes // 4), np.float32)
        grid[(num, row_bytes)] = (jax.device_put(x0, HOST), jnp.asarray(rows.astype(np.int32)),
                                  x0[rows].sum(axis=(0, 1)))
    ids_np = st.zipf_ids(rng, sparse["rows"], (sparse["steps"], sparse["batch"]), 1.1)
    ids = jnp.asarray(ids_np)
    targets = jnp.asarray(rng.standard_normal(
        (sparse["steps"], sparse["batch"], sparse["dim"]), np.float32) * 0.1)
    table0 = (rng.standard_normal((sparse["rows"], sparse["dim"])) * 0.1).astype(np.float32)
    read_only = jax.device_put(table0, HOST)
    print(f"jax {jax.__version__}, {jax.devices()[0].device_kind}, options {opts}; settings "
          f"{SETTINGS}; {steps} steps per grid scan, sparse {sparse}", flush=True)
    compiled, operands, trained = {}, {}, {}
    for name, settings in SETTINGS.items():
        for case, (x, rows, expected) in grid.items():
            fn = jax.jit(functools.partial(_get, settings)).lower(x, rows).compile(opts)
            got = np.asarray(fn(x, rows))
            np.testing.assert_allclose(got, expected, rtol=1e-3, atol=1e-2, err_msg=str(case))
            compiled[(name, "get", case)] = fn
            operands[(name, "get", case)] = (x, rows)
        fn = jax.jit(functools.partial(_get, settings)).lower(read_only, ids).compile(opts)
        compiled[(name, "sparse_gather", None)] = fn
        operands[(name, "sparse_gather", None)] = (read_only, ids)
        table = jax.device_put(table0, HOST)
        fn = jax.jit(functools.partial(_train, settings), donate_argnums=0).lower(
            table, ids, targets).compile(opts)
        kernels = hlo.kernels_per_step(fn.as_text(), sparse["steps"])
        print(f"{name}: sparse step launches {hlo.describe(kernels)}", flush=True)
        trained[name] = np.asarray(fn(table, ids, targets))
        compiled[(name, "sparse_step", None)] = fn
    sums = {name: np.asarray(compiled[(name, "sparse_gather", None)](read_only, ids))
            for name in SETTINGS}
    for name in SETTINGS:
        np.testing.assert_array_equal(trained[name], trained["off"], err_msg=name)
        np.testing.assert_allclose(sums[name], sums["off"], rtol=1e-4, atol=1e-2, err_msg=name)
    del trained
    state = {name: jax.device_put(table0, HOST) for name in SETTINGS}
    times = {key: [] for key in compiled}
    for _ in range(ROUNDS):
        for key, fn in compiled.items():
            name, op, case = key
            t0 = time.perf_counter()
            if op == "sparse_step":
                state[name] = jax.block_until_ready(fn(state[name], ids, targets))
            else:
                jax.block_until_ready(fn(*operands[key]))
            per = sparse["steps"] if case is None else steps
            times[key].append((time.perf_counter() - t0) / per * 1e6)
    print("checks passed (step tables bit-identical across settings); us per step, median "
          "(min-max):")
    print_table(times, SETTINGS)

if __name__ == "__main__":
    main()
