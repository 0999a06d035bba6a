"""A table in pinned host memory with a device cache of its busiest rows, and a prefetch pipeline.

An embedding table too big for the GPU lives in ``pinned_host`` memory; the rows a
training uses most are kept in a device cache (as FBGEMM's table-batched embeddings
keep theirs in HBM). Everything is a pytree and a pure function, so it goes under
``jit`` and ``lax.scan`` and donates like any carry::

    cache = cached_table.create(table, cache_size, companions=(accumulators,))
    rows, cache = cached_table.lookup(cache, ids)          # (B, D), device memory
    cache = cached_table.add_rows(cache, ids, deltas)       # or set_rows(cache, ids, rows)
    cache = cached_table.refresh(cache)                     # cache the busiest ids
    cache, carry, ys = cached_table.scan(step, cache, carry, ids, xs)   # a pipelined training
    cache = cached_table.flush(cache); cache.table          # the table as a plain array

Ids cached are chosen by :func:`refresh` from what the lookups observed: ``"lfu"`` counts
each id's lookups (the counts halve at every refresh, a window that forgets), ``"lru"``
records the step of its last use. Evicted rows that were written are written back
(``scatter_to_host``) and new ones loaded (``gather_from_host``); :func:`flush` writes
every written row back, before a checkpoint or reading the table. Companion tables (per-row
optimizer state, such as row-wise Adagrad's accumulators) share the ids, slots and dirty
flags of the table.

Ids are row numbers in ``[0, N)``; any other id reads zeros and its updates are dropped
(no wrapping of negative ids). Outside ``jit`` every entry point consumes the cache it is
given (its buffers are donated, as the library's writes consume ``x``): use the one it
returns. A refused call raises before anything runs and consumes nothing.

Rounding: a cached row and a row of the pinned table get the same arithmetic.
:func:`lookup` and :func:`set_rows` are exact. :func:`add_rows` and :func:`scan` sum the
updates of an id that repeats within a batch before adding them once (``jnp``'s
``.at[ids].add`` adds them one after another): with repeated ids a float32 row may differ
from a device table's in the last bits, about ``k * 2**-24 * max|row|`` for ``k``
repeats; without repeats the result is jnp's, bit for bit.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from pallas_pinned import (
    fix_memory_space,
    gather_from_host,
    scatter_add_to_host,
    scatter_to_host,
    sort_indices,
)

__all__ = [
    "POLICIES",
    "CacheStats",
    "CachedTable",
    "Rows",
    "add_rows",
    "create",
    "flush",
    "lookup",
    "refresh",
    "reset_stats",
    "scan",
    "set_rows",
    "stats",
]

POLICIES = ("lfu", "lru")
_INT32_MAX = 2**31 - 1
_DISTINCT = {"indices_are_sorted": True, "unique_indices": True}


class CacheStats(NamedTuple):
    """Counters (int32 scalars, on the device) since :func:`create` or :func:`reset_stats`.

    They wrap past ``2**31 - 1`` (about 500 000 steps of 4096 ids): reset them now and then.
    """

    lookups: jax.Array  #: ids looked up (entries, repeats included; out-of-range ids not)
    hits: jax.Array  #: of those, entries whose row was cached
    misses: jax.Array  #: entries read from the pinned table
    cold_rows: jax.Array  #: distinct rows read from the pinned table (what crossed PCIe)
    evictions: jax.Array  #: rows that left the cache at a refresh
    writebacks: jax.Array  #: of those, written rows written back to the pinned table
    loads: jax.Array  #: rows loaded into the cache by a refresh
    flushed: jax.Array  #: rows written back by flush
    refreshes: jax.Array
    steps: jax.Array  #: lookups and scan steps (LRU's clock)

    @classmethod
    def zeros(cls) -> CacheStats:
        return cls(*(jnp.zeros((), jnp.int32) for _ in cls._fields))


@functools.partial(jax.tree_util.register_dataclass,
                   data_fields=["tables", "rows", "slot_of", "id_of", "dirty", "score",
                                "stats"],
                   meta_fields=["policy"])
@dataclasses.dataclass(frozen=True)
class CachedTable:
    """A pinned table, its companions and their device cache (a pytree; ``policy`` is static).

    Attributes:
      tables: the pinned tables, ``(N, ...)`` each: ``tables[0]`` the table, then companions.
      rows: their cached rows, ``(C, ...)`` each, in device memory; slot ``s`` holds id
        ``id_of[s]``.
      slot_of: ``(N,)`` int32, each id's slot or -1.
      id_of: ``(C,)`` int32, each slot's id or -1 (empty).
      dirty: ``(C,)`` bool, slots written since they were loaded or flushed.
      score: ``(N,)`` int32, the policy's state: lookups counted (``"lfu"``) or the step of
        the last lookup plus one (``"lru"``); 0 for ids not seen.
      stats: :class:`CacheStats`.
      policy: ``"lfu"`` or ``"lru"``.
    """

    tables: tuple[jax.Array, ...]
    rows: tuple[jax.Array, ...]
    slot_of: jax.Array
    id_of: jax.Array
    dirty: jax.Array
    score: jax.Array
    stats: CacheStats
    policy: str = "lfu"

    @property
    def table(self) -> jax.Array:
        """The pinned table. Rows written in the cache reach it at :func:`flush`."""
        return self.tables[0]

    @property
    def companions(self) -> tuple[jax.Array, ...]:
        return self.tables[1:]

    @property
    def num_rows(self) -> int:
        return self.tables[0].shape[0]

    @property
    def cache_size(self) -> int:
        return self.id_of.shape[0]

    def replace(self, **changes) -> CachedTable:
        return dataclasses.replace(self, **changes)


class Rows(NamedTuple):
    """A batch's distinct rows, as :func:`scan` hands them to its step.

    Attributes:
      values: one ``(B, ...)`` array per table (the table's, then each companion's): row
        ``u`` is the value of the ``u``-th distinct id of the batch; rows past the distinct
        ids (``valid`` False) are zeros, and whatever is added to them is dropped.
      inverse: ``(B,)`` int32: entry ``b`` of the batch names row ``inverse[b]``.
      valid: ``(B,)`` bool: the rows that stand for an id in range.
    """

    values: tuple[jax.Array, ...]
    inverse: jax.Array
    valid: jax.Array

    def per_entry(self, table: int = 0) -> jax.Array:
        """Each entry's row of ``tables[table]``: ``values[table][inverse]``, ``(B, ...)``."""
        return self.values[table][self.inverse]


