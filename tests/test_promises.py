"""Promises describe the indices as the user wrote them (README, "How it differs from jnp").

``unique_indices`` and ``indices_are_sorted`` are promises about the index array as
written, and a negative index wraps as in jnp. So:

* indices sorted (or distinct) as written give jnp's result, also where a negative index
  makes them unsorted (or aliased) once it wraps: ``[-1, 0, ..., 0, 7]`` on 8 rows is
  sorted as written and names row 7 twice, ``[-1, 7]`` is distinct and names it twice;
* a promise that is false as written may change only the rows the call names more than
  once: a row it does not name keeps its value, a row it names once gets its update;
* ``mode="clip"`` and ``"wrap"`` ignore the promises (they map distinct indices onto one row).

Every op meets every promise on every backend at small sizes; the kernel backends also
meet sizes on both sides of the thresholds that pick their sub-paths
(``tuning.Thresholds``), which only they read. Index types signed (a negative index wraps)
and unsigned (the type's largest value is out of range, never -1). Buffers hold distinct
values, so a row written twice or not at all shows; the oracle is jnp without the
promises on the same index array (one jit for a table). The 2**31-entry refusal is here
too, traced on shapes only.
"""

from __future__ import annotations

import dataclasses
import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallas_pinned as pp
from pallas_pinned import tuning
from tests.helpers import (
    BACKENDS,
    KERNEL_BACKENDS,
    VALUE_BACKENDS,
    default_device,
    read,
    sharding,
)
from tests.index_support import buffer_values, case_rng, method_values, pinned

EAGER_AND_JIT = pytest.mark.parametrize("jitted", [False, True], ids=["eager", "jit"])
JNP_NAMES = {"mul": "multiply"}


def _write(x, idx, values, *, op, backend, **kwargs):
    return getattr(pp.at(x)[idx], op)(values, backend=backend, **kwargs)


@functools.cache
def _jitted(op, backend, settings, thresholds):
    """One jit per call signature, kept for the module. The thresholds key it too: they
    are read when it traces."""
    del thresholds
    return jax.jit(functools.partial(_write, op=op, backend=backend, **dict(settings)),
                   donate_argnums=0)


def run(x0, idx, values, *, op, backend, jitted, **settings):
    """``pp.at(x)[idx].<op>(values, ...)`` on a fresh pinned copy of ``x0``, as numpy."""
    idx, values = jnp.asarray(idx), jnp.asarray(values)
    if jitted:
        write = _jitted(op, backend, tuple(sorted(settings.items())), tuning.current())
    else:
        write = functools.partial(_write, op=op, backend=backend, **settings)
    out = write(pinned(x0), idx, values)
    assert out.sharding.memory_kind == "pinned_host", out.sharding
    return read(out)


def jnp_result(x0, idx, values, *, op, mode=None):
    """jnp's ``x.at[idx].<op>(values)`` without promises (``"wrap"``: idx modulo the rows)."""
    x0, idx = jnp.asarray(x0), jnp.asarray(idx)
    if mode == "wrap":
        idx, mode = idx % x0.shape[0], None
    return getattr(x0.at[idx], JNP_NAMES.get(op, op))(jnp.asarray(values), mode=mode)


# --- the two calls -------------------------------------------------------------

# Sorted as written; -1 wraps onto row 7, which the last entry names again. 66 entries:
# past fused_max_unpromised_adds (64), the sorted-runs kernel.
SORTED_WITH_A_NEGATIVE = [-1] + [0] * 64 + [7]


@EAGER_AND_JIT
@pytest.mark.parametrize("backend", BACKENDS)
def test_sorted_as_written_with_a_negative_index_adds_every_entry(backend, jitted):
    x0 = np.zeros((8, 1), np.float32)
    idx = np.array(SORTED_WITH_A_NEGATIVE, np.int32)
    got = run(x0, idx, np.float32(1), op="add", backend=backend, jitted=jitted,
              indices_are_sorted=True)
    assert got.ravel().tolist() == [64] + [0] * 6 + [2], got.ravel().tolist()


