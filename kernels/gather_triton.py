"""Raw Triton kernel, launched through jax-triton, that reads rows of a buffer.

The Triton backend of :mod:`gather_pallas`, with exactly its contract (see
:func:`gather_rows_triton`); launch, tiling checks and the import guard live
in :mod:`triton_common`. The buffer ``x`` is a plain operand (no aliasing),
so the kernel receives the buffer's own pointer: when ``x`` lives in
``pinned_host`` memory every load is a PCIe read straight from host memory
and the buffer is never copied. The output is an ordinary device array.

Data layout seen by the kernel (all prepared on the device by the caller):

* ``rows`` ``(n,)`` int32 or int64: source row of each output row, in the
  order the kernel should read them (ascending after sorting). Rows outside
  ``[0, num_rows)`` are not read; their output rows are zeros.
* ``dest`` ``(n,)`` int32, optional: which output row receives ``x[rows[k]]``;
  ``None`` means ``k`` itself. After sorting it is the inverse permutation,
  so the reads go out in ascending address order while the result lands in
  the caller's order without a second pass.
* ``x`` ``(num_rows, d)``: the buffer, any memory space.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from .triton_common import (
    LOAD_CACHE_MODIFIERS,
    TritonLaunch,
    TritonTiling,
    check_entries,
    launch,
    plan_rows,
    tile_entries,
    tile_mask,
    tl,
    triton,
)

__all__ = ["gather_rows_triton", "gather_rows_triton_kernel", "plan_gather_rows"]


@triton.jit
def gather_rows_triton_kernel(
    rows_ptr, dest_ptr, x_ptr, out_ptr,
    NUM_ENTRIES: tl.constexpr, NUM_ROWS: tl.constexpr, ROW_WIDTH: tl.constexpr,
    BLOCK_ROWS: tl.constexpr, BLOCK_COLS: tl.constexpr, HAS_PARTNER: tl.constexpr,
    AS_BYTES: tl.constexpr, CACHE_MODIFIER: tl.constexpr, EVICTION_POLICY: tl.constexpr,
):
    """Reads one ``BLOCK_ROWS x BLOCK_COLS`` tile: ``out[dest[k]] = x[rows[k]]``.

    Rows outside the buffer read nothing and write zeros. ``dest`` is the
    partner of ``triton_common.tile_entries`` (``HAS_PARTNER``). ``AS_BYTES`` (bool
    buffers, which jax-triton types ``*i1``) copies raw bytes, as the
    scatter kernel does.
    """
    entry_ok, rows, dest, row_ok, cols = tile_entries(
        rows_ptr, dest_ptr, NUM_ENTRIES, NUM_ROWS, ROW_WIDTH, BLOCK_ROWS, BLOCK_COLS,
        HAS_PARTNER, True,
    )
    if HAS_PARTNER:
        # dest is the caller's permutation of range(n); a bad one must still
        # never write outside the output.
        entry_ok = entry_ok & (dest >= 0) & (dest < NUM_ENTRIES)
    src_offsets = rows[:, None] * ROW_WIDTH + cols[None, :]
    dst_offsets = dest[:, None] * ROW_WIDTH + cols[None, :]
    if AS_BYTES:
        x_ptr = x_ptr.to(tl.pointer_type(tl.uint8), bitcast=True)
        out_ptr = out_ptr.to(tl.pointer_type(tl.uint8), bitcast=True)
    # Masked lanes never touch memory and read as zero.
    values = tl.load(
        x_ptr + src_offsets,
        mask=tile_mask(row_ok, cols, ROW_WIDTH, BLOCK_COLS),
        other=0,
        cache_modifier=CACHE_MODIFIER,
        eviction_policy=EVICTION_POLICY,
    )
    tl.store(out_ptr + dst_offsets, values, mask=tile_mask(entry_ok, cols, ROW_WIDTH, BLOCK_COLS))


def plan_gather_rows(
    x_shape: tuple[int, int], dtype, num_gathers: int, *, rows_dtype=jnp.int32,
    has_dest: bool = True, tiling: TritonTiling | None = None,
) -> TritonLaunch:
    """The static launch of :func:`gather_rows_triton` (see :func:`triton_common.plan_rows`)."""
    return plan_rows(
        gather_rows_triton_kernel, "gather_rows", x_shape, dtype, num_gathers,
        rows_dtype=rows_dtype, has_partner=has_dest, data_dtypes=(dtype,), in_place=False,
        cache_modifiers=LOAD_CACHE_MODIFIERS, tiling=tiling,
    )


def gather_rows_triton(
    x: jax.Array, rows: jax.Array, dest: jax.Array | None = None, *,
    tiling: TritonTiling | None = None,
) -> jax.Array:
    """Launches the Triton gather kernel: ``out[dest[k]] = x[rows[k]]``.

    Same contract as :func:`pallas_pinned.kernels.gather_pallas.gather_rows`:
    ``x`` is 2-D ``(num_rows, d)`` in any memory space, ``rows`` ``(n,)``
    int32/int64, ``dest`` ``(n,)`` int32, a permutation of ``range(n)``, or
    ``None``. Returns ``(n, d)`` of ``x.dtype`` in device memory, with zeros
    where ``rows[k]`` is outside ``[0, num_rows)``. Meant to be traced inside
    a CUDA ``jit``; ``x`` is only read. ``tiling.cache_modifier`` and
    ``eviction_policy`` go to the loads from ``x``.

    Raises:
      TypeError, ValueError: for operands or a tiling the kernel cannot take.
      ImportError, NotImplementedError: where jax-triton cannot launch
        (see :func:`triton_common.check_can_launch`).
    """
    check_entries(x, rows, dest, partner_name="dest")
    plan = plan_gather_rows(
        x.shape, x.dtype, rows.shape[0], rows_dtype=rows.dtype, has_dest=dest is not None,
        tiling=tiling,
    )
    return launch(plan, rows, dest, x)
