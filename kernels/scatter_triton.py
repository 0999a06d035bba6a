"""Raw Triton kernel, launched through jax-triton, that writes rows into a buffer in place.

The Triton backend of :mod:`scatter_pallas`, with exactly its contract (see
:func:`scatter_rows_triton`); launch, plan, tiling and the import guard live
in :mod:`triton_common`. The buffer ``x`` is the result, updated in place
(aliased with jax-triton 0.3, a Ref with 0.4), so the kernel receives the
buffer's own pointer: when ``x`` lives in ``pinned_host`` memory every store
is a PCIe write straight into host memory and the buffer is never copied.
The same kernel, with ``ADD``, is :mod:`scatter_add_triton`'s.

Data layout seen by the kernel (all prepared on the device by the caller):

* ``rows``  ``(n,)`` int32 or int64: destination row of each update, in the
  order the kernel should write them. Rows outside ``[0, num_rows)`` are
  skipped unless ``check_bounds=False``.
* ``src``   ``(n,)`` int32, optional: which row of ``updates`` goes to
  ``rows[k]``; ``None`` means ``k`` itself.
* ``updates`` ``(m, d)``: update rows in device memory, ``x``'s dtype (for
  the add, ``x``'s or the accumulator's).
* ``x``     ``(num_rows, d)``: the buffer, any memory space.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from .triton_common import (
    STORE_CACHE_MODIFIERS,
    TritonLaunch,
    TritonTiling,
    check_entries,
    check_updates,
    element_type,
    launch,
    plan_rows,
    tile_entries,
    tile_mask,
    tl,
    triton,
)

__all__ = ["plan_scatter_rows", "scatter_rows_triton", "scatter_rows_triton_kernel"]


@triton.jit
def scatter_rows_triton_kernel(
    rows_ptr, src_ptr, updates_ptr, x_in_ptr, x_ptr,
    NUM_ENTRIES: tl.constexpr, NUM_ROWS: tl.constexpr, ROW_WIDTH: tl.constexpr,
    BLOCK_ROWS: tl.constexpr, BLOCK_COLS: tl.constexpr, HAS_PARTNER: tl.constexpr,
    CHECK_BOUNDS: tl.constexpr, ADD: tl.constexpr, ACC_TYPE: tl.constexpr,
    AS_BYTES: tl.constexpr, CACHE_MODIFIER: tl.constexpr, EVICTION_POLICY: tl.constexpr,
):
    """Writes one ``BLOCK_ROWS x BLOCK_COLS`` tile: ``x[rows[k]] = updates[src[k]]``.

    With ``ADD``, ``x[rows[k]] += updates[src[k]]`` instead: the sum is
    formed in ``ACC_TYPE`` and rounded once (to nearest even, Triton's
    default for float narrowing, as XLA's convert); integer sums wrap; the
    read of ``x`` takes ``EVICTION_POLICY`` too. ``x_ptr`` is the buffer;
    ``x_in_ptr`` is unused (jax-triton 0.3 passes the same buffer there, 0.4
    a placeholder: see ``triton_common.launch``). ``src`` is the partner of
    ``triton_common.tile_entries`` (``HAS_PARTNER``). ``AS_BYTES`` (bool
    buffers, which jax-triton types ``*i1``; never with ``ADD``) copies raw
    bytes: through an ``i1`` pointer Triton loads a byte, compares it with
    zero and widens it back before every store (twice the PTX).
    """
    _, rows, src, row_ok, cols = tile_entries(
        rows_ptr, src_ptr, NUM_ENTRIES, NUM_ROWS, ROW_WIDTH, BLOCK_ROWS, BLOCK_COLS,
        HAS_PARTNER, CHECK_BOUNDS,
    )
    mask = tile_mask(row_ok, cols, ROW_WIDTH, BLOCK_COLS)
    x_offsets = rows[:, None] * ROW_WIDTH + cols[None, :]
    src_offsets = src[:, None] * ROW_WIDTH + cols[None, :]
    if AS_BYTES:
        updates_ptr = updates_ptr.to(tl.pointer_type(tl.uint8), bitcast=True)
        x_ptr = x_ptr.to(tl.pointer_type(tl.uint8), bitcast=True)
    # Masked lanes neither load nor store, so their values never matter.
    values = tl.load(updates_ptr + src_offsets, mask=mask)
    if ADD:
        current = tl.load(x_ptr + x_offsets, mask=mask, eviction_policy=EVICTION_POLICY)
        values = (current.to(ACC_TYPE) + values.to(ACC_TYPE)).to(x_ptr.dtype.element_ty)
    tl.store(
        x_ptr + x_offsets,
        values,
        mask=mask,
        cache_modifier=CACHE_MODIFIER,
        eviction_policy=EVICTION_POLICY,
    )


def plan_scatter_rows(
    x_shape: tuple[int, int], dtype, num_updates: int, *, rows_dtype=jnp.int32,
    has_src: bool = True, check_bounds: bool = True, tiling: TritonTiling | None = None,
) -> TritonLaunch:
    """The static launch of :func:`scatter_rows_triton` (see :func:`triton_common.plan_rows`)."""
    return plan_rows(
        scatter_rows_triton_kernel, "scatter_rows", x_shape, dtype, num_updates,
        rows_dtype=rows_dtype, has_partner=has_src, data_dtypes=(dtype, dtype), in_place=True,
        cache_modifiers=STORE_CACHE_MODIFIERS, tiling=tiling,
        CHECK_BOUNDS=check_bounds, ADD=False, ACC_TYPE=element_type(dtype),
    )


def scatter_rows_triton(
    x: jax.Array, rows: jax.Array, src: jax.Array | None, updates: jax.Array, *,
    check_bounds: bool = True, tiling: TritonTiling | None = None,
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
    return launch(plan, rows, src, updates, x)
