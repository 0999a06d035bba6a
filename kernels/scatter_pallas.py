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

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from .pallas_common import (
    RowGrid,
    RowTiling,
    choose_row_tiling,
    dest_rows,
    duplicates_possible,
    for_chunks,
    matching_entries,
    one_launch_tiling,
    raw_entries,
    row_kernel_call,
    tile_lanes,
    when,
)

__all__ = [
    "scatter_rows",
    "scatter_rows_fused",
    "scatter_rows_fused_kernel",
    "scatter_rows_kernel",
]


def scatter_rows_kernel(
    rows_ref, src_ref, updates_ref, x_in_ref, x_out_ref, *, grid: RowGrid, check_bounds: bool
):
    """Writes one ``block_rows x block_cols`` tile of update rows into ``x``."""
    del x_in_ref  # Aliased to x_out_ref: the same buffer.
    tile = tile_lanes(rows_ref, src_ref, grid, check_bounds=check_bounds)
    values = plgpu.load(updates_ref.at[tile.order[:, None], tile.cols[None, :]], mask=tile.mask)
    dest = dest_rows(tile.rows, tile.row_ok, grid.num_rows)
    plgpu.store(x_out_ref.at[dest[:, None], tile.cols[None, :]], values, mask=tile.mask)


def scatter_rows(
    x: jax.Array, rows: jax.Array, src: jax.Array | None, updates: jax.Array, *,
    check_bounds: bool = True, tiling: RowTiling | None = None, interpret: bool = False,
) -> jax.Array:
    """Builds and calls the kernel. Traced inside a ``jit``: the result aliases ``x``."""
    (num_updates,) = rows.shape
    tiling = tiling or choose_row_tiling(num_updates, x.shape[1], x.dtype.itemsize)
    body, arrays, params = row_kernel_call(
        scatter_rows_kernel, (rows, src, updates, x), tiling=tiling, in_place=True,
        check_bounds=check_bounds,
    )
    call = pl.pallas_call(body, name="pallas_pinned_scatter_rows", interpret=interpret, **params)
    return call(*arrays)


# --- one launch for small batches: normalization and de-duplication inside ---
#
# For a few thousand updates or fewer, the fixed costs of a call decide its
# speed: each XLA op around the kernel (wrapping negative indices, the bounds
# test, resolving duplicates) is a launch of its own. This variant takes the
# caller's raw indices and does all of that per program: it normalizes its own
# entries and drops each one that a LATER entry of the batch writes again
# (comparing against every later entry, chunk by chunk), so the last writer
# wins without a sort and the whole call is a single launch. The comparisons
# grow as n**2 / block_rows, which is why only small batches take this path.


def scatter_rows_fused_kernel(
    indices_ref, updates_ref, x_in_ref, x_out_ref, *, grid: RowGrid, chunk: int,
    mode: str | None, distinct: str | None,
):
    """Writes one tile of raw-indexed updates; entries superseded later are skipped."""
    del x_in_ref  # Aliased to x_out_ref: the same buffer.
    num_updates, num_rows = grid.num_entries, grid.num_rows
    first, k, cols, rows, row_ok = raw_entries(indices_ref, grid, mode)
    cols_ok = (cols < grid.row_width)[None, :]
    # Masked by the batch's end only, not by the rows: the load then goes out
    # beside the index loads instead of after them and the search.
    values = plgpu.load(
        updates_ref.at[k[:, None], cols[None, :]], mask=(k < num_updates)[:, None] & cols_ok
    )
    num_chunks = pl.cdiv(num_updates, chunk)

    def search_chunk(c, superseded):
        j = c * chunk + jnp.arange(chunk)
        hit = matching_entries(
            indices_ref, j, rows, num_entries=num_updates, num_rows=num_rows, mode=mode
        ) & (j[None, :] > k[:, None])
        return jnp.maximum(superseded, jnp.max(hit.astype(jnp.int32), axis=1))

    def search(superseded):
        # Only later entries can supersede: start at this program's own chunk.
        return for_chunks(first // chunk, num_chunks, num_chunks, search_chunk, superseded)

    possible = duplicates_possible(indices_ref, num_updates, chunk, distinct)
    superseded = when(possible, search, jnp.zeros((grid.block_rows,), jnp.int32))
    row_ok = row_ok & (superseded == 0)
    dest = dest_rows(rows, row_ok, num_rows)
    plgpu.store(x_out_ref.at[dest[:, None], cols[None, :]], values, mask=row_ok[:, None] & cols_ok)


def scatter_rows_fused(
    x: jax.Array,
    indices: jax.Array,
    updates: jax.Array,
    *,
    mode: str | None,
    distinct: str | None = None,
    tiling: RowTiling | None = None,
    interpret: bool = False,
) -> jax.Array:
    """``x.at[indices].set(updates, mode=mode)`` in one launch, the last duplicate winning.

    ``indices`` are the caller's raw ``(n,)`` int32/int64 indices (negative
    ones wrap once; ``num_rows`` must fit their type); ``updates`` ``(n, d)``
    of ``x.dtype``. ``distinct`` (:data:`~.pallas_common.DISTINCT`): what the caller
    promises of the rows; the duplicate search runs where they may repeat. Traced
    inside a ``jit``: the result aliases ``x``.
    """
    tiling, chunk = one_launch_tiling(x.shape, indices, x.dtype.itemsize, tiling)
    body, arrays, params = row_kernel_call(
        scatter_rows_fused_kernel, (indices, updates, x), tiling=tiling, in_place=True,
        chunk=chunk, mode=mode, distinct=distinct,
    )
    call = pl.pallas_call(body, name="pallas_pinned_scatter_rows_fused", interpret=interpret,
                          **params)
    return call(*arrays)
