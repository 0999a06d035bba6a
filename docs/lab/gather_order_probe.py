"""Lab probe, session 9 (2026-12-03): is the sparse gather bound by its address order?

Not a benchmark of the project. On a GPU, from the repository root:

    PYTHONPATH=. python docs/lab/gather_order_probe.py [--xla-option NAME=VALUE] [--quick]

What the session's two earlier probes left: the sparse client's gather (4096 Zipf ids of
256-byte rows from an 8 Mi-row pinned table) took 42.4 us per step, its ~1950 distinct ids
alone 36.8 (``gather_compaction_probe_h200_2003.log``), and a 1-16 KiB tile changed nothing
(``tile_probe_h200_2004.log``): ~13 GB/s, where the add kernel, which reads the same distinct
rows in ascending order after ordering them, costs only ~10 us beyond its ordering (session
6's step parts, ``docs/GPU_RUNS.md`` 16:11 and 16:21). Reading: the gather's scattered
addresses are what cost (PCIe read transactions and the GPU's address translation over a
2 GiB table), not its count of rows.

Prediction: ids in ascending order read in about a third of the time (~10-15 us); the
in-step XLA sort (~45 us) eats the gain; counting ranks (~20 us) keeps some of it; and a step
whose gather and add share one order (the add told ``indices_are_sorted=True``) saves the
add's own ordering as well (~70 -> ~45 us per step).

Variants, each in its own ``lax.scan`` over the same ids, Pallas kernels forced:

* gathers: ``zipf`` (as the client reads), ``zipf_sorted`` (each step's ids sorted ahead,
  ``indices_are_sorted=True``), ``distinct_first`` / ``distinct_sorted`` (the distinct ids in
  first-occurrence / ascending order, padded with a copy), ``xla_sort_in_step`` (the gather's
  own sort switched on: ``sort_min_gathers=0``), ``ranks_in_step`` (``_rows.stable_order``,
  the add's ranks, then a sorted gather and a device permutation back);
* steps of the client: ``step_ours`` (as committed), ``step_ranks_gather`` (the gather as in
  ``ranks_in_step``, the add as committed), ``step_shared_order`` (one order for both: the add
  gets the sorted ids and permuted updates with ``indices_are_sorted=True``).

Checks: every gather variant's per-step rows, summed, match ``zipf``'s within float32
reordering; every step variant's table matches ``step_ours``'s within 1e-5.

Result (H200, 2026-12-03 20:08 UTC, tree ``6d70bd1``; ``gather_order_probe_h200_2008.log``
graphed, ``..._defaults_h200_2008.log`` at the defaults), us per step graphed / defaults:
zipf 49.4 / 51.9, zipf_sorted 36.9 / 34.9, distinct_first 37.6 / 40.6, distinct_sorted
29.3 / 31.3, xla_sort_in_step 64.4 / 66.7, ranks_in_step 45.2 / 48.7; steps: ours 71.8 /
71.3, ranks_gather 74.1 / 74.7, shared_order 58.6 / 60.3 (tables bit-identical to ours).
Ascending order reads ~30 % faster, a third of the prediction; a shared order saves 13 us
of the step. Led to the gather's ranks order (``tuning.rank_order_min_gathers``).
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
from benchmarks import sparse_training as st
from pallas_pinned import _rows, tuning

ROUNDS = 5
HOST = jax.sharding.SingleDeviceSharding(jax.devices()[0], memory_kind="pinned_host")
KERNELS = "pallas" if jax.default_backend() == "gpu" else "interpret"
RANKS_MAX = 8192


def _read(x, i, sorted_=False):
    return pp.gather_from_host(x, i, indices_are_sorted=sorted_, backend=KERNELS)


def _ranks_read(x, i):
    """The rows of ``i`` read in ascending order, put back in ``i``'s order on the device."""
    sorted_ids, perm = _rows.stable_order(i, small_max=RANKS_MAX)
    rows = _read(x, sorted_ids, True)
    return jnp.zeros_like(rows).at[perm].set(rows, unique_indices=True)


def gather_fn(kind: str):
    def total(x, ids):
        def step(acc, i):
            if kind == "xla_sort_in_step":
                with tuning.override(sort_min_gathers=0):
                    rows = _read(x, i)
            elif kind == "ranks_in_step":
                rows = _ranks_read(x, i)
            else:
                rows = _read(x, i, kind in ("zipf_sorted", "distinct_sorted"))
            return acc + rows.sum(0), None
        return lax.scan(step, jnp.zeros(x.shape[1:], x.dtype), ids)[0]
    return total


