"""A block of the buffer as one copy: ``dynamic_update_slice`` / ``dynamic_slice``.

For a buffer in host memory this is XLA's own asynchronous DMA (the update is
placed in host memory first, inside the jit, which is what XLA's host-offload
pass turns into a copy). Semantics are jnp's for the same index (``_index``
computes the clamped starts and whether a dropping or filling mode keeps the
block); updates other than a set read the block first and combine on the device.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from pallas_pinned import _placement, _rows
from pallas_pinned._index import IndexPlan

__all__ = ["read", "write"]


def _current(x, starts, sizes):
    """The block as it is, in device memory."""
    return _placement.to_device_memory(lax.dynamic_slice(x, starts, sizes))


def write(x: jax.Array, plan: IndexPlan, operands, updates, *, op: str, mode) -> jax.Array:
    """``x.at[index].<op>(updates, mode=mode)`` for a block plan."""
    starts, sizes, ok = plan.block(operands, mode, read=False)
    if ok is False:
        return x  # Statically out of range in a dropping mode: nothing is written.
    block = _rows.cast_updates(_placement.to_device_memory(updates), x.dtype)
    block = jnp.broadcast_to(block, plan.result_shape).reshape(sizes)
    current = None
    if op != "set":
        current = _current(x, starts, sizes)
        acc = _rows.add_accumulator_dtype(x.dtype, op)
        combine = _rows.COMBINERS[op]
        block = combine(current.astype(acc), block.astype(acc)).astype(x.dtype)
    if ok is not True:
        # A dropping mode and a start known only at run time: write the block
        # back unchanged when it does not fit (jnp drops the whole window).
        current = _current(x, starts, sizes) if current is None else current
        block = jnp.where(ok, block, current)
    split = _split_axis(x, block)
    if split is None:
        return lax.dynamic_update_slice(x, _placement.place_like(block, x), starts)
    # The block is all of x (its starts are 0): written in two parts, see _split_axis.
    rest = lax.slice_in_dim(block, 1, x.shape[split], axis=split)
    x = lax.dynamic_update_slice(
        x, _placement.place_like(rest, x), tuple(int(a == split) for a in range(x.ndim))
    )
    first = lax.slice_in_dim(block, 0, 1, axis=split)
    return lax.dynamic_update_slice(x, _placement.place_like(first, x), (0,) * x.ndim)


def _split_axis(x, block) -> int | None:
    """The axis to split a block as large as ``x`` along, on a mesh of ``Auto`` axes.

    XLA replaces an update slice as large as its operand by the update, so its
    result would take the update's sharding: on an ``Auto`` mesh (where ``x``'s
    type does not say how it is sharded) a row-sharded buffer came back
    replicated, every device holding all of it. Two update slices keep ``x``
    as their operand, and its sharding. None: one update slice is right.
    """
    if block.shape != x.shape:
        return None
    mesh = _placement.typed_mesh(x)
    auto = jax.sharding.AxisType.Auto
    kinds = zip(getattr(mesh, "axis_sizes", ()), getattr(mesh, "axis_types", ()), strict=True)
    if not any(size > 1 and kind == auto for size, kind in kinds):
        return None
    return next((a for a, size in enumerate(x.shape) if size > 1), None)


def read(x: jax.Array, plan: IndexPlan, operands, *, mode, fill) -> jax.Array:
    """``x.at[index].get(mode=mode, fill_value=fill)`` for a block plan, in device memory."""
    starts, sizes, ok = plan.block(operands, mode, read=True)
    block = _current(x, starts, sizes).reshape(plan.result_shape)
    if ok is not True:
        block = jnp.where(ok, block, lax.full_like(block, fill))
    return block
