"""The sparse client with ``pallas_pinned.cached_table``: a device cache and a prefetch pipeline.

    python -m benchmarks.cached_table           # 8 Mi x 64 float32 (2 GiB) pinned, on a GPU
    python -m benchmarks.cached_table --quick   # a tiny table, seconds on CPU (a test runs it)

The training of ``benchmarks.sparse_training`` (its Zipf ids, spread by its permutation, and
its loss and SGD), each call a jitted ``lax.scan`` of ``--steps`` steps of ``--batch`` ids,
the state donated. Providers, in one run:

* ``device``: the table in device memory (``sparse_steps``' device step): the reference;
* ``uncached``: ``gather_from_host`` and ``scatter_add_to_host`` straight on the pinned
  table (``sparse_steps``' ``ours``);
* ``cached``: ``cached_table.scan`` without prefetch, then one ``cached_table.refresh``:
  the refresh interval is the scan, so its cost is in the per-step time;
* ``cached_pipeline``: the same with the prefetch pipeline (the next batch's cold rows read
  while this one computes);
* ``transfer``: the measured floor of the cold rows: each step's distinct cold ids (those
  the pipeline's cache left cold) read and written once, nothing else (``sparse_steps``'
  transfer step).

Fresh ids by default: every warm-up and timed call draws ids of its own, as a training does
(``--repeated-ids`` repeats the checked call's). The cached providers start empty: the
checked call and the warm-up calls fill the cache (each refresh from the counts of its
scan); the hit rate and distinct cold rows per step are the timed calls' (``CacheStats``).
Timing: median, min and max over ``--repeats`` synchronized calls after ``--warmup``,
per step. The nominal PCIe floor: the cold rows read once and written once at
``--pcie-gbps`` (given, not measured). Correctness: after the checked call every table is
compared with the device table (the cached ones flushed), within ``--tolerance`` times
``max(1, max|table|)``: updates of a repeated id are summed in another order (float32
rounding), while one lost update moves a row by ``lr * |row - target| / batch``. Writes
``cached_table.json`` under ``--out``; exits 1 on an error or a difference over the
tolerance.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import environment, report, timing
from benchmarks.sparse_steps import _loss, step_fns, transfer_rows
from benchmarks.sparse_training import max_abs_diff, zipf_ranks, zipf_spread
from pallas_pinned import cached_table as ct

PROVIDERS = ("device", "uncached", "cached", "cached_pipeline", "transfer")
# steps: the scan, and the refresh interval recommended (one refresh per scan of them).
FULL = {"rows": 8 << 20, "dim": 64, "batch": 4096, "steps": 200, "repeats": 7,
        "cache_rows": 1 << 18}
QUICK = {"rows": 1 << 12, "dim": 16, "batch": 128, "steps": 6, "repeats": 2, "cache_rows": 160}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.cached_table",
                                description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--quick", action="store_true", help=f"tiny sizes, on CPU too: {QUICK}")
    p.add_argument("--cpu", action="store_true", help="force the CPU (implies --quick sizes)")
    p.add_argument("--rows", type=int, default=None, help=f"table rows ({FULL['rows']})")
    p.add_argument("--dim", type=int, default=None, help=f"row width ({FULL['dim']})")
    p.add_argument("--batch", type=int, default=None, help=f"ids per step ({FULL['batch']})")
    p.add_argument("--steps", type=int, default=None,
                   help=f"steps per scan = the refresh interval ({FULL['steps']})")
    p.add_argument("--repeats", type=int, default=None, help=f"timed calls ({FULL['repeats']})")
    p.add_argument("--warmup", type=int, default=2, help="untimed calls after the checked one")
    p.add_argument("--cache-rows", type=int, default=None,
                   help=f"rows cached ({FULL['cache_rows']}: 3.1%% of the table)")
    p.add_argument("--policy", choices=ct.POLICIES, default="lfu")
    p.add_argument("--zipf-s", type=float, default=1.1)
    p.add_argument("--repeated-ids", action="store_true",
                   help="every call repeats the checked call's ids (fresh ids by default)")
    p.add_argument("--lr", type=float, default=0.5)
    p.add_argument("--tolerance", type=float, default=1e-5)
    p.add_argument("--pcie-gbps", type=float, default=52.0,
                   help="nominal PCIe rate of the floor (given, not measured)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=environment.REPO / "benchmarks" / "results")
    args = p.parse_args(argv)
    if args.cpu:
        jax.config.update("jax_platforms", "cpu")
    args.gpu = not args.cpu and environment.has_gpu()
    for key, value in (QUICK if (args.quick or not args.gpu) else FULL).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if min(args.rows, args.dim, args.batch, args.steps, args.repeats, args.cache_rows) < 1:
        p.error("sizes, --steps, --repeats and --cache-rows must be >= 1")
    if args.cache_rows > args.rows:
        p.error("--cache-rows must be at most --rows")
    return args


def make_inputs(args):
    """The initial table (device), the checked call's ids, one set per warm-up and timed call,
    and the targets (one set, reused), on the device."""
    rng = np.random.default_rng([args.seed, args.rows, args.dim, args.batch])
    shape = (args.steps, args.batch)
    ids, spread = zipf_spread(rng, args.rows, shape, args.zipf_s)
    fresh_rng = np.random.default_rng([args.seed, args.rows, 2])
    calls = args.warmup + args.repeats
    sets = ([spread[zipf_ranks(fresh_rng, args.rows, shape, args.zipf_s)] for _ in range(calls)]
            if not args.repeated_ids else [ids] * calls)
    scale = 1 / np.sqrt(args.dim)
    key_table, key_targets = jax.random.split(jax.random.key(args.seed))
    table = scale * jax.random.normal(key_table, (args.rows, args.dim), jnp.float32)
    targets = scale * jax.random.normal(key_targets, (*shape, args.dim), jnp.float32)
    return jax.block_until_ready(table), ids, sets, targets


def cached_fn(args, prefetch: bool):
    """A scan of the SGD step through the cache, then a refresh: one refresh interval."""
    lr = args.lr

    def step(carry, rows, targets):
        grad = jax.grad(lambda v: _loss(v[rows.inverse], targets))(rows.values[0])
        return carry, (-lr * grad).astype(rows.values[0].dtype), None

    def call(cache, ids, targets):
        cache, _, _ = ct.scan(step, cache, jnp.int32(0), ids, targets, prefetch=prefetch)
        return ct.refresh(cache)

    return jax.jit(call, donate_argnums=0)


def cold_transfer_rows(ids: np.ndarray, cached: np.ndarray, num_rows: int, width: int):
    """``transfer_rows`` of each step's cold ids: cached entries stand in for a cold id of
    their step (the distinct cold ids stay the same), or for the last row where a step has
    none."""
    cold = ~np.isin(ids, cached)
    first_cold = ids[np.arange(len(ids)), cold.argmax(1)]
    stand_in = np.where(cold.any(1), first_cold, num_rows - 1)
    return transfer_rows(np.where(cold, ids, stand_in[:, None]), num_rows, width)


def run(name, fn, state, first, timed, args, reference):
    """Compile and run once (checked), warm up, then time; returns the record, the state
    after the checked call's check (the reference's table for ``device``)."""
    record = {"provider": name, "status": "ok", "us_per_step": None, "us_min": None,
              "us_max": None, "max_abs_diff_vs_device": None, "correct": None}
    kept = None
    try:
        t0 = time.perf_counter()
        compiled = fn.lower(state, *first).compile()
        record["compile_s"] = time.perf_counter() - t0
        state = jax.block_until_ready(compiled(state, *first))
        cached = isinstance(state, ct.CachedTable)
        if cached:
            state = ct.flush(state)
        table = state.table if cached else state
        if name == "device":
            kept = jnp.copy(table)
        elif reference is not None and name != "transfer":
            diff = max_abs_diff(table, reference)
            tol = args.tolerance * max(1.0, float(jnp.max(jnp.abs(reference))))
            record.update(max_abs_diff_vs_device=diff, tolerance=tol, correct=diff <= tol)
        warm, rest = timed[:args.warmup], iter(timed[args.warmup:])
        for inputs in warm:
            state = jax.block_until_ready(compiled(state, *inputs))
        if cached:
            state = ct.reset_stats(state)
        state, measured = timing.measure(compiled, state, repeats=args.repeats, warmup=0,
                                         prepare=rest.__next__)
        if cached:
            s = ct.stats(state)
            calls = args.repeats * args.steps
            record.update(hit_rate=s["hit_rate"], cold_rows_per_step=s["cold_rows"] / calls,
                          loads_per_refresh=s["loads"] / args.repeats,
                          writebacks_per_refresh=s["writebacks"] / args.repeats)
            record["cached_ids"] = np.asarray(state.id_of)
    except Exception as err:  # noqa: BLE001 - recorded; the run fails at the end
        record.update(status="error", error=f"{type(err).__name__}: {err}"[:600])
        return record, kept
    per_step = 1e6 / args.steps
    record.update(us_per_step=measured.median_s * per_step, us_min=measured.min_s * per_step,
                  us_max=measured.max_s * per_step, runs=measured.reps)
    jax.tree.map(lambda a: a.delete(), state)
    return record, kept


def main(argv=None) -> int:
    args = parse_args(argv)
    started = time.monotonic()
    table0, ids, sets, targets = make_inputs(args)
    device = jax.devices()[0]
    pinned = jax.sharding.make_single_device_sharding(device, memory_kind="pinned_host")
    on_device = jax.sharding.make_single_device_sharding(device, memory_kind="device")
    row_bytes = args.dim * 4
    print(f"cached table: {args.rows} x {args.dim} float32 "
          f"({report.format_bytes(args.rows * row_bytes)}) pinned, cache of {args.cache_rows} "
          f"rows ({args.cache_rows / args.rows:.1%}, {args.policy}); {args.steps} steps of "
          f"{args.batch} Zipf(s={args.zipf_s}) ids a scan, one refresh a scan; "
          f"{'repeated' if args.repeated_ids else 'fresh'} ids", flush=True)
    sgd = step_fns(args.lr)

    def put(a):
        return jax.device_put(a, on_device)

    first = (put(ids), targets)
    timed = [(put(s), targets) for s in sets]
    records, reference, cached_ids = [], None, None
    for name in PROVIDERS:
        if name == "device":
            fn, state = sgd["device"], jnp.copy(table0)
        elif name == "uncached":
            fn, state = sgd["ours"], jax.device_put(table0, pinned)
        elif name == "transfer":
            if cached_ids is None:
                records.append({"provider": name, "status": "error",
                                "error": "no cache: cached_pipeline failed"})
                continue
            width = max(np.unique(r[~np.isin(r, cached_ids)]).size for s in [ids, *sets]
                        for r in s) or 1
            moves = [put(cold_transfer_rows(s, cached_ids, args.rows, width))
                     for s in [ids, *sets]]
            fn, state = sgd["transfer"], jax.device_put(table0, pinned)
            first, timed = (moves[0], targets), [(m, targets) for m in moves[1:]]
        else:
            fn = cached_fn(args, prefetch=name == "cached_pipeline")
            state = ct.create(jax.device_put(table0, pinned), args.cache_rows,
                              policy=args.policy)
        record, kept = run(name, fn, state, first, timed, args, reference)
        if name == "device":
            reference = kept
        if "cached_ids" in record:
            cached_ids = record.pop("cached_ids")
            cached_ids = cached_ids[cached_ids >= 0]
        records.append(record)
        print(f"  {name}: {record['status']}", flush=True)
    if reference is not None:
        reference.delete()
    by_name = {r["provider"]: r for r in records}
    pipe = by_name.get("cached_pipeline", {})
    cold = pipe.get("cold_rows_per_step")
    floor_us = None if cold is None else 2 * cold * row_bytes / (args.pcie_gbps * 1e9) * 1e6
    base = by_name["device"].get("us_per_step")
    ratios = {r["provider"]: (r["us_per_step"] / base if base and r["us_per_step"] else None)
              for r in records}
    if floor_us is not None and base:
        ratios["pcie_floor"] = floor_us / base
    rows = [[r["provider"], report.format_seconds_span(
        *(None if r.get(k) is None else r[k] * 1e-6 for k in ("us_per_step", "us_min", "us_max"))),
        "-" if ratios.get(r["provider"]) is None else f"{ratios[r['provider']]:.2f}x",
        "-" if r.get("hit_rate") is None else f"{r['hit_rate']:.1%}",
        "-" if r.get("cold_rows_per_step") is None else f"{r['cold_rows_per_step']:.0f}",
        {True: "yes", False: "NO", None: "-"}[r.get("correct")] if r["status"] == "ok"
        else r["error"][:60]] for r in records]
    report.print_table(["provider", "per step [min–max]", "vs device", "hit rate", "cold rows",
                        "correct"], rows, "cached table (per step, refresh included)",
                       left=["provider", "correct"])
    lines = []
    if floor_us is not None:
        lines.append(f"PCIe floor of the cold rows: {cold:.0f} rows read + written a step, "
                     f"{floor_us:.2f} us at {args.pcie_gbps:g} GB/s (nominal)"
                     + (f", {ratios['pcie_floor']:.2f}x the device step" if base else ""))
    target = ratios.get("cached_pipeline")
    if target is not None and args.gpu:
        lines.append(f"cached_pipeline / device = {target:.2f} (target <= 1.5)")
    print("\n".join(lines))
    meta = {"benchmark": "cached_table", "argv": sys.argv[1:] if argv is None else argv,
            **{k: getattr(args, k) for k in ("rows", "dim", "batch", "steps", "repeats",
                                              "warmup", "cache_rows", "policy", "zipf_s",
                                              "repeated_ids", "lr", "seed", "tolerance",
                                              "pcie_gbps")},
            "refresh_interval_steps": args.steps, "table_bytes": args.rows * row_bytes,
            **environment.environment()}
    summary = {"ratio_to_device": ratios, "pcie_floor_us_per_step": floor_us, "lines": lines}
    args.out.mkdir(parents=True, exist_ok=True)
    out = args.out / "cached_table.json"
    report.write_json(out, {"meta": meta, "records": records, "summary": summary})
    print(f"wrote {out} in {time.monotonic() - started:.0f} s")
    ok = all(r["status"] == "ok" and r["correct"] is not False for r in records)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