def step_fn(kind: str, lr: float = 0.5):
    def train(table, ids, targets):
        def step(table, xs):
            i, t = xs
            if kind == "step_ours":
                grad = jax.grad(st._loss)(_read(table, i), t)
                upd = (-lr * grad).astype(table.dtype)
                return pp.scatter_add_to_host(table, i, upd, backend=KERNELS), None
            if kind == "step_ranks_gather":
                grad = jax.grad(st._loss)(_ranks_read(table, i), t)
                upd = (-lr * grad).astype(table.dtype)
                return pp.scatter_add_to_host(table, i, upd, backend=KERNELS), None
            sorted_ids, perm = _rows.stable_order(i, small_max=RANKS_MAX)
            rows = _read(table, sorted_ids, True)  # in sorted order
            grad = jax.grad(st._loss)(rows, t[perm])  # the loss is a mean over entries
            upd = (-lr * grad).astype(table.dtype)
            return pp.scatter_add_to_host(table, sorted_ids, upd, indices_are_sorted=True,
                                          backend=KERNELS), None
        return lax.scan(step, table, (ids, targets))[0]
    return train


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    environment.add_xla_option(parser)
    parser.add_argument("--quick", action="store_true", help="tiny sizes (a CPU smoke test)")
    args = parser.parse_args()
    opts = args.compiler_options or None
    rows, dim, batch, steps = (1 << 12, 16, 256, 4) if args.quick else (8 << 20, 64, 4096, 40)
    rng = np.random.default_rng(0)
    ids = st.zipf_ids(rng, rows, (steps, batch), 1.1)
    firsts = [row[np.sort(np.unique(row, return_index=True)[1])] for row in ids]
    widest = max(d.size for d in firsts)
    pad = [np.concatenate([d, np.full(widest - d.size, d[0], np.int32)]) for d in firsts]
    spad = [np.sort(p) for p in pad]
    tables = {"zipf": ids, "zipf_sorted": np.sort(ids, axis=1), "distinct_first": np.stack(pad),
              "distinct_sorted": np.stack(spad), "xla_sort_in_step": ids, "ranks_in_step": ids}
    table0 = (rng.standard_normal((rows, dim)) * 0.1).astype(np.float32)
    x = jax.device_put(table0, HOST)
    targets = jnp.asarray((rng.standard_normal((steps, batch, dim)) * 0.1).astype(np.float32))
    print(f"jax {jax.__version__}, {jax.devices()[0].device_kind}, options {opts}; "
          f"distinct per step <= {widest}; {ROUNDS} rounds interleaved", flush=True)
    compiled, operands = {}, {}
    for name, tab in tables.items():
        operands[name] = (x, jnp.asarray(tab.astype(np.int32)))
        compiled[name] = jax.jit(gather_fn(name)).lower(*operands[name]).compile(opts)
    reference = None
    for name in tables:
        got = np.asarray(compiled[name](*operands[name]))
        picked = table0[tables[name]]
        scale = np.abs(picked).sum(axis=(0, 1))
        np.testing.assert_array_less(np.abs(got - picked.sum(axis=(0, 1))), 1e-4 * scale + 1e-3,
                                     err_msg=name)
        if name == "zipf":
            reference = got
        elif name in ("xla_sort_in_step", "ranks_in_step", "zipf_sorted"):
            np.testing.assert_array_less(np.abs(got - reference), 1e-4 * scale + 1e-3,
                                         err_msg=name)
    step_names = ("step_ours", "step_ranks_gather", "step_shared_order")
    ids_dev = jnp.asarray(ids.astype(np.int32))
    tables_out = {}
    for name in step_names:
        t = jax.device_put(table0, HOST)
        compiled[name] = jax.jit(step_fn(name), donate_argnums=0).lower(
            t, ids_dev, targets).compile(opts)
        tables_out[name] = np.asarray(compiled[name](t, ids_dev, targets))
    for name in step_names[1:]:
        diff = np.max(np.abs(tables_out[name] - tables_out["step_ours"]))
        assert diff <= 1e-5, (name, diff)
        print(f"{name}: max |table - step_ours table| {diff:.2e}")
    del tables_out
    state = jax.device_put(table0, HOST)
    results = {name: [] for name in compiled}
    for _ in range(ROUNDS):
        for name, fn in compiled.items():
            t0 = time.perf_counter()
            if name in step_names:
                state = jax.block_until_ready(fn(state, ids_dev, targets))
            else:
                jax.block_until_ready(fn(*operands[name]))
            results[name].append((time.perf_counter() - t0) / steps * 1e6)
    for name, us in results.items():
        print(f"{name:18} {statistics.median(us):8.1f} us/step (min {min(us):.1f}, "
              f"max {max(us):.1f})", flush=True)


if __name__ == "__main__":
    main()
