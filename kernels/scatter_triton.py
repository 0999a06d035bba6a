"""Raw Triton kernel, launched through jax-triton, that writes rows into a buffer in place.

The Triton backend of :mod:`scatter_pallas`, with exactly its contract (see
:func:`scatter_rows_triton`); launch, tiling checks and the import guard live
in :mod:`triton_common`. The buffer ``x`` is aliased to the only output, so
the kernel receives the buffer's own pointer: when ``x`` lives in
``pinned_host`` memory every store is a PCIe write straight into host memory
and the buffer is never copied.

Data layout seen by the kernel (all prepared on the device by the caller):

* ``rows``  ``(n,)`` int32 or int64: destination row of each update, in the
  order the kernel should write them. Rows outside ``[0, num_rows)`` are
  skipped unless ``check_bounds=False``.
* ``src``   ``(n,)`` int32, optional: which row of ``updates`` goes to
  ``rows[k]``; ``None`` means ``k`` itself.
* ``updates`` ``(m, d)``: update rows in device memory, ``x``'s dtype.
* ``x``     ``(num_rows, d)``: the buffer, any memory space.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from .triton_common import (
    STORE_CACHE_MODIFIERS,
    TritonLaunch,
    TritonTiling,
    check_can_launch,
    check_element_dtype,
    check_entries,
    check_tiling,
    check_updates,
    grid,
    launch,
    tile_entries,
    tile_mask,
    tiling_for_tile_bytes,
    tl,
    triton,
)

__all__ = [
    "choose_scatter_triton_tiling",
    "plan_scatter_rows",
    "scatter_rows_triton",
    "scatter_rows_triton_kernel",
]


def choose_scatter_triton_tiling(n: int, d: int, itemsize: int) -> TritonTiling:
    """Tile sizes for writing ``n`` rows of ``d`` elements.

    About 16 KiB of stores per program keeps enough PCIe writes in flight;
    a column block covers a row up to 4 KiB. Results never depend on the
    tiling; only speed does. Sizes: those of
    the Pallas kernels, a choice: the H200 tiling sweep found tile shape and
    warp count changing nothing beyond noise there, and the loop benchmark
    measured this backend within 5 % of Pallas for 64 Ki-row batches
    (benchmarks/results/loop_h200.json).
    """
    return tiling_for_tile_bytes(n, d, itemsize, tile_bytes=16 * 1024, max_col_block_bytes=4096)


@triton.jit
def scatter_rows_triton_kernel(
    rows_ptr,
    src_ptr,
    updates_ptr,
    x_in_ptr,
    x_out_ptr,
    NUM_UPDATES: tl.constexpr,
    NUM_ROWS: tl.constexpr,
    ROW_WIDTH: tl.constexpr,
    BLOCK_ROWS: tl.constexpr,
    BLOCK_COLS: tl.constexpr,
    HAS_SRC: tl.constexpr,
    CHECK_BOUNDS: tl.constexpr,
    AS_BYTES: tl.constexpr,
    CACHE_MODIFIER: tl.constexpr,
    EVICTION_POLICY: tl.constexpr,
):
    """Writes one ``BLOCK_ROWS x BLOCK_COLS`` tile: ``x[rows[k]] = updates[src[k]]``.

    ``x_in_ptr`` is the same buffer as ``x_out_ptr`` (aliased) and unused.
    ``AS_BYTES`` (bool buffers, which jax-triton types ``*i1``) copies raw
    bytes: through an ``i1`` pointer Triton loads a byte, compares it with
    zero and widens it back before every store (twice the PTX).
    """
    _, rows, src, row_ok, cols = tile_entries(
        rows_ptr, src_ptr, NUM_UPDATES, NUM_ROWS, ROW_WIDTH, BLOCK_ROWS, BLOCK_COLS,
        HAS_SRC, CHECK_BOUNDS,
    )
    mask = tile_mask(row_ok, cols, ROW_WIDTH, BLOCK_COLS)
    dst_offsets = rows[:, None] * ROW_WIDTH + cols[None, :]
    src_offsets = src[:, None] * ROW_WIDTH + cols[None, :]
    if AS_BYTES:
        updates_ptr = updates_ptr.to(tl.pointer_type(tl.uint8), bitcast=True)
        x_out_ptr = x_out_ptr.to(tl.pointer_type(tl.uint8), bitcast=True)
    # Masked lanes neither load nor store, so their values never matter.
    values = tl.load(updates_ptr + src_offsets, mask=mask)
    tl.store(
        x_out_ptr + dst_offsets,
        values,
        mask=mask,
        cache_modifier=CACHE_MODIFIER,
        eviction_policy=EVICTION_POLICY,
    )


def plan_scatter_rows(
    x_shape: tuple[int, int],
    dtype,
    num_updates: int,
    *,
    rows_dtype=jnp.int32,
    has_src: bool = True,
    check_bounds: bool = True,
    tiling: TritonTiling | None = None,
) -> TritonLaunch:
    """The static launch of :func:`scatter_rows_triton`, from shapes and dtypes alone.

    ``triton_common.compile_for_target(plan_scatter_rows(...))`` compiles
    exactly the kernel that call launches, without a GPU.
    """
    num_rows, row_width = x_shape
    dtype = jnp.dtype(dtype)
    check_element_dtype(dtype, "x")
    if tiling is None:
        tiling = choose_scatter_triton_tiling(num_updates, row_width, dtype.itemsize)
    check_tiling(tiling, num_updates, row_width, cache_modifiers=STORE_CACHE_MODIFIERS)
    rows_dtype = jnp.dtype(rows_dtype)
    # triton_call takes only arrays; without src, rows fills its slot unread.
    src_dtype = jnp.dtype(jnp.int32) if has_src else rows_dtype
    return TritonLaunch(
        kernel=scatter_rows_triton_kernel,
        name="pallas_pinned_scatter_rows_triton",
        operand_dtypes=(rows_dtype, src_dtype, dtype, dtype),
        out_shape=(num_rows, row_width),
        out_dtype=dtype,
        aliased_operand=3,
        tiling=tiling,
        grid=grid(num_updates, row_width, tiling),
        constexprs=dict(
            NUM_UPDATES=num_updates,
            NUM_ROWS=num_rows,
            ROW_WIDTH=row_width,
            BLOCK_ROWS=tiling.block_rows,
            BLOCK_COLS=tiling.block_cols,
            HAS_SRC=has_src,
            CHECK_BOUNDS=check_bounds,
            AS_BYTES=dtype == jnp.bool_,
            CACHE_MODIFIER=tiling.cache_modifier,
            EVICTION_POLICY=tiling.eviction_policy,
        ),
    )


def scatter_rows_triton(
    x: jax.Array,
    rows: jax.Array,
    src: jax.Array | None,
    updates: jax.Array,
    *,
    check_bounds: bool = True,
    tiling: TritonTiling | None = None,
) -> jax.Array:
    """Launches the Triton scatter kernel: ``x[rows[k]] = updates[src[k]]``.

    Same contract as :func:`pallas_pinned.kernels.scatter_pallas.scatter_rows`:
    ``x`` is 2-D ``(num_rows, d)``, ``rows`` ``(n,)`` int32/int64 already
    normalized and de-duplicated (skip markers negative or past the end),
    ``src`` ``(n,)`` int32 or ``None``, ``updates`` ``(m, d)`` of ``x``'s
    dtype. With ``check_bounds`` rows outside ``[0, num_rows)`` are skipped;
    without it the caller promises there are none. Meant to be traced inside
    a CUDA ``jit``: the result aliases ``x`` (donate it, or XLA copies it
    first) and is declared in device memory (see :func:`triton_common.launch`).

    Raises:
      TypeError, ValueError: for operands or a tiling the kernel cannot take.
      NotImplementedError: where jax-triton cannot launch (a jaxlib without CUDA).
    """
    check_entries(x, rows, src, partner_name="src")
    check_updates(x, rows, src, updates, dtypes=(x.dtype,))
    plan = plan_scatter_rows(
        x.shape, x.dtype, rows.shape[0], rows_dtype=rows.dtype, has_src=src is not None,
        check_bounds=check_bounds, tiling=tiling,
    )
    if x.shape[0] == 0:  # No row to write (launch() still says if it could not).
        check_can_launch()
        return x
    return launch(plan, rows, rows if src is None else src, updates, x)
