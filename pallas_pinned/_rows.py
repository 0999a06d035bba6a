"""Row numbers on the device: normalization, skip markers, de-duplication, combining.

Everything here runs inside the traced op, before a kernel or the XLA path
sees the rows. Entries that must not be touched are marked with
:func:`skip_row` (one past the end), which every kernel masks and every XLA
path drops. A buffer of more rows than the index type numbers is refused
(:func:`check_rows_addressable`).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from pallas_pinned.kernels.row_layout import skip_row

__all__ = [
    "add_accumulator_dtype",
    "combine_duplicates",
    "dedupe_last_wins",
    "index_dtype",
    "check_rows_addressable",
    "normalize_rows",
    "rows_in_range",
    "COMBINERS",
    "segmented_scan",
    "skip_row",
    "stable_order",
    "to_wide_numpy",
    "widen",
]


def cast_updates(updates, dtype):
    """``updates`` in the buffer's ``dtype`` as jnp's scatter casts them: through the type
    the two promote to, then to ``dtype`` (where int64 meets uint64, that is float64:
    -1 into uint64 gives 0, as in jnp). Equal to a direct cast everywhere else."""
    updates = jnp.asarray(updates)
    return updates.astype(jnp.result_type(jnp.dtype(dtype), updates)).astype(dtype)


def index_dtype():
    """The widest integer type jax computes with right now (x64 or not)."""
    return jnp.dtype(jnp.int64 if jax.config.jax_enable_x64 else jnp.int32)


def without_sub_byte(a: Any) -> Any:
    """An integer array (or jax scalar) of a sub-byte type (int4 and kin) as int8 or uint8,
    which numpy's integer tools and its array building know; anything else as it is."""
    dtype = getattr(a, "dtype", None)
    if dtype is not None and jnp.issubdtype(dtype, jnp.integer) and jnp.iinfo(dtype).bits < 8:
        return a.astype(np.int8 if jnp.issubdtype(dtype, jnp.signedinteger) else np.uint8)
    return a


def to_wide_numpy(rows: np.ndarray, wide) -> np.ndarray:
    """Saturating cast of host indices to ``wide``.

    Values the wide type cannot hold are out of range for any buffer jax can
    index; saturation keeps them out of range instead of wrapping them onto a
    real row (jnp truncates instead: see the README's semantics).
    """
    info, have = np.iinfo(wide), np.iinfo(rows.dtype)
    if have.max > info.max:
        rows = np.minimum(rows, np.asarray(info.max).astype(rows.dtype))
    if have.min < info.min:
        rows = np.maximum(rows, info.min)
    return rows.astype(wide)


def to_wide(rows, wide):
    """``rows`` cast to the integer type ``wide``, saturating values above its range."""
    dtype = jnp.dtype(rows.dtype)
    info = jnp.iinfo(wide)
    if jnp.iinfo(dtype).max > info.max:
        # Unsigned of the same width: saturate before the cast so that huge
        # values stay out of range instead of wrapping to small rows.
        rows = jnp.where(rows > info.max, jnp.asarray(info.max, dtype), rows)
    return rows.astype(wide)


def widen(rows):
    """Flat rows of :func:`index_dtype`, saturating (host indices are wide already)."""
    if isinstance(rows, np.ndarray):
        return jnp.asarray(to_wide_numpy(rows.reshape(-1), index_dtype()))
    return to_wide(jnp.ravel(rows), index_dtype())


def normalize_rows(rows, num_rows: int, mode: str | None):
    """Wraps negatives once, then drops (marks) or clips out-of-range rows.

    Returns a flat array of :func:`index_dtype`. In ``"drop"`` mode (and
    ``None`` and ``"fill"``) rows still out of range become :func:`skip_row`; with
    ``"promise_in_bounds"`` they are left as they are (the caller promised).
    """
    wide = index_dtype()
    check_rows_addressable(num_rows)
    rows = widen(rows)
    rows = jnp.where(rows < 0, rows + jnp.asarray(num_rows, wide), rows)
    if mode == "clip":
        return jnp.clip(rows, 0, num_rows - 1)
    if mode == "promise_in_bounds":
        return rows
    return jnp.where(rows_in_range(rows, num_rows), rows, skip_row(num_rows, wide))


def check_rows_addressable(num_rows: int, *, subject: str = "") -> None:
    """Refuses, at trace time, rows that the index type cannot address.

    ``subject`` opens the message (default: ``x has <num_rows> rows along the
    indexed axes``), for callers whose argument is not ``x``.

    Without x64, indices are int32: row 2**31 and beyond have no number, a negative
    index cannot wrap onto them, and a wider index saturates onto row 2**31 - 1.
    jnp's indexing refuses a signed index array into such an axis too
    (``OverflowError`` as it wraps negatives); it takes an unsigned one, we do not.
    """
    wide = index_dtype()
    if num_rows > jnp.iinfo(wide).max:
        subject = subject or f"x has {num_rows} rows along the indexed axes"
        raise OverflowError(
            f"{subject}, more than {wide} indices "
            f"address ({jnp.iinfo(wide).max}), as jnp refuses a signed index there. Turn "
            "on 64-bit indices before making the indices: jax.config.update("
            "'jax_enable_x64', True) (or JAX_ENABLE_X64=1)"
        )


