"""One order, or the distinct rows, of a batch of row indices, shared by several ops on them.

``sort_indices`` orders a batch once for a read and a write of the same rows;
``distinct_indices`` goes further: each distinct row once, so that a step reads
each row once and writes it once (a set, not an add: no second read).
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from pallas_pinned import _placement, _rows, tuning

__all__ = ["distinct_indices", "sort_indices"]

_MODES = (None, "drop", "fill", "clip", "promise_in_bounds")


def sort_indices(indices: Any, num_rows: int, *, mode: str | None = None):
    """Returns ``(sorted_indices, order)``: a stable ascending order of axis-0 row indices.

    A step that reads rows and then writes to the same rows (sparse training:
    ``gather_from_host``, then ``scatter_add_to_host``) orders the indices
    twice: the add puts duplicates next to each other, and a read in ascending
    address order is faster over PCIe. Ordering once and passing
    ``indices_are_sorted=True`` to every op does that work once::

        ids_sorted, order = pallas_pinned.sort_indices(ids, table.shape[0])
        rows = pallas_pinned.gather_from_host(table, ids_sorted, indices_are_sorted=True)
        grads = grad_fn(rows, targets[order])            # per-entry data, permuted alike
        table = pallas_pinned.scatter_add_to_host(table, ids_sorted, -lr * grads,
                                                  indices_are_sorted=True)

    The result is the same as with ``ids`` themselves: bit for bit where the
    add sums each row's run of a stable order (more than
    ``tuning.current().fused_max_adds`` entries, on the kernels); below that
    the kernels' one-launch add groups its sums by position, so the last bits
    of a row with repeated ids may differ. Up to
    ``tuning.current().runs_rank_max`` entries the order is counted as ranks
    (an ``n x n`` comparison XLA fuses), beyond by XLA's stable sort: the add's
    own way, so sharing it never costs more than the add alone. On the H200
    (2026-12-03 20:33 UTC, ``benchmarks.sparse_training``, 4096 Zipf ids a
    step) the sparse client's step took 57.0 us this way against 68.6 us
    (``ours_sorted`` against ``ours``).

    Args:
      indices: a 1-D integer array of row indices (axis 0) of a buffer with
        ``num_rows`` rows, in device memory or host memory.
      num_rows: the buffer's ``shape[0]``.
      mode: how out-of-range entries are normalized, matching the ``mode`` the
        ops will get: ``None``, ``"drop"`` or ``"fill"`` (negative entries wrap
        once; still out of range, they become one marker that every op skips
        or fills: pass ``mode="drop"`` or ``"fill"`` to the ops then, since
        jnp's default read mode clamps); ``"clip"`` (clamped into range);
        ``"promise_in_bounds"`` (left as they are: the caller promises they
        are in range).

    Returns:
      ``sorted_indices``: the normalized indices in ascending order (stable:
      equal indices keep their input order), of the widest integer type jax
      computes with; ``order``: int32 positions with ``sorted_indices ==
      normalized[order]``. Permute per-entry data with ``data[order]``.

    Raises:
      TypeError: ``indices`` are not integers.
      ValueError: ``indices`` are not 1-D, ``num_rows`` is not a positive
        integer, or ``mode`` is not one of the above (``"wrap"``: take
        ``jnp.mod(indices, num_rows)`` first).
    """
    _check("sort_indices", indices, num_rows, mode)
    return _sort(indices, int(num_rows), mode, tuning.current().runs_rank_max)


def distinct_indices(indices: Any, num_rows: int, *, mode: str | None = None):
    """Returns ``(rows, inverse)``: each distinct row of a batch once, and where each entry went.

    A step that reads rows, computes their new values and writes them back
    (sparse training) moves each row over PCIe once per entry that names it,
    and an add reads it a second time. Reading the distinct rows once and
    writing their new values with a set moves each row once each way::

        rows, inverse = pallas_pinned.distinct_indices(ids, table.shape[0])
        promise = dict(unique_indices=True, indices_are_sorted=True)
        values = pallas_pinned.gather_from_host(table, rows, mode="fill", fill_value=0,
                                                **promise)
        grads = jax.grad(lambda v: loss(v[inverse], targets))(values)  # summed per row
        table = pallas_pinned.scatter_to_host(table, rows, values - lr * grads,
                                              mode="drop", **promise)

    The result equals the add's ``table.at[ids].add(-lr * per_entry_grads)`` up
    to float rounding: each row's gradients are summed by ``jax.grad`` through
    ``v[inverse]`` (in XLA's order) instead of by the add. On the H200 see the
    README's sparse-training client (``ours_distinct``).

    Args:
      indices: a 1-D integer array of row indices (axis 0) of a buffer with
        ``num_rows`` rows, in device memory or host memory.
      num_rows: the buffer's ``shape[0]``.
      mode: how out-of-range entries are normalized, as for :func:`sort_indices`
        (``None``, ``"drop"``, ``"fill"``: still out of range, an entry becomes
        the marker every op skips; ``"clip"``; ``"promise_in_bounds"``).

    Returns:
      ``rows``: the distinct normalized rows, ascending, of the widest integer
      type jax computes with, as long as ``indices``, padded at the end with
      the skip marker (one past the last row, so still ascending; -1 for a
      buffer of more rows than that type holds), which every op with
      ``mode="drop"`` or ``"fill"`` skips or fills. Only the marker repeats, so
      ``unique_indices=True`` and ``indices_are_sorted=True`` hold for every op
      on them (the ops mask the marker wherever it stands). ``inverse``: int32
      positions with ``rows[inverse] == normalized(indices)``.

    Raises:
      TypeError: ``indices`` are not integers.
      ValueError: as :func:`sort_indices`.
    """
    _check("distinct_indices", indices, num_rows, mode)
    return _distinct(indices, int(num_rows), mode, tuning.current().runs_rank_max)


def _check(name: str, indices, num_rows, mode) -> None:
    shape, dtype = jnp.shape(indices), jnp.result_type(indices)
    if not jnp.issubdtype(dtype, jnp.integer):
        raise TypeError(f"{name} takes integer indices, got {dtype}")
    if len(shape) != 1:
        raise ValueError(
            f"{name} takes 1-D indices of axis 0, got shape {shape}; ravel a batch "
            "first (and the per-entry data with it)"
        )
    if isinstance(num_rows, bool) or not isinstance(num_rows, int | np.integer) or num_rows < 1:
        raise ValueError(
            f"num_rows must be a positive int (the buffer's shape[0]), got {num_rows!r}"
        )
    if mode not in _MODES:
        raise ValueError(
            f"{name} mode must be one of {_MODES}, got {mode!r}; for 'wrap', pass "
            "jnp.mod(indices, num_rows)"
        )


@functools.partial(jax.jit, static_argnums=(1, 2, 3))
def _sort(indices, num_rows: int, mode: str | None, rank_max: int):
    # Index arrays may live in host memory; the ordering runs on the device.
    rows = _rows.normalize_rows(_placement.to_device_memory(indices), num_rows, mode)
    return _rows.stable_order(rows, small_max=rank_max)


@functools.partial(jax.jit, static_argnums=(1, 2, 3))
def _distinct(indices, num_rows: int, mode: str | None, rank_max: int):
    rows = _rows.normalize_rows(_placement.to_device_memory(indices), num_rows, mode)
    n = rows.shape[0]
    if n == 0:
        return rows, jnp.zeros((0,), jnp.int32)
    ordered, order = _rows.stable_order(rows, small_max=rank_max)
    marker = _rows.skip_row(num_rows, rows.dtype)
    # Runs of equal sorted rows; the markers' run (a -1 marker sorts first) is no row.
    real = ordered != marker
    starts = real & jnp.concatenate([jnp.ones((1,), bool), ordered[1:] != ordered[:-1]])
    run = jnp.cumsum(starts, dtype=jnp.int32) - 1  # each sorted entry's distinct position
    # With a marker among the entries at most n - 1 rows are distinct: the last
    # place is padding, which holds the marker.
    run = jnp.where(real, run, n - 1)
    distinct = jnp.full((n,), marker, rows.dtype).at[jnp.where(starts, run, n)].set(
        ordered, mode="drop", unique_indices=True
    )
    inverse = jnp.zeros((n,), jnp.int32).at[order].set(run, unique_indices=True)
    return distinct, inverse
