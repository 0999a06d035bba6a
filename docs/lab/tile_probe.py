"""Lab probe, session 9 (2026-12-03): do small batches launch too few kernel programs?

Not a benchmark of the project. On a GPU, from the repository root:

    PYTHONPATH=. python docs/lab/tile_probe.py [--xla-option NAME=VALUE] [--quick]

``kernels.pallas_common.choose_row_tiling`` fills a tile up to 16 KiB (``_TILE_BYTES``)
whatever the batch: 4096 rows of 256 B run as 64 programs, 256 rows of 1 KiB as 16, 64 rows
of 1 KiB as 4, on an H200 of 132 SMs. If a program's PCIe reads are bound by what one SM
keeps in flight, a batch spread over more programs reads faster. The sparse client's
gather (4096 Zipf ids, 256 B rows) takes ~40 us where its 1 MiB needs ~20 at 50 GB/s.

Prediction, by reading: bound by the programs, the gather and the add (which read) at
1-4 KiB tiles take clearly less at 64-4096 rows (the sparse gather toward ~20-25 us); the
set (posted writes) changes little; at 16384 rows (256+ programs already) nothing changes.
Not bound by them: all tiles within noise.

Each op is timed in its own donated ``lax.scan`` of ``STEPS`` steps on distinct random
rows of a 1 GiB pinned buffer (the loop benchmark's grid), with the Pallas kernels forced
(``backend="pallas"``), per tile size (the module global patched, jax's caches cleared, the
programs compiled ahead), timed interleaved in ``ROUNDS`` rounds; plus the sparse client's
gather and whole step. Checks: each set's last step is read back and compared with its
updates; the gathers' sums agree across tile sizes.

Result (H200, 2026-12-03 20:04 UTC, graphed, tree ``6d70bd1``; ``tile_probe_h200_2004.log``):
no tile size is clearly faster anywhere. Sparse gather 53.5 / 53.8 / 55.6 / 55.1 us at
16 / 4 / 2 / 1 KiB tiles, its step 73.9 / 73.6 / 74.9 / 73.7; the grid within ~1-4 us, except
1 KiB tiles 6-10 % slower at 16384 rows. Not bound by the programs: the tiling stays.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from pallas_pinned.kernels import pallas_common

import pallas_pinned as pp
from benchmarks import environment
from benchmarks import sparse_training as st

ROUNDS = 5
TILES = (16384, 4096, 2048, 1024)
HOST = jax.sharding.SingleDeviceSharding(jax.devices()[0], memory_kind="pinned_host")


def _set(x, rows, ups):
    return lax.scan(lambda x, ru: (pp.scatter_to_host(x, *ru, backend=KERNELS), None),
                    x, (rows, ups))[0]


def _add(x, rows, ups):
    return lax.scan(lambda x, ru: (pp.scatter_add_to_host(x, *ru, backend=KERNELS), None),
                    x, (rows, ups))[0]


def _get(x, rows):
    def step(total, r):
        return total + pp.gather_from_host(x, r, backend=KERNELS).sum(0), None
    return lax.scan(step, jnp.zeros(x.shape[1:], x.dtype), rows)[0]


KERNELS = "pallas" if jax.default_backend() == "gpu" else "interpret"


def grid_inputs(rng, cases, steps, buffer_bytes):
    out = {}
    for num, row_bytes in cases:
        dim = row_bytes // 4
        num_rows = buffer_bytes // row_bytes
        rows = np.stack([rng.choice(num_rows, num, replace=False) for _ in range(steps)])
        ups = rng.standard_normal((steps, num, dim), np.float32)
        x = jax.device_put(jnp.zeros((num_rows, dim), jnp.float32), HOST)
        out[(num, row_bytes)] = (x, jnp.asarray(rows.astype(np.int32)), jnp.asarray(ups))
    return out


def probe_args(doc: str) -> argparse.Namespace:
    """``--xla-option`` and ``--quick``, the options of this session's lab probes."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    environment.add_xla_option(parser)
    parser.add_argument("--quick", action="store_true", help="tiny sizes (a CPU smoke test)")
    return parser.parse_args()