# ---------------------------------------------------------------------------
# Validation: shapes, dtypes and placement are static, so every check runs before anything
# does, under jit too.


def _is_concrete(a: Any) -> bool:
    return isinstance(a, jax.Array) and not isinstance(a, jax.core.Tracer)


def _on_pinned_host(a: Any) -> bool:
    if _is_concrete(a):
        return a.sharding.memory_kind == "pinned_host"
    return getattr(jax.typeof(a), "memory_space", None) == jax.memory.Space.Host


def _check_alive(name: str, a: Any) -> None:
    if _is_concrete(a) and a.is_deleted():
        raise ValueError(f"{name} has been deleted (donated to an earlier call): use the "
                         "cache or array that call returned")


def _check_pinned(name: str, a: Any) -> None:
    if not isinstance(a, jax.Array | jax.core.Tracer):
        raise TypeError(f"{name} must be a jax.Array in pinned_host memory, got "
                        f"{type(a).__name__}; make one with jax.device_put(x, "
                        "jax.memory.Space.Host)")
    _check_alive(name, a)
    if not _on_pinned_host(a):
        where = a.sharding.memory_kind if _is_concrete(a) else "device"
        raise ValueError(f"{name} must live in pinned_host memory, it is in {where!r} memory: "
                         "put it there with jax.device_put(x, jax.memory.Space.Host) (or "
                         "pallas_pinned.fix_memory_space for a restored buffer)")
    if _is_concrete(a) and len(a.sharding.device_set) != 1:
        raise ValueError(f"{name} is spread over {len(a.sharding.device_set)} devices; a "
                         "cached table lives on one: device_put it to one device's "
                         "pinned_host memory")
    if a.ndim < 1:
        raise ValueError(f"{name} must have a row axis (ndim >= 1), got shape {a.shape}")
    if a.dtype == jnp.bool_:
        raise TypeError(f"{name} has dtype bool, which cannot be added to; store it as int8")


def _check_cache(cache: Any, where: str) -> None:
    if not isinstance(cache, CachedTable):
        raise TypeError(f"{where} takes the CachedTable made by cached_table.create, got "
                        f"{type(cache).__name__}")
    if cache.policy not in POLICIES:
        raise ValueError(f"policy must be one of {POLICIES}, got {cache.policy!r}")
    n, c = cache.num_rows, cache.cache_size
    for k, (t, r) in enumerate(zip(cache.tables, cache.rows, strict=True)):
        name = "table" if k == 0 else f"companion {k - 1}"
        _check_pinned(name, t)
        _check_alive(f"the cached rows of {name}", r)
        if t.shape[0] != n or r.shape != (c, *t.shape[1:]) or r.dtype != t.dtype:
            raise ValueError(f"the cache of {name} {r.shape} {r.dtype} does not fit its table "
                             f"{t.shape} {t.dtype}: make caches with cached_table.create")
    for name, a, shape, dtype in (("slot_of", cache.slot_of, (n,), jnp.int32),
                                  ("id_of", cache.id_of, (c,), jnp.int32),
                                  ("dirty", cache.dirty, (c,), jnp.bool_),
                                  ("score", cache.score, (n,), jnp.int32)):
        _check_alive(name, a)
        if a.shape != shape or a.dtype != dtype:
            raise ValueError(f"the cache's {name} is {a.shape} {a.dtype}, expected {shape} "
                             f"{np.dtype(dtype)}: make caches with cached_table.create")


