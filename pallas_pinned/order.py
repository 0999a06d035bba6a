"""``sort_indices``: one order of a batch of row indices, shared by several ops on those rows."""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from pallas_pinned import _index_lists, _placement, _rows, _validation

__all__ = ["sort_indices"]

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
    add sums each row's run of a stable order (more than the smaller of
    ``tuning.current().fused_max_unpromised_adds`` and ``fused_max_updates``
    entries, on the kernels); up to that the kernels' one-launch add groups its
    sums by position, so the last bits of a row with repeated ids may differ. The
    order is XLA's stable sort (the Pallas add orders up to ``order_kernel_max``
    entries in one kernel launch instead, with the same result). docs/PERFORMANCE.md
    gives what it saves in the sparse-training client (``ours_sorted`` against ``ours``).

    Args:
      indices: a 1-D integer array (or list) of row indices (axis 0) of a buffer with
        ``num_rows`` rows, in device memory or host memory.
      num_rows: the buffer's ``shape[0]``.
      mode: how out-of-range entries are normalized, matching the ``mode`` the
        ops will get: ``None``, ``"drop"`` or ``"fill"`` (negative entries wrap
        once; still out of range, they become one marker that every op skips
        or fills: pass ``mode="drop"`` or ``"fill"`` to the ops then, since
        jnp's default read mode clamps); ``"clip"`` (clamped into range);
        ``"promise_in_bounds"`` (negative entries wrap once, the rest are left
        as they are: the caller promises they are in range).

    Returns:
      ``sorted_indices``: the normalized indices in ascending order (stable:
      equal indices keep their input order), unsigned, of the width of the widest
      integer type jax computes with (uint32, uint64 with x64): no index is negative, so
      the ops take ``indices_are_sorted=True`` at its word (of a signed index type they
      use it only where they can check that no index is negative: README, "How it
      differs from jnp"); ``order``: int32 positions with ``sorted_indices ==
      normalized[order]``. Permute per-entry data with ``data[order]``.

    Raises:
      TypeError: ``indices`` are not integers, not an array, list or tuple, or a list
        holding traced values.
      OverflowError: ``num_rows`` is past what the index type numbers (2**31 - 1
        without ``jax_enable_x64``), as the ops refuse such a buffer.
      ValueError: ``indices`` are not 1-D, a ragged list, or a deleted array;
        ``num_rows`` is not a positive integer, or ``mode`` is not one of the
        above (``"wrap"``: take ``jnp.mod(indices, num_rows)`` first).
    """
    _validation.check_arguments_alive(indices=indices)
    if isinstance(indices, list | tuple):  # As the ops take a list of positions.
        indices = _index_lists.positions_array(indices)
    if not hasattr(indices, "dtype"):
        raise TypeError(
            f"sort_indices takes a 1-D integer array or list, got {type(indices).__name__}"
        )
    shape, dtype = jnp.shape(indices), jnp.dtype(indices.dtype)
    if not jnp.issubdtype(dtype, jnp.integer):
        raise TypeError(f"sort_indices takes integer indices, got {dtype}")
    if len(shape) != 1:
        raise ValueError(
            f"sort_indices takes 1-D indices of axis 0, got shape {shape}; ravel a batch "
            "first (and the per-entry data with it)"
        )
    if isinstance(num_rows, bool) or not isinstance(num_rows, int | np.integer) or num_rows < 1:
        raise ValueError(
            f"num_rows must be a positive int (the buffer's shape[0]), got {num_rows!r}"
        )
    if mode not in _MODES:
        raise ValueError(
            f"sort_indices mode must be one of {_MODES}, got {mode!r}; for 'wrap', pass "
            "jnp.mod(indices, num_rows)"
        )
    _rows.check_rows_addressable(int(num_rows), subject=f"num_rows is {num_rows}")
    if isinstance(indices, np.ndarray):
        # As the ops narrow host indices: saturating, so that a value past the index
        # type stays out of range (jax would truncate it onto a real row).
        indices = _rows.widen(_rows.without_sub_byte(indices))
    ordered = _sort(indices, int(num_rows), mode)
    if not _placement.is_concrete(indices):
        return ordered
    return _placement.wait_for_result(ordered)  # Pinned indices must outlive their read.


@functools.partial(jax.jit, static_argnums=(1, 2))
def _sort(indices, num_rows: int, mode: str | None):
    # Index arrays may live in host memory; the ordering runs on the device, over
    # every entry (sharded over a mesh, they are gathered).
    indices = _placement.gathered(_placement.to_device_memory(indices))
    rows = _rows.normalize_rows(indices, num_rows, mode)
    ordered, order = _rows.stable_order(rows)
    # Normalized rows are never negative (a "promise_in_bounds" index the caller broke
    # aside): unsigned, they say so to the ops' promise rule.
    return ordered.astype(jnp.dtype(f"uint{8 * ordered.dtype.itemsize}")), order
