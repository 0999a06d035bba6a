"""The cached table's state (:class:`CachedTable`, :class:`CacheStats`) and the checks of
what its entry points are given (one cache, or a tuple or dict of them).

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

from pallas_pinned._cache_optim import RowOptimizer

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

    @property
    def hit_rate(self):
        """``hits / lookups`` (0 before any lookup)."""
        if isinstance(self.lookups, int):
            return self.hits / self.lookups if self.lookups else 0.0
        return jnp.where(self.lookups > 0, self.hits / jnp.maximum(self.lookups, 1), 0.0)

    @classmethod
    def zeros(cls) -> CacheStats:
        return cls(*(jnp.zeros((), jnp.int32) for _ in cls._fields))


@functools.partial(jax.tree_util.register_dataclass,
                   data_fields=["tables", "rows", "slot_of", "id_of", "dirty", "score",
                                "stats"],
                   meta_fields=["policy", "optimizer"])
@dataclasses.dataclass(frozen=True)
class CachedTable:
    """A pinned table, its companions and their device cache (a pytree; ``policy`` is static).

    Attributes:
      tables: the pinned tables, ``(N, ...)`` each: ``tables[0]`` the table, then the
        optimizer's state tables, then the user's companions.
      rows: their cached rows, ``(C, ...)`` each, in device memory; slot ``s`` holds id
        ``id_of[s]``.
      slot_of: ``(N,)`` int32, each id's slot or -1.
      id_of: ``(C,)`` int32, each slot's id or -1 (empty).
      dirty: ``(C,)`` bool, slots written since they were loaded or flushed.
      score: ``(N,)`` int32, the policy's state: lookups counted (``"lfu"``) or the step of
        the last lookup plus one (``"lru"``); 0 for ids not seen.
      stats: :class:`CacheStats`.
      policy: ``"lfu"`` or ``"lru"``.
      optimizer: what :class:`Grads` are applied with (static), or None.
    """

    tables: tuple[jax.Array, ...]
    rows: tuple[jax.Array, ...]
    slot_of: jax.Array
    id_of: jax.Array
    dirty: jax.Array
    score: jax.Array
    stats: CacheStats
    policy: str = "lfu"
    optimizer: RowOptimizer | None = None

    @property
    def table(self) -> jax.Array:
        """The pinned table. Rows written in the cache reach it at :func:`flush`."""
        return self.tables[0]

    @property
    def companions(self) -> tuple[jax.Array, ...]:
        """Every table but the table: the optimizer's state, then the user's companions."""
        return self.tables[1:]

    @property
    def state(self) -> tuple[jax.Array, ...]:
        """The optimizer's state tables (pinned; up to date after :func:`flush`)."""
        return self.tables[1:1 + self.num_state]

    @property
    def num_state(self) -> int:
        return 0 if self.optimizer is None else len(self.optimizer.state)

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
    if len(cache.tables) < 1 + cache.num_state:
        raise ValueError(f"the cache holds {len(cache.tables)} tables, its optimizer needs "
                         f"1 + {cache.num_state}: make caches with cached_table.create")
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


def narrow_ids(ids: Any, num_rows: int, xp: Any = jnp) -> Any:
    """``ids`` as int32, -1 where outside ``[0, num_rows)``: compared in the ids' own dtype
    before the cast, so that ``2**32 + k`` or ``2**31`` never wraps onto a row."""
    info = np.iinfo(ids.dtype)
    valid = ids >= 0 if info.min < 0 else xp.ones(ids.shape, bool)
    if num_rows <= info.max:
        valid = valid & (ids < xp.asarray(num_rows, ids.dtype))
    return xp.where(valid, ids.astype(xp.int32), xp.int32(-1))


def check_ids(ids: Any, ndim: int, where: str, cache: CachedTable) -> Any:
    """``ids`` checked: ``(batch,)`` (``ndim`` 1) or ``(steps, batch)`` (``ndim`` 2) integers
    of any width; host arrays come back narrowed (:func:`narrow_ids`), the others as they
    are (the jitted entry points narrow them)."""
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
    if isinstance(ids, jax.Array | jax.core.Tracer) and _on_pinned_host(ids):
        raise ValueError(f"{where}: ids are in pinned_host memory; the cache plans a batch "
                         "on the device: pass jax.device_put(ids, jax.memory.Space.Device)")
    # A batch's keys and the out-of-range positions that drop its writes are numbered past
    # N + C (_cache_ops): they must stay int32.
    if cache.num_rows + cache.cache_size + 2 * ids.shape[-1] + 1 > INT32_MAX:
        raise ValueError(f"{where}: a table of {cache.num_rows} rows with a cache of "
                         f"{cache.cache_size} and batches of {ids.shape[-1]} ids numbers its "
                         "keys past int32; use smaller batches or a smaller cache")
    if isinstance(ids, np.ndarray):
        ids = narrow_ids(ids, cache.num_rows, np)
    return ids


def is_cache(a: Any) -> bool:
    return isinstance(a, CachedTable)


def flatten_caches(caches: Any, where: str) -> tuple[list, Any]:
    """The caches of ``caches`` (one :class:`CachedTable`, or a tuple, list or dict of them)
    and their structure; each checked."""
    leaves, treedef = jax.tree.flatten(caches, is_leaf=is_cache)
    if not leaves or not all(is_cache(c) for c in leaves):
        raise TypeError(f"{where} takes the CachedTable made by cached_table.create, or a "
                        f"tuple or dict of them, got {type(caches).__name__}")
    for c in leaves:
        check_cache(c, where)
    return leaves, treedef


def match(treedef: Any, tree: Any, where: str, what: str) -> list:
    """``tree``'s entries, one per cache of ``treedef`` (same tuple, list or dict)."""
    try:
        return treedef.flatten_up_to(tree)
    except (TypeError, ValueError) as err:
        raise ValueError(f"{where}: {what} must match the caches: one entry per cache, in "
                         f"the same tuple or dict ({treedef}), got {type(tree).__name__}"
                         ) from err


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


def check_grads(grads: Any, cache: CachedTable, batch: int, where: str) -> jax.Array:
    """The per-entry gradients of a :class:`Grads`, checked against the cache's table."""
    if cache.optimizer is None:
        raise ValueError(f"{where}: Grads need the table's optimizer, and this cache has "
                         "none: create it with optimizer=cached_table.sgd(learning_rate) (or "
                         "adagrad, rowwise_adagrad, adam, custom_optimizer), or hand back "
                         "cached_table.Deltas(...) for the distinct rows")
    if not hasattr(grads, "dtype"):
        grads = jnp.asarray(grads)
    _check_alive("the gradients", grads)
    want = (batch, *cache.table.shape[1:])
    if tuple(grads.shape) != want:
        raise ValueError(f"{where}: Grads must be {want}: one gradient per entry of the "
                         f"batch, aligned with its ids (the gradient of rows.per_entry()), "
                         f"got {tuple(grads.shape)}")
    if not jnp.issubdtype(grads.dtype, jnp.inexact):
        raise TypeError(f"{where}: Grads must be floats, got {grads.dtype}")
    return grads
