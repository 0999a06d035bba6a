"""The cached table's plain ops: :func:`create`, :func:`lookup`, :func:`add_rows`,
:func:`set_rows`, :func:`stats`, :func:`reset_stats`; and the batch plan, reads and writes
(:func:`new_rows`: a batch's rows after its update) that
:mod:`pallas_pinned._cache_pipeline` builds on."""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from pallas_pinned._cache_optim import (
    Deltas,
    Grads,
    RowOptimizer,
    apply_optimizer,
    check_optimizer,
    compute_dtype,
    plus,
    sum_runs,
)
from pallas_pinned._cache_state import (
    INT32_MAX,
    CachedTable,
    CacheStats,
    check_cache,
    check_grads,
    check_ids,
    check_pinned,
    check_policy,
    check_updates,
    flatten_caches,
    is_concrete,
    narrow_ids,
)
from pallas_pinned._placement import fix_memory_space
from pallas_pinned.gather import gather_from_host
from pallas_pinned.order import sort_indices
from pallas_pinned.scatter import scatter_to_host

DISTINCT = {"indices_are_sorted": True, "unique_indices": True}


def create(table: jax.Array, cache_size: int, *, optimizer: RowOptimizer | None = None,
           state: tuple | list | None = None, companions: tuple | list = (),
           policy: str = "lfu") -> CachedTable:
    """An empty device cache of ``cache_size`` rows over ``table`` (and its state tables).

    Args:
      table: ``(N, ...)`` in ``pinned_host`` memory, on one device.
      cache_size: rows cached, ``1 <= cache_size <= N``.
      optimizer: what a step's :class:`Grads` are applied with (static): ``sgd``,
        ``adagrad``, ``rowwise_adagrad``, ``adam`` or ``custom_optimizer``; None: only
        :class:`Deltas` and the plain writes.
      state: the optimizer's state tables, e.g. ``cache.state`` restored from a checkpoint
        (pinned, as the table); None makes them, filled with each one's initial value.
      companions: more per-row tables sharing the table's ids and slots, written only
        through :class:`Deltas` and the plain writes; each in ``pinned_host`` memory with
        ``N`` rows, on the table's device.
      policy: ``"lfu"`` or ``"lru"`` (static): how :func:`refresh` chooses the ids.

    ``cache.tables`` is the table, then the optimizer's state, then the companions. The
    cache starts empty (every lookup a miss): :func:`refresh` fills it from what the
    lookups observed. Device memory: the cached rows of every table, and two int32 arrays
    as long as the table (the slot map and the policy's score). The tables are not copied.
    """
    check_policy(policy)
    check_optimizer(optimizer)
    for name, group in (("companions", companions), ("state", state)):
        if group is not None and not isinstance(group, tuple | list):
            raise TypeError(f"{name} must be a tuple of tables, got "
                            f"{type(group).__name__}: pass {name}=(t,) for one")
    check_pinned("table", table)
    n = table.shape[0]
    if isinstance(cache_size, bool) or not isinstance(cache_size, int | np.integer):
        raise TypeError(f"cache_size must be an int, got {type(cache_size).__name__}")
    if not 1 <= cache_size <= n:
        raise ValueError(f"cache_size must be between 1 and the table's {n} rows, got "
                         f"{cache_size}; cache fewer rows (or keep the table on the device)")
    if n + cache_size + 3 > INT32_MAX:
        raise ValueError(f"a table of {n} rows with a cache of {cache_size} numbers its keys "
                         "past int32; use a smaller cache")
    state = _state_tables(table, optimizer, state)
    for k, t in enumerate(companions):
        check_pinned(f"companion {k}", t)
    for name, t in [*((f"state {k}", t) for k, t in enumerate(state)),
                    *((f"companion {k}", t) for k, t in enumerate(companions))]:
        if t.shape[0] != n:
            raise ValueError(f"{name} has {t.shape[0]} rows, the table {n}: it holds one row "
                             "per id of the table")
        if is_concrete(t) and is_concrete(table) and t.sharding.device_set != \
                table.sharding.device_set:
            raise ValueError(f"{name} is on {t.sharding.device_set}, the table on "
                             f"{table.sharding.device_set}: put them on one device")
    tables = (table, *state, *companions)
    tables = tuple(fix_memory_space(t) if is_concrete(t) else t for t in tables)
    # The cache's own arrays are made beside the tables, which are not passed through a jit
    # (no copy).
    c = int(cache_size)
    # Made by numpy and put on the device at once (eagerly, jnp compiles each shape's fill).
    xp = np if is_concrete(table) else jnp
    made = (
        tuple(xp.zeros((c, *t.shape[1:]), t.dtype) for t in tables),
        xp.full((n,), -1, np.int32), xp.full((c,), -1, np.int32), xp.zeros((c,), np.bool_),
        xp.zeros((n,), np.int32), CacheStats(*(xp.zeros((), np.int32)
                                                for _ in CacheStats._fields)))
    if is_concrete(table):
        made = jax.device_put(made, _device_of(table))
    rows, slot_of, id_of, dirty, score, counters = made
    return CachedTable(tables=tables, rows=rows, slot_of=slot_of, id_of=id_of, dirty=dirty,
                       score=score, stats=counters, policy=policy, optimizer=optimizer)


