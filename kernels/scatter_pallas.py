"""Pallas kernel that writes rows into a buffer in place: ``x[rows[k]] = updates[src[k]]``.

The buffer ``x`` is an operand of ``pallas_call`` aliased to its only output,
so the kernel receives the buffer's own pointer: when ``x`` lives in
``pinned_host`` memory, every store is a PCIe write straight into host memory
and the buffer is never copied.

Operands (all prepared on the device by the caller):

* ``rows``  ``(n,)`` int: destination row of each update, in the order the
  kernel should write them (ascending after coalescing). Rows outside
  ``[0, num_rows)`` are skipped unless ``check_bounds=False``. Valid rows
  must be distinct: programs run in parallel.
* ``src``   ``(n,)`` int32 or ``None``: which row of ``updates`` goes to
  ``rows[k]``; ``None`` means ``k`` itself.
* ``updates`` ``(m, d)`` of ``x.dtype``, in device memory.
* ``x``     ``(num_rows, d)``: the buffer, any memory space.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental.pallas import triton as plgpu

from .pallas_common import RowTiling, call_row_kernel, choose_row_tiling, skip_row, tile_lanes

__all__ = ["scatter_rows", "scatter_rows_kernel"]


def scatter_rows_kernel(
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
):
    """Writes one ``block_rows x block_cols`` tile of update rows into ``x``."""
    del x_in_ref  # Aliased to x_out_ref: the same buffer.
    tile = tile_lanes(
        rows_ref,
        src_ref,
        num_entries=num_updates,
        num_rows=num_rows,
        row_width=row_width,
        block_rows=block_rows,
        block_cols=block_cols,
        check_bounds=check_bounds,
    )
    values = plgpu.load(updates_ref.at[tile.order[:, None], tile.cols[None, :]], mask=tile.mask)
    # Masked-off lanes point past the end, never at a real element: interpret
    # mode emulates a masked store with a scatter that writes back the old
    # value, which would race a real write to the same element.
    dest = jnp.where(tile.row_ok, tile.rows, skip_row(num_rows, tile.rows.dtype))
    plgpu.store(x_out_ref.at[dest[:, None], tile.cols[None, :]], values, mask=tile.mask)


def scatter_rows(
    x: jax.Array,
    rows: jax.Array,
    src: jax.Array | None,
    updates: jax.Array,
    *,
    check_bounds: bool = True,
    tiling: RowTiling | None = None,
    interpret: bool = False,
) -> jax.Array:
    """Builds and calls the kernel. Traced inside a ``jit``: the result aliases ``x``."""
    num_rows, row_width = x.shape
    (num_updates,) = rows.shape
    tiling = tiling or choose_row_tiling(num_updates, row_width, x.dtype.itemsize)
    kernel = functools.partial(
        scatter_rows_kernel,
        num_updates=num_updates,
        num_rows=num_rows,
        row_width=row_width,
        block_rows=tiling.block_rows,
        block_cols=tiling.block_cols,
        check_bounds=check_bounds,
    )
    return call_row_kernel(
        kernel,
        (rows, src, updates, x),
        out_shape=x.shape,
        num_entries=num_updates,
        row_width=row_width,
        tiling=tiling,
        alias_last=True,
        interpret=interpret,
        name="pallas_pinned_scatter_rows",
    )
