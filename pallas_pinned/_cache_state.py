"""The cached table's state (:class:`CachedTable`, :class:`CacheStats`) and the checks of
what its entry points are given.

Shapes, dtypes and placement are static, so every check runs before anything does, under
``jit`` too: a refused call raises and consumes nothing.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

POLICIES = ("lfu", "lru")
INT32_MAX = 2**31 - 1


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


def table_name(k: int) -> str:
    """How messages name ``tables[k]``."""
    return "table" if k == 0 else f"companion {k - 1}"


def is_concrete(a: Any) -> bool:
    return isinstance(a, jax.Array) and not isinstance(a, jax.core.Tracer)


def _on_pinned_host(a: Any) -> bool:
    if is_concrete(a):
        return a.sharding.memory_kind == "pinned_host"
    return getattr(jax.typeof(a), "memory_space", None) == jax.memory.Space.Host


def _check_alive(name: str, a: Any) -> None:
    if is_concrete(a) and a.is_deleted():
        raise ValueError(f"{name} has been deleted (donated to an earlier call): use the "
                         "cache or array that call returned")


def check_policy(policy: Any) -> None:
    if policy not in POLICIES:
        raise ValueError(f"policy must be one of {POLICIES}, got {policy!r}")


def check_pinned(name: str, a: Any) -> None:
    if not isinstance(a, jax.Array | jax.core.Tracer):
        raise TypeError(f"{name} must be a jax.Array in pinned_host memory, got "
                        f"{type(a).__name__}; make one with jax.device_put(x, "
                        "jax.memory.Space.Host)")
    _check_alive(name, a)
    if not _on_pinned_host(a):
        where = a.sharding.memory_kind if is_concrete(a) else "device"
        raise ValueError(f"{name} must live in pinned_host memory, it is in {where!r} memory: "
                         "put it there with jax.device_put(x, jax.memory.Space.Host) (or "
                         "pallas_pinned.fix_memory_space for a restored buffer)")
    if is_concrete(a) and len(a.sharding.device_set) != 1:
        raise ValueError(f"{name} is spread over {len(a.sharding.device_set)} devices; a "
                         "cached table lives on one: device_put it to one device's "
                         "pinned_host memory")
    if a.ndim < 1:
        raise ValueError(f"{name} must have a row axis (ndim >= 1), got shape {a.shape}")
    if a.dtype == jnp.bool_:
        raise TypeError(f"{name} has dtype bool, which cannot be added to; store it as int8")


def check_cache(cache: Any, where: str) -> None:
    if not isinstance(cache, CachedTable):
        raise TypeError(f"{where} takes the CachedTable made by cached_table.create, got "
                        f"{type(cache).__name__}")
    check_policy(cache.policy)
    n, c = cache.num_rows, cache.cache_size
    for k, (t, r) in enumerate(zip(cache.tables, cache.rows, strict=True)):
        name = table_name(k)
        check_pinned(name, t)
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


def check_ids(ids: Any, ndim: int, where: str, cache: CachedTable) -> jax.Array:
    """``ids`` as int32, ``(batch,)`` (``ndim`` 1) or ``(steps, batch)`` (``ndim`` 2)."""
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
    # A batch's keys and the out-of-range positions that drop its writes are numbered past
    # N + C (_cache_ops): they must stay int32.
    if cache.num_rows + cache.cache_size + 2 * ids.shape[-1] + 1 > INT32_MAX:
        raise ValueError(f"{where}: a table of {cache.num_rows} rows with a cache of "
                         f"{cache.cache_size} and batches of {ids.shape[-1]} ids numbers its "
                         "keys past int32; use smaller batches or a smaller cache")
    if isinstance(ids, np.ndarray) and ids.dtype.itemsize > 4:
        # Saturate, so that a value past int32 stays out of range instead of wrapping onto
        # a row.
        ids = np.clip(ids, -1, INT32_MAX)
    return jnp.asarray(ids).astype(jnp.int32)


def check_updates(updates: Any, cache: CachedTable, batch: int, where: str,
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
        name = table_name(k)
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
