"""sort_indices and distinct_indices: shared orders of row indices; steps using them agree.

The oracle is numpy: the indices normalized as jnp's modes do (negatives wrap
once; out of range dropped, clipped, or left), then ``np.argsort(kind="stable")``.
The step test reads rows and adds to them (the sparse-training pattern) once
with the caller's indices and once with the shared order, on fresh random
float data with repeated, negative and out-of-range ids, and wants equal bits
where the add sums each row's run of a stable order (beyond ``fused_max_adds``).
``distinct_indices`` is checked against ``np.unique`` of the normalized indices,
and the read-once step it serves (gather the distinct rows, set their new
values) against the add of the per-entry updates, up to float rounding.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallas_pinned as pp
from pallas_pinned import tuning
from tests.helpers import BACKENDS, mixed_indices, put, read

SORT_MODES = [None, "drop", "fill", "clip", "promise_in_bounds"]


def normalized(idx: np.ndarray, num_rows: int, mode) -> np.ndarray:
    wrapped = np.where(idx < 0, idx + num_rows, idx)
    if mode == "clip":
        return np.clip(wrapped, 0, num_rows - 1)
    if mode == "promise_in_bounds":
        return wrapped
    return np.where((wrapped >= 0) & (wrapped < num_rows), wrapped, num_rows)


@pytest.mark.parametrize("mode", SORT_MODES)
@pytest.mark.parametrize("ranks", [True, False], ids=["ranks", "sort"])
@pytest.mark.parametrize("jitted", [False, True], ids=["eager", "jit"])
def test_sort_indices_is_numpys_stable_argsort_of_the_normalized_indices(rng, mode, ranks,
                                                                         jitted):
    num_rows = 50
    idx = mixed_indices(rng, num_rows, (300,))
    if mode == "promise_in_bounds":
        idx = rng.integers(-num_rows, num_rows, size=300)
    sort = functools.partial(pp.sort_indices, num_rows=num_rows, mode=mode)
    # runs_rank_max decides between counted ranks and XLA's sort: both are checked.
    with tuning.override(runs_rank_max=1 << 20 if ranks else 8):
        got_sorted, got_order = (jax.jit(sort) if jitted else sort)(jnp.asarray(idx))
    want = normalized(idx, num_rows, mode)
    order = np.argsort(want, kind="stable")
    np.testing.assert_array_equal(np.asarray(got_order), order)
    np.testing.assert_array_equal(np.asarray(got_sorted), want[order])
    assert got_order.dtype == jnp.int32


def test_sort_indices_takes_numpy_and_host_indices(rng):
    idx = rng.integers(0, 20, size=33).astype(np.int32)
    from_numpy = pp.sort_indices(idx, 20)
    from_host = pp.sort_indices(put(idx), 20)
    for got in (from_numpy, from_host):
        np.testing.assert_array_equal(np.asarray(got[0]), np.sort(idx, kind="stable"))
        np.testing.assert_array_equal(np.asarray(got[1]), np.argsort(idx, kind="stable"))


def _step(x, ids, targets, *, shared: bool, backend: str):
    """Reads the rows of ``ids``, then adds a gradient-like update to them."""
    mode = {"mode": "fill", "fill_value": 0}
    if shared:
        ids, order = pp.sort_indices(ids, x.shape[0])
        targets = targets[order]
    rows = pp.gather_from_host(x, ids, indices_are_sorted=shared, backend=backend, **mode)
    updates = 0.5 * (targets - rows) * jnp.arange(1, rows.shape[1] + 1, dtype=rows.dtype)
    x = pp.scatter_add_to_host(x, ids, updates, mode="drop", indices_are_sorted=shared,
                               backend=backend)
    return x, jnp.sum(rows, axis=0)


def _step_inputs(rng, num_ids: int, num_rows: int = 64, dim: int = 5):
    """A table, ids (repeated, negative, out of range, one hot row) and targets."""
    x0 = rng.standard_normal((num_rows, dim)).astype(np.float32)
    ids = mixed_indices(rng, num_rows, (num_ids,)).astype(np.int32)
    ids[:40] = ids[0]  # a hot row, as Zipf ids have
    return x0, ids, rng.standard_normal((num_ids, dim)).astype(np.float32)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("num_ids", [200, 1500])
def test_a_step_sharing_one_order_gives_the_same_result(rng, backend, num_ids):
    # Beyond tuning's fused_max_adds (1024) the add sums each row's run of a
    # stable order: the same sums either way, bit for bit. Below it the kernel's
    # one-launch add groups the sums by position: equal up to float rounding.
    x0, ids, targets = _step_inputs(rng, num_ids)
    results = {}
    for shared in (False, True):
        step = jax.jit(lambda x, i, t, shared=shared: _step(x, i, t, shared=shared,
                                                            backend=backend),
                       donate_argnums=0)
        x, row_sums = step(put(x0), jnp.asarray(ids), jnp.asarray(targets))
        assert x.sharding.memory_kind == "pinned_host"
        results[shared] = (read(x), np.asarray(row_sums))
    if num_ids > tuning.current().fused_max_adds:
        np.testing.assert_array_equal(results[True][0], results[False][0])
    else:
        np.testing.assert_allclose(results[True][0], results[False][0], rtol=1e-5, atol=1e-5)
    # The reads are the same rows; their sum over the batch is taken in another order.
    np.testing.assert_allclose(results[True][1], results[False][1], rtol=1e-5, atol=1e-4)
    assert not np.array_equal(results[False][0], x0)  # the step did write


@pytest.mark.parametrize(
    ("indices", "num_rows", "mode", "error", "match"),
    [
        (np.zeros((2, 3), np.int32), 4, None, ValueError, "1-D indices"),
        (np.zeros(3, np.float32), 4, None, TypeError, "integer indices"),
        (np.zeros(3, np.int32), 0, None, ValueError, "positive int"),
        (np.zeros(3, np.int32), 4.0, None, ValueError, "positive int"),
        (np.zeros(3, np.int32), 4, "wrap", ValueError, "jnp.mod"),
    ],
)
def test_sort_indices_refuses_what_it_cannot_order(indices, num_rows, mode, error, match):
    for fn in (pp.sort_indices, pp.distinct_indices):
        with pytest.raises(error, match=match):
            fn(indices, num_rows, mode=mode)


@pytest.mark.parametrize("mode", SORT_MODES)
@pytest.mark.parametrize("ranks", [True, False], ids=["ranks", "sort"])
@pytest.mark.parametrize("jitted", [False, True], ids=["eager", "jit"])
def test_distinct_indices_are_numpys_unique_of_the_normalized_indices(rng, mode, ranks, jitted):
    num_rows = 50
    idx = mixed_indices(rng, num_rows, (300,))
    if mode == "promise_in_bounds":
        idx = rng.integers(-num_rows, num_rows, size=300)
    distinct = functools.partial(pp.distinct_indices, num_rows=num_rows, mode=mode)
    with tuning.override(runs_rank_max=1 << 20 if ranks else 8):
        rows, inverse = (jax.jit(distinct) if jitted else distinct)(jnp.asarray(idx))
    rows, inverse = np.asarray(rows), np.asarray(inverse)
    want = normalized(idx, num_rows, mode)
    real = np.unique(want[want < num_rows])
    # The distinct rows ascending, then the marker (num_rows) to the batch's length.
    np.testing.assert_array_equal(rows[: real.size], real)
    np.testing.assert_array_equal(rows[real.size:], num_rows)
    np.testing.assert_array_equal(rows[inverse], want)
    assert inverse.dtype == np.int32 and rows.shape == inverse.shape == idx.shape


def test_distinct_indices_with_the_minus_one_marker_of_huge_buffers():
    # A buffer of more rows than int32 holds marks skipped entries -1 (x64 off):
    # the marker's run sorts first but is no row; the distinct rows still lead.
    num_rows = 1 << 40
    idx = np.array([7, -3, 7, 2, -3], np.int64)  # -3 wraps to num_rows - 3: out of int32
    rows, inverse = pp.distinct_indices(jnp.asarray(idx.astype(np.int32)), num_rows)
    rows, inverse = np.asarray(rows), np.asarray(inverse)
    if rows.dtype == np.int32:
        np.testing.assert_array_equal(rows, [2, 7, -1, -1, -1])
        np.testing.assert_array_equal(rows[inverse], [7, -1, 7, 2, -1])


def test_distinct_indices_of_an_empty_batch():
    rows, inverse = pp.distinct_indices(jnp.zeros((0,), jnp.int32), 5)
    assert rows.shape == inverse.shape == (0,)


def _read_once_step(x, ids, targets, *, backend: str):
    """Reads each distinct row once, writes its new value with a set (the sparse recipe)."""
    rows, inverse = pp.distinct_indices(ids, x.shape[0])
    promise = {"unique_indices": True, "indices_are_sorted": True, "backend": backend}
    values = pp.gather_from_host(x, rows, mode="fill", fill_value=0, **promise)

    def loss(v):
        return 0.5 * jnp.mean(jnp.sum((v[inverse] - targets) ** 2, axis=-1))

    return pp.scatter_to_host(x, rows, values - 0.5 * jax.grad(loss)(values), mode="drop",
                              **promise)


def _add_step(x, ids, targets, *, backend: str):
    picked = pp.gather_from_host(x, ids, mode="fill", fill_value=0, backend=backend)
    grads = (picked - targets) / ids.shape[0]
    return pp.scatter_add_to_host(x, ids, -0.5 * grads, mode="drop", backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("num_ids", [200, 1500])
def test_a_step_reading_each_distinct_row_once_equals_the_add(rng, backend, num_ids):
    x0, ids, targets = _step_inputs(rng, num_ids)
    results = []
    for step in (_add_step, _read_once_step):
        run = jax.jit(functools.partial(step, backend=backend), donate_argnums=0)
        x = run(put(x0), jnp.asarray(ids), jnp.asarray(targets))
        assert x.sharding.memory_kind == "pinned_host"
        results.append(read(x))
    np.testing.assert_allclose(results[1], results[0], rtol=1e-5, atol=1e-6)
    assert not np.array_equal(results[1], x0)  # the step did write
