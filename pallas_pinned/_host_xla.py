"""XLA's own row reads and writes, for buffers in any memory space.

XLA wants the operands of one op in one memory space. For a buffer in host
memory the small index (and the written rows) go to the host for the access
alone; the buffer is never moved, and all arithmetic stays on the device.
These are the fallbacks of the kernel paths and the XLA backend.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from pallas_pinned import _placement
from pallas_pinned._rows import rows_in_range
from pallas_pinned.reference import gather_rows_reference

__all__ = ["gather_rows", "set_distinct_rows"]

_HOST = jax.memory.Space.Host


def gather_rows(x2d: jax.Array, rows: jax.Array) -> jax.Array:
    """``(n, d)`` rows of ``x2d`` in device memory; zeros where ``rows`` is out of range."""
    if not _placement.on_host(x2d):
        return gather_rows_reference(x2d, rows)
    valid = rows_in_range(rows, x2d.shape[0])
    host_rows = jax.device_put(jnp.where(valid, rows, 0), _HOST)
    picked = jnp.take(x2d, host_rows, axis=0, mode="clip")
    # The barrier keeps XLA from moving a later reshape of the result back
    # across the copy (a reshape that adds a size-1 axis can become a bitcast
    # between memory spaces, which XLA then refuses).
    picked = jax.lax.optimization_barrier(jax.device_put(picked, jax.memory.Space.Device))
    return jnp.where(valid[:, None], picked, jnp.zeros((), x2d.dtype))


def set_distinct_rows(x2d: jax.Array, rows: jax.Array, values: jax.Array) -> jax.Array:
    """``x2d[rows[k]] = values[k]`` for distinct valid rows; skip markers are dropped."""
    if _placement.on_host(x2d):
        rows, values = jax.device_put(rows, _HOST), jax.device_put(values, _HOST)
    return x2d.at[rows].set(
        values, mode="drop", unique_indices=True, wrap_negative_indices=False
    )