def _check_ids(ids: Any, ndim: int, where: str, cache: CachedTable) -> jax.Array:
    if isinstance(ids, list | tuple):
        ids = np.asarray(ids)
    if not hasattr(ids, "dtype") or not hasattr(ids, "shape"):
        raise TypeError(f"{where}: ids must be an integer array, got {type(ids).__name__}")
    _check_alive("ids", ids)
    if not jnp.issubdtype(ids.dtype, jnp.integer):
        raise TypeError(f"{where}: ids must be integers, got dtype {ids.dtype}; convert with "
                        "ids.astype(jnp.int32)")
    if ids.ndim != ndim:
        what = "(batch,)" if ndim == 1 else "(steps, batch)"
        raise ValueError(f"{where}: ids must be {what}, got shape {ids.shape}; reshape "
                         f"them to {what}")
    if ids.shape[-1] < 1:
        raise ValueError(f"{where}: a batch needs at least one id, got shape {ids.shape}")
    if cache.num_rows + cache.cache_size + 2 * ids.shape[-1] + 1 > _INT32_MAX:
        raise ValueError(f"{where}: a table of {cache.num_rows} rows with a cache of "
                         f"{cache.cache_size} and batches of {ids.shape[-1]} ids numbers its "
                         "keys past int32; use smaller batches or a smaller cache")
    if isinstance(ids, np.ndarray) and ids.dtype.itemsize > 4:
        # Saturate, so that a value past int32 stays out of range instead of wrapping onto
        # a row.
        ids = np.clip(ids, -1, _INT32_MAX)
    return jnp.asarray(ids).astype(jnp.int32)


def _check_updates(updates: Any, cache: CachedTable, batch: int, where: str,
                   what: str) -> tuple:
    """``updates`` as one entry per table (None: that table unchanged), shapes and dtypes
    checked."""
    if not isinstance(updates, tuple | list):
        updates = (updates,) + (None,) * (len(cache.tables) - 1)
    if len(updates) != len(cache.tables):
        raise ValueError(f"{where}: {what} has {len(updates)} entries, one per table is "
                         f"needed ({len(cache.tables)}: the table, then each companion; None "
                         "leaves one unchanged)")
    out = []
    for k, (u, t) in enumerate(zip(updates, cache.tables, strict=True)):
        if u is None:
            out.append(None)
            continue
        name = "table" if k == 0 else f"companion {k - 1}"
        if not hasattr(u, "dtype"):
            u = jnp.asarray(u)
        _check_alive(f"the {what} of {name}", u)
        want = (batch, *t.shape[1:])
        if tuple(u.shape) != want:
            raise ValueError(f"{where}: the {what} of {name} must be {want} (one row per "
                             f"entry), got {tuple(u.shape)}")
        if not jnp.can_cast(u.dtype, t.dtype, casting="same_kind"):
            raise TypeError(f"{where}: the {what} of {name} are {u.dtype}, which does not "
                            f"cast to the table's {t.dtype}; convert them with "
                            f".astype({t.dtype})")
        out.append(u)
    return tuple(out)


# ---------------------------------------------------------------------------
# Creating, reading, writing


