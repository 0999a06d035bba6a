"""Pallas (Triton backend) kernel that reads rows of a buffer into device memory.

The buffer ``x`` is a plain operand of ``pallas_call`` (``memory_space=pl.ANY``,
no aliasing), so the kernel receives the buffer's own pointer: when ``x``
lives in ``pinned_host`` memory every load is a PCIe read straight from host
memory and the buffer is never copied. The output is an ordinary device array.

Data layout seen by the kernel (all prepared on the device by the caller):

* ``rows`` ``(n,)`` int: source row of each output row, in the order the
  kernel should read them (ascending after coalescing). Rows outside
  ``[0, num_rows)`` are not read; their output rows are zeros.
* ``dest`` ``(n,)`` int32, optional: which output row receives ``x[rows[k]]``;
  ``None`` means ``k`` itself. After sorting it is the inverse permutation,
  so the reads go out in ascending address order while the result lands in
  the caller's order without a second pass.
* ``x`` ``(num_rows, d)``: the buffer, any memory space.

The grid is ``(cdiv(n, block_rows), cdiv(d, block_cols))``; program ``(i, j)``
reads the ``block_rows x block_cols`` tile of rows ``rows[i*block_rows...]``
and columns ``j*block_cols...``.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from .scatter_pallas import ScatterTiling, choose_scatter_tiling

__all__ = ["choose_gather_tiling", "gather_rows", "gather_rows_kernel"]


def choose_gather_tiling(n: int, d: int, itemsize: int) -> ScatterTiling:
    """Tile sizes for reading ``n`` rows of ``d`` elements.

    Same heuristic as the scatter kernel for now: about 16 KiB per program
    keeps enough PCIe reads in flight to cover their round-trip latency.
    Results never depend on the tiling; only speed does.
    """
    return choose_scatter_tiling(n, d, itemsize)


def gather_rows_kernel(
    rows_ref,
    dest_ref,
    x_ref,
    out_ref,
    *,
    num_gathers: int,
    num_rows: int,
    row_width: int,
    block_rows: int,
    block_cols: int,
):
    """Reads one ``block_rows x block_cols`` tile of ``x`` rows into ``out``."""
    k = pl.program_id(0) * block_rows + jnp.arange(block_rows)
    cols = pl.program_id(1) * block_cols + jnp.arange(block_cols)
    k_ok = k < num_gathers
    cols_ok = cols < row_width
    rows = plgpu.load(rows_ref.at[k], mask=k_ok, other=0)
    dest = k if dest_ref is None else plgpu.load(dest_ref.at[k], mask=k_ok, other=0)
    row_ok = k_ok & (rows >= 0)
    if num_rows <= jnp.iinfo(rows.dtype).max:
        row_ok = row_ok & (rows < num_rows)
    # Rows that are not read still get a real address (row 0): a masked load
    # never touches memory on the GPU, and interpret mode clamps anyway.
    safe_rows = jnp.where(row_ok, rows, 0)
    values = plgpu.load(
        x_ref.at[safe_rows[:, None], cols[None, :]],
        mask=row_ok[:, None] & cols_ok[None, :],
        # Typed, so that bool stays bool in interpret mode (a weak 0 promotes it).
        other=jnp.zeros((), x_ref.dtype),
    )
    # Lanes past the end of the batch point past the end of the output:
    # interpret mode emulates a masked store with a scatter that writes back
    # the old value, which must never land on a real output row.
    dest = jnp.where(k_ok, dest, num_gathers)
    plgpu.store(
        out_ref.at[dest[:, None], cols[None, :]],
        values,
        mask=k_ok[:, None] & cols_ok[None, :],
    )


def gather_rows(
    x: jax.Array,
    rows: jax.Array,
    dest: jax.Array | None = None,
    *,
    tiling: ScatterTiling | None = None,
    interpret: bool = False,
) -> jax.Array:
    """Builds and calls the gather kernel: ``out[dest[k]] = x[rows[k]]``.

    ``x`` must be 2-D ``(num_rows, d)``; the result is ``(n, d)`` of
    ``x.dtype`` in device memory, with zeros where ``rows[k]`` is out of
    range. ``dest`` must be a permutation of ``range(n)`` (or ``None``).
    """
    num_rows, row_width = x.shape
    (num_gathers,) = rows.shape
    if tiling is None:
        tiling = choose_gather_tiling(num_gathers, row_width, x.dtype.itemsize)
    kernel = functools.partial(
        gather_rows_kernel,
        num_gathers=num_gathers,
        num_rows=num_rows,
        row_width=row_width,
        block_rows=tiling.block_rows,
        block_cols=tiling.block_cols,
    )
    grid = (pl.cdiv(num_gathers, tiling.block_rows), pl.cdiv(row_width, tiling.block_cols))
    any_spec = pl.BlockSpec(memory_space=pl.ANY)
    if dest is None:
        # pallas_call needs arrays, so a missing permutation is bound as None
        # inside the kernel instead of being passed.
        body = lambda r, xr, o: kernel(r, None, xr, o)  # noqa: E731
        operands = (rows, x)
    else:
        body = kernel
        operands = (rows, dest, x)
    return pl.pallas_call(
        body,
        out_shape=jax.ShapeDtypeStruct((num_gathers, row_width), x.dtype),
        grid=grid,
        in_specs=[any_spec] * len(operands),
        out_specs=any_spec,
        compiler_params=plgpu.CompilerParams(num_warps=tiling.num_warps, num_stages=1),
        interpret=interpret,
        name="pallas_pinned_gather_rows",
    )(*operands)
