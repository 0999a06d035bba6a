"""Plain-jnp references, one beside each kernel.

They define the semantics the kernels must match and double as the XLA
fallback for buffers that are not in pinned host memory of a GPU (device
memory, CPU-only JAX). Duplicate rows resolve deterministically: the last
occurrence in ``indices`` (row-major order) wins.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from pallas_pinned._indexing import skip_row

__all__ = ["dedupe_last_wins", "scatter_rows_reference"]


def dedupe_last_wins(rows: jax.Array, num_rows: int, *, presorted: bool = False):
    """Orders rows ascending and keeps only the last occurrence of each.

    Returns ``(rows, src)``: ``rows`` ascending with every superseded or
    out-of-range entry replaced by :func:`skip_row`, and ``src`` the position
    in the input each entry came from. With ``presorted=True`` the input is
    taken to be ascending already and ``src`` is ``None`` (the identity).
    """
    if presorted:
        src = None
    else:
        # A stable sort keeps equal rows in their original order, so the last
        # of each run is the last occurrence in the input.
        rows, src = lax.sort((rows, lax.iota(jnp.int32, rows.shape[0])), num_keys=1, is_stable=True)
    superseded = jnp.concatenate([rows[:-1] == rows[1:], jnp.zeros((1,), bool)])
    rows = jnp.where(superseded, skip_row(num_rows, rows.dtype), rows)
    return rows, src


def scatter_rows_reference(
    x: jax.Array, rows: jax.Array, updates: jax.Array, *, unique: bool = False
) -> jax.Array:
    """``x[rows[k]] = updates[k]`` for a 2-D ``x`` and normalized ``rows``.

    ``rows`` are already normalized (see ``normalize_rows``): skip markers and
    any other out-of-range row are dropped. Duplicates: last occurrence wins.
    """
    num_rows = x.shape[0]
    if not unique and rows.shape[0] > 1:
        rows, src = dedupe_last_wins(rows, num_rows)
        updates = updates[src]
    # Negative skip markers must not wrap: map them past the end.
    rows = jnp.where(rows < 0, num_rows, rows) if num_rows < jnp.iinfo(rows.dtype).max else rows
    return x.at[rows].set(updates, mode="drop", unique_indices=True)
