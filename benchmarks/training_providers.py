"""The providers of ``python -m benchmarks.training`` (its docstring says what each one is):
their jitted scans of SGD steps, the transfer floor's rows and its numpy replay, and one
provider's run: the checked call, then the warm-up and timed calls."""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import pallas_pinned as pp
from benchmarks import timing
from pallas_pinned import cached_table as ct

_DISTINCT = {"unique_indices": True, "indices_are_sorted": True}


def single_device(kind: str) -> jax.sharding.Sharding:
    """The first device, in memory of ``kind`` (``"device"`` or ``"pinned_host"``)."""
    return jax.sharding.make_single_device_sharding(jax.devices()[0], memory_kind=kind)


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


def table_provider(name: str, table0, lr: float, options: tuple) -> Provider:
    """``device`` (a copy of ``table0``) or ``uncached`` (``table0`` in pinned memory)."""
    table = jnp.copy(table0) if name == "device" else jax.device_put(
        table0, single_device("pinned_host"))
    return Provider(table, _jit(_sgd_scan(*READ_ADD[name], lr), options))


@functools.cache
def cached_train(prefetch: bool) -> Callable:
    """``(cache, ids, targets) -> cache``: the scan through ``pallas_pinned.cached_table``;
    the step hands back each entry's gradient, the table's SGD applies them."""

    def step(carry, rows, targets):
        return carry, ct.Grads(jax.grad(_loss)(rows.per_entry(), targets)), None

    def train(cache, ids, targets):
        return ct.scan(step, cache, jnp.int32(0), ids, targets, prefetch=prefetch)[0]

    return train


def cached_provider(table0, cache_rows: int, policy: str, lr: float, prefetch: bool,
                    prime_ids, options: tuple) -> Provider:
    """Everything else the benchmark does with ``pallas_pinned.cached_table``, on ``table0``
    in pinned memory.

    The cache starts with the busiest ids of ``prime_ids`` (looked up, then a refresh:
    nothing written yet)."""

    def flushed(cache):
        cache = ct.flush(cache)
        return cache, cache.table

    table = jax.device_put(table0, single_device("pinned_host"))
    cache = ct.create(table, cache_rows, optimizer=ct.sgd(lr), policy=policy)
    _, cache = ct.lookup(cache, jnp.ravel(prime_ids))
    cache = ct.reset_stats(ct.refresh(cache))
    return Provider(cache, _jit(cached_train(prefetch), options),
                    refresh=_jit(ct.refresh, options), checked=flushed,
                    cached_ids=lambda c: np.asarray(c.id_of),
                    stats=lambda c: ct.stats(c)._asdict(), reset=ct.reset_stats)


# ---------------------------------------------------------------------------
# The transfer floor


def transfer_scan(table, rows, targets):
    """The floor: step ``s`` reads the rows ``rows[s, 0]`` and writes them to ``rows[s, 1]``
    (:func:`transfer_rows`), straight from the gather into the scatter. ``targets`` unused."""
    del targets

    def step(table, pair):
        values = pp.gather_from_host(table, pair[0], mode="fill", fill_value=0, **_DISTINCT)
        return pp.scatter_to_host(table, pair[1], values, mode="drop", **_DISTINCT), None

    return lax.scan(step, table, rows)[0]


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


def run_floor(table0, ids, caches, cached_record: dict, args, options: tuple) -> dict:
    """The ``transfer`` provider on the cold rows each warm-up and timed call had
    (``caches``: the ids cached before each; ``cached_record``: that cached run's record)."""
    if caches is None:
        return {"provider": "transfer", "status": "error", "us_per_step": None,
                "correct": None, "error": "no cache ran: cached or cached_pipeline must"}
    num_rows = table0.shape[0]
    cold = [cold_rows(i, c, num_rows) for i, c in zip(ids, caches, strict=True)]
    width = max(1, *(r.size for steps in cold for r in steps))  # one shape: one compile
    reads = [padded(steps, num_rows, width) for steps in cold]
    on_device = single_device("device")
    pairs = [(jax.device_put(transfer_rows(r, num_rows), on_device), None) for r in reads]
    train = _jit(transfer_scan, options)
    pinned = single_device("pinned_host")
    # The checked call repeats the first warm-up call's rows.
    record, _, _ = run_provider(
        "transfer", lambda: Provider(jax.device_put(table0, pinned), train),
        [pairs[0], *pairs], args, None, table0=table0)
    timed = reads[args.warmup:]
    record["cold_rows_per_step"] = float(np.mean([(r < num_rows).sum(1) for r in timed]))
    counted = cached_record.get("cold_rows_per_step")
    if record["status"] == "ok" and not np.isclose(counted, record["cold_rows_per_step"]):
        record.update(status="error", error=f"the floor moved {record['cold_rows_per_step']:g} "
                      f"cold rows a step, the cache counted {counted:g}")
    return record


# ---------------------------------------------------------------------------
# One provider


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
