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
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import pallas_pinned as pp
from benchmarks import environment, report, timing
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
_DISTINCT = {"unique_indices": True, "indices_are_sorted": True}


# ---------------------------------------------------------------------------
# The steps


def _loss(rows, targets):
    return 0.5 * jnp.mean(jnp.sum((rows - targets) ** 2, axis=-1))


@functools.cache
def _jit(fn: Callable, options: tuple) -> Callable:
    """``fn`` jitted, its state donated: one object per function and options for the whole
    run, so that a cell of the grid with the shapes of an earlier one compiles nothing."""
    return jax.jit(fn, donate_argnums=0, compiler_options=dict(options) or None)


@functools.cache
def _sgd_scan(read, add, lr: float):
    """``(table, ids, targets) -> table``: one SGD step per row of ``ids``."""

    def train(table, ids, targets):
        def step(table, xs):
            i, t = xs
            grad = jax.grad(_loss)(read(table, i), t)
            return add(table, i, (-lr * grad).astype(table.dtype)), None

        return lax.scan(step, table, (ids, targets))[0]

    return train


# Looked up at run time (a test swaps in a broken one).
READ_ADD = {
    "device": (lambda x, i: jnp.take(x, i, axis=0), lambda x, i, u: x.at[i].add(u)),
    "uncached": (pp.gather_from_host, pp.scatter_add_to_host),
}


def transfer_scan(table, rows, targets):
    """The floor: step ``s`` reads the rows ``rows[s, 0]`` and writes them to ``rows[s, 1]``
    (:func:`transfer_rows`), straight from the gather into the scatter. ``targets`` unused."""
    del targets

    def step(table, pair):
        values = pp.gather_from_host(table, pair[0], mode="fill", fill_value=0, **_DISTINCT)
        return pp.scatter_to_host(table, pair[1], values, mode="drop", **_DISTINCT), None

    return lax.scan(step, table, rows)[0]


@dataclasses.dataclass
class Provider:
    """A provider's state and what the run does with it."""

    state: Any
    call: Callable  # (state, ids, targets) -> state: one scan, timed
    refresh: Callable | None = None  # state -> state, timed apart
    checked: Callable = lambda s: (s, s)  # state -> (state, its table as it is checked)
    cached_ids: Callable | None = None  # state -> the ids cached (numpy)
    stats: Callable | None = None  # state -> the CacheStats counters, a dict of ints
    reset: Callable | None = None  # state -> state with the counters at zero


@functools.cache
def cached_train(prefetch: bool) -> Callable:
    """``(cache, ids, targets) -> cache``: the scan through ``pallas_pinned.cached_table``;
    the step hands back each entry's gradient, the table's SGD applies them."""

    def step(carry, rows, targets):
        return carry, ct.Grads(jax.grad(_loss)(rows.per_entry(), targets)), None

    def train(cache, ids, targets):
        return ct.scan(step, cache, jnp.int32(0), ids, targets, prefetch=prefetch)[0]

    return train


def cached_provider(table, cache_rows: int, policy: str, lr: float, prefetch: bool,
                    prime_ids, options: tuple) -> Provider:
    """Everything else the benchmark does with ``pallas_pinned.cached_table``.

    The cache starts with the busiest ids of ``prime_ids`` (looked up, then a refresh:
    nothing written yet)."""

    def flushed(cache):
        cache = ct.flush(cache)
        return cache, cache.table

    cache = ct.create(table, cache_rows, optimizer=ct.sgd(lr), policy=policy)
    _, cache = ct.lookup(cache, jnp.ravel(prime_ids))
    cache = ct.reset_stats(ct.refresh(cache))
    return Provider(cache, _jit(cached_train(prefetch), options),
                    refresh=_jit(ct.refresh, options), checked=flushed,
                    cached_ids=lambda c: np.asarray(c.id_of),
                    stats=lambda c: ct.stats(c)._asdict(), reset=ct.reset_stats)


# ---------------------------------------------------------------------------
# Inputs


def zipf_cdf(rows: int, s: float) -> np.ndarray:
    weights = np.arange(1, rows + 1, dtype=np.float64) ** -s
    cdf = np.cumsum(weights)
    return cdf / cdf[-1]


def draw_ids(rng: np.random.Generator, rows: int, shape: tuple, s: float,
             count: int, repeated: bool) -> list[np.ndarray]:
    """``count`` sets of ids with ``P(rank k) ~ (k + 1) ** -s``, the ranks spread over the
    table by one permutation; with ``repeated`` the first set ``count`` times."""
    cdf, spread = zipf_cdf(rows, s), rng.permutation(rows).astype(np.int32)
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


def cold_rows(ids: np.ndarray, cached: np.ndarray, num_rows: int) -> list[np.ndarray]:
    """Each step's distinct ids not in ``cached`` (ids of ``[0, num_rows)``), ascending."""
    is_cached = np.zeros(num_rows, bool)
    is_cached[cached[cached >= 0]] = True
    return [np.unique(row[~is_cached[row]]) for row in ids]


