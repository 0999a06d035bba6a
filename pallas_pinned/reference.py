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

__all__ = ["dedupe_last_wins", "drop_superseded_small", "scatter_rows_reference"]


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


def drop_superseded_small(rows: jax.Array, num_rows: int) -> jax.Array:
    """Marks every row written again later as skipped, keeping the input order.

    Same survivors as :func:`dedupe_last_wins` without a sort: an ``n x n``
    comparison that XLA fuses with the index normalization, so for a handful
    of updates no sort kernel is launched. Quadratic: small batches only.
    """
    n = rows.shape[0]
    later = jnp.arange(n)[None, :] > jnp.arange(n)[:, None]
    superseded = jnp.any((rows[:, None] == rows[None, :]) & later, axis=1)
    return jnp.where(superseded, skip_row(num_rows, rows.dtype), rows)


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


# --- gather_from_host and scatter_add_to_host ------------------------------

__all__ += [
    "add_accumulator_dtype",
    "combine_duplicates",
    "gather_rows_reference",
    "rows_in_range",
    "scatter_add_rows_reference",
    "segmented_prefix_sum",
]


def add_accumulator_dtype(dtype) -> jnp.dtype:
    """The type sums are formed in: float32 for 16-bit floats, else ``dtype``.

    Integer sums wrap modulo 2**bits as in jnp, whatever the order.
    """
    dtype = jnp.dtype(dtype)
    if dtype in (jnp.dtype(jnp.float16), jnp.dtype(jnp.bfloat16)):
        return jnp.dtype(jnp.float32)
    return dtype


def rows_in_range(rows: jax.Array, num_rows: int) -> jax.Array:
    """Which normalized rows point at a real row (skip markers do not)."""
    ok = rows >= 0
    if num_rows <= jnp.iinfo(rows.dtype).max:
        ok &= rows < num_rows
    return ok


def gather_rows_reference(x: jax.Array, rows: jax.Array) -> jax.Array:
    """``x[rows[k]]`` for a 2-D ``x`` and normalized ``rows``; zeros where out of range."""
    num_rows, width = x.shape
    if num_rows == 0:
        return jnp.zeros((rows.shape[0], width), x.dtype)
    valid = rows_in_range(rows, num_rows)
    picked = jnp.take(x, jnp.where(valid, rows, 0), axis=0, mode="clip")
    return jnp.where(valid[:, None], picked, jnp.zeros((), x.dtype))


def segmented_prefix_sum(run_ids: jax.Array, values: jax.Array) -> jax.Array:
    """Inclusive prefix sums of the ``(n, d)`` values within runs of equal ``run_ids``.

    ``run_ids`` must not decrease (each run is one contiguous stretch).
    Log-step (Hillis-Steele) scan: step ``i`` adds the entry ``2**i`` places
    back when it belongs to the same run. The order of additions depends on
    ``n`` alone (no atomics), so the same input always gives the same bits;
    as a loop it also compiles fast.
    """
    n = run_ids.shape[0]
    zeros = jnp.zeros_like(values)

    def add_from_behind(step, sums):
        shift = jnp.left_shift(1, step)
        behind = lax.dynamic_slice_in_dim(jnp.concatenate([zeros, sums]), n - shift, n)
        # A run id below every real one marks "nothing that far back".
        ids_behind = lax.dynamic_slice_in_dim(
            jnp.concatenate([jnp.full_like(run_ids, -1), run_ids]), n - shift, n
        )
        same_run = ids_behind == run_ids
        return jnp.where(same_run[:, None], sums + behind, sums)

    return lax.fori_loop(0, max(0, (n - 1).bit_length()), add_from_behind, values)


def combine_duplicates(
    rows: jax.Array, values: jax.Array, num_rows: int, *, presorted: bool = False
):
    """Sums the ``(n, d)`` value rows of equal rows, in a fixed order.

    Returns ``(rows, totals)``: ``rows`` ascending with every entry but the
    last of each run replaced by :func:`skip_row`, and ``totals`` holding at
    that last entry the sum of the run (see :func:`segmented_prefix_sum`: the
    same input always gives the same bits). With ``presorted=True`` the rows
    are taken to ascend already.
    """
    if not presorted:
        # Stable, so the order of equal rows (and hence the sum) is fixed.
        rows, perm = lax.sort(
            (rows, lax.iota(jnp.int32, rows.shape[0])), num_keys=1, is_stable=True
        )
        values = values[perm]
    changes = rows[1:] != rows[:-1]
    # Runs are stretches of adjacent equal rows; should a broken "presorted"
    # promise leave equal rows apart, they stay separate runs, never merged.
    run_ids = jnp.concatenate([jnp.zeros((1,), jnp.int32), jnp.cumsum(changes, dtype=jnp.int32)])
    totals = segmented_prefix_sum(run_ids, values)
    last = jnp.concatenate([changes, jnp.ones((1,), bool)])
    return jnp.where(last, rows, skip_row(num_rows, rows.dtype)), totals


def scatter_add_rows_reference(
    x: jax.Array, rows: jax.Array, updates: jax.Array, *, unique: bool = False
) -> jax.Array:
    """``x[rows[k]] += updates[k]`` for a 2-D ``x`` and normalized ``rows``.

    Duplicates are combined with :func:`combine_duplicates`, then each row is
    read, added in :func:`add_accumulator_dtype` and rounded once, exactly as
    the kernel does. Skip markers and other out-of-range rows are dropped.
    """
    num_rows = x.shape[0]
    acc = add_accumulator_dtype(x.dtype)
    values = updates.astype(acc)
    if not unique and rows.shape[0] > 1:
        rows, values = combine_duplicates(rows, values, num_rows)
    summed = (gather_rows_reference(x, rows).astype(acc) + values).astype(x.dtype)
    # Skip markers (past the end, or -1 for huge buffers) must be dropped, not wrapped.
    return x.at[rows].set(summed, mode="drop", unique_indices=True, wrap_negative_indices=False)
