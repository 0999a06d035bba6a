"""How fast is my training step against a table in device memory?

    python -m benchmarks.training           # on a GPU: the grid below, 1 and 16 GiB tables
    python -m benchmarks.training --quick   # a tiny table, seconds on CPU (a test runs it)

Sparse SGD on a float32 embedding table: each step gathers the rows of ``--batch`` Zipf ids
(the popular ids spread over the table by a permutation), takes the gradient of
``0.5 * mean_b ||row_b - target_b||^2`` with respect to them and adds ``-lr * grad`` back.
``--steps`` steps run in one jitted ``lax.scan``, the state donated. Providers, in one run,
from the same table, ids and targets:

* ``device``: the table in device memory (``jnp.take``, ``.at[ids].add``): the reference;
* ``uncached``: ``gather_from_host`` and ``scatter_add_to_host`` on the pinned table;
* ``cached``: ``pallas_pinned.cached_table.scan`` without prefetch (the step hands back
  ``Grads``, the table's ``sgd`` applies them), then one ``refresh`` (the refresh interval
  is the scan's ``--steps``); the cache starts with the busiest ids of the checked call's
  batches (a lookup of them, then a refresh), so the checked call reads cached and cold
  rows alike;
* ``cached_pipeline``: the same with the prefetch (the next batch's cold rows read while
  this batch computes);
* ``transfer``: the floor. Each step's distinct cold ids (not cached when that call ran,
  as recorded untimed before it) read by ``gather_from_host`` and written by
  ``scatter_to_host``, nothing else. Each read row goes to the next one, so a floor that
  moves nothing fails its check against a numpy replay; its rows must be as many as the
  cache counted cold.

The grid: ``--zipf-s`` x ``--table-gib`` (or ``--rows``) x ``--cache-fraction``; ``device``
and ``uncached`` run once per Zipf exponent and table. Fresh ids by default: the checked,
each warm-up and each timed call draws ids of its own (``--repeated-ids``: the checked
call's every time). Per step: median, min and max over ``--repeats`` synchronized calls;
the cached providers' refresh is timed apart and reported per step of its interval, and
their time per step is the scan's plus that. Also the bytes floor: the cold rows read and
written once at the copy rates this run measures (a contiguous pinned<->device copy).

Correctness: after its checked call every provider's table (the cached ones flushed) is
compared with the device table's, within ``--tolerance`` times ``max(1, max|table|)``
(updates of a repeated id are summed in another order), and must stay in its memory kind.
Without the device table nothing is checked and the run fails. Ratios read checked times
only. On a GPU the targets' verdicts are printed: ``cached_pipeline`` within 1.2x
``max(device, transfer)``, and within 1.5x ``device`` at a 5 % cache with s = 1.2. Writes
``training.json`` under ``--out``; exits 1 on an error, a wrong or unchecked table. Device
memory: about four times the table (the table, the reference, a copy being checked).

The providers' steps, their checked and timed run and the floor: ``training_providers``.
"""

from __future__ import annotations

import argparse
import functools
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from benchmarks import environment, report, timing
from benchmarks import training_providers as providers
from pallas_pinned import cached_table as ct

PROVIDERS = ("device", "uncached", "cached", "cached_pipeline", "transfer")
CACHED = ("cached", "cached_pipeline")
FULL = {"zipf_s": "1.05,1.2", "table_gib": "1,16", "cache_fraction": "0.01,0.05,0.2",
        "dim": 64, "batch": 4096, "steps": 200, "repeats": 7, "warmup": 2}
QUICK = {"zipf_s": "1.2", "rows": "4096", "cache_fraction": "0.05", "dim": 16, "batch": 128,
         "steps": 6, "repeats": 2, "warmup": 1}
# The targets, judged on a GPU only: cached_pipeline against max(device, transfer), and
# against the device table at a 5 % cache with s = 1.2.
FLOOR_TARGET, DEVICE_TARGET, DEVICE_TARGET_CELL = 1.2, 1.5, (1.2, 0.05)


# ---------------------------------------------------------------------------
# Inputs


