"""Pallas kernel that reads rows of a buffer into device memory: ``out[dest[k]] = x[rows[k]]``.

The buffer ``x`` is a plain operand of ``pallas_call`` (no aliasing), so the
kernel receives the buffer's own pointer: when ``x`` lives in ``pinned_host``
memory every load is a PCIe read straight from host memory and the buffer is
never copied. The output is an ordinary ``(n, d)`` device array.

Operands (all prepared on the device by the caller):

* ``rows`` ``(n,)`` int: source row of each output row, in the order the
  kernel should read them (ascending after coalescing). Rows outside
  ``[0, num_rows)`` are not read; their output rows are zeros.
* ``dest`` ``(n,)`` int32 or ``None``: which output row receives ``x[rows[k]]``;
  ``None`` means ``k`` itself. After sorting it is the inverse permutation,
  so the reads go out in ascending address order while the result lands in
  the caller's order without a second pass.
* ``x`` ``(num_rows, d)``: the buffer, any memory space.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from .pallas_common import RowGrid, RowTiling, choose_row_tiling, row_kernel_call, tile_lanes

__all__ = ["gather_rows", "gather_rows_kernel"]


def gather_rows_kernel(rows_ref, dest_ref, x_ref, out_ref, *, grid: RowGrid):
    """Reads one ``block_rows x block_cols`` tile of ``x`` rows into ``out``."""
    tile = tile_lanes(rows_ref, dest_ref, grid, check_bounds=True)  # Never reads outside x.
    # Rows that are not read still get a real address (row 0): a masked load
    # never touches memory on the GPU, and interpret mode clamps anyway.
    safe_rows = jnp.where(tile.row_ok, tile.rows, 0)
    # Typed, so that bool stays bool in interpret mode (a weak 0 promotes it).
    values = plgpu.load(
        x_ref.at[safe_rows[:, None], tile.cols[None, :]],
        mask=tile.mask,
        other=jnp.zeros((), x_ref.dtype),
    )
    # Every existing entry stores (zeros where its row is out of range). Lanes
    # past the end of the batch point past the end of the output: interpret
    # mode emulates a masked store with a scatter that writes back the old
    # value, which must never land on a real output row.
    dest = jnp.where(tile.entry_ok, tile.order, grid.num_entries)
    plgpu.store(out_ref.at[dest[:, None], tile.cols[None, :]], values, mask=tile.entry_mask)


def gather_rows(
    x: jax.Array, rows: jax.Array, dest: jax.Array | None = None, *,
    tiling: RowTiling | None = None, interpret: bool = False,
) -> jax.Array:
    """Builds and calls the kernel; the ``(n, d)`` result is in device memory."""
    (num_gathers,) = rows.shape
    tiling = tiling or choose_row_tiling(num_gathers, x.shape[1], x.dtype.itemsize)
    body, arrays, params = row_kernel_call(
        gather_rows_kernel, (rows, dest, x), tiling=tiling, in_place=False,
    )
    call = pl.pallas_call(body, name="pallas_pinned_gather_rows", interpret=interpret, **params)
    return call(*arrays)
