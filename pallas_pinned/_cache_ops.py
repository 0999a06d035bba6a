"""The cached table's plain ops: :func:`create`, :func:`lookup`, :func:`add_rows`,
:func:`set_rows`, :func:`stats`, :func:`reset_stats`; and the batch plan, reads and writes
that :mod:`pallas_pinned._cache_pipeline` builds on."""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from pallas_pinned._cache_state import (
    INT32_MAX,
    CachedTable,
    CacheStats,
    check_cache,
    check_ids,
    check_pinned,
    check_policy,
    check_updates,
    is_concrete,
    table_name,
)
from pallas_pinned._placement import fix_memory_space
from pallas_pinned.gather import gather_from_host
from pallas_pinned.order import sort_indices
from pallas_pinned.scatter import scatter_to_host
from pallas_pinned.scatter_add import scatter_add_to_host

DISTINCT = {"indices_are_sorted": True, "unique_indices": True}


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
    check_policy(policy)
    tables = (table, *companions)
    for k, t in enumerate(tables):
        check_pinned(table_name(k), t)
    n = table.shape[0]
    if isinstance(cache_size, bool) or not isinstance(cache_size, int | np.integer):
        raise TypeError(f"cache_size must be an int, got {type(cache_size).__name__}")
    if not 1 <= cache_size <= n:
        raise ValueError(f"cache_size must be between 1 and the table's {n} rows, got "
                         f"{cache_size}; cache fewer rows (or keep the table on the device)")
    if n + cache_size + 3 > INT32_MAX:
        raise ValueError(f"a table of {n} rows with a cache of {cache_size} numbers its keys "
                         "past int32; use a smaller cache")
    for k, t in enumerate(companions):
        if t.shape[0] != n:
            raise ValueError(f"companion {k} has {t.shape[0]} rows, the table {n}: a companion "
                             "holds one row per id of the table")
        if is_concrete(t) and is_concrete(table) and t.sharding.device_set != \
                table.sharding.device_set:
            raise ValueError(f"companion {k} is on {t.sharding.device_set}, the table on "
                             f"{table.sharding.device_set}: put them on one device")
    tables = tuple(fix_memory_space(t) if is_concrete(t) else t for t in tables)
    # The state is made beside the tables, which are not passed through a jit (no copy).
    c = int(cache_size)
    state = (
        tuple(jnp.zeros((c, *t.shape[1:]), t.dtype) for t in tables),
        jnp.full((n,), -1, jnp.int32), jnp.full((c,), -1, jnp.int32),
        jnp.zeros((c,), jnp.bool_), jnp.zeros((n,), jnp.int32), CacheStats.zeros())
    if is_concrete(table):
        device = jax.sharding.make_single_device_sharding(next(iter(table.sharding.device_set)))
        state = jax.device_put(state, device)
    rows, slot_of, id_of, dirty, score, counters = state
    return CachedTable(tables=tables, rows=rows, slot_of=slot_of, id_of=id_of, dirty=dirty,
                       score=score, stats=counters, policy=policy)


def stats(cache: CachedTable) -> dict:
    """The counters as Python ints, with ``hit_rate`` (hits over lookups)."""
    out = {k: int(v) for k, v in cache.stats._asdict().items()}
    out["hit_rate"] = out["hits"] / out["lookups"] if out["lookups"] else 0.0
    return out


def reset_stats(cache: CachedTable) -> CachedTable:
    """The cache with its counters at zero, but ``steps``: LRU's clock keeps running."""
    check_cache(cache, "reset_stats")
    return cache.replace(stats=CacheStats.zeros()._replace(steps=cache.stats.steps))


# ---------------------------------------------------------------------------
# A batch's plan, reads and writes


class Plan(NamedTuple):
    """A batch's distinct ids, ordered as keys: a cold id's key is the id, a cached id's is
    ``N + slot``, an id out of range ``N + C``, and the padding past the distinct ids
    ``N + C + 1 + position``; so the keys ascend, are distinct, and only the cold ones are
    rows of the pinned table."""

    ids: jax.Array  # (B,) the batch, for the policy
    keys: jax.Array  # (B,) ascending, distinct
    inverse: jax.Array  # (B,) entry -> its key's position


