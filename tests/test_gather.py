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

from pallas_pinned import tuning
from pallas_pinned.gather import gather_from_host
from pallas_pinned.testing import assert_same, gather_oracle, make_values
from tests.helpers import BACKENDS, VALUE_BACKENDS, check_gather, mixed_indices, put, read

GATHER_DTYPES = ["float32", "bfloat16", "float16", "int32", "int8", "uint8", "bool"]
GATHER_MODES = [None, "fill", "drop", "clip", "promise_in_bounds"]
# A read takes one of two row paths, whatever the dtype: "fill" and "drop" give
# fill values (each dtype's default), the other modes clamp. Every dtype goes
# through both; every mode through float32.
DTYPE_MODES = [(dtype, mode) for dtype in GATHER_DTYPES for mode in ("fill", "clip")] + [
    ("float32", mode) for mode in GATHER_MODES if mode not in ("fill", "clip")
]


@pytest.fixture
def small_sort_crossover():
    """Makes batches of 64+ rows take the sorted (coalescing) kernel path.

    The thresholds are part of the ops' jit cache keys, so no cache clearing.
    """
    with tuning.override(sort_min_gathers=64):
        yield


@pytest.mark.parametrize("backend", VALUE_BACKENDS)
@pytest.mark.parametrize(("dtype", "mode"), DTYPE_MODES)
def test_gather_dtypes_and_modes(rng, backend, dtype, mode):
    # Every jnp get mode on one batch of negative, out-of-range and repeated
    # rows, each dtype's default fill value included.
    x0 = make_values(rng, (17, 3), dtype)
    idx = mixed_indices(rng, 17, (4, 5))
    out = gather_from_host(put(x0), jnp.asarray(idx), mode=mode, backend=backend)
    check_gather(out, x0, idx, mode)


@pytest.mark.parametrize("backend", VALUE_BACKENDS)
@pytest.mark.parametrize(
    "row_shape",
    [
        (),  # rank 1: one element per row
        (3,),  # rank 2, width off any power of two
        (100,),  # width not a multiple of the column block
        (4, 25),  # rank 3: rows flattened to 100 elements
        (0,),  # rows of no elements: an empty result of the right shape
    ],
)
def test_gather_row_shapes(rng, backend, row_shape):
    x0 = make_values(rng, (23, *row_shape), "float32")
    idx = mixed_indices(rng, 23, (11,))
    check_gather(gather_from_host(put(x0), idx, mode="fill", backend=backend), x0, idx, "fill")


@pytest.mark.parametrize("backend", VALUE_BACKENDS)
@pytest.mark.parametrize(
    "n",
    [
        0,  # empty: nothing read, an empty device array comes back
        1,  # a single row
        5,  # the example size
        1027,  # several row blocks for width 3, the last one partial
    ],
)
def test_gather_counts(rng, backend, n):
    x0 = make_values(rng, (1500, 3), "float32")
    idx = mixed_indices(rng, 1500, (n,))
    check_gather(gather_from_host(put(x0), idx, mode="fill", backend=backend), x0, idx, "fill")


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
@pytest.mark.parametrize("index_dtype", ["int8", "uint8", "int16", "int32", "int64"])
def test_gather_index_dtypes(rng, backend, index_dtype):
    # Narrow index types must not overflow when negatives wrap.
    x0 = make_values(rng, (100, 2), "float32")
    info = np.iinfo(index_dtype)
    idx = np.array(
        [5, 99, max(info.min, -100), min(info.max, 150), 0, max(info.min, -1)], index_dtype
    )
    out = gather_from_host(put(x0), idx, mode="fill", backend=backend)
    assert_same(read(out), gather_oracle(x0, idx, "fill"))


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