def _device_of(table: jax.Array, memory_kind: str = "device"):
    """The table's device, as a sharding of the table's kind: a cache's arrays then keep
    their types through a jit (whose outputs take the inputs'), and one program serves."""
    sharding = table.sharding
    if isinstance(sharding, jax.sharding.NamedSharding):
        return jax.sharding.NamedSharding(sharding.mesh, jax.sharding.PartitionSpec(),
                                          memory_kind=memory_kind)
    return jax.sharding.make_single_device_sharding(next(iter(sharding.device_set)),
                                                    memory_kind=memory_kind)


def _state_tables(table: jax.Array, optimizer: RowOptimizer | None, state) -> tuple:
    """The optimizer's state tables: ``state`` checked, or new ones in pinned memory."""
    specs = () if optimizer is None else optimizer.state
    if optimizer is not None and not jnp.issubdtype(table.dtype, jnp.floating) and \
            optimizer.name != "custom":
        raise TypeError(f"the {optimizer.name} optimizer needs a table of floats, got "
                        f"{table.dtype}")
    if state is None:
        return tuple(_filled(table, s.full_shape(table.shape), s.dtype, s.init)
                     for s in specs)
    if len(state) != len(specs):
        raise ValueError(f"state has {len(state)} tables, the {optimizer and optimizer.name} "
                         f"optimizer keeps {len(specs)}: pass cache.state as it was saved")
    for k, (t, s) in enumerate(zip(state, specs, strict=True)):
        check_pinned(f"state {k}", t)
        want = s.full_shape(table.shape)
        if t.shape != want or t.dtype != np.dtype(s.dtype):
            raise ValueError(f"state {k} is {t.shape} {t.dtype}, the optimizer keeps {want} "
                             f"{np.dtype(s.dtype)}: pass cache.state as it was saved")
    return tuple(state)


def _filled(table: jax.Array, shape: tuple, dtype, value) -> jax.Array:
    if is_concrete(table):  # made on the host: a state table may not fit the device
        return jax.device_put(np.full(shape, value, dtype), _device_of(table, "pinned_host"))
    return jax.device_put(jnp.full(shape, value, dtype), jax.memory.Space.Host)


def stats(caches) -> CacheStats:
    """The counters as Python ints (a :class:`CacheStats`, with ``hit_rate``); for a tuple
    or dict of caches, one per cache in the same structure."""
    leaves, treedef = flatten_caches(caches, "stats")
    return treedef.unflatten([CacheStats(*(int(v) for v in c.stats)) for c in leaves])