def padded(rows: list[np.ndarray], num_rows: int, width: int) -> np.ndarray:
    """``(steps, width)`` int32: each step's rows, then ``num_rows, num_rows + 1, ...`` (out of
    range: they move nothing)."""
    out = num_rows + np.tile(np.arange(width, dtype=np.int64), (len(rows), 1))
    for s, r in enumerate(rows):
        out[s, :r.size] = r
    return out.astype(np.int32)


def transfer_rows(reads: np.ndarray, num_rows: int) -> np.ndarray:
    """``(steps, 2, width)``: the rows read (:func:`padded`) and those written: entry
    ``j``'s value goes to the row read by entry ``j + 1`` (the last one's out of range).
    Both ascending and distinct, as the floor's ops are promised."""
    past = np.full((reads.shape[0], 1), num_rows + reads.shape[1], np.int32)
    return np.stack([reads, np.concatenate([reads[:, 1:], past], axis=1)], axis=1)


def transfer_replay(table0: jax.Array, rows: np.ndarray) -> jax.Array:
    """The table after one :func:`transfer_scan` from ``table0``, replayed in numpy on the
    rows it touches (each step's values read before any is written, as the step does)."""
    num_rows = table0.shape[0]
    touched = np.unique(rows[:, 0][rows[:, 0] < num_rows])
    values = np.array(table0[jnp.asarray(touched)])  # a writable copy
    for read, write in rows:
        moved = write < num_rows
        values[np.searchsorted(touched, write[moved])] = values[
            np.searchsorted(touched, read[moved])]
    return table0.at[touched].set(values)


@jax.jit
def _max_abs(a, b=0.0):
    return jnp.max(jnp.abs(a - b))  # fused under jit: no temporary as large as the table


def max_abs_diff(a: jax.Array, reference: jax.Array) -> float:
    """Largest ``|a - reference|`` in device memory (``a`` moved by memory space: jax's CPU
    runtime refuses a pinned_host array for a sharding of kind "device")."""
    a_dev = jax.device_put(a, jax.memory.Space.Device)
    diff = float(_max_abs(a_dev, reference))
    if a_dev is not a:
        a_dev.delete()
    return diff