def _locate(cache: CachedTable, ids: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Whether each id is in range, and its slot (-1 where it is not cached)."""
    n = cache.num_rows
    return (ids >= 0) & (ids < n), cache.slot_of[jnp.clip(ids, 0, n - 1)]


def plan(cache: CachedTable, ids: jax.Array) -> Plan:
    n, c, b = cache.num_rows, cache.cache_size, ids.shape[0]
    valid, slot = _locate(cache, ids)
    key = jnp.where(valid, jnp.where(slot >= 0, n + slot, ids), n + c)
    ordered, order = sort_indices(key, n + c + 1, mode="promise_in_bounds")
    ordered = ordered.astype(jnp.int32)
    start = jnp.concatenate([jnp.ones((1,), bool), ordered[1:] != ordered[:-1]])
    run = jnp.cumsum(start, dtype=jnp.int32) - 1
    inverse = jnp.zeros((b,), jnp.int32).at[order].set(run, unique_indices=True)
    pad = n + c + 1 + jnp.arange(b, dtype=jnp.int32)
    keys = pad.at[jnp.where(start, run, b)].set(ordered, mode="drop", unique_indices=True)
    return Plan(ids, keys, inverse)


def slots(cache: CachedTable, keys: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Whether each key is a cached row, and its slot (``C + position`` where not: out of
    range and distinct, so writes to them are dropped)."""
    n, c = cache.num_rows, cache.cache_size
    hit = (keys >= n) & (keys < n + c)
    return hit, jnp.where(hit, keys - n, c + jnp.arange(keys.shape[0], dtype=jnp.int32))


def read_cold(tables: tuple, keys: jax.Array) -> tuple:
    """The cold rows of the keys from the pinned tables (zeros for every other key)."""
    return tuple(gather_from_host(t, keys, mode="fill", fill_value=0, **DISTINCT)
                 for t in tables)


def expand(mask: jax.Array, like: jax.Array) -> jax.Array:
    """``mask`` with trailing axes to broadcast against ``like``'s rows."""
    return mask.reshape(mask.shape + (1,) * (like.ndim - 1))


def assemble(cache: CachedTable, keys: jax.Array, cold: tuple) -> tuple:
    """Each key's row of each table: cached, read cold, or zeros."""
    hit, slot = slots(cache, keys)
    safe = jnp.minimum(slot, cache.cache_size - 1)
    return tuple(jnp.where(expand(hit, r), r[safe], v) for r, v in zip(cache.rows, cold,
                                                                       strict=True))


def observe(cache: CachedTable, batch: Plan) -> CachedTable:
    """The policy's score and the counters after a batch's lookup."""
    n = cache.num_rows
    valid, _ = _locate(cache, batch.ids)
    seen = jnp.where(valid, batch.ids, n)
    s = cache.stats
    if cache.policy == "lfu":
        score = cache.score.at[seen].add(1, mode="drop")
    else:
        score = cache.score.at[seen].set(s.steps + 1, mode="drop")
    hit, _ = slots(cache, batch.keys)
    looked = jnp.sum(valid, dtype=jnp.int32)
    hits = jnp.sum(hit[batch.inverse] & valid, dtype=jnp.int32)
    stats = s._replace(lookups=s.lookups + looked, hits=s.hits + hits,
                       misses=s.misses + looked - hits,
                       cold_rows=s.cold_rows + jnp.sum(batch.keys < n, dtype=jnp.int32),
                       steps=s.steps + 1)
    return cache.replace(score=score, stats=stats)


def store(cache: CachedTable, slot: jax.Array, cold: jax.Array, updates: tuple, *,
          add: bool = False, **host) -> CachedTable:
    """Writes ``updates`` (one per table; None leaves one unchanged) into the cache at
    ``slot`` (marked dirty) and into the pinned tables at rows ``cold``; positions out of
    range of either are dropped. ``add`` adds instead (the slots may then repeat); ``host``
    goes to the pinned table's write."""
    rows, tables = list(cache.rows), list(cache.tables)
    for k, u in enumerate(updates):
        if u is None:
            continue
        u = u.astype(tables[k].dtype)
        if add:
            rows[k] = rows[k].at[slot].add(u, mode="drop")
            tables[k] = scatter_add_to_host(tables[k], cold, u, mode="drop", **host)
        else:
            rows[k] = rows[k].at[slot].set(u, mode="drop", unique_indices=True)
            tables[k] = scatter_to_host(tables[k], cold, u, mode="drop", **host)
    dirty = cache.dirty
    if any(u is not None for u in updates):
        dirty = dirty.at[slot].set(True, mode="drop", unique_indices=not add)
    return cache.replace(rows=tuple(rows), tables=tuple(tables), dirty=dirty)


# ---------------------------------------------------------------------------
# Reading and writing rows


def lookup(cache: CachedTable, ids: Any, *, companions: bool = False):
    """``(rows, cache)``: the rows of ``ids`` (``table[ids]``, ``(B, ...)``, device memory).

    Cached ids read the cache, the others ``gather_from_host`` (each distinct row once).
    The returned cache has counted the lookup (policy score and :class:`CacheStats`).
    With ``companions=True`` ``rows`` is a tuple: the table's rows, then each companion's.
    ``ids``: 1-D integers; ids outside ``[0, N)`` read zeros.
    """
    check_cache(cache, "lookup")
    ids = check_ids(ids, 1, "lookup", cache)
    return _lookup(cache, ids, bool(companions))


@functools.partial(jax.jit, static_argnums=2, donate_argnums=0)
def _lookup(cache: CachedTable, ids: jax.Array, companions: bool):
    batch = plan(cache, ids)
    values = assemble(cache, batch.keys, read_cold(cache.tables, batch.keys))
    rows = tuple(v[batch.inverse] for v in values)
    return (rows if companions else rows[0]), observe(cache, batch)


def add_rows(cache: CachedTable, ids: Any, deltas: Any) -> CachedTable:
    """``table.at[ids].add(deltas)``: cached rows on the device (marked dirty), the others by
    ``scatter_add_to_host`` straight into the pinned table.

    ``deltas``: ``(B, ...)`` for the table, or a tuple with one entry per table (the table,
    then each companion; None leaves one unchanged). A cached row takes XLA's scatter-add
    (jnp's), a pinned one the library's, which sums the updates of an id that repeats
    first (:mod:`pallas_pinned.cached_table`: rounding). Ids outside ``[0, N)`` are
    dropped. Lookups are counted by :func:`lookup`, not here.
    """
    check_cache(cache, "add_rows")
    ids = check_ids(ids, 1, "add_rows", cache)
    deltas = check_updates(deltas, cache, ids.shape[0], "add_rows", "deltas")
    return _add_rows(cache, ids, deltas)


def _split_hits(cache: CachedTable, ids: jax.Array):
    """Whether each entry's row is cached; the entry numbers; each entry's slot (``C +
    entry`` where not cached) and cold id (``N + entry`` where cached or out of range):
    both out of range where they do not apply, and distinct."""
    n, c = cache.num_rows, cache.cache_size
    entry = jnp.arange(ids.shape[0], dtype=jnp.int32)
    valid, slot = _locate(cache, ids)
    hit = valid & (slot >= 0)
    return hit, entry, jnp.where(hit, slot, c + entry), jnp.where(hit | ~valid, n + entry, ids)


@functools.partial(jax.jit, donate_argnums=0)
def _add_rows(cache: CachedTable, ids: jax.Array, deltas: tuple) -> CachedTable:
    _, _, slot, cold = _split_hits(cache, ids)
    return store(cache, slot, cold, deltas, add=True)


def set_rows(cache: CachedTable, ids: Any, values: Any) -> CachedTable:
    """``table.at[ids].set(values)``: the last entry of an id that repeats wins (as
    ``scatter_to_host``). Cached rows are set on the device and marked dirty, the others
    straight in the pinned table. ``values`` as :func:`add_rows`'s ``deltas``."""
    check_cache(cache, "set_rows")
    ids = check_ids(ids, 1, "set_rows", cache)
    values = check_updates(values, cache, ids.shape[0], "set_rows", "values")
    return _set_rows(cache, ids, values)


@functools.partial(jax.jit, donate_argnums=0)
def _set_rows(cache: CachedTable, ids: jax.Array, values: tuple) -> CachedTable:
    c = cache.cache_size
    hit, entry, slot, cold = _split_hits(cache, ids)
    # The last entry of each cached slot wins: it alone writes, so the slots are distinct.
    last = jnp.full((c,), -1, jnp.int32).at[slot].max(entry, mode="drop")
    wins = hit & (last[jnp.minimum(slot, c - 1)] == entry)
    return store(cache, jnp.where(wins, slot, c + entry), cold, values)
