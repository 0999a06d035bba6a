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

from pallas_pinned.testing import assert_same, scatter_oracle


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
    whole = jax.device_put(x, jax.memory.Space.Device)  # see training_providers.max_abs_diff
    picked = np.asarray(
        _gather_fn(flat)(whole, jax.device_put(rows.astype(np.int32), on_device)))
    if whole is not x:
        whole.delete()
    return picked