def draw_ids(rng: np.random.Generator, rows: int, shape: tuple, s: float,
             count: int, repeated: bool) -> list[np.ndarray]:
    """``count`` sets of ids with ``P(rank k) ~ (k + 1) ** -s``, the ranks spread over the
    table by one permutation; with ``repeated`` the first set ``count`` times."""
    cdf = np.cumsum(np.arange(1, rows + 1, dtype=np.float64) ** -s)
    cdf, spread = cdf / cdf[-1], rng.permutation(rows).astype(np.int32)
    draw = lambda: spread[np.minimum(np.searchsorted(cdf, rng.random(shape)), rows - 1)]  # noqa: E731
    return [draw()] * count if repeated else [draw() for _ in range(count)]


def initial_table(seed: int, rows: int, dim: int) -> jax.Array:
    """Normal values of scale ``1/sqrt(dim)`` in device memory, drawn in chunks (a draw of
    the whole of a large table at once needs several times its memory)."""
    chunk = min(rows, max(1, (1 << 26) // dim))
    key = jax.random.key(seed)

    @functools.partial(jax.jit, donate_argnums=0)
    def fill(table, start):
        block = jax.random.normal(jax.random.fold_in(key, start), (chunk, dim), jnp.float32)
        return lax.dynamic_update_slice(table, block / np.sqrt(dim), (start, 0))

    table = jnp.zeros((rows, dim), jnp.float32)
    for start in range(0, rows, chunk):
        table = fill(table, jnp.int32(min(start, rows - chunk)))
    return jax.block_until_ready(table)


def copy_rates(nbytes: int) -> dict:
    """GB/s of a contiguous pinned->device and device->pinned copy of ``nbytes`` (median of 5)."""
    kinds = {k: providers.single_device(k) for k in ("device", "pinned_host")}
    rates = {}
    for name, src, dst in (("h2d", "pinned_host", "device"), ("d2h", "device", "pinned_host")):
        buf = jax.device_put(jnp.zeros((max(1, nbytes // 4),), jnp.float32), kinds[src])
        copy = lambda s, dst=dst: (s[0], jax.device_put(s[0], kinds[dst]))  # noqa: E731
        _, took = timing.measure(copy, (buf, None), repeats=5, warmup=1)
        rates[f"{name}_gbps"] = buf.nbytes / took.median_s / 1e9
    rates["bytes"] = max(1, nbytes // 4) * 4
    return rates


# ---------------------------------------------------------------------------
# The grid


def run_table(s: float, rows: int, args, progress) -> list[dict]:
    """Every provider at one Zipf exponent and table size, over the cache fractions."""
    cell = {"zipf_s": s, "rows": rows, "table_bytes": rows * args.dim * 4}
    label = f"s={s:g} {report.format_bytes(cell['table_bytes'])}"
    rng = np.random.default_rng([args.seed, rows, round(s * 1000)])
    shape = (args.steps, args.batch)
    ids = draw_ids(rng, rows, shape, s, 1 + args.warmup + args.repeats, args.repeated_ids)
    table0 = initial_table(args.seed, rows, args.dim)
    targets = jax.random.normal(jax.random.key(args.seed + 1), (*shape, args.dim)) / np.sqrt(
        args.dim)
    on_device = providers.single_device("device")
    sets = [(jax.device_put(i, on_device), targets) for i in ids]
    opts = tuple(sorted(args.compiler_options.items()))
    records, reference = [], None

    def add(record, **extra):
        records.append({**cell, **extra, **record})
        progress.step(f"{label} {extra.get('cache_fraction', '')} {record['provider']}")

    for name in ("device", "uncached"):
        if name not in args.providers:
            continue
        make = functools.partial(providers.table_provider, name, table0, args.lr, opts)
        record, kept, _ = providers.run_provider(name, make, sets, args, reference)
        reference = kept if name == "device" else reference
        add(record)
    for fraction in args.cache_fraction:
        cache_rows = max(1, min(rows, round(fraction * rows)))
        extra = {"cache_fraction": fraction, "cache_rows": cache_rows}
        caches, cached_record = None, None
        for name in CACHED:
            if name not in args.providers:
                continue
            # Looked up on the module at run time: a test swaps in a broken one.
            make = functools.partial(providers.cached_provider, table0, cache_rows, args.policy,
                                     args.lr, name == "cached_pipeline", sets[0][0], opts)
            record, _, seen = providers.run_provider(name, make, sets, args, reference)
            if record["status"] == "ok":
                caches, cached_record = seen, record
            add(record, **extra)
        if "transfer" in args.providers:
            add(providers.run_floor(table0, ids[1:], caches, cached_record, args, opts),
                **extra)
    if reference is not None:
        reference.delete()
    table0.delete()
    return records


# ---------------------------------------------------------------------------
# Summary


def checked_us(r: dict | None) -> float | None:
    """A record's time per step where it may enter a ratio: the reference's, or a checked one."""
    if r is None or r["status"] != "ok" or (r["provider"] != "device" and r["correct"] is not True):
        return None
    return r["us_per_step"]


def why_not(r: dict | None, name: str) -> str:
    if r is None:
        return f"{name} not run"
    if r["status"] != "ok":
        return f"{name} errored"
    return f"{name} incorrect" if r["correct"] is False else f"{name} unchecked"


def _ratio(cell: dict, key: str) -> str:
    return "n/a" if key not in cell else f"{cell[key]:.2f}"


def summarize(records: list[dict], rates: dict, on_gpu: bool) -> dict:
    """Per cell (Zipf exponent, table, cache): ratios of checked times, the bytes floor and,
    on a GPU, the targets' verdicts; each ratio missing says why."""
    cells, lines = [], []
    keys = dict.fromkeys((r["zipf_s"], r["rows"], r["cache_fraction"]) for r in records
                         if "cache_fraction" in r)
    for s, rows, fraction in keys:
        at = {r["provider"]: r for r in records if r["zipf_s"] == s and r["rows"] == rows
              and r.get("cache_fraction", fraction) == fraction}
        us = {name: checked_us(at.get(name)) for name in PROVIDERS}
        cell = {"zipf_s": s, "rows": rows, "cache_fraction": fraction}
        table_bytes = next(iter(at.values()))["table_bytes"]
        label = f"s={s:g}, {report.format_bytes(table_bytes)}, cache {fraction:.0%}"
        cold = next((at[n].get("cold_rows_per_step") for n in CACHED if n in at), None)
        if cold is not None:
            row_bytes = table_bytes / rows
            cell["bytes_floor_us"] = cold * row_bytes * (1 / rates["h2d_gbps"]
                                                         + 1 / rates["d2h_gbps"]) / 1e3
        if us["device"] and us["transfer"]:
            cell["floor_us"] = max(us["device"], us["transfer"])
        for name in ("uncached", *CACHED, "transfer"):
            if us[name] and us["device"]:
                cell[f"{name}_over_device"] = us[name] / us["device"]
        for name in CACHED:
            if us[name] and cell.get("floor_us"):
                cell[f"{name}_over_floor"] = us[name] / cell["floor_us"]
        cells.append(cell)
        pipe = cell.get("cached_pipeline_over_floor")
        if pipe is None:
            missing = "; ".join(why_not(at.get(n), n) for n in ("cached_pipeline", "device",
                                                                 "transfer") if not us[n])
            lines.append(f"{label}: cached_pipeline / max(device, transfer) n/a ({missing})")
            continue
        ratio = functools.partial(_ratio, cell)
        line = (f"{label}: / max(device, transfer): cached_pipeline {pipe:.2f}, cached "
                f"{ratio('cached_over_floor')}; / device: cached_pipeline "
                f"{ratio('cached_pipeline_over_device')}, cached "
                f"{ratio('cached_over_device')}; transfer {us['transfer']:.1f} us, bytes floor "
                f"{cell.get('bytes_floor_us', float('nan')):.1f} us a step")
        if on_gpu:
            line += f" (target <= {FLOOR_TARGET}: {'met' if pipe <= FLOOR_TARGET else 'NOT met'}"
            if (s, fraction) == DEVICE_TARGET_CELL:
                dev = cell["cached_pipeline_over_device"]
                line += (f"; <= {DEVICE_TARGET} x device: "
                         f"{'met' if dev <= DEVICE_TARGET else 'NOT met'}")
            line += ")"
        lines.append(line)
    if not on_gpu:
        lines.append("no verdict on the targets: a CPU run")
    return {"cells": cells, "lines": lines}


def print_records(records: list[dict]) -> None:
    def num(r, key, spec):
        return "-" if r.get(key) is None else format(r[key], spec)

    rows = []
    for r in records:
        device = next((checked_us(d) for d in records if d["provider"] == "device"
                       and d["zipf_s"] == r["zipf_s"] and d["rows"] == r["rows"]), None)
        us = checked_us(r)
        rows.append([
            f"{r['zipf_s']:g}", report.format_bytes(r["table_bytes"]),
            "-" if "cache_fraction" not in r else f"{r['cache_fraction']:.0%}", r["provider"],
            report.format_seconds_span(*(None if r.get(k) is None else r[k] * 1e-6
                                         for k in ("us_per_step", "us_min", "us_max"))),
            num(r, "refresh_us_per_step", ".1f"),
            "-" if not (us and device) else f"{us / device:.2f}x",
            "-" if r.get("hit_rate") is None else f"{r['hit_rate']:.1%}",
            num(r, "cold_rows_per_step", ".0f"),
            {True: "yes", False: "NO", None: "-"}[r.get("correct")] if r["status"] == "ok"
            else r["error"][:70]])
    report.print_table(["s", "table", "cache", "provider", "per step [min–max]", "refresh us",
                        "vs device", "hit rate", "cold rows", "correct"], rows,
                       "training step (per step; the cached ones with their refresh)",
                       left=("provider", "correct"))


def exit_status(records: list[dict]) -> int:
    """1 on an error, a wrong table, or a table left unchecked."""
    failed = [r for r in records if r["status"] != "ok" or r["correct"] is False
              or (r["correct"] is None and r["provider"] != "device")]
    for r in failed:
        where = f"s={r['zipf_s']:g} rows={r['rows']} cache={r.get('cache_fraction', '-')}"
        print(f"ERROR: {r['provider']} ({where}): {r['error'][:300]}" if r["status"] != "ok"
              else f"UNCHECKED: {r['provider']} ({where})" if r["correct"] is None
              else f"INCORRECT: {r['provider']} ({where}): max |table - {r['checked_against']}"
              f"| {r['max_abs_diff']:.3g} (tolerance {r['tolerance']:.3g}), memory kind "
              f"{r['memory_kind']}")
    return 1 if failed else 0


# ---------------------------------------------------------------------------
# Command line


def _floats(text: str) -> list[float]:
    return [float(v) for v in text.split(",") if v.strip()]


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.training",
                                description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--quick", action="store_true", help=f"tiny sizes, on CPU too: {QUICK}")
    p.add_argument("--cpu", action="store_true", help="force the CPU (implies --quick sizes)")
    p.add_argument("--providers", default=",".join(PROVIDERS),
                   help="a subset of these; prefetch on and off: cached_pipeline and cached")
    p.add_argument("--zipf-s", default=None, help=f"Zipf exponents ({FULL['zipf_s']})")
    p.add_argument("--table-gib", default=None, help=f"table sizes in GiB ({FULL['table_gib']})")
    p.add_argument("--rows", default=None, help="table sizes in rows, in place of --table-gib")
    p.add_argument("--cache-fraction", default=None,
                   help=f"cached share of the rows ({FULL['cache_fraction']})")
    p.add_argument("--dim", type=int, default=None, help=f"row width ({FULL['dim']})")
    p.add_argument("--batch", type=int, default=None, help=f"ids per step ({FULL['batch']})")
    p.add_argument("--steps", type=int, default=None,
                   help=f"steps per scan = the refresh interval ({FULL['steps']})")
    p.add_argument("--repeats", type=int, default=None, help=f"timed calls ({FULL['repeats']})")
    p.add_argument("--warmup", type=int, default=None,
                   help=f"untimed calls after the checked one ({FULL['warmup']})")
    p.add_argument("--policy", choices=ct.POLICIES, default="lfu")
    p.add_argument("--repeated-ids", action="store_true",
                   help="every call repeats the checked call's ids (fresh ids by default)")
    p.add_argument("--lr", type=float, default=0.5)
    p.add_argument("--tolerance", type=float, default=1e-5,
                   help="largest |table - device table| after the checked call, times "
                   "max(1, max|device table|)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=environment.REPO / "benchmarks" / "results")
    environment.add_xla_option(p)
    args = p.parse_args(argv)
    if args.cpu:
        jax.config.update("jax_platforms", "cpu")
    args.gpu = not args.cpu and environment.has_gpu()
    sizes = QUICK if (args.quick or not args.gpu) else FULL
    for key, value in sizes.items():
        if getattr(args, key, None) is None and not (key == "rows" and args.table_gib):
            setattr(args, key, value)
    if args.table_gib is None and args.rows is None:
        args.table_gib = FULL["table_gib"]
    args.providers = [n.strip() for n in args.providers.split(",") if n.strip()]
    if unknown := set(args.providers) - set(PROVIDERS):
        p.error(f"unknown providers {sorted(unknown)}; known: {', '.join(PROVIDERS)}")
    args.zipf_s, args.cache_fraction = _floats(args.zipf_s), _floats(args.cache_fraction)
    row_bytes = args.dim * 4
    args.rows = ([int(v) for v in _floats(args.rows)] if args.rows else
                 [max(1, round(g * (1 << 30) / row_bytes)) for g in _floats(args.table_gib)])
    if min(args.dim, args.batch, args.steps, args.repeats, *args.rows) < 1 or args.warmup < 0:
        p.error("sizes, --steps and --repeats must be >= 1, --warmup >= 0")
    if not all(0 < f <= 1 for f in args.cache_fraction):
        p.error("--cache-fraction: each in (0, 1]")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    started = time.monotonic()
    if not args.gpu and not args.quick:
        print("no GPU found: on CPU, with the quick sizes where none is given")
    rates = copy_rates(min(256 << 20, max(args.rows) * args.dim * 4))
    print(f"training step: {args.steps} steps of {args.batch} Zipf ids a scan (one refresh a "
          f"scan), float32 rows of {args.dim}, {'repeated' if args.repeated_ids else 'fresh'} "
          f"ids; copies pinned->device {rates['h2d_gbps']:.1f}, device->pinned "
          f"{rates['d2h_gbps']:.1f} GB/s", flush=True)
    per_table = sum(n in args.providers for n in ("device", "uncached"))
    per_cache = sum(n in args.providers for n in (*CACHED, "transfer"))
    progress = report.Progress(len(args.zipf_s) * len(args.rows) * (
        per_table + per_cache * len(args.cache_fraction)), "training")
    records = []
    for s in args.zipf_s:
        for rows in args.rows:
            records += run_table(s, rows, args, progress)
    progress.close()
    summary = summarize(records, rates, args.gpu)
    print_records(records)
    print("\n".join(summary["lines"]))
    meta = {"benchmark": "training", "argv": sys.argv[1:] if argv is None else argv,
            **{k: getattr(args, k) for k in ("providers", "zipf_s", "rows", "cache_fraction",
                                              "dim", "batch", "steps", "repeats", "warmup",
                                              "policy", "repeated_ids", "lr", "tolerance",
                                              "seed", "compiler_options")},
            "refresh_interval_steps": args.steps, "copy_rates": rates,
            "loss": "0.5 * mean_b ||row_b - target_b||^2, SGD on the rows of the batch",
            **environment.environment()}
    args.out.mkdir(parents=True, exist_ok=True)
    out = args.out / "training.json"
    report.write_json(out, {"meta": meta, "records": records, "summary": summary})
    print(f"wrote {out} in {time.monotonic() - started:.0f} s")
    return exit_status(records)


if __name__ == "__main__":
    sys.exit(main())
