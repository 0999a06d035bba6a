"""Plain-jnp references, one beside each kernel.

They define the semantics the kernels must match bit for bit (one exception:
float sums of duplicate indices on Pallas's add, folded in entry order chunk
by chunk rather than in the reference's tree), and double as
the XLA path for buffers that are not in pinned host memory of a GPU (device
memory, CPU-only JAX). Each takes a 2-D ``x`` and rows already normalized by
``pallas_pinned._rows.normalize_rows`` (skip markers are dropped, never wrapped).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from pallas_pinned._rows import (
    COMBINERS,
    add_accumulator_dtype,
    combine_duplicates,
    dedupe_last_wins,
    rows_in_range,
)

__all__ = [
    "gather_rows_reference",
    "scatter_combine_rows_reference",
    "scatter_rows_reference",
]


def scatter_rows_reference(
    x: jax.Array, rows: jax.Array, updates: jax.Array, *, unique: bool = False
) -> jax.Array:
    """``x[rows[k]] = updates[k]``; duplicates: the last occurrence wins."""
    num_rows = x.shape[0]
    if not unique and rows.shape[0] > 1:
        rows, src = dedupe_last_wins(rows, num_rows)
        updates = updates[src]
    # Skip markers (past the end, or -1 for huge buffers) are dropped, never wrapped.
    return x.at[rows].set(updates, mode="drop", unique_indices=True, wrap_negative_indices=False)


def gather_rows_reference(x: jax.Array, rows: jax.Array) -> jax.Array:
    """``x[rows[k]]``; zeros where ``rows[k]`` is out of range."""
    num_rows, width = x.shape
    if num_rows == 0:
        return jnp.zeros((rows.shape[0], width), x.dtype)
    valid = rows_in_range(rows, num_rows)
    picked = jnp.take(x, jnp.where(valid, rows, 0), axis=0, mode="clip")
    return jnp.where(valid[:, None], picked, jnp.zeros((), x.dtype))


def scatter_combine_rows_reference(
    x: jax.Array, rows: jax.Array, updates: jax.Array, *, op: str, unique: bool = False
) -> jax.Array:
    """``x[rows[k]] = op(x[rows[k]], updates[k])``, duplicates combined first, as the kernels.

    ``op`` is ``"add"``, ``"mul"``, ``"min"`` or ``"max"``. Totals are formed
    in :func:`add_accumulator_dtype` and rounded once per row.
    """
    num_rows = x.shape[0]
    acc = add_accumulator_dtype(x.dtype, op)
    values = updates.astype(acc)
    if not unique and rows.shape[0] > 1:
        rows, values = combine_duplicates(rows, values, num_rows, op=op)
    merged = COMBINERS[op](gather_rows_reference(x, rows).astype(acc), values).astype(x.dtype)
    return x.at[rows].set(merged, mode="drop", unique_indices=True, wrap_negative_indices=False)
