"""Shared argument specs, data makers, a numpy oracle and a comparator.

One set of specs drives the tests and the benchmarks (as tokamax does), so a
case that is measured is a case that is checked. Nothing here is needed at run
time by the ops themselves.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

__all__ = [
    "PATTERNS",
    "ScatterSpec",
    "assert_same",
    "make_indices",
    "make_values",
    "scatter_oracle",
]

# Index patterns of the benchmark sweep and the randomized tests.
PATTERNS = ("random_unique", "random_dup25", "sorted", "contiguous", "random_any")


@dataclasses.dataclass(frozen=True)
class ScatterSpec:
    """One scatter case: a buffer of ``num_rows`` rows and ``n_updates`` writes."""

    num_rows: int
    row_shape: tuple[int, ...]
    dtype: str
    n_updates: int
    pattern: str = "random_unique"

    @property
    def row_elems(self) -> int:
        return math.prod(self.row_shape)

    @property
    def row_bytes(self) -> int:
        return self.row_elems * np.dtype(_np_dtype(self.dtype)).itemsize

    @property
    def name(self) -> str:
        shape = "x".join(map(str, self.row_shape)) or "scalar"
        return f"{self.dtype}[{self.num_rows}|{shape}]n{self.n_updates}-{self.pattern}"


def _np_dtype(dtype: str):
    if dtype == "bfloat16":
        import ml_dtypes

        return ml_dtypes.bfloat16
    return np.dtype(dtype)


def make_values(rng: np.random.Generator, shape: tuple[int, ...], dtype: str) -> np.ndarray:
    """Fresh random data of ``dtype``: never zeros, so unwritten rows show."""
    np_dtype = _np_dtype(dtype)
    if np.dtype(np_dtype) == np.bool_:
        return rng.random(shape) < 0.5
    if np.issubdtype(np.dtype(np_dtype), np.integer):
        info = np.iinfo(np_dtype)
        return rng.integers(info.min, info.max, size=shape, endpoint=True, dtype=np_dtype)
    return rng.standard_normal(shape).astype(np_dtype)


def make_indices(rng: np.random.Generator, spec: ScatterSpec) -> np.ndarray:
    """Row indices in ``[0, num_rows)`` following ``spec.pattern``.

    ``random_any`` also draws negative and out-of-range indices, for the
    mode tests.
    """
    n, r = spec.n_updates, spec.num_rows
    if spec.pattern == "random_unique":
        return _unique_rows(rng, r, n)
    if spec.pattern == "sorted":
        return np.sort(_unique_rows(rng, r, n))
    if spec.pattern == "contiguous":
        start = int(rng.integers(0, max(1, r - n + 1)))
        return (start + np.arange(n)) % r
    if spec.pattern == "random_dup25":
        # A quarter of the writes repeat a row already written in this batch.
        rows = _unique_rows(rng, r, n)
        n_dup = n // 4
        if n_dup and n > n_dup:
            rows[rng.choice(n, n_dup, replace=False)] = rng.choice(rows, n_dup)
        return rows
    if spec.pattern == "random_any":
        return rng.integers(-r - 3, r + 3, size=n)
    raise ValueError(f"unknown pattern {spec.pattern!r}; expected one of {PATTERNS}")


def _unique_rows(rng: np.random.Generator, r: int, n: int) -> np.ndarray:
    if n <= r:
        if n * 8 < r:  # Sparse: draw and reject duplicates, cheaper than a permutation.
            rows = np.unique(rng.integers(0, r, size=n + n // 8 + 8))
            while rows.size < n:
                rows = np.unique(np.concatenate([rows, rng.integers(0, r, size=n)]))
            return rng.permutation(rows)[:n]
        return rng.permutation(r)[:n]
    return rng.integers(0, r, size=n)  # More writes than rows: duplicates are unavoidable.


def scatter_oracle(
    x: np.ndarray, indices: np.ndarray, updates: np.ndarray, mode: str | None = None
) -> np.ndarray:
    """The promised semantics, written as plainly as possible.

    Updates are applied one after another in row-major order of ``indices``,
    so the last occurrence of a duplicate wins. ``updates`` must already be
    broadcast to ``indices.shape + x.shape[1:]``.
    """
    out = np.array(x, copy=True)
    r = x.shape[0]
    # Python ints: no index type can overflow while negatives wrap.
    flat_rows = np.asarray(indices).reshape(-1).tolist()
    flat_updates = np.asarray(updates).reshape((len(flat_rows),) + x.shape[1:])
    for row, value in zip(flat_rows, flat_updates, strict=True):
        if row < 0:
            row += r
        if mode == "clip":
            row = min(max(row, 0), r - 1)
        elif not 0 <= row < r:
            continue
        out[row] = value.astype(out.dtype)
    return out


def assert_same(actual, expected, *, what: str = "result", max_rows: int = 5) -> None:
    """Bit-exact comparison that says which rows differ and how."""
    actual, expected = np.asarray(actual), np.asarray(expected)
    if actual.shape != expected.shape or actual.dtype != expected.dtype:
        raise AssertionError(
            f"{what}: got {actual.dtype}{actual.shape}, expected {expected.dtype}{expected.shape}"
        )
    if actual.size == 0:
        return  # Same shape and dtype, nothing else to compare.
    a = actual.reshape(actual.shape[0], -1) if actual.ndim else actual.reshape(1, 1)
    e = expected.reshape(a.shape)
    # Compare bit patterns so that NaN == NaN and -0.0 != 0.0.
    bad_elems = a.view(np.uint8).reshape(a.shape + (-1,)) != e.view(np.uint8).reshape(
        a.shape + (-1,)
    )
    bad_rows = np.flatnonzero(bad_elems.reshape(a.shape[0], -1).any(axis=1))
    if bad_rows.size:
        lines = [f"{what}: {bad_rows.size} of {a.shape[0]} rows differ"]
        for row in bad_rows[:max_rows]:
            cols = np.flatnonzero(bad_elems[row].any(axis=-1))[:4]
            pairs = ", ".join(f"[{c}] got {a[row, c]!r} want {e[row, c]!r}" for c in cols)
            lines.append(f"  row {row}: {pairs}")
        raise AssertionError("\n".join(lines))
