"""gather_from_host against jnp and the numpy oracle, on every backend.

Every case runs through the XLA fallback, the Pallas kernel in interpret mode,
"auto", and (marker ``gpu``) the compiled kernels; off CUDA, auto skips the
grids of values, where it would repeat the xla case (``VALUE_BACKENDS``,
tests/helpers.py). Buffers hold fresh random data, never zeros; rows the
kernel failed to read show up as mismatches. Interpret mode is slow on a CPU,
so the shapes stay tiny. Bad input: tests/test_errors.py; vmap and grad:
tests/test_transforms.py.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pallas_pinned import tuning
from pallas_pinned.gather import gather_from_host
from pallas_pinned.testing import assert_same, gather_oracle, make_values
from tests.helpers import (
    BACKENDS,
    VALUE_BACKENDS,
    check_gather,
    examples,
    mixed_indices,
    put,
    read,
    row_cases,
    run_row_op,
)

GATHER_DTYPES = ["float32", "bfloat16", "float16", "int32", "int8", "uint8", "bool"]
GATHER_MODES = [None, "fill", "drop", "clip", "promise_in_bounds"]
@pytest.fixture
def small_sort_crossover():
    """Makes batches of 64+ rows take the sorted (coalescing) kernel path.

    The thresholds are part of the ops' jit cache keys, so no cache clearing.
    """
    with tuning.override(sort_from=64):
        yield


@pytest.mark.parametrize("backend", VALUE_BACKENDS)
@examples(25)
@given(case=row_cases(GATHER_DTYPES, GATHER_MODES), fill=st.sampled_from([None, 2.5, -1, 0]))
def test_gather_follows_the_oracle_and_jnp(backend, case, fill):
    # Every dtype (each one's default fill value), row shape, count, mode, index dtype,
    # honest promise, memory kind, fill value; 1-D and 2-D indices; eagerly and under jit.
    x0 = make_values(case.rng(), (case.num_rows, *case.row_shape), case.dtype)
    if case.dtype == "bool" and fill is not None:
        fill = bool(fill)
    x, out = run_row_op(gather_from_host, case, x0, donate=False, fill_value=fill,
                        backend=backend)
    assert out.sharding.memory_kind == "device", out.sharding
    assert_same(read(out), gather_oracle(x0, case.indices, case.mode, fill), what="oracle")
    jnp_indices = case.jnp_indices()
    if jnp_indices is not None:
        want = jnp.asarray(x0).at[jnp_indices].get(mode=case.mode, fill_value=fill)
        assert_same(read(out), np.asarray(want), what="vs jnp")
    assert not x.is_deleted()


@pytest.mark.parametrize("backend", VALUE_BACKENDS)
@pytest.mark.parametrize("mode", ["fill", "clip"])
def test_gather_sorted_reads_come_back_in_callers_order(rng, backend, mode, small_sort_crossover):
    # Above the (lowered) crossover the kernel reads in ascending row order
    # and stores each row at its caller position; out-of-range rows mixed in.
    x0 = make_values(rng, (300, 2), "int32")
    idx = mixed_indices(rng, 300, (10, 20))
    check_gather(gather_from_host(put(x0), idx, mode=mode, backend=backend), x0, idx, mode)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", ["device", "pinned_host"])
def test_gather_memory_kinds_and_x_is_kept(rng, backend, kind):
    # The result is in device memory whatever x's memory; x is not consumed.
    x0 = make_values(rng, (40, 4), "float32")
    x = put(x0, kind)
    idx = mixed_indices(rng, 40, (9,))
    check_gather(gather_from_host(x, idx, backend=backend), x0, idx)
    assert not x.is_deleted()
    assert x.sharding.memory_kind == kind
    assert_same(read(x), x0)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    "index",
    [
        4,  # a Python int: the result drops the row axis
        -1,  # a negative int wraps
        99,  # an int past the end: clamped in the default mode
        np.int64(2),  # a numpy scalar
        [1, 1, 3],  # a list with a duplicate
        slice(None, 36, 7),  # the strided slice that eager indexing chokes on
        slice(None, None, -3),  # descending
        slice(100, 200),  # empty: past the end
    ],
)
def test_gather_index_forms(rng, backend, index):
    x0 = make_values(rng, (40, 3), "float32")
    out = gather_from_host(put(x0), index, backend=backend)
    # jnp reads a list as several axes; the op (like numpy) as one index array.
    jnp_index = np.asarray(index) if isinstance(index, list) else index
    expected = np.asarray(jnp.asarray(x0).at[jnp_index].get())
    assert out.sharding.memory_kind == "device"
    assert_same(read(out), expected)


@pytest.mark.parametrize("backend", VALUE_BACKENDS)
@pytest.mark.parametrize(
    ("dtype", "fill_value"),
    [
        ("float32", 2.5),  # an ordinary fill
        ("float32", np.float32(-np.inf)),  # a numpy scalar
        ("int8", 1000),  # out of the dtype's range: wraps as in jnp
        ("int32", 3.7),  # a float into an int buffer: truncated as in jnp
        ("uint8", -1),  # a negative into unsigned: wraps to 255 as in jnp
        ("bool", 0),  # into bool
        ("bfloat16", 1e30),  # rounds to the nearest bfloat16
    ],
)
def test_gather_fill_values_convert_like_jnp(rng, backend, dtype, fill_value):
    x0 = make_values(rng, (9, 2), dtype)
    idx = np.array([3, 9, -10, 20, 0])
    out = gather_from_host(put(x0), idx, mode="fill", fill_value=fill_value, backend=backend)
    expected = jnp.asarray(x0).at[idx].get(mode="fill", fill_value=fill_value)
    assert_same(read(out), np.asarray(expected))


@pytest.mark.parametrize("backend", VALUE_BACKENDS)
def test_gather_fill_value_is_ignored_outside_fill_modes(rng, backend):
    x0 = make_values(rng, (9, 2), "float32")
    idx = np.array([3, 9, -10])
    out = gather_from_host(put(x0), idx, mode="clip", fill_value=7.0, backend=backend)
    assert_same(read(out), gather_oracle(x0, idx, "clip"))


@pytest.mark.parametrize("backend", VALUE_BACKENDS)
def test_gather_from_an_empty_buffer_fills(backend):
    # No rows exist: fill mode answers with fill values (jnp raises in every mode).
    out = gather_from_host(
        put(np.zeros((0, 3), np.float32)), [0, -1], mode="fill", fill_value=1.5, backend=backend
    )
    assert_same(read(out), np.full((2, 3), 1.5, np.float32))


@pytest.mark.parametrize("backend", BACKENDS)
def test_gather_under_jit_and_with_a_sorted_promise(rng, backend):
    x0 = make_values(rng, (50, 3), "float16")
    idx = np.sort(rng.integers(0, 50, size=12))
    fn = jax.jit(lambda x, i: gather_from_host(x, i, indices_are_sorted=True, backend=backend))
    check_gather(fn(put(x0), jnp.asarray(idx)), x0, idx)
