"""Pallas kernel that adds rows into a buffer in place: ``x[rows[k]] += updates[src[k]]``.

Same operands and launch as :mod:`.scatter_pallas` (the buffer ``x`` is aliased
to the only output, so a ``pinned_host`` buffer is read and written over PCIe
and never copied), except that each program reads the destination rows, adds
the update rows in an accumulator type and writes the sums back, rounded once.

The caller must make the valid rows distinct (duplicates are combined on the
device first): programs run in parallel, and two read-add-write sequences on
the same row would lose one of the additions. ``updates`` may be of
``x.dtype`` or of the accumulator type.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.experimental.pallas import triton as plgpu

from .pallas_common import (
    RowGrid,
    RowTiling,
    choose_row_tiling,
    dest_rows,
    launch_row_kernel,
    tile_lanes,
)

__all__ = ["scatter_add_rows", "scatter_add_rows_kernel"]


def scatter_add_rows_kernel(
    rows_ref, src_ref, updates_ref, x_in_ref, x_out_ref, *, grid: RowGrid, check_bounds: bool,
    acc_dtype,
):
    """Adds one ``block_rows x block_cols`` tile of update rows into ``x``."""
    # Aliased to x_out_ref: the same buffer. Reading through the output ref
    # is what interpret mode also supports (it seeds the output with x).
    del x_in_ref
    tile = tile_lanes(rows_ref, src_ref, grid, check_bounds=check_bounds)
    dest = dest_rows(tile.rows, tile.row_ok, grid.num_rows)
    source = updates_ref.at[tile.order[:, None], tile.cols[None, :]]
    target = x_out_ref.at[dest[:, None], tile.cols[None, :]]
    addend = plgpu.load(source, mask=tile.mask, other=0)
    current = plgpu.load(target, mask=tile.mask, other=0)
    total = current.astype(acc_dtype) + addend.astype(acc_dtype)
    plgpu.store(target, total.astype(x_out_ref.dtype), mask=tile.mask)


def scatter_add_rows(
    x: jax.Array, rows: jax.Array, src: jax.Array | None, updates: jax.Array, *,
    acc_dtype=None, check_bounds: bool = True, tiling: RowTiling | None = None,
    interpret: bool = False,
) -> jax.Array:
    """Builds and calls the kernel; sums in ``acc_dtype`` (default ``x.dtype``).

    Traced inside a ``jit``: the result aliases ``x``.
    """
    (num_updates,) = rows.shape
    acc_dtype = jnp.dtype(x.dtype if acc_dtype is None else acc_dtype)
    itemsize = max(x.dtype.itemsize, updates.dtype.itemsize)
    tiling = tiling or choose_row_tiling(num_updates, x.shape[1], itemsize)
    return launch_row_kernel(
        scatter_add_rows_kernel, (rows, src, updates, x), tiling=tiling, in_place=True,
        interpret=interpret, name="pallas_pinned_scatter_add_rows", check_bounds=check_bounds,
        acc_dtype=acc_dtype,
    )