@EAGER_AND_JIT
@pytest.mark.parametrize("backend", BACKENDS)
def test_distinct_as_written_with_a_negative_alias_adds_both(backend, jitted):
    x0 = np.zeros((8, 1), np.float32)
    got = run(x0, np.array([-1, 7], np.int32), np.float32(1), op="add", backend=backend,
              jitted=jitted, unique_indices=True)
    assert got.ravel().tolist() == [0] * 7 + [2], got.ravel().tolist()


# --- the tables --------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Case:
    op: str
    promise: str  # "unique", "sorted" or "both"; broken as written where ``broken``
    n: int  # index entries
    dtype: str  # the index array's type
    rows: int
    thresholds: tuple = ()  # tuning.override's, where a sub-path has no small natural size
    broken: bool = False
    mode: str | None = None

    def __str__(self):
        limits = "".join(f"-{k}={v}" for k, v in self.thresholds)
        return (f"{self.op}-{'false-' if self.broken else ''}{self.promise}-{self.n}x"
                f"{self.dtype}-{self.rows}rows{limits}{f'-{self.mode}' if self.mode else ''}")

    @property
    def settings(self):
        return {"unique_indices": self.promise in ("unique", "both"),
                "indices_are_sorted": self.promise in ("sorted", "both"), "mode": self.mode}

    @property
    def jitted(self) -> bool:
        """Whether the case runs under jit or eagerly: about half each, by a hash of the
        case (the same on every run), so that each table meets both."""
        return bool(case_rng(str(self), "jit").integers(2))

    def data(self):
        """The buffer (distinct values), the indices, the updates: the same on every run."""
        rng = case_rng(str(self))
        x0 = buffer_values(rng, (self.rows, 2))
        idx = (broken_indices if self.broken else promised_indices)(rng, self)
        if self.op == "mul":  # Powers of two: products exact in any order.
            values = rng.choice(np.float32([-2, -1, 0.5, 2]), size=(self.n, 2))
        else:
            values = method_values(rng, self.op, (self.n, 2), x0, np.float32)
        return x0, idx, values


def promised_indices(rng, case: Case) -> np.ndarray:
    """``case.n`` indices for ``case.rows`` rows, sorted and/or distinct as written.

    Signed: among them -1 and ``rows - 1`` (one row named twice once -1 wraps), rows past
    the end (dropped), and repeats unless distinct. Unsigned: the type's largest value,
    which is out of range (never -1). Under clip and wrap, rows far past either end.
    """
    info = np.iinfo(case.dtype)
    signed = info.min < 0
    must = [-1, case.rows - 1] if signed else [info.max]
    reach = 3 * case.rows if case.mode else case.rows + 2
    pool = np.arange(-reach if signed else 0, reach)
    pool = pool[~np.isin(pool, must)]
    distinct = case.promise != "sorted"
    assert not distinct or case.n - len(must) <= pool.size, case
    idx = np.concatenate([must, rng.choice(pool, case.n - len(must), replace=not distinct)])
    idx = np.sort(idx) if case.promise != "unique" else rng.permutation(idx)
    assert info.min <= idx.min() and idx.max() <= info.max, case
    return idx.astype(case.dtype)