def reset_stats(caches):
    """The caches with their counters at zero, but ``steps``: LRU's clock keeps running.
    Consumes the caches it is given, as every entry point does."""
    leaves, treedef = flatten_caches(caches, "reset_stats")
    return treedef.unflatten(_reset_stats(leaves))


@functools.partial(jax.jit, donate_argnums=0)
def _reset_stats(caches: list) -> list:
    return [c.replace(stats=CacheStats.zeros()._replace(steps=c.stats.steps)) for c in caches]


# ---------------------------------------------------------------------------
# A batch's plan, reads and writes


class Plan(NamedTuple):
    """A batch's distinct ids, ordered as keys: a cold id's key is the id, a cached id's is
    ``N + slot``, an id out of range ``N + C``, and the padding past the distinct ids
    ``N + C + 1 + position``; so the keys ascend, are distinct, and only the cold ones are
    rows of the pinned table."""

    ids: jax.Array  # (B,) the batch (int32, -1 out of range), for the policy
    keys: jax.Array  # (B,) ascending, distinct
    inverse: jax.Array  # (B,) entry -> its key's position
    order: jax.Array  # (B,) a stable sort of the entries by key
    start: jax.Array  # (B,) bool: where a key's run begins, in that order
    run: jax.Array  # (B,) each sorted position's key position


