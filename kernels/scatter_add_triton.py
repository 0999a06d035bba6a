"""Raw Triton kernel, launched through jax-triton, that adds rows into a buffer in place.

The Triton backend of :mod:`scatter_add_pallas`, with exactly its contract
(see :func:`scatter_add_rows_triton`); launch, tiling checks and the import
guard live in :mod:`triton_common`. Same layout and launch as
:mod:`scatter_triton` (``x`` aliased to the only output, so a ``pinned_host``
buffer is read and written over PCIe and never copied), except that each
program reads the destination rows, adds the update rows in an accumulator
type and writes the sums back.

The caller must make the valid rows distinct (duplicates are combined on the
device first): programs run in parallel, and two read-add-write sequences on
the same row would lose one of the additions.

* ``rows``  ``(n,)`` int32 or int64: destination row of each update. Rows
  outside ``[0, num_rows)`` are skipped unless ``check_bounds=False``.
* ``src``   ``(n,)`` int32, optional: which row of ``updates`` goes to
  ``rows[k]``; ``None`` means ``k`` itself.
* ``updates`` ``(m, d)``: update rows in device memory, ``x.dtype`` or the
  accumulator type.
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
    element_type,
    grid,
    launch,
    tile_entries,
    tile_mask,
    tiling_for_tile_bytes,
    tl,
    triton,
)

__all__ = [
    "choose_scatter_add_triton_tiling",
    "plan_scatter_add_rows",
    "scatter_add_rows_triton",
    "scatter_add_rows_triton_kernel",
]


def choose_scatter_add_triton_tiling(n: int, d: int, itemsize: int) -> TritonTiling:
    """Tile sizes for ``n`` read-add-write rows of ``d`` elements.

    ``itemsize`` is the widest of the buffer, update and accumulator types:
    the accumulator is what the registers hold. About 16 KiB per program, a
    column block up to 4 KiB, as for the scatter. Results never depend on
    the tiling; only speed does. Sizes: those of
    the Pallas kernels, a choice: the H200 tiling sweep found tile shape and
    warp count changing nothing beyond noise there, and the loop benchmark
    measured this backend within 5 % of Pallas for 64 Ki-row batches
    (benchmarks/results/loop_h200.json).
    """
    return tiling_for_tile_bytes(n, d, itemsize, tile_bytes=16 * 1024, max_col_block_bytes=4096)


@triton.jit
def scatter_add_rows_triton_kernel(
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
    ACC_TYPE: tl.constexpr,
    CACHE_MODIFIER: tl.constexpr,
    EVICTION_POLICY: tl.constexpr,
):
    """Adds one ``BLOCK_ROWS x BLOCK_COLS`` tile: ``x[rows[k]] += updates[src[k]]``.

    ``x_in_ptr`` is the same buffer as ``x_out_ptr`` (aliased) and unused:
    both the read and the write go through the output's pointer. The sum is
    formed in ``ACC_TYPE`` and rounded once (to nearest even, Triton's
    default for float narrowing, as XLA's convert); integer sums wrap.
    """
    _, rows, src, row_ok, cols = tile_entries(
        rows_ptr, src_ptr, NUM_UPDATES, NUM_ROWS, ROW_WIDTH, BLOCK_ROWS, BLOCK_COLS,
        HAS_SRC, CHECK_BOUNDS,
    )
    mask = tile_mask(row_ok, cols, ROW_WIDTH, BLOCK_COLS)
    x_offsets = rows[:, None] * ROW_WIDTH + cols[None, :]
    src_offsets = src[:, None] * ROW_WIDTH + cols[None, :]
    # Masked lanes neither load nor store, so their values never matter.
    addend = tl.load(updates_ptr + src_offsets, mask=mask)
    current = tl.load(x_out_ptr + x_offsets, mask=mask, eviction_policy=EVICTION_POLICY)
    total = current.to(ACC_TYPE) + addend.to(ACC_TYPE)
    tl.store(
        x_out_ptr + x_offsets,
        total.to(x_out_ptr.dtype.element_ty),
        mask=mask,
        cache_modifier=CACHE_MODIFIER,
        eviction_policy=EVICTION_POLICY,
    )


def plan_scatter_add_rows(
    x_shape: tuple[int, int],
    dtype,
    num_updates: int,
    *,
    updates_dtype=None,
    acc_dtype=None,
    rows_dtype=jnp.int32,
    has_src: bool = True,
    check_bounds: bool = True,
    tiling: TritonTiling | None = None,
) -> TritonLaunch:
    """The static launch of :func:`scatter_add_rows_triton`, from shapes and dtypes alone.

    ``updates_dtype`` and ``acc_dtype`` default to ``dtype``.
    ``triton_common.compile_for_target(plan_scatter_add_rows(...))`` compiles
    exactly the kernel that call launches, without a GPU.
    """
    num_rows, row_width = x_shape
    dtype = jnp.dtype(dtype)
    acc_dtype = dtype if acc_dtype is None else jnp.dtype(acc_dtype)
    updates_dtype = dtype if updates_dtype is None else jnp.dtype(updates_dtype)
    for what, t in (("x", dtype), ("acc_dtype", acc_dtype)):
        check_element_dtype(t, what)
        if t == jnp.bool_:
            raise TypeError(f"the Triton add kernel does not add bool ({what}); there is no sum")
    if updates_dtype not in (dtype, acc_dtype):
        raise ValueError(
            f"updates must be of x's dtype {dtype} or the accumulator's {acc_dtype}, "
            f"got {updates_dtype}"
        )
    if tiling is None:
        itemsize = max(dtype.itemsize, updates_dtype.itemsize, acc_dtype.itemsize)
        tiling = choose_scatter_add_triton_tiling(num_updates, row_width, itemsize)
    check_tiling(tiling, num_updates, row_width, cache_modifiers=STORE_CACHE_MODIFIERS)
    rows_dtype = jnp.dtype(rows_dtype)
    # triton_call takes only arrays; without src, rows fills its slot unread.
    src_dtype = jnp.dtype(jnp.int32) if has_src else rows_dtype
    return TritonLaunch(
        kernel=scatter_add_rows_triton_kernel,
        name="pallas_pinned_scatter_add_rows_triton",
        operand_dtypes=(rows_dtype, src_dtype, updates_dtype, dtype),
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
            ACC_TYPE=element_type(acc_dtype),
            CACHE_MODIFIER=tiling.cache_modifier,
            EVICTION_POLICY=tiling.eviction_policy,
        ),
    )


def scatter_add_rows_triton(
    x: jax.Array,
    rows: jax.Array,
    src: jax.Array | None,
    updates: jax.Array,
    *,
    acc_dtype=None,
    check_bounds: bool = True,
    tiling: TritonTiling | None = None,
) -> jax.Array:
    """Launches the Triton add kernel: ``x[rows[k]] += updates[src[k]]``.

    Same contract as :func:`pallas_pinned.kernels.scatter_add_pallas.scatter_add_rows`:
    ``x`` is 2-D ``(num_rows, d)``, ``rows`` ``(n,)`` int32/int64 whose valid
    entries are distinct, ``src`` ``(n,)`` int32 or ``None``, ``updates``
    ``(m, d)`` of ``x.dtype`` or ``acc_dtype``. The sum is formed in
    ``acc_dtype`` (default ``x.dtype``; callers pass float32 for 16-bit
    floats) and rounded to ``x.dtype`` once; integer sums wrap. With
    ``check_bounds`` rows outside ``[0, num_rows)`` are skipped; without it
    the caller promises there are none. Meant to be traced inside a CUDA
    ``jit``: the result aliases ``x`` (donate it, or XLA copies it first) and
    is declared in device memory (see :func:`triton_common.launch`).
    ``tiling.cache_modifier`` goes to the stores into ``x``,
    ``eviction_policy`` to its loads and stores.

    Raises:
      TypeError, ValueError: for operands or a tiling the kernel cannot take.
      ImportError, NotImplementedError: where jax-triton cannot launch
        (see :func:`triton_common.check_can_launch`).
    """
    check_entries(x, rows, src, partner_name="src")
    acc_dtype = x.dtype if acc_dtype is None else jnp.dtype(acc_dtype)
    check_updates(x, rows, src, updates, dtypes=(x.dtype, acc_dtype))
    plan = plan_scatter_add_rows(
        x.shape, x.dtype, rows.shape[0], updates_dtype=updates.dtype, acc_dtype=acc_dtype,
        rows_dtype=rows.dtype, has_src=src is not None, check_bounds=check_bounds,
        tiling=tiling,
    )
    if x.shape[0] == 0:  # No row to add to (launch() still says if it could not).
        check_can_launch()
        return x
    return launch(plan, rows, rows if src is None else src, updates, x)