def create(table: jax.Array, cache_size: int, *, companions: tuple | list = (),
           policy: str = "lfu") -> CachedTable:
    """An empty device cache of ``cache_size`` rows over ``table`` (and its companions).

    Args:
      table: ``(N, ...)`` in ``pinned_host`` memory, on one device.
      cache_size: rows cached, ``1 <= cache_size <= N``.
      companions: per-row state sharing the table's ids and slots (e.g. row-wise Adagrad
        accumulators, ``(N,)`` or ``(N, 1)``), each in ``pinned_host`` memory with ``N``
        rows, on the table's device.
      policy: ``"lfu"`` or ``"lru"`` (static): how :func:`refresh` chooses the ids.

    The cache starts empty (every lookup a miss): :func:`refresh` fills it from what the
    lookups observed. Device memory: the cached rows, and two int32 arrays as long as the
    table (the slot map and the policy's score). The tables are not copied.
    """
    if policy not in POLICIES:
        raise ValueError(f"policy must be one of {POLICIES}, got {policy!r}")
    tables = (table, *companions)
    for k, t in enumerate(tables):
        _check_pinned("table" if k == 0 else f"companion {k - 1}", t)
    n = table.shape[0]
    if isinstance(cache_size, bool) or not isinstance(cache_size, int | np.integer):
        raise TypeError(f"cache_size must be an int, got {type(cache_size).__name__}")
    if not 1 <= cache_size <= n:
        raise ValueError(f"cache_size must be between 1 and the table's {n} rows, got "
                         f"{cache_size}; cache fewer rows (or keep the table on the device)")
    if n + cache_size + 3 > _INT32_MAX:
        raise ValueError(f"a table of {n} rows with a cache of {cache_size} numbers its keys "
                         "past int32; use a smaller cache")
    for k, t in enumerate(tables[1:]):
        if t.shape[0] != n:
            raise ValueError(f"companion {k} has {t.shape[0]} rows, the table {n}: a companion "
                             "holds one row per id of the table")
        if _is_concrete(t) and _is_concrete(table) and t.sharding.device_set != \
                table.sharding.device_set:
            raise ValueError(f"companion {k} is on {t.sharding.device_set}, the table on "
                             f"{table.sharding.device_set}: put them on one device")
    tables = tuple(fix_memory_space(t) if _is_concrete(t) else t for t in tables)
    # The state is made beside the tables, which are not passed through a jit (no copy).
    c = int(cache_size)
    state = (
        tuple(jnp.zeros((c, *t.shape[1:]), t.dtype) for t in tables),
        jnp.full((n,), -1, jnp.int32), jnp.full((c,), -1, jnp.int32),
        jnp.zeros((c,), jnp.bool_), jnp.zeros((n,), jnp.int32), CacheStats.zeros())
    if _is_concrete(table):
        device = jax.sharding.make_single_device_sharding(next(iter(table.sharding.device_set)))
        state = jax.device_put(state, device)
    rows, slot_of, id_of, dirty, score, counters = state
    return CachedTable(tables=tables, rows=rows, slot_of=slot_of, id_of=id_of, dirty=dirty,
                       score=score, stats=counters, policy=policy)


class _Plan(NamedTuple):
    """A batch's distinct ids, ordered as keys: a cold id's key is the id, a cached id's is
    ``N + slot``, an id out of range ``N + C``, and the padding past the distinct ids
    ``N + C + 1 + position``; so the keys ascend, are distinct, and only the cold ones are
    rows of the pinned table."""

    ids: jax.Array  # (B,) the batch, for the policy
    keys: jax.Array  # (B,) ascending, distinct
    inverse: jax.Array  # (B,) entry -> its key's position


def _plan(cache: CachedTable, ids: jax.Array) -> _Plan:
    n, c, b = cache.num_rows, cache.cache_size, ids.shape[0]
    valid = (ids >= 0) & (ids < n)
    slot = cache.slot_of[jnp.clip(ids, 0, n - 1)]
    key = jnp.where(valid, jnp.where(slot >= 0, n + slot, ids), n + c)
    ordered, order = sort_indices(key, n + c + 1, mode="promise_in_bounds")
    ordered = ordered.astype(jnp.int32)
    start = jnp.concatenate([jnp.ones((1,), bool), ordered[1:] != ordered[:-1]])
    run = jnp.cumsum(start, dtype=jnp.int32) - 1
    inverse = jnp.zeros((b,), jnp.int32).at[order].set(run, unique_indices=True)
    pad = n + c + 1 + jnp.arange(b, dtype=jnp.int32)
    keys = pad.at[jnp.where(start, run, b)].set(ordered, mode="drop", unique_indices=True)
    return _Plan(ids, keys, inverse)