def _locate(cache: CachedTable, ids: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Whether each id is in range, and its slot (-1 where it is not cached)."""
    n = cache.num_rows
    return (ids >= 0) & (ids < n), cache.slot_of[jnp.clip(ids, 0, n - 1)]


def plan(cache: CachedTable, ids: jax.Array) -> Plan:
    """The plan of a batch of ids narrowed by :func:`narrow_ids`."""
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
    return Plan(ids, keys, inverse, order.astype(jnp.int32), start, run)


def summed(batch: Plan, values: jax.Array, dtype) -> jax.Array:
    """Per-entry ``values`` summed per distinct key (rows as the keys), in a fixed order."""
    return sum_runs(values, batch.order, batch.start, batch.run, dtype)


def new_rows(cache: CachedTable, batch: Plan, values: tuple, update, where: str) -> tuple:
    """Each table's distinct rows of a batch after ``update`` (None where unchanged):
    :class:`Grads` through the optimizer, :class:`Deltas` added, None nothing."""
    b, none = batch.keys.shape[0], (None,) * len(values)
    if update is None:
        return none
    if isinstance(update, Grads):
        grads = check_grads(update.grads, cache, b, where)
        g = summed(batch, grads, compute_dtype(cache.table.dtype))
        new = apply_optimizer(cache.optimizer, values, g)
        return new + none[len(new):]
    if isinstance(update, Deltas):
        deltas = check_updates(update.deltas, cache, b, where, "deltas")
        return tuple(None if d is None else plus(v, d) for v, d in zip(values, deltas,
                                                                        strict=True))
    raise TypeError(f"{where}: the update must say what it is: cached_table.Grads(g) for "
                    "per-entry gradients (B, ...) aligned with the ids (the table's optimizer "
                    "applies them), or cached_table.Deltas(d) for values added to the "
                    f"distinct rows (rows.values' order), or None; got {type(update).__name__}")


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


def store(cache: CachedTable, slot: jax.Array, cold: jax.Array, updates: tuple,
          **host) -> CachedTable:
    """Sets ``updates`` (one per table; None leaves one unchanged) into the cache at the
    distinct ``slot`` (marked dirty) and into the pinned tables at the distinct rows
    ``cold``; positions out of range of either are dropped. ``host`` goes to the pinned
    table's write."""
    rows, tables = list(cache.rows), list(cache.tables)
    for k, u in enumerate(updates):
        if u is None:
            continue
        u = u.astype(tables[k].dtype)
        rows[k] = rows[k].at[slot].set(u, mode="drop", unique_indices=True)
        tables[k] = scatter_to_host(tables[k], cold, u, mode="drop", **host)
    dirty = cache.dirty
    if any(u is not None for u in updates):
        dirty = dirty.at[slot].set(True, mode="drop", unique_indices=True)
    return cache.replace(rows=tuple(rows), tables=tuple(tables), dirty=dirty)


def write(cache: CachedTable, batch: Plan, new: tuple) -> CachedTable:
    """Writes a batch's new distinct rows where they live: cached ones in the cache, the
    others in the pinned tables (each key is distinct; a cached one names its slot)."""
    _, slot = slots(cache, batch.keys)
    return store(cache, slot, batch.keys, new, **DISTINCT)


# ---------------------------------------------------------------------------
# Reading and writing rows


def lookup(cache: CachedTable, ids: Any, *, companions: bool = False):
    """``(rows, cache)``: the rows of ``ids`` (``table[ids]``, ``(B, ...)``, device memory).

    Cached ids read the cache, the others ``gather_from_host`` (each distinct row once).
    The returned cache has counted the lookup (policy score and :class:`CacheStats`).
    With ``companions=True`` ``rows`` is a tuple: the table's rows, then each companion's
    (the optimizer's state first). ``ids``: 1-D integers of any width; ids outside
    ``[0, N)`` read zeros.
    """
    check_cache(cache, "lookup")
    ids = check_ids(ids, 1, "lookup", cache)
    return _lookup(cache, ids, bool(companions))


@functools.partial(jax.jit, static_argnums=2, donate_argnums=0)
def _lookup(cache: CachedTable, ids: jax.Array, companions: bool):
    batch = plan(cache, narrow_ids(ids, cache.num_rows))
    values = assemble(cache, batch.keys, read_cold(cache.tables, batch.keys))
    rows = tuple(v[batch.inverse] for v in values)
    return (rows if companions else rows[0]), observe(cache, batch)


def add_rows(cache: CachedTable, ids: Any, deltas: Any) -> CachedTable:
    """``table.at[ids].add(deltas)``, each distinct row written once where it lives.

    ``deltas``: ``(B, ...)`` for the table, or a tuple with one entry per table (the table,
    then each companion; None leaves one unchanged). The deltas of an id that repeats are
    summed in a fixed order (float32 for smaller floats) and added once, with the same
    arithmetic whether the row is cached or not (:mod:`pallas_pinned.cached_table`:
    rounding). Ids outside ``[0, N)`` are dropped. Lookups are counted by :func:`lookup`,
    not here.
    """
    check_cache(cache, "add_rows")
    ids = check_ids(ids, 1, "add_rows", cache)
    deltas = check_updates(deltas, cache, ids.shape[0], "add_rows", "deltas")
    return _add_rows(cache, ids, deltas)


@functools.partial(jax.jit, donate_argnums=0)
def _add_rows(cache: CachedTable, ids: jax.Array, deltas: tuple) -> CachedTable:
    batch = plan(cache, narrow_ids(ids, cache.num_rows))
    values = assemble(cache, batch.keys, read_cold(cache.tables, batch.keys))
    new = tuple(None if d is None else plus(v, summed(batch, d, compute_dtype(v.dtype)))
                for v, d in zip(values, deltas, strict=True))
    return write(cache, batch, new)


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
    n, c = cache.num_rows, cache.cache_size
    ids = narrow_ids(ids, n)
    entry = jnp.arange(ids.shape[0], dtype=jnp.int32)
    valid, slot = _locate(cache, ids)
    hit = valid & (slot >= 0)
    # The last entry of each cached slot wins: it alone writes, so the slots are distinct.
    # Out of range (and so dropped) where they do not apply, and distinct.
    slot = jnp.where(hit, slot, c + entry)
    last = jnp.full((c,), -1, jnp.int32).at[slot].max(entry, mode="drop")
    wins = hit & (last[jnp.minimum(slot, c - 1)] == entry)
    cold = jnp.where(hit | ~valid, n + entry, ids)
    return store(cache, jnp.where(wins, slot, c + entry), cold, values)
