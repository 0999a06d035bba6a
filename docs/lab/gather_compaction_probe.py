"""Lab probe, prepared in session 8 (2026-12-03) and not yet run on a GPU: what bounds the
sparse client's gather?

Not a benchmark of the project (no CPU test, no report). On a GPU, from the repository root:

    PYTHONPATH=. python docs/lab/gather_compaction_probe.py [--xla-option NAME=VALUE]

The sparse client gathers 4096 Zipf ids of 256-byte rows per step, about 1895 of them
distinct, in ~40 us. Masking the repeats (their lanes read nothing) changed nothing
(docs/lab/read_repeats_probe.py, 19:07 UTC: 40.8 against 40.3 us). Two readings fit:

* the gather is bound by its programs, each waiting a PCIe round trip however few of its
  lanes read (masking leaves every program in place): then the distinct rows packed into
  the first programs, the others reading nothing, should take about half;
* the repeats were never read twice (the GPU's L2 serves them) and the distinct rows' bytes
  bound it: then packing changes nothing either.

Each step of a scan gathers, over the same 8 Mi x 64 float32 pinned table and the same
Zipf ids (``benchmarks.sparse_training.zipf_ids``), one of:

* ``zipf``: the 4096 ids as the client reads them;
* ``distinct_packed``: the step's distinct ids first, then out-of-range entries
  (``mode="fill"``: read nothing) up to 4096;
* ``distinct_spread``: the same entries, the out-of-range ones spread evenly between the
  distinct ids, so every program keeps some rows to read (what masking the repeats gave);
* ``distinct_only``: the distinct ids alone, padded with copies of the step's first id up
  to the most any step has (a batch of ~1900, no out-of-range entries).

Prediction, by reading: bound by programs, ``distinct_packed`` and ``distinct_only`` take
about half of ``zipf`` (~20 us), ``distinct_spread`` about as long as ``zipf``; bound by
the distinct rows' bytes, all four take about as long. A compaction step in the library
(the distinct rows packed in front, their copies expanded on the device) pays only in the
first case.

Result (H200, 2026-12-03 20:03 UTC, graphed, tree ``6d70bd1``;
``gather_compaction_probe_h200_2003.log``; an earlier try at 19:59 failed its own check, a
tolerance too tight for float32 sums, since mended): zipf 42.4, distinct_packed 40.7,
distinct_spread 39.9, distinct_only 36.8 us per step. Neither reading: fewer programs or
fewer rows barely matter; the distinct rows' scattered addresses do (see
``gather_order_probe.py``).

The distinct ids keep the order of their first occurrence (not sorted: sorting would
change the addresses' locality too). Each variant's rows, summed over every step, are
checked against numpy's sum of the rows it names; then all are timed interleaved in
``ROUNDS`` rounds of one scan each.
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
from benchmarks.sparse_training import zipf_ids

ROUNDS = 5
HOST = jax.sharding.SingleDeviceSharding(jax.devices()[0], memory_kind="pinned_host")


def _gathers(x, ids):
    """Every step's rows summed (out-of-range entries read as 0): the reads stay live."""
    def step(total, i):
        rows = pp.gather_from_host(x, i, mode="fill", fill_value=0)
        return total + rows.sum(0), None

    return lax.scan(step, jnp.zeros(x.shape[1:], x.dtype), ids)[0]


def id_tables(ids: np.ndarray, num_rows: int) -> dict[str, np.ndarray]:
    """The variants' per-step ids (see the module docstring), each ``(steps, width)``."""
    steps, batch = ids.shape
    distinct = [row[np.sort(np.unique(row, return_index=True)[1])] for row in ids]
    widest = max(d.size for d in distinct)
    packed = np.full((steps, batch), num_rows, np.int32)  # out of range: read nothing
    spread = np.full((steps, batch), num_rows, np.int32)
    only = np.empty((steps, widest), np.int32)
    for t, d in enumerate(distinct):
        packed[t, :d.size] = d
        spread[t, np.linspace(0, batch - 1, d.size).astype(int)] = d
        only[t] = np.concatenate([d, np.full(widest - d.size, d[0], np.int32)])
    return {"zipf": ids, "distinct_packed": packed, "distinct_spread": spread,
            "distinct_only": only}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    environment.add_xla_option(parser)
    parser.add_argument("--quick", action="store_true", help="tiny sizes (a CPU smoke test)")
    args = parser.parse_args()
    rows, dim, batch, steps = (1 << 12, 16, 256, 4) if args.quick else (8 << 20, 64, 4096, 40)
    rng = np.random.default_rng(0)
    ids = zipf_ids(rng, rows, (steps, batch), 1.1)
    table0 = rng.standard_normal((rows, dim)).astype(np.float32)
    x = jax.device_put(table0, HOST)
    tables = id_tables(ids, rows)
    print(f"jax {jax.__version__}, {jax.devices()[0].device_kind}, options "
          f"{args.compiler_options}; distinct ids per step {tables['distinct_only'].shape[1]} "
          f"at most, {ROUNDS} rounds interleaved", flush=True)
    compiled, device_ids = {}, {}
    for name, table in tables.items():
        device_ids[name] = jnp.asarray(table)
        compiled[name] = jax.jit(_gathers).lower(x, device_ids[name]).compile(
            args.compiler_options or None)
        got = np.asarray(compiled[name](x, device_ids[name]))
        padded = np.concatenate([table0, np.zeros((1, dim), np.float32)])
        picked = padded[np.minimum(table, rows)]
        # float32 sums of ~160k terms in another order: bounded against the terms' sizes
        # (the 20:00 UTC run failed a plain rtol of 1e-4 by a 12 in 5e4 difference).
        np.testing.assert_array_less(np.abs(got - picked.sum(axis=(0, 1))),
                                     1e-4 * np.abs(picked).sum(axis=(0, 1)) + 1e-3, err_msg=name)
    results = {name: [] for name in tables}
    for _ in range(ROUNDS):
        for name, fn in compiled.items():
            t0 = time.perf_counter()
            jax.block_until_ready(fn(x, device_ids[name]))
            results[name].append((time.perf_counter() - t0) / steps * 1e6)
    for name, us in results.items():
        print(f"{name:16} {statistics.median(us):8.1f} us/step (min {min(us):.1f}, "
              f"max {max(us):.1f})", flush=True)


if __name__ == "__main__":
    main()