def rows_in_range(rows: jax.Array, num_rows: int) -> jax.Array:
    """Which rows point at a real row of the buffer (skip markers do not)."""
    ok = rows >= 0
    if num_rows <= jnp.iinfo(rows.dtype).max:  # Else every row of the type is a real one.
        ok &= rows < num_rows
    return ok


def dedupe_last_wins(rows: jax.Array, num_rows: int, *, presorted: bool = False):
    """Orders rows ascending and keeps only the last occurrence of each.

    Returns ``(rows, src)``: ``rows`` ascending with every superseded entry
    replaced by :func:`skip_row`, and ``src`` the position in the input each
    entry came from. With ``presorted=True`` the input is taken to ascend
    already and ``src`` is ``None`` (the identity).
    """
    if presorted:
        src = None
    else:
        # A stable order keeps equal rows in their input order, so the last of
        # each run is the last occurrence in the input.
        rows, src = stable_order(rows)
    superseded = jnp.concatenate([rows[:-1] == rows[1:], jnp.zeros((1,), bool)])
    return jnp.where(superseded, skip_row(num_rows, rows.dtype), rows), src


# How duplicate updates of one row combine, and how the total meets the row.
# Each is associative and commutative, so a fixed tree order is deterministic.
COMBINERS = {"add": jnp.add, "mul": jnp.multiply, "min": jnp.minimum, "max": jnp.maximum}


def add_accumulator_dtype(dtype, op: str = "add") -> jnp.dtype:
    """The type totals are formed in: float32 for 16-bit floats (add, mul), else ``dtype``.

    min and max need no wider type (they pick a value). Integer sums and
    products wrap modulo 2**bits as in jnp, whatever the order.
    """
    dtype = jnp.dtype(dtype)
    if op in ("add", "mul") and dtype in (jnp.dtype(jnp.float16), jnp.dtype(jnp.bfloat16)):
        return jnp.dtype(jnp.float32)
    return dtype


def segmented_scan(run_ids: jax.Array, values: jax.Array, op: str = "add") -> jax.Array:
    """Inclusive scans of the ``(n, d)`` values within runs of equal ``run_ids``.

    ``run_ids`` must not decrease (each run is one contiguous stretch); ``op``
    names a :data:`COMBINERS` entry. Log-step (Hillis-Steele) scan: step ``i``
    combines the entry ``2**i`` places back when it belongs to the same run.
    The order of combinations depends only on the run's own entries (no
    atomics), so the same input always gives the same bits. The ``log2(n)``
    steps are unrolled: as straight-line code they fuse, where a loop would
    cost a launch and a host round trip per step.
    """
    combine = COMBINERS[op]
    n = run_ids.shape[0]
    totals = values
    for step in range(max(0, (n - 1).bit_length())):
        shift = 1 << step
        behind = jnp.concatenate([totals[:shift], totals[:-shift]])
        # A run id below every real one marks "nothing that far back".
        ids_behind = jnp.concatenate([jnp.full_like(run_ids[:shift], -1), run_ids[:-shift]])
        totals = jnp.where((ids_behind == run_ids)[:, None], combine(totals, behind), totals)
    return totals


def stable_order(rows: jax.Array):
    """``(sorted_rows, perm)``: a stable ascending order of ``rows`` (ties keep their input
    order)."""
    return lax.sort((rows, lax.iota(jnp.int32, rows.shape[0])), num_keys=1, is_stable=True)


def combine_duplicates(
    rows: jax.Array,
    values: jax.Array,
    num_rows: int,
    *,
    presorted: bool = False,
    op: str = "add",
):
    """Combines the ``(n, d)`` value rows of equal rows with ``op``, in a fixed order.

    Returns ``(rows, totals)``: ``rows`` ascending with every entry but the
    last of each run replaced by :func:`skip_row`, and ``totals`` holding at
    that last entry the total of the run (:func:`segmented_scan`: the same
    input always gives the same bits). With ``presorted=True`` the rows are
    taken to ascend already; otherwise they are put in a stable order
    (:func:`stable_order`), so the order of equal rows, and hence their total, is fixed.
    """
    if not presorted:
        rows, perm = stable_order(rows)
        values = values[perm]
    changes = rows[1:] != rows[:-1]
    # Runs are stretches of adjacent equal rows; should a broken "presorted"
    # promise leave equal rows apart, they stay separate runs, never merged.
    run_ids = jnp.concatenate([jnp.zeros((1,), jnp.int32), jnp.cumsum(changes, dtype=jnp.int32)])
    totals = segmented_scan(run_ids, values, op)
    last = jnp.concatenate([changes, jnp.ones((1,), bool)])
    return jnp.where(last, rows, skip_row(num_rows, rows.dtype)), totals