def copy_rates(nbytes: int) -> dict:
    """GB/s of a contiguous pinned->device and device->pinned copy of ``nbytes`` (median of 5)."""
    device = jax.devices()[0]
    kinds = {k: jax.sharding.make_single_device_sharding(device, memory_kind=k)
             for k in ("device", "pinned_host")}
    rates = {}
    for name, src, dst in (("h2d", "pinned_host", "device"), ("d2h", "device", "pinned_host")):
        buf = jax.device_put(jnp.zeros((max(1, nbytes // 4),), jnp.float32), kinds[src])
        copy = lambda s, dst=dst: (s[0], jax.device_put(s[0], kinds[dst]))  # noqa: E731
        _, took = timing.measure(copy, (buf, None), repeats=5, warmup=1)
        rates[f"{name}_gbps"] = buf.nbytes / took.median_s / 1e9
    rates["bytes"] = max(1, nbytes // 4) * 4
    return rates


# ---------------------------------------------------------------------------
# One provider


def run_provider(name: str, make: Callable[[], Provider], sets: list, args, reference,
                 table0=None) -> tuple[dict, Any, list]:
    """Checked call on ``sets[0]``, warm-up calls, timed calls on the rest.

    Returns the record, the table kept as the reference (``device`` only) and the ids each
    warm-up and timed call had cached (the cached providers). ``table0`` given: checked
    against the numpy replay of :func:`transfer_scan` (bit for bit) instead."""
    record = {"provider": name, "status": "ok", "us_per_step": None, "us_min": None,
              "us_max": None, "max_abs_diff": None, "correct": None}
    kept, caches = None, []
    try:
        p = make()
        t0 = time.perf_counter()
        p.state = jax.block_until_ready(p.call(p.state, *sets[0]))
        if p.refresh:
            p.state = p.refresh(p.state)
        record["first_call_s"] = time.perf_counter() - t0
        p.state, table = p.checked(p.state)
        record["memory_kind"] = table.sharding.memory_kind
        want_kind = "device" if name == "device" else "pinned_host"
        if name == "device":
            kept = jnp.copy(table)
        elif table0 is not None or reference is not None:
            replayed = None if table0 is None else transfer_replay(table0, np.asarray(sets[0][0]))
            diff = max_abs_diff(table, reference if replayed is None else replayed)
            tol = 0.0 if replayed is not None else args.tolerance * max(
                1.0, float(_max_abs(reference)))
            record.update(max_abs_diff=diff, tolerance=tol, checked_against="device table"
                          if replayed is None else "numpy replay",
                          correct=diff <= tol and record["memory_kind"] == want_kind)
            if replayed is not None:
                replayed.delete()
        else:
            record["note"] = "unchecked: no device table to check against"
        scan_s, refresh_s = [], []
        for k, inputs in enumerate(sets[1:]):
            if k == args.warmup and p.reset:
                p.state = p.reset(p.state)
            if p.cached_ids:
                caches.append(p.cached_ids(p.state))
            p.state, took = timing.measure(p.call, p.state, *inputs, repeats=1, warmup=0)
            scan_s.append(took.median_s)
            if p.refresh:
                p.state, took = timing.measure(p.refresh, p.state, repeats=1, warmup=0)
                refresh_s.append(took.median_s)
        scan_s, refresh_s = scan_s[args.warmup:], refresh_s[args.warmup:]
        if p.stats:
            s, calls = p.stats(p.state), args.repeats * args.steps
            record.update(hit_rate=s["hits"] / max(1, s["lookups"]),
                          cold_rows_per_step=s["cold_rows"] / calls,
                          loads_per_refresh=s["loads"] / args.repeats,
                          writebacks_per_refresh=s["writebacks"] / args.repeats)
        jax.tree.map(lambda a: a.delete(), p.state)
    except Exception as err:  # noqa: BLE001 - recorded; the run fails at the end
        record.update(status="error", error=f"{type(err).__name__}: {err}"[:600])
        if kept is not None:
            kept.delete()
        return record, None, []
    total = np.add(scan_s, refresh_s) if refresh_s else np.asarray(scan_s)
    per_step = 1e6 / args.steps
    record.update(us_per_step=float(np.median(total)) * per_step,
                  us_min=float(total.min()) * per_step, us_max=float(total.max()) * per_step,
                  runs=len(total))
    if refresh_s:
        record.update(scan_us_per_step=float(np.median(scan_s)) * per_step,
                      refresh_us_per_step=float(np.median(refresh_s)) * per_step)
    return record, kept, caches


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
    device = jax.devices()[0]
    on_device = jax.sharding.make_single_device_sharding(device, memory_kind="device")
    pinned = jax.sharding.make_single_device_sharding(device, memory_kind="pinned_host")
    sets = [(jax.device_put(i, on_device), targets) for i in ids]
    opts = tuple(sorted(args.compiler_options.items()))
    records, reference = [], None

    def add(record, **extra):
        records.append({**cell, **extra, **record})
        progress.step(f"{label} {extra.get('cache_fraction', '')} {record['provider']}")

    for name in ("device", "uncached"):
        if name not in args.providers:
            continue
        train = _jit(_sgd_scan(*READ_ADD[name], args.lr), opts)
        start = (lambda: jnp.copy(table0)) if name == "device" else (
            lambda: jax.device_put(table0, pinned))
        record, kept, _ = run_provider(name, lambda t=train, f=start: Provider(f(), t), sets,
                                       args, reference)
        reference = kept if name == "device" else reference
        add(record)
    for fraction in args.cache_fraction:
        cache_rows = max(1, min(rows, round(fraction * rows)))
        extra = {"cache_fraction": fraction, "cache_rows": cache_rows}
        caches, stats = None, None
        for name in CACHED:
            if name not in args.providers:
                continue
            make = functools.partial(
                lambda n, c: cached_provider(jax.device_put(table0, pinned), c, args.policy,
                                             args.lr, n == "cached_pipeline", sets[0][0], opts),
                name, cache_rows)
            record, _, seen = run_provider(name, make, sets, args, reference)
            if record["status"] == "ok":
                caches, stats = seen, record
            add(record, **extra)
        if "transfer" in args.providers:
            add(run_floor(table0, ids[1:], caches, stats, args, pinned, on_device, opts),
                **extra)
    if reference is not None:
        reference.delete()
    table0.delete()
    return records


def run_floor(table0, ids, caches, stats, args, pinned, on_device, opts) -> dict:
    """The ``transfer`` provider on the cold rows each warm-up and timed call had."""
    if caches is None:
        return {"provider": "transfer", "status": "error", "us_per_step": None,
                "correct": None, "error": "no cache ran: cached or cached_pipeline must"}
    num_rows = table0.shape[0]
    cold = [cold_rows(i, c, num_rows) for i, c in zip(ids, caches, strict=True)]
    width = max(1, *(r.size for steps in cold for r in steps))  # one shape: one compile
    reads = [padded(steps, num_rows, width) for steps in cold]
    pairs = [(jax.device_put(transfer_rows(r, num_rows), on_device), None) for r in reads]
    train = _jit(transfer_scan, opts)
    # The checked call repeats the first warm-up call's rows.
    record, _, _ = run_provider(
        "transfer", lambda: Provider(jax.device_put(table0, pinned), train),
        [pairs[0], *pairs], args, None, table0=table0)
    timed = reads[args.warmup:]
    record["cold_rows_per_step"] = float(np.mean([(r < num_rows).sum(1) for r in timed]))
    counted = stats.get("cold_rows_per_step")
    if record["status"] == "ok" and not np.isclose(counted, record["cold_rows_per_step"]):
        record.update(status="error", error=f"the floor moved {record['cold_rows_per_step']:g} "
                      f"cold rows a step, the cache counted {counted:g}")
    return record


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
        label = (f"s={s:g}, {report.format_bytes(at[next(iter(at))]['table_bytes'])}, "
                 f"cache {fraction:.0%}")
        cold = next((at[n].get("cold_rows_per_step") for n in CACHED if n in at), None)
        if cold is not None:
            row_bytes = at[next(iter(at))]["table_bytes"] / rows
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
