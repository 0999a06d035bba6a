"""Pallas (Triton backend) kernel that adds rows into a buffer in place.

Same layout and launch as :mod:`scatter_pallas` (the buffer ``x`` is aliased
to the only output, so a ``pinned_host`` buffer is read and written over PCIe
and never copied), except that each program reads the destination rows,
adds the update rows in an accumulator type and writes the sums back.

The caller must make the valid rows distinct (duplicates are combined on the
device first): programs run in parallel, and two read-add-write sequences on
the same row would lose one of the additions.

* ``rows``  ``(n,)`` int: destination row of each update, ascending after
  coalescing. Rows outside ``[0, num_rows)`` are skipped unless
  ``check_bounds=False``.
* ``src``   ``(n,)`` int32, optional: which row of ``updates`` goes to
  ``rows[k]``; ``None`` means ``k`` itself.
* ``updates`` ``(m, d)``: update rows in device memory, ``x.dtype`` or the
  accumulator type.
* ``x``     ``(num_rows, d)``: the buffer, any memory space.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental.pallas import triton as plgpu

from .scatter_pallas import (
    ScatterTiling,
    call_row_kernel,
    choose_scatter_tiling,
    skip_row,
    tile_lanes,
)

__all__ = ["choose_scatter_add_tiling", "scatter_add_rows", "scatter_add_rows_kernel"]


def choose_scatter_add_tiling(n: int, d: int, itemsize: int) -> ScatterTiling:
    """Tile sizes for ``n`` read-add-write rows of ``d`` elements.

    The scatter heuristic for now; results never depend on the tiling.
    """
    return choose_scatter_tiling(n, d, itemsize)


def scatter_add_rows_kernel(
    rows_ref,
    src_ref,
    updates_ref,
    x_in_ref,
    x_out_ref,
    *,
    num_updates: int,
    num_rows: int,
    row_width: int,
    block_rows: int,
    block_cols: int,
    check_bounds: bool,
    acc_dtype,
):
    """Adds one ``block_rows x block_cols`` tile of update rows into ``x``."""
    # Aliased to x_out_ref: the same buffer. Reading through the output ref
    # is what interpret mode also supports (it seeds the output with x).
    del x_in_ref
    rows, src, cols, row_ok, mask = tile_lanes(
        rows_ref,
        src_ref,
        num_updates=num_updates,
        num_rows=num_rows,
        row_width=row_width,
        block_rows=block_rows,
        block_cols=block_cols,
        check_bounds=check_bounds,
    )
    # Masked-off lanes point past the end, never at a real element (see the
    # scatter kernel: interpret mode writes old values back on masked lanes).
    dest = jnp.where(row_ok, rows, skip_row(num_rows, rows.dtype))
    addend = plgpu.load(updates_ref.at[src[:, None], cols[None, :]], mask=mask, other=0)
    current = plgpu.load(x_out_ref.at[dest[:, None], cols[None, :]], mask=mask, other=0)
    total = current.astype(acc_dtype) + addend.astype(acc_dtype)
    plgpu.store(
        x_out_ref.at[dest[:, None], cols[None, :]], total.astype(x_out_ref.dtype), mask=mask
    )


def scatter_add_rows(
    x: jax.Array,
    rows: jax.Array,
    src: jax.Array | None,
    updates: jax.Array,
    *,
    acc_dtype=None,
    check_bounds: bool = True,
    tiling: ScatterTiling | None = None,
    interpret: bool = False,
) -> jax.Array:
    """Builds and calls the kernel: ``x[rows[k]] += updates[src[k]]``.

    ``x`` must be 2-D ``(num_rows, d)`` and ``updates`` ``(m, d)``; the sum is
    formed in ``acc_dtype`` (default ``x.dtype``) and rounded to ``x.dtype``
    once. Valid rows must be distinct. Meant to be traced inside a ``jit``:
    the result aliases ``x``.
    """
    num_rows, row_width = x.shape
    (num_updates,) = rows.shape
    acc_dtype = jnp.dtype(x.dtype if acc_dtype is None else acc_dtype)
    if tiling is None:
        itemsize = max(x.dtype.itemsize, updates.dtype.itemsize)
        tiling = choose_scatter_add_tiling(num_updates, row_width, itemsize)
    kernel = functools.partial(
        scatter_add_rows_kernel,
        num_updates=num_updates,
        num_rows=num_rows,
        row_width=row_width,
        block_rows=tiling.block_rows,
        block_cols=tiling.block_cols,
        check_bounds=check_bounds,
        acc_dtype=acc_dtype,
    )
    return call_row_kernel(
        kernel,
        x,
        rows,
        src,
        updates,
        tiling=tiling,
        interpret=interpret,
        name="pallas_pinned_scatter_add_rows",
    )
