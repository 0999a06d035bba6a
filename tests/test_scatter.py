"""Correctness of scatter_to_host against the numpy oracle, on every backend.

Every case runs through the XLA fallback, the Pallas kernel in interpret mode
(CPU or GPU), "auto", and — on a GPU — the compiled Pallas kernel; off CUDA,
auto skips the grids of values, where it would repeat the xla case
(``VALUE_BACKENDS``, tests/helpers.py). Buffers are filled with fresh random
data, never zeros, so a row the kernel failed to write, or wrote twice, shows
up as a mismatch against the oracle.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from jax import lax

import pallas_pinned as pp
from pallas_pinned.testing import ScatterSpec, assert_same, make_indices, make_values
from tests.helpers import (
    BACKENDS,
    KERNEL_BACKENDS,
    VALUE_BACKENDS,
    check_scatter,
    examples,
    has_gpu,
    put,
    read,
    row_cases,
    run_row_op,
)

DTYPES = ["float32", "bfloat16", "float16", "int32", "int8", "uint8", "bool"]
# "drop" is what None does for a write (the same code); fill and drop against
# jnp's: tests/test_semantics.py.
MODES = [None, "clip", "drop"]

# The rng fixture (conftest.py) seeds each case by a CRC of its test id.


def _run(rng, backend, spec, *, mode=None, kind="pinned_host", **kwargs):
    x0 = make_values(rng, (spec.num_rows, *spec.row_shape), spec.dtype)
    idx = make_indices(rng, spec)
    upd = make_values(rng, (spec.n_updates, *spec.row_shape), spec.dtype)
    out = pp.scatter_to_host(
        put(x0, kind), jnp.asarray(idx), jnp.asarray(upd), mode=mode, backend=backend, **kwargs
    )
    check_scatter(out, x0, idx, upd, mode, kind=kind)


@pytest.mark.parametrize("backend", VALUE_BACKENDS)
@examples(25)
@given(case=row_cases(DTYPES, MODES), scalar=st.booleans())
def test_scatter_follows_the_oracle_and_jnp(backend, case, scalar):
    # Every dtype, row shape, count, mode, index dtype, honest promise, memory kind; 1-D
    # and 2-D indices; eagerly and under a donating jit; a scalar or a full update.
    rng = case.rng()
    x0 = make_values(rng, (case.num_rows, *case.row_shape), case.dtype)
    upd = make_values(rng, () if scalar else case.indices.shape + case.row_shape, case.dtype)
    _, out = run_row_op(pp.scatter_to_host, case, x0, jnp.asarray(upd), backend=backend)
    check_scatter(out, x0, case.indices, upd, case.mode, kind=case.kind)
    jnp_indices = case.jnp_indices()
    if jnp_indices is not None and not has_gpu():  # jnp's order of duplicates: XLA CPU's
        want = jnp.asarray(x0).at[jnp_indices].set(upd, mode=case.mode)
        assert_same(read(out), np.asarray(want), what="vs jnp")


@pytest.mark.parametrize("backend", KERNEL_BACKENDS)
def test_multiple_column_blocks(rng, backend):
    # 2000 int8 elements per row would fit one block; 5000 float32 elements
    # (20 KB) need several column programs, the last one partial.
    _run(rng, backend, ScatterSpec(7, (5000,), "float32", 4, "random_unique"))


@pytest.mark.parametrize("backend", KERNEL_BACKENDS)
def test_multiple_row_blocks(rng, backend):
    # 4096 float32 rows of width 1 fill one program; 4099 spill into a second.
    _run(rng, backend, ScatterSpec(9000, (), "float32", 4099, "random_unique"))


@pytest.mark.parametrize("backend", VALUE_BACKENDS)
def test_promise_in_bounds_with_valid_indices(rng, backend):
    # Unchecked mode is only defined for in-range indices (negative ones wrap).
    x0 = make_values(rng, (30, 4), "float32")
    idx = np.array([3, -1, 7, 3, 0, -30])
    upd = make_values(rng, (6, 4), "float32")
    out = pp.scatter_to_host(put(x0), idx, upd, mode="promise_in_bounds", backend=backend)
    check_scatter(out, x0, idx, upd)


@pytest.mark.parametrize("backend", VALUE_BACKENDS)
def test_last_duplicate_wins(backend):
    # jnp leaves duplicate order unspecified; we promise row-major last wins.
    x0 = np.full((6, 2), -1.0, np.float32)
    idx = np.array([[2, 5, 2], [2, 0, 5]])
    upd = np.arange(12, dtype=np.float32).reshape(2, 3, 2)
    out = read(pp.scatter_to_host(put(x0), idx, upd, backend=backend))
    np.testing.assert_array_equal(out[2], upd[1, 0])
    np.testing.assert_array_equal(out[5], upd[1, 2])
    np.testing.assert_array_equal(out[0], upd[1, 1])


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    "index",
    [
        slice(None, 36, 7),  # the strided slice that eager indexing chokes on
        slice(5, None),  # open-ended
        slice(None, None, -3),  # descending
        slice(100, 200),  # empty: past the end
    ],
)
def test_static_slices(rng, backend, index):
    x0 = make_values(rng, (40, 3), "float32")
    rows = np.arange(40)[index]
    upd = make_values(rng, (rows.size, 3), "float32")
    out = pp.scatter_to_host(put(x0), index, upd, backend=backend)
    check_scatter(out, x0, rows, upd)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("index", [4, -1, [1, 1, 3], np.int64(2)])
def test_python_index_forms(rng, backend, index):
    x0 = make_values(rng, (6, 3), "float32")
    idx = np.asarray(index)
    upd = make_values(rng, idx.shape + (3,), "float32")
    check_scatter(pp.scatter_to_host(put(x0), index, upd, backend=backend), x0, idx, upd)


@pytest.mark.parametrize("backend", BACKENDS)
def test_updates_are_cast_like_jnp(rng, backend):
    # float64 updates into bfloat16 and int updates into float32, with values that
    # round in the cast (jnp's result is the oracle, bit for bit). The first cast can
    # lose information, so it warns as jnp's does (tests/test_semantics.py).
    x_bf16 = make_values(rng, (8, 3), "bfloat16")
    upd = rng.standard_normal((2, 3)) * 1e3
    with pytest.warns(FutureWarning, match="cast"):
        out = pp.scatter_to_host(put(x_bf16), np.array([1, 6]), upd, backend=backend)
    with pytest.warns(FutureWarning, match="cast"):
        want = jnp.asarray(x_bf16).at[np.array([1, 6])].set(upd)
    assert np.asarray(out).tobytes() == np.asarray(want).tobytes()
    x_f32 = make_values(rng, (8, 3), "float32")
    upd_int = rng.integers(2**24, 2**30, size=(3,), dtype=np.int32) | 1  # Odd: they round.
    out = pp.scatter_to_host(put(x_f32), 2, upd_int, backend=backend)
    want = jnp.asarray(x_f32).at[2].set(upd_int)
    assert np.asarray(out).tobytes() == np.asarray(want).tobytes()


@pytest.mark.parametrize("backend", BACKENDS)
def test_indices_and_updates_in_pinned_host(rng, backend):
    # As in the example: everything, even indices, on the host.
    x0 = make_values(rng, (64, 3), "float32")
    idx = np.array([3, 60, -2, 3])
    upd = make_values(rng, (4, 3), "float32")
    out = pp.scatter_to_host(put(x0), put(idx), put(upd), backend=backend)
    check_scatter(out, x0, idx, upd)


# --- drop-in use under jit, loops and donation ---------------------------------


def _user_update(backend):
    host = jax.sharding.make_single_device_sharding(jax.devices()[0], memory_kind="pinned_host")

    def update(x, y):
        i = jax.device_put(jnp.arange(5), host)
        y = jax.device_put(y.astype(x.dtype), host)
        return pp.scatter_to_host(x, i, y, backend=backend)

    return update


@pytest.mark.parametrize("backend", BACKENDS)
def test_user_example_under_jit(backend):
    x0 = np.random.default_rng(1).standard_normal(1000).astype(np.float32)
    x_cpu = put(x0)
    y = jax.device_put(jnp.arange(5))
    out = jax.jit(_user_update(backend), donate_argnums=(0,))(x_cpu, y)
    assert x_cpu.is_deleted()
    check_scatter(out, x0, np.arange(5), np.arange(5))


@pytest.mark.parametrize("backend", BACKENDS)
def test_without_donation_the_answer_is_still_right(backend):
    x0 = np.random.default_rng(2).standard_normal(100).astype(np.float32)
    x = put(x0)
    out = jax.jit(_user_update(backend))(x, jnp.arange(5))
    assert not x.is_deleted()
    check_scatter(out, x0, np.arange(5), np.arange(5))
    np.testing.assert_array_equal(read(x), x0)  # The input was not touched.


@pytest.mark.parametrize("backend", BACKENDS)
def test_fori_loop_carries_the_buffer(rng, backend):
    steps, batch = 6, 9
    x0 = make_values(rng, (40, 3), "float32")
    idx = rng.integers(-45, 45, size=(steps, batch))
    upd = make_values(rng, (steps, batch, 3), "float32")

    @jax.jit
    def run(x, idx, upd):
        def body(t, x):
            return pp.scatter_to_host(x, idx[t], upd[t], backend=backend)

        return lax.fori_loop(0, steps, body, x)

    run = jax.jit(run, donate_argnums=(0,))
    out = run(put(x0), jnp.asarray(idx), jnp.asarray(upd))
    check_scatter(out, x0, idx, upd)  # Row-major order = step order.


@pytest.mark.parametrize("backend", BACKENDS)
def test_scan_carries_the_buffer(rng, backend):
    x0 = make_values(rng, (30, 2), "int32")
    idx = rng.integers(0, 30, size=(4, 5))
    upd = make_values(rng, (4, 5, 2), "int32")

    def step(x, batch):
        i, u = batch
        return pp.scatter_to_host(x, i, u, backend=backend), None

    run = jax.jit(lambda x, i, u: lax.scan(step, x, (i, u))[0], donate_argnums=(0,))
    check_scatter(run(put(x0), jnp.asarray(idx), jnp.asarray(upd)), x0, idx, upd)


@pytest.mark.parametrize("backend", BACKENDS)
def test_eager_call_consumes_the_buffer(rng, backend):
    x0 = make_values(rng, (16, 4), "float32")
    x = put(x0)
    out = pp.scatter_to_host(
        x, jnp.array([1, 2]), make_values(rng, (2, 4), "float32"), backend=backend
    )
    assert x.is_deleted()
    assert out.sharding == x.sharding


def test_empty_update_returns_the_buffer_untouched(rng):
    x0 = make_values(rng, (5, 2), "float32")
    x = put(x0)
    out = pp.scatter_to_host(x, np.zeros((0,), np.int32), np.zeros((0, 2), np.float32))
    assert out is x
    np.testing.assert_array_equal(read(out), x0)


@pytest.mark.skipif(has_gpu(), reason="CPU-only check of the error message")
def test_pallas_backend_on_cpu_names_the_alternatives():
    x = put(np.ones((4, 2), np.float32))
    with pytest.raises(NotImplementedError, match="backend='interpret'"):
        pp.scatter_to_host(x, 1, 1.0, backend="pallas")
    assert not x.is_deleted()


@pytest.mark.parametrize("backend", KERNEL_BACKENDS)
@pytest.mark.parametrize("field", [f.name for f in dataclasses.fields(pp.tuning.Thresholds)])
def test_no_threshold_changes_a_sets_result(rng, backend, field):
    # Each threshold at both of its ends, whatever paths it selects between (sorting,
    # de-duplicating, one launch): the buffer is the oracle's, with and without a promise.
    for value in (0, 10**9):
        with pp.tuning.override(**{field: value}):
            _run(rng, backend, ScatterSpec(300, (5,), "float32", 200, "random_unique"),
                 unique_indices=True)
            _run(rng, backend, ScatterSpec(20, (3,), "int32", 40, "random_any"))
