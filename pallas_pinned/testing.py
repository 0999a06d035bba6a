"""The one set of specs, data makers, numpy oracles and timing shared by tests and benchmarks.

A case that is measured is a case that is checked: the benchmarks draw their
indices and values from the same makers as the tests and compare their results
with the same oracles. Nothing here is needed at run time by the ops themselves.

* specs: :class:`ScatterSpec` and :data:`PATTERNS` (scatter cases),
  :class:`LoopCase` and :data:`LOOP_CASES` (the in-loop benchmark's grid),
  :data:`BACKENDS` (the ``backend=`` values the ops accept);
* data: :func:`make_indices`, :func:`make_values`;
* oracles, written as plainly as possible: :func:`scatter_oracle`,
  :func:`scatter_add_oracle`, :func:`gather_oracle`; :func:`assert_same`
  compares bit for bit;
* timing: :func:`time_calls`, used by the demo and every benchmark.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = [
    "BACKENDS",
    "LOOP_CASES",
    "LOOP_CPU_CASES",
    "LOOP_DTYPES",
    "LOOP_ROWS",
    "LOOP_ROW_BYTES",
    "LOOP_TARGETS",
    "PATTERNS",
    "LoopCase",
    "ScatterSpec",
    "assert_same",
    "gather_oracle",
    "make_indices",
    "make_values",
    "scatter_add_oracle",
    "scatter_oracle",
    "time_calls",
]

# The values of the ops' ``backend=`` argument: "auto" picks the kernel for
# host buffers on CUDA and XLA otherwise; "pallas" and "triton" compile a
# kernel and need a CUDA GPU ("triton" also the jax-triton extra);
# "interpret" runs the Pallas kernel in the interpreter (CPU included).
BACKENDS = ("auto", "xla", "pallas", "triton", "interpret")

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


# ---------------------------------------------------------------------------
# The in-loop benchmark's grid (benchmarks/loop.py)


@dataclasses.dataclass(frozen=True)
class LoopCase:
    """One step shape of the in-loop benchmark: ``rows`` rows of ``row_bytes`` per step."""

    rows: int
    row_bytes: int
    dtype: str = "float32"

    @property
    def row_elems(self) -> int:
        return self.row_bytes // np.dtype(_np_dtype(self.dtype)).itemsize

    @property
    def step_bytes(self) -> int:
        return self.rows * self.row_bytes

    @property
    def name(self) -> str:
        return f"{self.rows}x{self.row_bytes}B-{self.dtype}"


LOOP_ROWS = (1, 5, 16, 64, 256, 1024, 4096, 16384, 65536)
LOOP_ROW_BYTES = (4, 256, 512, 1024, 8192)
LOOP_DTYPES = ("float32", "bfloat16")

# The rows of the table in the "loop speed" issue: measured first, so that a
# run cut short by its time budget still answers the question asked.
LOOP_TARGETS = (
    LoopCase(5, 4),
    LoopCase(64, 1024),
    LoopCase(256, 4),
    LoopCase(256, 1024),
    LoopCase(1024, 1024),
    LoopCase(4096, 512),
    LoopCase(16384, 256),
)


def _loop_grid() -> tuple[LoopCase, ...]:
    """The whole grid, most wanted first.

    Targets; then the ends of the row range (1, 16, 65536 rows) at the
    targets' two main widths; then the targets in bfloat16; then the other
    widths and row counts of float32; then the rest of bfloat16. Within a
    tier, cheaper steps (fewer bytes) come first, so a budget that runs out
    leaves out the few slow cases, not many fast ones.
    """
    every = [LoopCase(r, b, d) for d in LOOP_DTYPES for b in LOOP_ROW_BYTES for r in LOOP_ROWS]
    ends = {LoopCase(r, b) for r in (1, 16, 65536) for b in (4, 1024)}
    bf16_targets = {dataclasses.replace(c, dtype="bfloat16") for c in LOOP_TARGETS}

    def tier(c: LoopCase) -> int:
        if c in LOOP_TARGETS:
            return 0
        if c in ends:
            return 1
        if c in bf16_targets:
            return 2
        return 3 if c.dtype == "float32" else 4

    def key(c: LoopCase):
        f32 = dataclasses.replace(c, dtype="float32")
        within = LOOP_TARGETS.index(f32) if f32 in LOOP_TARGETS else c.step_bytes
        return (tier(c), within, c.rows)

    return tuple(sorted(every, key=key))


LOOP_CASES = _loop_grid()

# A few seconds on a CPU: the grid of `python -m benchmarks.loop` without a GPU
# (tests/test_benchmarks_loop.py checks it is the default CPU plan).
LOOP_CPU_CASES = (LoopCase(5, 4), LoopCase(64, 256), LoopCase(16, 256, "bfloat16"))


# ---------------------------------------------------------------------------
# Data


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


# ---------------------------------------------------------------------------
# Oracles


def _target_row(row: int, num_rows: int, mode: str | None) -> int | None:
    """Where a scatter of ``row`` lands: negatives wrap once; "clip" clamps, else drop.

    "wrap" (ours, beyond jnp) takes the row modulo the row count.
    """
    if mode == "wrap":
        return row % num_rows
    if row < 0:
        row += num_rows
    if mode == "clip":
        return min(max(row, 0), num_rows - 1)
    return row if 0 <= row < num_rows else None


def _flat_updates(x: np.ndarray, indices, updates) -> tuple[list[int], np.ndarray]:
    # Python ints: no index type can overflow while negatives wrap.
    rows = np.asarray(indices).reshape(-1).tolist()
    target = np.shape(indices) + x.shape[1:]
    flat = np.broadcast_to(np.asarray(updates), target).reshape((len(rows),) + x.shape[1:])
    return rows, flat


def scatter_oracle(
    x: np.ndarray, indices: np.ndarray, updates: np.ndarray, mode: str | None = None
) -> np.ndarray:
    """The promised semantics of ``scatter_to_host``, written as plainly as possible.

    Updates are applied one after another in row-major order of ``indices``,
    so the last occurrence of a duplicate wins. ``updates`` must already be
    broadcast to ``indices.shape + x.shape[1:]``.
    """
    out = np.array(x, copy=True)
    r = x.shape[0]
    flat_rows = np.asarray(indices).reshape(-1).tolist()
    flat_updates = np.asarray(updates).reshape((len(flat_rows),) + x.shape[1:])
    for row, value in zip(flat_rows, flat_updates, strict=True):
        target = _target_row(row, r, mode)
        if target is not None:
            out[target] = value.astype(out.dtype)
    return out


def scatter_add_oracle(
    x: np.ndarray, indices: np.ndarray, updates: np.ndarray, mode: str | None = None
) -> np.ndarray:
    """``x.at[indices].add(updates, mode=mode)``: every update of a row is summed into it.

    Rows land as in :func:`scatter_oracle`. Sums are carried in a wider type
    and converted back once per row: integers in int64, so the result wraps
    as jnp's narrow integer sums do; float16/bfloat16 rows in float32, one
    rounding per row (what the kernel does after combining duplicates); other
    types in their own. ``updates`` broadcast to ``indices.shape + x.shape[1:]``.
    """
    x = np.asarray(x)
    wide = _sum_dtype(x.dtype)
    out = x.astype(wide)
    rows, flat = _flat_updates(x, indices, updates)
    for row, value in zip(rows, flat, strict=True):
        target = _target_row(row, x.shape[0], mode)
        if target is not None:
            out[target] = out[target] + value.astype(wide)
    return out.astype(x.dtype)  # int64 -> int8 wraps; bool: any non-zero sum is True.


def _sum_dtype(dtype: np.dtype):
    dtype = np.dtype(dtype)
    if dtype == np.bool_ or np.issubdtype(dtype, np.integer):
        return np.int64
    if dtype.itemsize <= 2:  # float16, bfloat16 (and narrower floats)
        return np.float32
    return dtype


def gather_oracle(
    x: np.ndarray, indices: np.ndarray, mode: str | None = None, fill_value=None
) -> np.ndarray:
    """``x.at[indices].get(mode=mode, fill_value=fill_value)`` as jnp does it (jax 0.11-0.12).

    Negative rows wrap once. Then "fill" and "drop" give ``fill_value`` for
    rows still out of range (default: NaN for floats, the most negative value
    for signed integers, the largest for unsigned ones, True for bool); every
    other mode (None, "clip", "promise_in_bounds") clamps into range.
    """
    x = np.asarray(x)
    flat = np.asarray(indices, np.int64).reshape(-1)
    num_rows = x.shape[0]
    out = np.empty((flat.size,) + x.shape[1:], x.dtype)
    fill = _default_fill(x.dtype) if fill_value is None else fill_value
    for k, row in enumerate(flat.tolist()):
        if mode == "wrap":  # Ours, beyond jnp: modulo the row count.
            row %= num_rows
        if row < 0:
            row += num_rows
        if mode in ("fill", "drop"):
            out[k] = x[row] if 0 <= row < num_rows else fill
        else:
            out[k] = x[min(max(row, 0), num_rows - 1)]
    return out.reshape(np.shape(indices) + x.shape[1:])


def _default_fill(dtype):
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return True
    if np.issubdtype(dtype, np.integer):
        info = np.iinfo(dtype)
        return info.min if np.issubdtype(dtype, np.signedinteger) else info.max
    return np.nan


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


# ---------------------------------------------------------------------------
# Timing


def time_calls(
    fn: Callable[..., Any],
    state: Any,
    *args: Any,
    repeats: int,
    warmup: int = 1,
    prepare: Callable[[], tuple] | None = None,
) -> tuple[Any, list[float]]:
    """Wall-clock seconds of ``state = fn(state, *args)``, ``repeats`` times after ``warmup``.

    ``state`` is threaded from call to call, so a buffer donated to ``fn`` is
    never used again after it was consumed. Each timed call ends when its
    result is ready (``jax.block_until_ready``), so a sample is the whole
    round: dispatch, device work, completion. A ``fn`` that waits for its own
    work (a PyTorch call with ``torch.cuda.synchronize()``) may return None.
    ``prepare()``, when given, runs untimed before every call and its tuple
    replaces ``args``. The warm-up calls (compilation, first touch) are not
    returned. Returns ``(state, seconds)``.
    """
    import jax

    def one_call(state):
        call_args = prepare() if prepare is not None else args
        start = time.perf_counter()
        state = jax.block_until_ready(fn(state, *call_args))
        return state, time.perf_counter() - start

    for _ in range(warmup):
        state, _ = one_call(state)
    seconds = []
    for _ in range(repeats):
        state, took = one_call(state)
        seconds.append(took)
    return state, seconds
