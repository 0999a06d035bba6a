"""The cached table's policy and write-back: :func:`refresh` chooses the ids cached and
moves the rows, :func:`flush` writes every written row back to the pinned tables."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax

from pallas_pinned._cache_ops import DISTINCT, read_cold
from pallas_pinned._cache_state import CachedTable, flatten_caches
from pallas_pinned.scatter import scatter_to_host


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


def _dirty_ids(cache: CachedTable) -> jax.Array:
    """``(N,)`` bool: the cached ids whose rows were written."""
    return (cache.slot_of >= 0) & cache.dirty[jnp.maximum(cache.slot_of, 0)]


def _write_back(cache: CachedTable, mask: jax.Array) -> tuple[tuple, jax.Array]:
    """The pinned tables with the cached rows of the ids in ``mask`` (cached ids only)
    written back, in ascending id order; and how many ids that was."""
    n, c = cache.num_rows, cache.cache_size
    ids, count = _compact(mask, c, n)
    slot = jnp.minimum(cache.slot_of[jnp.minimum(ids, n - 1)], c - 1)
    tables = tuple(scatter_to_host(t, ids, r[slot], mode="drop", **DISTINCT)
                   for t, r in zip(cache.tables, cache.rows, strict=True))
    return tables, count


def refresh(caches):
    """Caches the ids the policy ranks highest among those seen (or cached); for a tuple
    or dict of caches, in each of them (one compiled program).

    ``"lfu"``: the most looked-up since the counts last halved; ``"lru"``: the most recently
    looked-up. Ties keep the ids already cached, then take the smaller id. Ids that leave
    free their slots; those that were written are written back first (``scatter_to_host``);
    entering ids are read in (``gather_from_host``); ids that stay keep their slot. LFU's
    counts halve afterwards. Cost: a few passes over the ``(N,)`` arrays, plus the rows
    that move.
    """
    leaves, treedef = flatten_caches(caches, "refresh")
    return treedef.unflatten(_refresh_all(leaves))


@functools.partial(jax.jit, donate_argnums=0)
def _refresh_all(caches: list) -> list:
    return [_refresh(c) for c in caches]


def _refresh(cache: CachedTable) -> CachedTable:
    n, c = cache.num_rows, cache.cache_size
    cached = cache.slot_of >= 0
    # The score ranks; the low bit keeps cached ids on ties (no churn for nothing).
    key = jnp.minimum(cache.score, 2**29) * 2 + cached
    member = _choose(key, c)
    has_id = cache.id_of >= 0
    leaves = has_id & ~member[jnp.maximum(cache.id_of, 0)]
    free = ~has_id | leaves
    tables, written_back = _write_back(cache, _dirty_ids(cache) & ~member)
    entering, n_in = _compact(member & ~cached, c, n)
    loaded = read_cold(tables, entering)
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
    # LFU's counts halve, so that the ranking forgets old traffic.
    score = cache.score // 2 if cache.policy == "lfu" else cache.score
    s = cache.stats
    stats = s._replace(evictions=s.evictions + jnp.sum(leaves, dtype=jnp.int32),
                       writebacks=s.writebacks + written_back,
                       loads=s.loads + n_in, refreshes=s.refreshes + 1)
    return cache.replace(tables=tables, rows=rows, id_of=id_of, slot_of=slot_of,
                         dirty=cache.dirty & ~free, score=score, stats=stats)


def flush(caches):
    """Writes every dirty cached row back to the pinned tables (``scatter_to_host``); the
    cache keeps its rows, now clean. Afterwards ``cache.tables`` hold every update (the
    table, ``cache.state``, the companions): flush before a checkpoint or before reading
    ``cache.table``. A tuple or dict of caches: each of them."""
    leaves, treedef = flatten_caches(caches, "flush")
    return treedef.unflatten(_flush_all(leaves))


@functools.partial(jax.jit, donate_argnums=0)
def _flush_all(caches: list) -> list:
    return [_flush(c) for c in caches]


def _flush(cache: CachedTable) -> CachedTable:
    tables, count = _write_back(cache, _dirty_ids(cache))
    stats = cache.stats._replace(flushed=cache.stats.flushed + count)
    return cache.replace(tables=tables, dirty=jnp.zeros_like(cache.dirty), stats=stats)