def _slots(cache: CachedTable, keys: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Whether each key is a cached row, and its slot (``C + position`` where not: out of
    range and distinct, so writes to them are dropped)."""
    n, c = cache.num_rows, cache.cache_size
    hit = (keys >= n) & (keys < n + c)
    return hit, jnp.where(hit, keys - n, c + jnp.arange(keys.shape[0], dtype=jnp.int32))


def _read_cold(tables: tuple, keys: jax.Array) -> tuple:
    """The cold rows of the keys from the pinned tables (zeros for every other key)."""
    return tuple(gather_from_host(t, keys, mode="fill", fill_value=0, **_DISTINCT)
                 for t in tables)


def _expand(mask: jax.Array, like: jax.Array) -> jax.Array:
    return mask.reshape(mask.shape + (1,) * (like.ndim - 1))


def _assemble(cache: CachedTable, keys: jax.Array, cold: tuple) -> tuple:
    """Each key's row of each table: cached, read cold, or zeros."""
    hit, slot = _slots(cache, keys)
    safe = jnp.minimum(slot, cache.cache_size - 1)
    return tuple(jnp.where(_expand(hit, r), r[safe], v) for r, v in zip(cache.rows, cold,
                                                                        strict=True))


def _observe(cache: CachedTable, plan: _Plan) -> CachedTable:
    """The policy's score and the counters after a batch's lookup."""
    n = cache.num_rows
    ids = plan.ids
    valid = (ids >= 0) & (ids < n)
    seen = jnp.where(valid, ids, n)
    s = cache.stats
    if cache.policy == "lfu":
        score = cache.score.at[seen].add(1, mode="drop")
    else:
        score = cache.score.at[seen].set(s.steps + 1, mode="drop")
    hit, _ = _slots(cache, plan.keys)
    entry_hit = hit[plan.inverse] & valid
    looked = jnp.sum(valid, dtype=jnp.int32)
    hits = jnp.sum(entry_hit, dtype=jnp.int32)
    stats = s._replace(lookups=s.lookups + looked, hits=s.hits + hits,
                       misses=s.misses + looked - hits,
                       cold_rows=s.cold_rows + jnp.sum(plan.keys < n, dtype=jnp.int32),
                       steps=s.steps + 1)
    return cache.replace(score=score, stats=stats)


def _write(cache: CachedTable, keys: jax.Array, new: tuple) -> CachedTable:
    """Sets the keys' rows to ``new`` (None: unchanged): cached ones in the cache (marked
    dirty), cold ones in the pinned tables."""
    _, slot = _slots(cache, keys)
    rows, tables = list(cache.rows), list(cache.tables)
    for k, v in enumerate(new):
        if v is None:
            continue
        rows[k] = rows[k].at[slot].set(v, mode="drop", unique_indices=True)
        tables[k] = scatter_to_host(tables[k], keys, v, mode="drop", **_DISTINCT)
    dirty = cache.dirty
    if any(v is not None for v in new):
        dirty = dirty.at[slot].set(True, mode="drop", unique_indices=True)
    return cache.replace(rows=tuple(rows), tables=tuple(tables), dirty=dirty)


def lookup(cache: CachedTable, ids: Any, *, companions: bool = False):
    """``(rows, cache)``: the rows of ``ids`` (``table[ids]``, ``(B, ...)``, device memory).

    Cached ids read the cache, the others ``gather_from_host`` (each distinct row once).
    The returned cache has counted the lookup (policy score and :class:`CacheStats`).
    With ``companions=True`` ``rows`` is a tuple: the table's rows, then each companion's.
    ``ids``: 1-D integers; ids outside ``[0, N)`` read zeros.
    """
    _check_cache(cache, "lookup")
    ids = _check_ids(ids, 1, "lookup", cache)
    return _lookup(cache, ids, bool(companions))


@functools.partial(jax.jit, static_argnums=2, donate_argnums=0)
def _lookup(cache: CachedTable, ids: jax.Array, companions: bool):
    plan = _plan(cache, ids)
    values = _assemble(cache, plan.keys, _read_cold(cache.tables, plan.keys))
    rows = tuple(v[plan.inverse] for v in values)
    return (rows if companions else rows[0]), _observe(cache, plan)


def add_rows(cache: CachedTable, ids: Any, deltas: Any) -> CachedTable:
    """``table.at[ids].add(deltas)``: cached rows on the device (marked dirty), the others by
    ``scatter_add_to_host`` straight into the pinned table.

    ``deltas``: ``(B, ...)`` for the table, or a tuple with one entry per table (the table,
    then each companion; None leaves one unchanged). A cached row takes XLA's scatter-add
    (jnp's), a pinned one the library's, which sums the updates of an id that repeats
    first (module doc: rounding). Ids outside ``[0, N)`` are dropped. Lookups are
    counted by :func:`lookup`, not here.
    """
    _check_cache(cache, "add_rows")
    ids = _check_ids(ids, 1, "add_rows", cache)
    deltas = _check_updates(deltas, cache, ids.shape[0], "add_rows", "deltas")
    return _add_rows(cache, ids, deltas)


def _split_hits(cache: CachedTable, ids: jax.Array):
    """Each entry's slot (``C + entry`` where not cached) and cold id (``N + entry`` where
    cached or out of range): both out of range where they do not apply, and distinct."""
    n, c, b = cache.num_rows, cache.cache_size, ids.shape[0]
    entry = jnp.arange(b, dtype=jnp.int32)
    valid = (ids >= 0) & (ids < n)
    slot = cache.slot_of[jnp.clip(ids, 0, n - 1)]
    hit = valid & (slot >= 0)
    return hit, entry, jnp.where(hit, slot, c + entry), jnp.where(hit | ~valid, n + entry, ids)


@functools.partial(jax.jit, donate_argnums=0)
def _add_rows(cache: CachedTable, ids: jax.Array, deltas: tuple) -> CachedTable:
    hit, _, slot, cold = _split_hits(cache, ids)
    rows, tables = list(cache.rows), list(cache.tables)
    for k, d in enumerate(deltas):
        if d is None:
            continue
        d = d.astype(tables[k].dtype)
        rows[k] = rows[k].at[slot].add(d, mode="drop")
        tables[k] = scatter_add_to_host(tables[k], cold, d, mode="drop")
    dirty = cache.dirty
    if any(d is not None for d in deltas):
        dirty = dirty.at[slot].set(True, mode="drop")
    return cache.replace(rows=tuple(rows), tables=tuple(tables), dirty=dirty)


def set_rows(cache: CachedTable, ids: Any, values: Any) -> CachedTable:
    """``table.at[ids].set(values)``: the last entry of an id that repeats wins (as
    ``scatter_to_host``). Cached rows are set on the device and marked dirty, the others
    straight in the pinned table. ``values`` as :func:`add_rows`'s ``deltas``."""
    _check_cache(cache, "set_rows")
    ids = _check_ids(ids, 1, "set_rows", cache)
    values = _check_updates(values, cache, ids.shape[0], "set_rows", "values")
    return _set_rows(cache, ids, values)


@functools.partial(jax.jit, donate_argnums=0)
def _set_rows(cache: CachedTable, ids: jax.Array, values: tuple) -> CachedTable:
    c = cache.cache_size
    hit, entry, slot, cold = _split_hits(cache, ids)
    # The last entry of each cached slot wins: it alone writes.
    last = jnp.full((c,), -1, jnp.int32).at[slot].max(entry, mode="drop")
    wins = hit & (last[jnp.minimum(slot, c - 1)] == entry)
    slot = jnp.where(wins, slot, c + entry)
    rows, tables = list(cache.rows), list(cache.tables)
    for k, v in enumerate(values):
        if v is None:
            continue
        v = v.astype(tables[k].dtype)
        rows[k] = rows[k].at[slot].set(v, mode="drop", unique_indices=True)
        tables[k] = scatter_to_host(tables[k], cold, v, mode="drop")
    dirty = cache.dirty
    if any(v is not None for v in values):
        dirty = dirty.at[slot].set(True, mode="drop", unique_indices=True)
    return cache.replace(rows=tuple(rows), tables=tuple(tables), dirty=dirty)


# ---------------------------------------------------------------------------
# Refresh and flush


def _compact(mask: jax.Array, width: int, pad_from: int) -> tuple[jax.Array, jax.Array]:
    """The positions where ``mask`` holds, ascending, in ``width`` places, then
    ``pad_from + place`` (ascending and distinct); and how many there are (at most
    ``width`` are kept)."""
    place = jnp.cumsum(mask, dtype=jnp.int32) - 1
    out = pad_from + jnp.arange(width, dtype=jnp.int32)
    out = out.at[jnp.where(mask, place, width)].set(
        jnp.arange(mask.shape[0], dtype=jnp.int32), mode="drop", unique_indices=True)
    return out, jnp.minimum(jnp.sum(mask, dtype=jnp.int32), width)


def _choose(key: jax.Array, count: int) -> jax.Array:
    """The ``min(count, #(key > 0))`` ids of highest ``key``, ties to the smaller id, as a
    mask. A binary search for the threshold (one reduction over the ids per bit of the
    largest key) instead of sorting the whole table."""
    m = jnp.minimum(jnp.sum(key > 0, dtype=jnp.int32), count)

    def narrow(bounds):
        lo, hi = bounds
        mid = lo + (hi - lo) // 2
        enough = jnp.sum(key >= mid, dtype=jnp.int32) >= m
        return jnp.where(enough, mid, lo), jnp.where(enough, hi, mid)

    # Invariant: at least m keys reach lo, fewer than m reach hi (for m > 0).
    lo, _ = lax.while_loop(lambda b: b[1] - b[0] > 1, narrow,
                           (jnp.int32(1), jnp.max(key).astype(jnp.int32) + 1))
    above = key > lo
    tied = key == lo
    need = m - jnp.sum(above, dtype=jnp.int32)
    return above | (tied & (jnp.cumsum(tied, dtype=jnp.int32) <= need))


def refresh(cache: CachedTable) -> CachedTable:
    """Caches the ids the policy ranks highest among those seen (or cached).

    ``"lfu"``: the most looked-up since the counts last halved; ``"lru"``: the most recently
    looked-up. Ties keep the ids already cached, then take the smaller id. Ids that leave
    free their slots; those that were written are written back first (``scatter_to_host``);
    entering ids are read in (``gather_from_host``); ids that stay keep their slot. LFU's
    counts halve afterwards. Cost: a few passes over the ``(N,)`` arrays, plus the rows
    that move.
    """
    _check_cache(cache, "refresh")
    return _refresh(cache)


@functools.partial(jax.jit, donate_argnums=0)
def _refresh(cache: CachedTable) -> CachedTable:
    n, c = cache.num_rows, cache.cache_size
    cached = cache.slot_of >= 0
    # The score ranks; the low bit keeps cached ids on ties (no churn for nothing).
    key = jnp.minimum(cache.score, 2**29) * 2 + cached
    member = _choose(key, c)
    has_id = cache.id_of >= 0
    safe_id = jnp.maximum(cache.id_of, 0)
    leaves = has_id & ~member[safe_id]
    free = ~has_id | leaves
    # Written rows that leave, written back in ascending id order.
    slot_safe = jnp.maximum(cache.slot_of, 0)
    back_mask = cached & ~member & cache.dirty[slot_safe]
    back, _ = _compact(back_mask, c, n)
    back_slot = jnp.minimum(cache.slot_of[jnp.minimum(back, n - 1)], c - 1)
    tables = tuple(scatter_to_host(t, back, r[back_slot], mode="drop", **_DISTINCT)
                   for t, r in zip(cache.tables, cache.rows, strict=True))
    entering, n_in = _compact(member & ~cached, c, n)
    loaded = _read_cold(tables, entering)
    free_slots, _ = _compact(free, c, c)
    place = jnp.arange(c, dtype=jnp.int32)
    target = jnp.where(place < n_in, free_slots, c + place)
    rows = tuple(r.at[target].set(v, mode="drop", unique_indices=True)
                 for r, v in zip(cache.rows, loaded, strict=True))
    id_of = jnp.where(leaves, -1, cache.id_of).at[target].set(entering, mode="drop",
                                                               unique_indices=True)
    slot_of = cache.slot_of.at[jnp.where(leaves, cache.id_of, n)].set(
        -1, mode="drop", unique_indices=True)
    slot_of = slot_of.at[entering].set(target, mode="drop", unique_indices=True)
    score = cache.score // 2 if cache.policy == "lfu" else cache.score
    s = cache.stats
    stats = s._replace(evictions=s.evictions + jnp.sum(leaves, dtype=jnp.int32),
                       writebacks=s.writebacks + jnp.sum(back_mask, dtype=jnp.int32),
                       loads=s.loads + n_in, refreshes=s.refreshes + 1)
    return cache.replace(tables=tables, rows=rows, id_of=id_of, slot_of=slot_of,
                         dirty=cache.dirty & ~free, score=score, stats=stats)


def flush(cache: CachedTable) -> CachedTable:
    """Writes every dirty cached row back to the pinned tables (``scatter_to_host``); the
    cache keeps its rows, now clean. Afterwards ``cache.tables`` hold every update: flush
    before a checkpoint (save ``cache.tables``) or before reading ``cache.table``."""
    _check_cache(cache, "flush")
    return _flush(cache)


@functools.partial(jax.jit, donate_argnums=0)
def _flush(cache: CachedTable) -> CachedTable:
    n, c = cache.num_rows, cache.cache_size
    slot_safe = jnp.maximum(cache.slot_of, 0)
    ids, count = _compact((cache.slot_of >= 0) & cache.dirty[slot_safe], c, n)
    slot = jnp.minimum(cache.slot_of[jnp.minimum(ids, n - 1)], c - 1)
    tables = tuple(scatter_to_host(t, ids, r[slot], mode="drop", **_DISTINCT)
                   for t, r in zip(cache.tables, cache.rows, strict=True))
    stats = cache.stats._replace(flushed=cache.stats.flushed + count)
    return cache.replace(tables=tables, dirty=jnp.zeros_like(cache.dirty), stats=stats)


def stats(cache: CachedTable) -> dict:
    """The counters as Python ints, with ``hit_rate`` (hits over lookups)."""
    out = {k: int(v) for k, v in cache.stats._asdict().items()}
    out["hit_rate"] = out["hits"] / out["lookups"] if out["lookups"] else 0.0
    return out


def reset_stats(cache: CachedTable) -> CachedTable:
    """The cache with its counters at zero, but ``steps``: LRU's clock keeps running."""
    _check_cache(cache, "reset_stats")
    return cache.replace(stats=CacheStats.zeros()._replace(steps=cache.stats.steps))


# ---------------------------------------------------------------------------
# The pipelined training scan


def scan(step: Callable, cache: CachedTable, carry: Any, ids: Any, xs: Any = None, *,
         prefetch: bool = True, _patch_staged: bool = True):
    """``(cache, carry, ys)``: ``step`` over ``ids.shape[0]`` batches in one ``lax.scan``.

    ``step(carry, rows, x) -> (carry, deltas, y)``: ``rows`` is a :class:`Rows`, the
    batch's distinct rows; ``deltas`` is added to them (``(B, ...)``, rows as ``rows.values``:
    one array for the table, or a tuple with one entry per table, None for unchanged). The
    new rows are written where they live: cached ones in the cache (dirty), the others set
    in the pinned tables (``scatter_to_host``, each distinct row once). ``x`` and ``y`` as in
    ``lax.scan`` (``x`` None when ``xs`` is None).

    With ``prefetch`` (the default) the next batch's cold rows are read from the pinned
    tables (``gather_from_host``) while this batch computes: the read does not depend on
    this step's compute, only on the ids and the cache's slots (which a scan never
    changes), and it is ordered before this step's write-back. Rows this step writes that
    the next batch also reads cold are then patched with this step's new values, on the
    device, so no update is lost. ``_patch_staged=False`` turns that off (for the test
    that shows the hazard only). Without ``prefetch`` each step reads its own rows first.

    The cached ids do not change within a scan: refresh between scans (e.g. a scan of a
    refresh interval's steps, then :func:`refresh`). Lookups are counted as by
    :func:`lookup`. Every batch is ``ids.shape[1]`` ids.
    """
    _check_cache(cache, "scan")
    if not callable(step):
        raise TypeError(f"scan: step must be callable, got {type(step).__name__}")
    ids = _check_ids(ids, 2, "scan", cache)
    if ids.shape[0] < 1:
        raise ValueError("scan: ids must hold at least one batch, got shape "
                         f"{tuple(ids.shape)}")
    return _scan(step, cache, carry, ids, xs, bool(prefetch), bool(_patch_staged))


def _apply(step: Callable, cache: CachedTable, carry: Any, plan: _Plan, cold: tuple,
           x: Any):
    """One step on its planned batch: assemble, compute, write. Also the new rows."""
    values = _assemble(cache, plan.keys, cold)
    valid = plan.keys < cache.num_rows + cache.cache_size
    carry, deltas, y = step(carry, Rows(values, plan.inverse, valid), x)
    deltas = _check_updates(deltas, cache, plan.keys.shape[0], "scan's step", "deltas")
    new = tuple(None if d is None else (v + d.astype(v.dtype)).astype(v.dtype)
                for v, d in zip(values, deltas, strict=True))
    cache = _write(_observe(cache, plan), plan.keys, new)
    return cache, carry, y, tuple(v if n is None else n for v, n in zip(values, new,
                                                                         strict=True))


def _patch(keys: jax.Array, new: tuple, next_keys: jax.Array, staged: tuple,
           num_rows: int) -> tuple:
    """The staged cold rows of ``next_keys``, with this step's values where it wrote them
    (both key lists ascend)."""
    pos = jnp.minimum(jnp.searchsorted(keys, next_keys), keys.shape[0] - 1)
    same = (keys[pos] == next_keys) & (next_keys < num_rows)
    return tuple(jnp.where(_expand(same, s), v[pos], s) for v, s in zip(new, staged,
                                                                        strict=True))


@functools.partial(jax.jit, static_argnums=(0, 5, 6), donate_argnums=(1,))
def _scan(step, cache, carry, ids, xs, prefetch: bool, patch: bool):
    if not prefetch:
        def body(state, inp):
            cache, carry = state
            batch, x = inp
            plan = _plan(cache, batch)
            cache, carry, y, _ = _apply(step, cache, carry, plan,
                                        _read_cold(cache.tables, plan.keys), x)
            return (cache, carry), y

        (cache, carry), ys = lax.scan(body, (cache, carry), (ids, xs))
        return cache, carry, ys

    n = cache.num_rows
    first = _plan(cache, ids[0])
    staged = _read_cold(cache.tables, first.keys)
    upcoming = jnp.concatenate([ids[1:], ids[-1:]])  # the last step's prefetch goes unused

    def body(state, inp):
        cache, carry, plan, cold = state
        batch_next, x = inp
        plan_next = _plan(cache, batch_next)
        staged = _read_cold(cache.tables, plan_next.keys)
        # The next batch's read happens before this step writes the pinned tables: it does
        # not wait for this step's compute, and the write does not copy the tables to keep
        # the old rows alive for it.
        staged, tables = lax.optimization_barrier((staged, cache.tables))
        cache = cache.replace(tables=tables)
        cache, carry, y, new = _apply(step, cache, carry, plan, cold, x)
        if patch:
            staged = _patch(plan.keys, new, plan_next.keys, staged, n)
        return (cache, carry, plan_next, staged), y

    (cache, carry, _, _), ys = lax.scan(body, (cache, carry, first, staged), (upcoming, xs))
    return cache, carry, ys