def broken_indices(rng, case: Case) -> np.ndarray:
    """Indices whose promise is false as written: a quarter of the rows named once, a
    quarter several times, the rest not at all, each written as itself or as its negative
    alias, and rows past the end; shuffled for ``unique`` (which the repeats break),
    descending for ``sorted``."""
    rows, n = case.rows, case.n
    order = rng.permutation(rows)
    once, several = order[: rows // 4], order[rows // 4: rows // 2]
    past = np.arange(rows, rows + 2)
    repeats = rng.choice(several, n - once.size - past.size - several.size)
    idx = np.concatenate([once, several, repeats])
    idx = np.concatenate([np.where(rng.random(idx.size) < 0.5, idx - rows, idx), past])
    idx = rng.permutation(idx) if case.promise == "unique" else np.sort(idx)[::-1]
    return idx.astype(case.dtype)


@functools.cache
def expected(cases: tuple[Case, ...]) -> dict[Case, np.ndarray]:
    """jnp's result for every case of a table, in one jit."""
    data = [case.data() for case in cases]
    outs = jax.jit(lambda data: [
        jnp_result(x0, idx, v, op=c.op, mode=c.mode) for c, (x0, idx, v) in zip(cases, data,
                                                                               strict=True)
    ])(data)
    return {case: np.asarray(out) for case, out in zip(cases, outs, strict=True)}


def run_case(case: Case, backend: str):
    x0, idx, values = case.data()
    with tuning.override(**dict(case.thresholds)):
        got = run(x0, idx, values, op=case.op, backend=backend, jitted=case.jitted,
                  **case.settings)
    return x0, idx, got


# --- promises true as written: jnp's result ---------------------------------------------

# Every op and promise, on every backend; unsigned and signed index types.
SMALL = (
    Case("set", "unique", 6, "int8", 5),
    Case("set", "sorted", 9, "uint8", 5),
    Case("add", "unique", 7, "uint32", 5),
    Case("add", "both", 9, "int16", 5),
    Case("min", "unique", 10, "int32", 5),
    Case("max", "sorted", 9, "int8", 5),
    Case("mul", "both", 6, "int16", 5),
)
# Both sides of the kernels' thresholds, as this process has them. add: one launch up to
# fused_max_unpromised_adds for rows that may repeat and up to fused_max_updates for
# distinct ones; past them the sorted-runs kernel (repeats) or the add kernel (distinct).
# set: one launch up to fused_max_updates, the row kernel past it. Sorting for locality
# (sort_from) is forced for a few entries: only unsorted rows are sorted.
LIMITS = tuning.current()
REPEATS_MAX, DISTINCT_MAX = LIMITS.fused_max_unpromised_adds, LIMITS.fused_max_updates
ROWS = DISTINCT_MAX // 2 + 60  # Room for DISTINCT_MAX + 1 distinct indices in [-ROWS, ROWS).
UNFUSED_SORTING = (("fused_max_updates", 0), ("fused_max_unpromised_adds", 0), ("sort_from", 0))
SIZES = (
    Case("add", "sorted", REPEATS_MAX, "int8", 8),
    Case("add", "sorted", REPEATS_MAX + 1, "uint8", 8),  # (Signed: the first test's call.)
    Case("add", "unique", DISTINCT_MAX, "int16", ROWS),
    Case("add", "unique", DISTINCT_MAX + 1, "int32", ROWS),
    Case("add", "unique", 40, "int8", 30, UNFUSED_SORTING),
    Case("set", "unique", DISTINCT_MAX + 1, "int32", ROWS),
    Case("set", "sorted", DISTINCT_MAX + 1, "int16", 300),
    Case("set", "both", DISTINCT_MAX + 1, "uint16", DISTINCT_MAX + 9),
    Case("set", "unique", 40, "int16", 30, UNFUSED_SORTING),
)


@pytest.mark.parametrize("case", SMALL, ids=str)
@pytest.mark.parametrize("backend", VALUE_BACKENDS)
def test_promises_true_as_written_give_jnps_result(backend, case):
    _, _, got = run_case(case, backend)
    np.testing.assert_array_equal(got, expected(SMALL)[case], err_msg=f"jit={case.jitted}")


@pytest.mark.parametrize("case", SIZES, ids=str)
@pytest.mark.parametrize("backend", KERNEL_BACKENDS)
def test_promises_true_as_written_give_jnps_result_on_every_kernel_path(backend, case):
    _, _, got = run_case(case, backend)
    np.testing.assert_array_equal(got, expected(SIZES)[case], err_msg=f"jit={case.jitted}")


# --- clip and wrap ignore the promises ------------------------------------------------

# Distinct and ascending as written; clip and wrap map many of them onto one row.
PROMISE_FREE = (
    Case("add", "both", 40, "int32", 8, mode="clip"),
    Case("add", "both", 40, "int8", 8, mode="wrap"),
)


@pytest.mark.parametrize("case", PROMISE_FREE, ids=str)
@pytest.mark.parametrize("backend", VALUE_BACKENDS)
def test_clip_and_wrap_ignore_the_promises(backend, case):
    _, _, got = run_case(case, backend)
    np.testing.assert_array_equal(got, expected(PROMISE_FREE)[case])


# --- promises false as written: only the rows named more than once may differ ------------

FALSE = (
    Case("add", "unique", 10, "int32", 8, broken=True),
    Case("add", "sorted", 10, "int8", 8, broken=True),
    Case("set", "unique", 10, "int16", 8, broken=True),
    Case("max", "sorted", 10, "int32", 8, broken=True),
)
# Past the one launch: the add and row kernels, the sorted runs.
FALSE_SIZES = (
    Case("add", "unique", DISTINCT_MAX + 4, "int32", ROWS, broken=True),
    Case("add", "sorted", REPEATS_MAX + 2, "int16", 8, broken=True),
    Case("set", "unique", DISTINCT_MAX + 4, "int32", ROWS, broken=True),
)


def check_only_rows_named_twice_differ(case, x0, idx, got, jnps):
    wrapped = np.where(idx < 0, idx + case.rows, idx)
    named = np.bincount(wrapped[(wrapped >= 0) & (wrapped < case.rows)], minlength=case.rows)
    assert (named == 0).any() and (named == 1).any() and (named > 1).any(), named
    np.testing.assert_array_equal(got[named == 0], x0[named == 0],
                                  err_msg=f"{case}: a row the call does not name changed")
    np.testing.assert_array_equal(got[named == 1], jnps[named == 1],
                                  err_msg=f"{case}: a row the call names once lost its update")


@pytest.mark.parametrize("case", FALSE, ids=str)
@pytest.mark.parametrize("backend", VALUE_BACKENDS)
def test_a_false_promise_changes_only_rows_named_more_than_once(backend, case):
    check_only_rows_named_twice_differ(case, *run_case(case, backend), expected(FALSE)[case])


@pytest.mark.parametrize("case", FALSE_SIZES, ids=str)
@pytest.mark.parametrize("backend", KERNEL_BACKENDS)
def test_a_false_promise_changes_only_rows_named_more_than_once_on_every_kernel_path(
        backend, case):
    check_only_rows_named_twice_differ(case, *run_case(case, backend),
                                       expected(FALSE_SIZES)[case])


# --- 2**31 index entries: refused, naming the split ------------------------------------

# The refusal names the limit (2**31 - 1 entries, or the count it refuses) and the fix.
TOO_MANY = re.compile(r"(?s)(?=.*(2\*\*31|2147483648))(?=.*split)")
REFUSALS = (NotImplementedError, ValueError, OverflowError)


def _shape(shape, dtype=jnp.float32, kind=None):
    where = sharding(kind, default_device()) if kind else None
    return jax.ShapeDtypeStruct(shape, dtype, sharding=where)


@pytest.mark.parametrize("op", ["set", "add", "max"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_2_31_index_entries_are_refused_naming_the_split(backend, op):
    # Traced on shapes only: refused before anything is allocated or runs. One index
    # array of 2**31 entries, and two small ones that broadcast to 2**31.
    write = jax.jit(lambda x, idx, u: getattr(pp.at(x)[idx], op)(u, backend=backend))
    with pytest.raises(REFUSALS, match=TOO_MANY):
        write.trace(_shape((64, 1), kind="pinned_host"), _shape((2**31,), jnp.int32),
                    _shape((2**31, 1)))
    pair = (_shape((2**16, 1), jnp.int32), _shape((2**15,), jnp.int32))
    with pytest.raises(REFUSALS, match=TOO_MANY):
        write.trace(_shape((64, 64), kind="pinned_host"), pair, _shape(()))
