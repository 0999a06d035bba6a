"""Raw Triton kernel, launched through jax-triton, that adds rows into a buffer in place.

The Triton backend of :mod:`scatter_add_pallas`, with exactly its contract
(see :func:`scatter_add_rows_triton`): :mod:`scatter_triton`'s kernel with
``ADD``, same layout and launch (``x`` is the result, updated in place, so a
``pinned_host`` buffer is read and written over PCIe and never copied),
except that each program reads the destination rows, adds the update rows in
an accumulator type and writes the sums back.

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

from .scatter_triton import scatter_rows_triton_kernel
from .triton_common import (
    STORE_CACHE_MODIFIERS,
    TritonLaunch,
    TritonTiling,
    check_element_dtype,
    check_entries,
    check_updates,
    element_type,
    launch,
    plan_rows,
)

__all__ = ["plan_scatter_add_rows", "scatter_add_rows_triton"]


def plan_scatter_add_rows(
    x_shape: tuple[int, int], dtype, num_updates: int, *, updates_dtype=None, acc_dtype=None,
    rows_dtype=jnp.int32, has_src: bool = True, check_bounds: bool = True,
    tiling: TritonTiling | None = None,
) -> TritonLaunch:
    """The static launch of :func:`scatter_add_rows_triton` (see :func:`triton_common.plan_rows`).

    ``updates_dtype`` and ``acc_dtype`` default to ``dtype``.
    """
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
    return plan_rows(
        scatter_rows_triton_kernel, "scatter_add_rows", x_shape, dtype, num_updates,
        rows_dtype=rows_dtype, has_partner=has_src, data_dtypes=(updates_dtype, dtype),
        in_place=True, cache_modifiers=STORE_CACHE_MODIFIERS, tiling=tiling,
        # The registers hold the accumulator: size the tile by the widest type.
        itemsize=max(dtype.itemsize, updates_dtype.itemsize, acc_dtype.itemsize),
        CHECK_BOUNDS=check_bounds, ADD=True, ACC_TYPE=element_type(acc_dtype),
    )


def scatter_add_rows_triton(
    x: jax.Array, rows: jax.Array, src: jax.Array | None, updates: jax.Array, *,
    acc_dtype=None, check_bounds: bool = True, tiling: TritonTiling | None = None,
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
    return launch(plan, rows, src, updates, x)
