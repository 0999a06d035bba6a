"""Checking results against the numpy oracles of ``pallas_pinned.testing`` on sampled rows.

Reading a whole multi-GiB buffer back and comparing it in numpy for every
(case, provider) would take longer than the measurements. A scatter can go
wrong in two ways: a written row holds the wrong value (or is not written), or
a row it should not touch changes. So a :class:`RowSample` holds up to
``max_written`` of the rows written (all of them in small cases) plus
``n_others`` random rows anywhere in the buffer, which are nearly all untouched
and catch stray writes. Every update aimed at a sampled row is replayed by the
oracle, so duplicates among them resolve exactly.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import numpy as np

from pallas_pinned.testing import assert_same, scatter_add_oracle, scatter_oracle


@dataclasses.dataclass(frozen=True)
class RowSample:
    """Rows of the buffer read back to check one case."""

    rows: np.ndarray  # sorted unique buffer rows to read
    hit_positions: np.ndarray  # positions k in indices with indices[k] in rows
    hit_slots: np.ndarray  # for each of those, its position in ``rows``


def make_row_sample(
    rng: np.random.Generator, indices: np.ndarray, num_rows: int, *,
    max_written: int, n_others: int,
) -> RowSample:
    n = indices.shape[0]
    picked = indices if n <= max_written else indices[rng.choice(n, max_written, replace=False)]
    others = rng.integers(0, num_rows, size=min(n_others, num_rows))
    rows = np.unique(np.concatenate([picked, others]).astype(np.int64))
    return RowSample(rows, *hits_in(rows, indices))


def hits_in(rows: np.ndarray, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(positions k with indices[k] in rows, their slots in the sorted rows)``."""
    slots = np.minimum(np.searchsorted(rows, indices), rows.size - 1)
    positions = np.flatnonzero(rows[slots] == indices)
    return positions, slots[positions]


def _equal_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.tobytes() == b.tobytes()


def check_rows(
    before: np.ndarray, after: np.ndarray, sample: RowSample, hit_updates: np.ndarray,
    *, duplicates: str,
) -> str | None:
    """Compares sampled rows of a set with the oracle; returns None when they match.

    ``hit_updates[j]`` is the update for ``indices[sample.hit_positions[j]]``.
    ``duplicates="last"`` demands the promised last-occurrence-wins; ``"any"``
    (for XLA and the peers, whose duplicate order is unspecified) accepts any
    of the values aimed at a repeated row.
    """
    expected = scatter_oracle(before, sample.hit_slots, hit_updates)
    try:
        assert_same(after, expected, what="sampled rows")
        return None
    except AssertionError as err:
        if duplicates == "last":
            return str(err)
        message = str(err)
    # Group the updates by the row they aim at once, not once per row.
    order = np.argsort(sample.hit_slots, kind="stable")
    grouped = sample.hit_slots[order]
    for slot in _differing_slots(after, expected):
        lo, hi = np.searchsorted(grouped, [slot, slot + 1])
        if not any(_equal_bits(after[slot], c) for c in hit_updates[order[lo:hi]]):
            return message
    return None


def check_added_rows(
    before: np.ndarray, after: np.ndarray, hit_slots: np.ndarray, hit_updates: np.ndarray,
) -> str | None:
    """Compares sampled rows of an add with ``scatter_add_oracle``; None when they match."""
    expected = scatter_add_oracle(before, hit_slots, hit_updates)
    magnitude = scatter_add_oracle(
        np.abs(before.astype(np.float64)), hit_slots, np.abs(hit_updates.astype(np.float64)))
    terms = np.bincount(hit_slots, minlength=before.shape[0])
    return compare_sums(after, expected, magnitude, terms)


def compare_sums(
    after: np.ndarray, expected: np.ndarray, magnitude: np.ndarray, terms: np.ndarray,
    *, exact: bool = False,
) -> str | None:
    """Sums against the oracle's, within their rounding error; None when they match.

    Floating-point sums depend on their order, which the op does not promise,
    so each element may differ from the oracle by the error bound of its sum:
    ``(terms + 1) * eps * magnitude``, where ``magnitude`` is the sum of the
    absolute values summed into it and ``terms[row]`` how many updates the row
    got. Integers and bool must match exactly. The bound grows with the
    magnitude, so a missing or doubled update smaller than it passes (in
    bfloat16 an update of 1 against rows grown to about 1000); ``exact=True``
    compares bits, for sums with one order only (``expected`` rounded as the op
    rounds: every row one update per call, as the loop benchmark's steps have).
    """
    eps = _float_eps(expected.dtype)
    if eps is None or exact:  # integers and bool, or one order only: exact
        try:
            assert_same(after, expected, what="sampled rows")
            return None
        except AssertionError as err:
            return str(err)
    if after.shape != expected.shape or after.dtype != expected.dtype:
        return (f"sampled rows: got {after.dtype}{after.shape}, "
                f"expected {expected.dtype}{expected.shape}")
    terms = np.asarray(terms).reshape((-1,) + (1,) * (expected.ndim - 1))
    bound = (terms + 1) * eps * magnitude
    error = np.abs(after.astype(np.float64) - expected.astype(np.float64))
    bad = ~(error <= bound)  # NaN in the result counts as bad
    if not bad.any():
        return None
    rows = np.flatnonzero(bad.reshape(bad.shape[0], -1).any(axis=1))
    row = rows[0]
    return (f"sampled rows: {rows.size} of {expected.shape[0]} rows differ beyond rounding; "
            f"slot {row}: got {after[row].ravel()[:4]!r} want {expected[row].ravel()[:4]!r}")


def _float_eps(dtype) -> float | None:
    """Machine epsilon of a floating dtype (bfloat16 included), None for the rest."""
    import ml_dtypes

    try:
        return float(ml_dtypes.finfo(dtype).eps)
    except ValueError:  # ml_dtypes.finfo's answer for non-float dtypes
        return None


def _differing_slots(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a2 = a.reshape(a.shape[0], -1).view(np.uint8)
    b2 = b.reshape(b.shape[0], -1).view(np.uint8)
    return np.flatnonzero((a2 != b2).any(axis=1))


@functools.cache
def _gather_fn(flat: bool):
    if flat:
        return jax.jit(lambda a, rows: a.reshape(-1, a.shape[-1])[rows])
    return jax.jit(lambda a, rows: a[rows])


def read_rows(x: jax.Array, rows: np.ndarray, *, flat: bool = False) -> np.ndarray:
    """``x[rows]`` of a buffer in any memory kind, as numpy, leaving ``x`` as it is;
    with ``flat``, rows of ``x`` seen as ``(-1, shape[-1])``.

    A pinned buffer is copied whole to device memory (one PCIe read at full
    speed, ~0.1 s for 4 GiB) and gathered there: indexing a pinned array
    directly fails eagerly and runs on the host under jit.
    """
    device = next(iter(x.devices()))
    on_device = jax.sharding.make_single_device_sharding(device, memory_kind="device")
    whole = jax.device_put(x, jax.memory.Space.Device)  # see sparse_training.max_abs_diff
    picked = np.asarray(
        _gather_fn(flat)(whole, jax.device_put(rows.astype(np.int32), on_device)))
    if whole is not x:
        whole.delete()
    return picked
