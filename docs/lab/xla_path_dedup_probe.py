"""Lab probe of 2026-12-04 (session 11): what does resolving duplicates cost on XLA's path?

Not a benchmark of the project (no CPU test, no report). On a GPU, from the repository root:

    PYTHONPATH=. python docs/lab/xla_path_dedup_probe.py [--xla-option NAME=VALUE] [--out DIR]

Question. In the graphed loop (2026-12-04 16:22 UTC) XLA's set path, with our
de-duplication in front (``drop_superseded``: an ``n x n`` comparison up to 1024
entries), took 51.2 us per step at 1024 x 1 KiB against 24.3 for XLA's bare set
and 24.7 for the same path with rows promised distinct: the de-duplication cost
27 us, 3.3 us at 256 rows and 1.6 us at 64. Unpromised adds stay on the kernels
because XLA's add on the Zipf client took 705 us per step against the kernels' 73.

Predictions (written before the first run):
- set: the ``n x n`` check costs ~n**2: ~27 us at 1024. A stable sort whose
  "last of each run" mask is scattered back to input order (the updates never
  permuted) should cost a sort and two small fusions, ~3-5 us at 1024, so XLA's
  path at ~28-30 us: about the kernel's 28.8, no clear win; at 64-256 the ``n x n``
  check stays the cheaper.
- add: XLA's add on the pinned buffer with device operands is a GPU scatter whose
  duplicates contend (the Zipf client's 705 us). Combining duplicates on the
  device first (sort + segmented scan) leaves XLA distinct rows: the Zipf client
  near the uniform client's 120 us scaled to 1895 distinct rows (~60-70 us), and
  the loop's adds at XLA's time plus the combine (~3-6 us), below the kernels'
  unpromised 16.8 / 44.5 / 94.1 us at 256 / 1024 / 4096 rows.

Outcome (H200, jax 0.11.2, 2026-12-04 17:18 UTC, graphed, tree ``79edbfc``;
``xla_path_dedup_probe_h200_1718.log`` beside this file), us per step at 64 / 256 / 1024 x 1 KiB
and 4096 x 512 B. XLA compiles every scatter into the pinned buffer as host compute (its
host-offload pass warns so), device operands or not. Set: bare 6.1 / 10.6 / 29.1 / 165.1 (it
kept another update than the last in rows written twice: "DIFFERS"); ``n x n`` check 8.0 /
14.5 / 55.4 / 129.3; sort + mask 11.5 / 16.9 / 39.3 / 200.2; sort + permuted updates 10.8 /
15.6 / 38.9 / 119.9; ``auto`` 7.8 / 13.4 / 36.4 / 60.2. Add: bare 7.5 / 15.1 / 37.3 / 63.1;
combined first (``n x n`` / sort) 18.3 / 27.8 / 62.2 / 104.2 and 17.2 / 25.0 / 61.9 / 123.2;
``auto`` 11.4 / 20.1 / 54.1 / 95.1; the operands moved to the host first 20.7 / 27.5 / 54.0 /
76.2. Sparse client (Zipf): ``auto`` 80.5, bare XLA add 699.5, combined first 116.2 (host
operands 122.5), the host-moved add 671.7. The predictions held for the ``n x n`` cost and
for combining curing the Zipf slowdown, and failed for the rest: the sorts cost ~10 us at
every size, and combining in front of XLA's add costs 10-60 us in the loop, more than the
kernels' whole add. No formulation beats ``auto`` anywhere; nothing in the library changed.

Each variant is compiled, run once from the same buffer and checked against
``pallas_pinned``'s own result, then timed in ``ROUNDS`` interleaved rounds of
one donated scan each (the buffer chained): medians of the per-step time.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import pallas_pinned as pp
from benchmarks import environment
from benchmarks.sparse_training import _sgd_scan, _xla_read, zipf_ids
from pallas_pinned import _rows

ROUNDS = 5
HOST = jax.sharding.SingleDeviceSharding(jax.devices()[0], memory_kind="pinned_host")
FULL = {"steps": 100, "buffer": 1 << 30, "cases": ((64, 1024), (256, 1024), (1024, 1024),
                                                   (4096, 512)),
        "sparse": (8 << 20, 64, 4096, 40)}
QUICK = {"steps": 4, "buffer": 1 << 20, "cases": ((64, 1024),), "sparse": (1 << 12, 16, 256, 4)}


def _skip(num_rows, rows):
    return _rows.skip_row(num_rows, rows.dtype)


def sort_mask_superseded(rows, num_rows):
    """Rows written again later -> skip marker, input order kept (the updates stay put)."""
    n = rows.shape[0]
    sorted_rows, perm = lax.sort((rows, lax.iota(jnp.int32, n)), num_keys=1, is_stable=True)
    last = jnp.concatenate([sorted_rows[1:] != sorted_rows[:-1], jnp.ones((1,), bool)])
    keep = jnp.zeros((n,), bool).at[perm].set(last, unique_indices=True)
    return jnp.where(keep, rows, _skip(num_rows, rows))


def set_variants(num_rows):
    def raw(x, r, u):
        return x.at[r].set(u, mode="drop")

    def nxn(x, r, u):
        return x.at[_rows.drop_superseded_small(r, num_rows)].set(u, mode="drop")

    def sortmask(x, r, u):
        return x.at[sort_mask_superseded(r, num_rows)].set(u, mode="drop")

    def sortperm(x, r, u):
        r2, src = _rows.dedupe_last_wins(r, num_rows)
        return x.at[r2].set(u[src], mode="drop")

    return {"ours_auto": pp.scatter_to_host, "xla_raw": raw, "nxn": nxn,
            "sortmask": sortmask, "sortperm": sortperm}


def combined_add(small_max, unique):
    def add(x, r, u):
        r2, totals = _rows.combine_duplicates(r, u, x.shape[0], small_max=small_max)
        return x.at[r2].add(totals, mode="drop", unique_indices=unique)

    return add


def combined_host_add(x, r, u):
    r2, totals = _rows.combine_duplicates(r, u, x.shape[0], small_max=0)
    return host_add(x, r2, totals)


def host_add(x, r, u):
    """The operands moved to the host: XLA's host compute applies the add there."""
    r = jax.device_put(r, jax.memory.Space.Host)
    u = jax.device_put(u, jax.memory.Space.Host)
    return x.at[r].add(u, mode="drop")


