"""sort_indices: a stable order of row indices; a step that shares it gives the same result.

The oracle is numpy: the indices normalized as jnp's modes do (negatives wrap
once; out of range dropped, clipped, or left), then ``np.argsort(kind="stable")``.
The step test reads rows and adds to them (the sparse-training pattern) once
with the caller's indices and once with the shared order, on fresh random
float data with repeated, negative and out-of-range ids, and wants equal bits
where the add sums each row's run of a stable order (beyond ``fused_max_unpromised_adds``).
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
@pytest.mark.parametrize("jitted", [False, True], ids=["eager", "jit"])
def test_sort_indices_is_numpys_stable_argsort_of_the_normalized_indices(rng, mode, jitted):
    num_rows = 50
    idx = mixed_indices(rng, num_rows, (300,))
    if mode == "promise_in_bounds":
        idx = rng.integers(-num_rows, num_rows, size=300)
    sort = functools.partial(pp.sort_indices, num_rows=num_rows, mode=mode)
    got_sorted, got_order = (jax.jit(sort) if jitted else sort)(jnp.asarray(idx))
    want = normalized(idx, num_rows, mode)
    order = np.argsort(want, kind="stable")
    np.testing.assert_array_equal(np.asarray(got_order), order)
    np.testing.assert_array_equal(np.asarray(got_sorted), want[order])
    assert got_order.dtype == jnp.int32


def test_sort_indices_takes_numpy_host_and_list_indices(rng):
    idx = rng.integers(0, 20, size=33).astype(np.int32)
    from_numpy = pp.sort_indices(idx, 20)
    from_host = pp.sort_indices(put(idx), 20)
    from_list = pp.sort_indices(idx.tolist(), 20)  # As the ops take a list of positions.
    for got in (from_numpy, from_host, from_list):
        np.testing.assert_array_equal(np.asarray(got[0]), np.sort(idx, kind="stable"))
        np.testing.assert_array_equal(np.asarray(got[1]), np.argsort(idx, kind="stable"))


@pytest.mark.parametrize("as_list", [False, True], ids=["numpy", "list"])
def test_sort_indices_narrows_wide_host_indices_as_the_ops_do(as_list):
    # Without x64 jax would truncate 2**40 + 3 onto row 3; the ops saturate such host
    # indices (out of range, dropped), and the shared order must name the rows they write.
    num_rows = 40
    idx = np.array([2**40 + 3, -2**40, 5, 2**62, 2**32 + 7], np.int64)
    ids_sorted, order = pp.sort_indices(idx.tolist() if as_list else idx, num_rows)
    np.testing.assert_array_equal(np.asarray(ids_sorted), [5, 40, 40, 40, 40])
    np.testing.assert_array_equal(np.asarray(order), [2, 0, 1, 3, 4])
    x = pp.scatter_add_to_host(put(np.zeros((num_rows, 1), np.float32)), idx,
                               np.ones((5, 1), np.float32), mode="drop")
    assert np.flatnonzero(read(x)).tolist() == [5]


def test_sort_indices_refuses_rows_its_index_type_cannot_number():
    if jax.config.jax_enable_x64:
        pytest.skip("with 64-bit indices every such buffer's rows have a number")
    with pytest.raises(OverflowError, match="num_rows is 2147483648.*jax_enable_x64"):
        pp.sort_indices(np.zeros(3, np.int32), 2**31)


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


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("num_ids", [50, 200, 1500])
def test_a_step_sharing_one_order_gives_the_same_result(rng, backend, num_ids):
    # Beyond tuning's one-launch limit for rows that may repeat (fused_max_unpromised_adds,
    # 64) the add sums each row's run of a stable order: the same sums either way, bit for
    # bit. Below it the kernel's one-launch add groups the sums by position: equal up to
    # float rounding.
    num_rows, dim = 64, 5
    x0 = rng.standard_normal((num_rows, dim)).astype(np.float32)
    ids = mixed_indices(rng, num_rows, (num_ids,)).astype(np.int32)
    ids[:40] = ids[0]  # a hot row, as Zipf ids have
    targets = rng.standard_normal((num_ids, dim)).astype(np.float32)
    results = {}
    for shared in (False, True):
        step = jax.jit(lambda x, i, t, shared=shared: _step(x, i, t, shared=shared,
                                                            backend=backend),
                       donate_argnums=0)
        x, row_sums = step(put(x0), jnp.asarray(ids), jnp.asarray(targets))
        assert x.sharding.memory_kind == "pinned_host"
        results[shared] = (read(x), np.asarray(row_sums))
    limits = tuning.current()
    if num_ids > min(limits.fused_max_updates, limits.fused_max_unpromised_adds):
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
        (["a", "b"], 4, None, TypeError, "indices holds .a., which is not a number"),
        ([[1], [1, 2]], 4, None, ValueError, "ragged"),
        (5, 4, None, TypeError, "1-D integer array or list"),
    ],
)
def test_sort_indices_refuses_what_it_cannot_order(indices, num_rows, mode, error, match):
    with pytest.raises(error, match=match):
        pp.sort_indices(indices, num_rows, mode=mode)


def test_sort_indices_takes_an_empty_list_as_the_ops_do():
    ids_sorted, order = pp.sort_indices([], 4)
    assert ids_sorted.shape == order.shape == (0,)
    assert jnp.issubdtype(ids_sorted.dtype, jnp.integer)


def test_sort_indices_refuses_a_deleted_array_by_name():
    ids = jnp.array([3, 1])
    ids.delete()
    with pytest.raises(ValueError, match="has been deleted"):
        pp.sort_indices(ids, 4)
