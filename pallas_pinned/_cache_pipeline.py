"""The cached table's training pipeline: :func:`scan` runs a step over batches in one
``lax.scan``, reading the next batch's cold rows while this batch computes."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from pallas_pinned import _cache_ops as ops
from pallas_pinned._cache_state import CachedTable, check_cache, check_ids, check_updates


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
    check_cache(cache, "scan")
    if not callable(step):
        raise TypeError(f"scan: step must be callable, got {type(step).__name__}")
    ids = check_ids(ids, 2, "scan", cache)
    if ids.shape[0] < 1:
        raise ValueError("scan: ids must hold at least one batch, got shape "
                         f"{tuple(ids.shape)}")
    return _scan(step, cache, carry, ids, xs, bool(prefetch), bool(_patch_staged))


def _apply(step: Callable, cache: CachedTable, carry: Any, batch: ops.Plan, cold: tuple,
           x: Any):
    """One step on its planned batch: assemble, compute, write. Also each table's rows of
    the batch as written (as read where the step left the table unchanged)."""
    values = ops.assemble(cache, batch.keys, cold)
    valid = batch.keys < cache.num_rows + cache.cache_size
    carry, deltas, y = step(carry, Rows(values, batch.inverse, valid), x)
    deltas = check_updates(deltas, cache, batch.keys.shape[0], "scan's step", "deltas")
    new = tuple(None if d is None else (v + d.astype(v.dtype)).astype(v.dtype)
                for v, d in zip(values, deltas, strict=True))
    # Each key is distinct, a cached one stands for its slot and a cold one for its row.
    _, slot = ops.slots(cache, batch.keys)
    cache = ops.store(ops.observe(cache, batch), slot, batch.keys, new, **ops.DISTINCT)
    return cache, carry, y, tuple(v if w is None else w for v, w in zip(values, new,
                                                                        strict=True))


def _patch(keys: jax.Array, new: tuple, next_keys: jax.Array, staged: tuple,
           num_rows: int) -> tuple:
    """The staged cold rows of ``next_keys``, with this step's values where it wrote them
    (both key lists ascend)."""
    pos = jnp.minimum(jnp.searchsorted(keys, next_keys), keys.shape[0] - 1)
    same = (keys[pos] == next_keys) & (next_keys < num_rows)
    return tuple(jnp.where(ops.expand(same, s), v[pos], s) for v, s in zip(new, staged,
                                                                           strict=True))


@functools.partial(jax.jit, static_argnums=(0, 5, 6), donate_argnums=(1,))
def _scan(step, cache, carry, ids, xs, prefetch: bool, patch: bool):
    if not prefetch:
        def body(state, inp):
            cache, carry = state
            batch_ids, x = inp
            batch = ops.plan(cache, batch_ids)
            cold = ops.read_cold(cache.tables, batch.keys)
            cache, carry, y, _ = _apply(step, cache, carry, batch, cold, x)
            return (cache, carry), y

        (cache, carry), ys = lax.scan(body, (cache, carry), (ids, xs))
        return cache, carry, ys

    first = ops.plan(cache, ids[0])
    staged = ops.read_cold(cache.tables, first.keys)
    upcoming = jnp.concatenate([ids[1:], ids[-1:]])  # the last step's prefetch goes unused

    def body(state, inp):
        cache, carry, batch, cold = state
        next_ids, x = inp
        next_batch = ops.plan(cache, next_ids)
        staged = ops.read_cold(cache.tables, next_batch.keys)
        # The next batch's read happens before this step writes the pinned tables: it does
        # not wait for this step's compute, and the write does not copy the tables to keep
        # the old rows alive for it.
        staged, tables = lax.optimization_barrier((staged, cache.tables))
        cache = cache.replace(tables=tables)
        cache, carry, y, new = _apply(step, cache, carry, batch, cold, x)
        if patch:
            staged = _patch(batch.keys, new, next_batch.keys, staged, cache.num_rows)
        return (cache, carry, next_batch, staged), y

    (cache, carry, _, _), ys = lax.scan(body, (cache, carry, first, staged), (upcoming, xs))
    return cache, carry, ys