def print_table(times: dict, columns) -> None:
    """``times[(column, op, case)]`` lists of us per step: one line per op and case."""
    labels = sorted({(op, case) for _, op, case in times}, key=str)
    print(f"{'op':14} {'case':12} " + " ".join(f"{c:>18}" for c in columns))
    for op, case in labels:
        cells = []
        for column in columns:
            us = times[(column, op, case)]
            cells.append(f"{statistics.median(us):7.1f} ({min(us):.1f}-{max(us):.1f})")
        name = "-" if case is None else f"{case[0]}x{case[1]}B"
        print(f"{op:14} {name:12} " + " ".join(f"{c:>18}" for c in cells), flush=True)


def main():
    args = probe_args(__doc__)
    opts = args.compiler_options or None
    rng = np.random.default_rng(0)
    if args.quick:
        cases, steps, buffer_bytes = [(16, 64), (64, 256)], 4, 1 << 20
        sparse = dict(rows=1 << 12, dim=16, batch=256, steps=4)
    else:
        cases = [(64, 1024), (256, 1024), (1024, 1024), (4096, 512), (16384, 256)]
        steps, buffer_bytes = 100, 1 << 30
        sparse = dict(rows=8 << 20, dim=64, batch=4096, steps=40)
    grid = grid_inputs(rng, cases, steps, buffer_bytes)
    ids = st.zipf_ids(rng, sparse["rows"], (sparse["steps"], sparse["batch"]), 1.1)
    ids = jnp.asarray(ids)
    targets = jnp.asarray(rng.standard_normal(
        (sparse["steps"], sparse["batch"], sparse["dim"]), np.float32) * 0.1)
    table = jax.device_put(jnp.asarray(rng.standard_normal(
        (sparse["rows"], sparse["dim"]), np.float32) * 0.1), HOST)
    print(f"jax {jax.__version__}, {jax.devices()[0].device_kind}, options {opts}; tiles "
          f"{TILES}; {steps} steps per grid scan, sparse {sparse}", flush=True)
    train = st._sgd_scan(functools.partial(pp.gather_from_host, backend=KERNELS),
                         functools.partial(pp.scatter_add_to_host, backend=KERNELS), 0.5)
    compiled = {}
    for tile in TILES:
        pallas_common._TILE_BYTES = tile
        jax.clear_caches()
        for case, (x, rows, ups) in grid.items():
            for op, fn, operands in (("set", _set, (x, rows, ups)), ("add", _add, (x, rows, ups)),
                                     ("get", _get, (x, rows))):
                donate = (0,) if op != "get" else ()
                compiled[(tile, op, case)] = jax.jit(fn, donate_argnums=donate).lower(
                    *operands).compile(opts)
        compiled[(tile, "sparse_gather", None)] = jax.jit(_get).lower(table, ids).compile(opts)
        compiled[(tile, "sparse_step", None)] = jax.jit(train, donate_argnums=0).lower(
            table, ids, targets).compile(opts)
    state = {case: x for case, (x, _, _) in grid.items()}
    state["table"] = table
    read_only = jax.device_put(jnp.asarray(np.asarray(table)), HOST)  # the step trains `table`
    sums = {}

    def call(key):
        tile, op, case = key
        fn = compiled[key]
        if op in ("set", "add"):
            _, rows, ups = grid[case]
            state[case] = fn(state[case], rows, ups)
            return state[case]
        if op == "get":
            return fn(state[case], grid[case][1])
        if op == "sparse_gather":
            return fn(read_only, ids)
        state["table"] = fn(state["table"], ids, targets)
        return state["table"]

    for key in compiled:  # warm-up and checks
        out = jax.block_until_ready(call(key))
        tile, op, case = key
        if op == "set":
            _, rows, ups = grid[case]
            got = pp.gather_from_host(out, rows[-1])
            np.testing.assert_array_equal(np.asarray(got), np.asarray(ups[-1]), err_msg=str(key))
        if op == "sparse_gather":
            sums[tile] = np.asarray(out)
    for tile in TILES[1:]:
        np.testing.assert_array_equal(sums[tile], sums[TILES[0]], err_msg=f"gather tile {tile}")
    times = {key: [] for key in compiled}
    for _ in range(ROUNDS):
        for key in compiled:
            t0 = time.perf_counter()
            jax.block_until_ready(call(key))
            tile, op, case = key
            per = sparse["steps"] if case is None else steps
            times[key].append((time.perf_counter() - t0) / per * 1e6)
    print("checks passed; us per step, median (min-max), by tile bytes:")
    print_table(times, TILES)

if __name__ == "__main__":
    main()
