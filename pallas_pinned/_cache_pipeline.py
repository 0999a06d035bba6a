"""The cached table's training pipeline: :func:`scan` runs a step over batches of one
or many caches in one ``lax.scan``, reading the next batch's cold rows while this batch
computes."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from pallas_pinned import _cache_ops as ops
from pallas_pinned._cache_state import check_ids, flatten_caches, match, narrow_ids


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
        """Each entry's row of ``tables[table]``: ``values[table][inverse]``, ``(B, ...)``.
        Differentiate with respect to this, not ``values``, and hand back ``Grads``: the
        library then sums a row's gradients in a fixed order (``jax.grad`` through the
        gather would sum them with a scatter-add, in an order XLA does not promise)."""
        return self.values[table][self.inverse]


def scan(step: Callable, caches: Any, carry: Any, ids: Any, xs: Any = None, *,
         prefetch: bool = True, _patch_staged: bool = True):
    """``(caches, carry, ys)``: ``step`` over ``steps`` batches in one ``lax.scan``.

    ``caches``: one cache, or a tuple or dict of them (each its own rows, width, dtype,
    cache size and optimizer); ``ids`` the same structure, one ``(steps, batch)`` integer
    array per cache (batches may differ in width; ``steps`` may not).

    ``step(carry, rows, x) -> (carry, update, y)``: ``rows`` is a :class:`Rows` per cache
    (in the structure of ``caches``), ``update`` one per cache, of one kind:
    ``Grads(g)``, the per-entry gradients ``(B, ...)`` with respect to
    ``rows.per_entry()``, summed per distinct row in a fixed order and applied by the
    table's optimizer; ``Deltas(d)``, added to the distinct rows (``rows.values``' order);
    or None. The new rows are written where they live: cached ones in the cache (dirty),
    the others set in the pinned tables (each distinct row once). ``x`` and ``y`` as in
    ``lax.scan`` (``x`` None when ``xs`` is None). One compiled program for all caches.

    With ``prefetch`` (the default) the next batch's cold rows are read from the pinned
    tables (``gather_from_host``) while this batch computes: the read does not depend on
    this step's compute, only on the ids and the cache's slots (which a scan never
    changes), and it is ordered before this step's write-back. Rows this step writes that
    the next batch also reads cold are then patched with this step's new values, on the
    device, so no update is lost. ``_patch_staged=False`` turns that off (for the test
    that shows the hazard only). Without ``prefetch`` each step reads its own rows first.

    The cached ids do not change within a scan: refresh between scans (e.g. a scan of a
    refresh interval's steps, then :func:`refresh`). Lookups are counted as by
    :func:`lookup`.
    """
    leaves, treedef = flatten_caches(caches, "scan")
    if not callable(step):
        raise TypeError(f"scan: step must be callable, got {type(step).__name__}")
    ids = [check_ids(i, 2, "scan", c) for i, c in zip(match(treedef, ids, "scan", "ids"),
                                                       leaves, strict=True)]
    steps = {int(i.shape[0]) for i in ids}
    if len(steps) != 1 or min(steps) < 1:
        raise ValueError("scan: ids must hold the same number of batches (at least one) for "
                         f"every cache, got shapes {[tuple(i.shape) for i in ids]}")
    out, carry, ys = _scan(step, treedef, leaves, carry, ids, xs, bool(prefetch),
                           bool(_patch_staged))
    return treedef.unflatten(out), carry, ys


def _apply(step: Callable, treedef: Any, caches: list, carry: Any, batches: list,
           colds: list, x: Any):
    """One step on its planned batches: assemble, compute, write. Also each cache's rows
    of the batch as written (as read where the step left a table unchanged)."""
    values = [ops.assemble(c, b.keys, cold) for c, b, cold in zip(caches, batches, colds,
                                                                   strict=True)]
    rows = [Rows(v, b.inverse, b.keys < c.num_rows + c.cache_size)
            for c, b, v in zip(caches, batches, values, strict=True)]
    out = step(carry, treedef.unflatten(rows), x)
    if not (isinstance(out, tuple) and len(out) == 3):
        got = f"{len(out)} values" if isinstance(out, tuple | list) else type(out).__name__
        raise TypeError("scan: step(carry, rows, x) must return (carry, update, y), update "
                        "a cached_table.Grads or Deltas (one per cache) or None; it "
                        f"returned {got}")
    carry, updates, y = out
    updates = match(treedef, updates, "scan's step", "the update")
    written, done = [], []
    for c, b, v, u in zip(caches, batches, values, updates, strict=True):
        new = ops.new_rows(c, b, v, u, "scan's step")
        written.append(ops.write(ops.observe(c, b), b, new))
        done.append(tuple(old if w is None else w for old, w in zip(v, new, strict=True)))
    return written, carry, y, done


def _patch(keys: jax.Array, new: tuple, next_keys: jax.Array, staged: tuple,
           num_rows: int) -> tuple:
    """The staged cold rows of ``next_keys``, with this step's values where it wrote them
    (both key lists ascend)."""
    pos = jnp.minimum(jnp.searchsorted(keys, next_keys), keys.shape[0] - 1)
    same = (keys[pos] == next_keys) & (next_keys < num_rows)
    return tuple(jnp.where(ops.expand(same, s), v[pos], s) for v, s in zip(new, staged,
                                                                           strict=True))


def _plans(caches: list, ids: list) -> list:
    return [ops.plan(c, i) for c, i in zip(caches, ids, strict=True)]


def _reads(caches: list, batches: list) -> list:
    return [ops.read_cold(c.tables, b.keys) for c, b in zip(caches, batches, strict=True)]


@functools.partial(jax.jit, static_argnums=(0, 1, 6, 7), donate_argnums=(2,))
def _scan(step, treedef, caches, carry, ids, xs, prefetch: bool, patch: bool):
    ids = [narrow_ids(i, c.num_rows) for c, i in zip(caches, ids, strict=True)]
    if not prefetch:
        def body(state, inp):
            caches, carry = state
            batch_ids, x = inp
            batches = _plans(caches, batch_ids)
            caches, carry, y, _ = _apply(step, treedef, caches, carry, batches,
                                         _reads(caches, batches), x)
            return (caches, carry), y

        (caches, carry), ys = lax.scan(body, (caches, carry), (ids, xs))
        return caches, carry, ys

    first = _plans(caches, [i[0] for i in ids])
    staged = _reads(caches, first)
    # The last step's prefetch goes unused.
    upcoming = [jnp.concatenate([i[1:], i[-1:]]) for i in ids]

    def body(state, inp):
        caches, carry, batches, colds = state
        next_ids, x = inp
        next_batches = _plans(caches, next_ids)
        staged = _reads(caches, next_batches)
        # The next batch's reads happen before this step writes the pinned tables: they do
        # not wait for this step's compute, and the writes do not copy the tables to keep
        # the old rows alive for them.
        staged, tables = lax.optimization_barrier((staged, [c.tables for c in caches]))
        caches = [c.replace(tables=t) for c, t in zip(caches, tables, strict=True)]
        caches, carry, y, new = _apply(step, treedef, caches, carry, batches, colds, x)
        if patch:
            staged = [_patch(b.keys, w, nb.keys, s, c.num_rows) for b, w, nb, s, c in
                      zip(batches, new, next_batches, staged, caches, strict=True)]
        return (caches, carry, next_batches, staged), y

    (caches, carry, _, _), ys = lax.scan(body, (caches, carry, first, staged), (upcoming, xs))
    return caches, carry, ys