def add_variants():
    return {"ours_auto": pp.scatter_add_to_host,
            "xla_raw": lambda x, r, u: x.at[r].add(u, mode="drop"),
            "comb_nxn": combined_add(1 << 30, False),
            "comb_sort": combined_add(0, False),
            "comb_sort_uq": combined_add(0, True),
            "host_add": host_add,
            "comb_host": combined_host_add}


def check_rows(outs, rows, *, tol):
    """Each variant's ``rows`` against ``ours_auto``'s: max |diff| within ``tol`` (0: exact)."""
    ref = np.asarray(pp.gather_from_host(outs["ours_auto"], rows))
    for name, out in outs.items():
        err = float(np.max(np.abs(np.asarray(pp.gather_from_host(out, rows)) - ref)))
        print(f"  check {name:14} max |diff| {err:.3g} {'ok' if err <= tol else 'DIFFERS'}",
              flush=True)


def _scan(op):
    def run(x, ids, upd):
        return lax.scan(lambda x, xs: (op(x, *xs), None), x, (ids, upd))[0]

    return run


def _time(compiled, make_args, steps, check, out_dir, label):
    outs = {}
    for name, fn in compiled.items():
        outs[name] = jax.block_until_ready(fn(*make_args(fresh=True)))
    check(outs)
    results = {name: [] for name in compiled}
    for _ in range(ROUNDS):
        for name, fn in compiled.items():
            args = (outs[name], *make_args(fresh=False)[1:])
            t0 = time.perf_counter()
            outs[name] = jax.block_until_ready(fn(*args))
            results[name].append((time.perf_counter() - t0) / steps * 1e6)
    for name, us in results.items():
        print(f"{label:34} {name:12} {statistics.median(us):8.1f} us/step "
              f"(min {min(us):.1f}, max {max(us):.1f})", flush=True)
    for out in outs.values():
        out.delete()
    return results


