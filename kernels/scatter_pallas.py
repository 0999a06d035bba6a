"""Pallas (Triton backend) kernel that writes rows into a buffer in place.

The buffer ``x`` is an operand of ``pallas_call`` aliased to its only output,
so the kernel receives the buffer's own pointer: when ``x`` lives in
``pinned_host`` memory, every store is a PCIe write straight into host memory
and the buffer is never copied.

Data layout seen by the kernel (all prepared on the device by the caller):

* ``rows``  ``(n,)`` int: destination row of each update, in the order the
  kernel should write them (ascending after coalescing). Rows outside
  ``[0, num_rows)`` are skipped unless ``check_bounds=False``.
* ``src``   ``(n,)`` int32, optional: which row of ``updates`` goes to
  ``rows[k]``; ``None`` means ``k`` itself (no permutation).
* ``updates`` ``(m, d)``: update rows in device memory.
* ``x``     ``(num_rows, d)``: the buffer, any memory space.

The grid is ``(cdiv(n, block_rows), cdiv(d, block_cols))``; program ``(i, j)``
writes the ``block_rows x block_cols`` tile of rows ``i*block_rows...`` and
columns ``j*block_cols...``. Consecutive programs write consecutive (sorted)
rows, so the stores reach the PCIe bus in ascending address order.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

__all__ = [
    "ScatterTiling",
    "call_row_kernel",
    "offsets_fit",
    "choose_scatter_tiling",
    "scatter_rows",
    "scatter_rows_kernel",
    "skip_row",
    "tile_lanes",
]

# A tile moves about this many bytes: enough independent stores per program
# to keep PCIe writes in flight, small enough to keep registers in check.
_TILE_BYTES = 16 * 1024
# Widest column block, in bytes; wider rows are split across programs.
_MAX_COL_BLOCK_BYTES = 4096


@dataclasses.dataclass(frozen=True)
class ScatterTiling:
    """Static launch settings of the scatter kernel."""

    block_rows: int
    block_cols: int
    num_warps: int


def offsets_fit(shape: tuple[int, ...], dtype) -> bool:
    """Whether Pallas's Triton lowering computes correct offsets for ``shape``.

    It switches to 64-bit offsets only for buffers over 2**32 bytes and counts
    offsets in elements with signed arithmetic, so a 1-byte dtype between 2**31
    and 2**32 elements would wrap to negative offsets: outside the buffer.
    """
    size = math.prod(shape)
    return not (jnp.dtype(dtype).itemsize == 1 and 2**31 < size <= 2**32)


def _next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def choose_scatter_tiling(n: int, d: int, itemsize: int) -> ScatterTiling:
    """Picks power-of-two tile sizes for ``n`` rows of ``d`` elements.

    Results never depend on the tiling; only speed does.
    """
    block_cols = min(_next_pow2(d), max(1, _MAX_COL_BLOCK_BYTES // itemsize))
    rows_per_tile = max(1, _TILE_BYTES // (block_cols * itemsize))
    block_rows = min(_next_pow2(max(n, 1)), _next_pow2(rows_per_tile))
    num_warps = 8 if block_rows * block_cols * itemsize >= 8192 else 4
    return ScatterTiling(block_rows, block_cols, num_warps)


def skip_row(num_rows: int, dtype) -> int:
    # One past the end when it is representable; interpret mode drops it.
    return num_rows if num_rows <= jnp.iinfo(dtype).max else -1


def tile_lanes(
    rows_ref, src_ref, *, num_updates, num_rows, row_width, block_rows, block_cols, check_bounds
):
    """This program's tile: its destination rows, source rows and masks.

    Returns ``(rows, src, cols, row_ok, mask)``: ``row_ok`` marks update
    slots that exist and (with ``check_bounds``) point inside the buffer;
    ``mask`` is ``row_ok`` crossed with the columns inside the row.
    """
    k = pl.program_id(0) * block_rows + jnp.arange(block_rows)
    cols = pl.program_id(1) * block_cols + jnp.arange(block_cols)
    k_ok = k < num_updates
    cols_ok = cols < row_width
    rows = plgpu.load(rows_ref.at[k], mask=k_ok, other=-1)
    src = k if src_ref is None else plgpu.load(src_ref.at[k], mask=k_ok, other=0)
    row_ok = k_ok
    if check_bounds:
        row_ok = row_ok & (rows >= 0)
        if num_rows <= jnp.iinfo(rows.dtype).max:
            row_ok = row_ok & (rows < num_rows)
    mask = row_ok[:, None] & cols_ok[None, :]
    return rows, src, cols, row_ok, mask


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
    values = plgpu.load(updates_ref.at[src[:, None], cols[None, :]], mask=mask)
    # Masked-off lanes point past the end, never at a real element: interpret
    # mode emulates a masked store with a scatter that writes back the old
    # value, which would race a real write to the same element.
    dest = jnp.where(row_ok, rows, skip_row(num_rows, rows.dtype))
    plgpu.store(x_out_ref.at[dest[:, None], cols[None, :]], values, mask=mask)


def scatter_rows(
    x: jax.Array,
    rows: jax.Array,
    src: jax.Array | None,
    updates: jax.Array,
    *,
    check_bounds: bool = True,
    tiling: ScatterTiling | None = None,
    interpret: bool = False,
) -> jax.Array:
    """Builds and calls the scatter kernel: ``x[rows[k]] = updates[src[k]]``.

    ``x`` must be 2-D ``(num_rows, d)`` and ``updates`` ``(m, d)`` of the same
    dtype. Meant to be traced inside a ``jit``: the result aliases ``x``.
    """
    num_rows, row_width = x.shape
    (num_updates,) = rows.shape
    if tiling is None:
        tiling = choose_scatter_tiling(num_updates, row_width, x.dtype.itemsize)
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
        x,
        rows,
        src,
        updates,
        tiling=tiling,
        interpret=interpret,
        name="pallas_pinned_scatter_rows",
    )


def call_row_kernel(kernel, x, rows, src, updates, *, tiling, interpret, name):
    """Launches a ``kernel(rows, src, updates, x_in, x_out)`` tile by tile.

    Every operand stays in its own memory space (``pl.ANY``: the kernel does
    its own addressing), and ``x`` is aliased to the only output, so for a
    pinned ``x`` the kernel writes host memory in place.
    """
    grid = (pl.cdiv(rows.shape[0], tiling.block_rows), pl.cdiv(x.shape[1], tiling.block_cols))
    any_spec = pl.BlockSpec(memory_space=pl.ANY)
    if src is None:
        # pallas_call needs arrays, so a missing permutation is bound as None
        # inside the kernel instead of being passed.
        body = lambda r, u, xi, xo: kernel(r, None, u, xi, xo)  # noqa: E731
        operands = (rows, updates, x)
    else:
        body = kernel
        operands = (rows, src, updates, x)
    return pl.pallas_call(
        body,
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        grid=grid,
        in_specs=[any_spec] * len(operands),
        out_specs=any_spec,
        input_output_aliases={len(operands) - 1: 0},
        compiler_params=plgpu.CompilerParams(num_warps=tiling.num_warps, num_stages=1),
        interpret=interpret,
        name=name,
    )(*operands)