def _compile(fns, args, options, out_dir, label):
    compiled = {}
    for name, fn in fns.items():
        try:
            compiled[name] = jax.jit(fn, donate_argnums=0).lower(*args).compile(options)
        except Exception as e:  # noqa: BLE001 - a lab probe reports and goes on
            print(f"{label:34} {name:12} FAILED to compile: {type(e).__name__}: "
                  f"{str(e)[:300]}", flush=True)
            continue
        text = compiled[name].as_text()
        counts = {op: text.count(f" {op}(") for op in ("fusion", "sort", "scatter",
                                                         "custom-call", "copy-start")}
        scatters = [line.strip()[:160] for line in text.splitlines() if " scatter(" in line]
        print(f"{label:34} {name:12} hlo: {counts} {scatters[:1]}", flush=True)
        if out_dir is not None and label.startswith("add 1024") and name in (
                "xla_raw", "comb_sort", "host_add"):
            (out_dir / f"hlo_{name}.txt").write_text(text)
    return compiled


def compile_and_time(fns, make_args, steps, check, options, out_dir, label, inspect=None):
    """``fns`` compiled on a fresh buffer (freed after), then run once, checked, timed.

    ``inspect(compiled)``, if given, sees the executables before the buffer goes.
    """
    args = make_args(fresh=True)
    compiled = _compile(fns, args, options, out_dir, label)
    if inspect is not None:
        inspect(compiled)
    args[0].delete()
    return _time(compiled, make_args, steps, check, out_dir, label)


def loop_cases(options, rng, out_dir, sizes):
    steps = sizes["steps"]
    for n, row_bytes in sizes["cases"]:
        d = row_bytes // 4
        num_rows = sizes["buffer"] // row_bytes
        ids = jnp.asarray(rng.integers(0, num_rows, (steps, n), dtype=np.int32))
        upd = jnp.asarray(rng.standard_normal((steps, n, d), dtype=np.float32))
        zeros = np.zeros((num_rows, d), np.float32)

        def make_args(fresh, ids=ids, upd=upd, zeros=zeros):
            return (jax.device_put(zeros, HOST) if fresh else None), ids, upd

        flat = ids.reshape(-1)
        for op, fns, tol in (("set", set_variants(num_rows), 0.0),
                             ("add", add_variants(), 1e-4)):
            compile_and_time({k: _scan(f) for k, f in fns.items()}, make_args, steps,
                             lambda outs, flat=flat, tol=tol: check_rows(outs, flat, tol=tol),
                             options, out_dir, f"{op} {n} x {row_bytes} B")


def sparse(options, rng, sizes):
    adds = {"ours_auto": pp.scatter_add_to_host,
            "xla_raw": lambda x, r, u: x.at[r].add(u),
            "comb_sort": combined_add(0, False),
            "comb_sort_uq": combined_add(0, True),
            "host_add": host_add,
            "comb_host": combined_host_add}
    fns = {name: _sgd_scan(pp.gather_from_host, add, 0.5) for name, add in adds.items()}
    fns["xla_read_comb"] = _sgd_scan(_xla_read, combined_add(0, False), 0.5)
    run_sparse(options, rng, sizes, fns)


def run_sparse(options, rng, sizes, fns):
    """The sparse client's scans ``fns`` (``ours_auto`` among them) on Zipf ids: checked, timed."""
    rows, dim, batch, steps = sizes["sparse"]
    ids = jnp.asarray(zipf_ids(rng, rows, (steps, batch), 1.1))
    targets = jnp.asarray(rng.standard_normal((steps, batch, dim)).astype(np.float32) / 8)
    table0 = rng.standard_normal((rows, dim)).astype(np.float32) / 8

    def make_args(fresh):
        return (jax.device_put(table0, HOST) if fresh else None), ids, targets

    touched = jnp.asarray(np.unique(np.asarray(ids)))

    def check(outs):
        check_rows(outs, touched, tol=1e-5)

    compile_and_time(fns, make_args, steps, check, options, None, "sparse Zipf 4096 x 256 B")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    environment.add_xla_option(parser)
    parser.add_argument("--out", type=Path, default=None, help="folder for the HLO texts")
    parser.add_argument("--quick", action="store_true", help="tiny sizes (a CPU smoke test)")
    args = parser.parse_args()
    sizes = QUICK if args.quick else FULL
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
    print(f"jax {jax.__version__}, {jax.devices()[0].device_kind}, options "
          f"{args.compiler_options}, {ROUNDS} rounds interleaved, {sizes}", flush=True)
    rng = np.random.default_rng(0)
    options = args.compiler_options or None
    sparse(options, rng, sizes)
    loop_cases(options, rng, args.out, sizes)


if __name__ == "__main__":
    main()
