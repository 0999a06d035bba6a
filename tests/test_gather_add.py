"""gather_from_host and scatter_add_to_host against jnp and plain numpy oracles.

Every case runs through the XLA fallback, the Pallas kernels in interpret
mode, "auto", and (marker ``gpu``) the compiled kernels. Buffers hold fresh
random data, never zeros; gathered rows that the kernel failed to read, and
rows it added into twice or not at all, show up as mismatches. Interpret mode
is slow on a CPU, so the shapes stay tiny.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import zlib

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from pallas_pinned import tuning
from pallas_pinned.gather import gather_from_host
from pallas_pinned.scatter_add import scatter_add_to_host
from pallas_pinned.testing import assert_same, make_values
from tests.helpers import put, read

BACKENDS = ["xla", "interpret", "auto", pytest.param("pallas", marks=pytest.mark.gpu)]
KERNEL_BACKENDS = ["interpret", pytest.param("pallas", marks=pytest.mark.gpu)]
GATHER_DTYPES = ["float32", "bfloat16", "float16", "int32", "int8", "uint8", "bool"]
ADD_DTYPES = ["float32", "bfloat16", "float16", "int32", "int8", "uint8"]
GATHER_MODES = [None, "fill", "drop", "clip", "promise_in_bounds"]
ADD_MODES = [None, "drop", "clip"]


@pytest.fixture
def rng(request):
    # Reproducible across runs (str hashes are not), different per case.
    return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))


@pytest.fixture
def small_sort_crossover():
    """Makes batches of 64+ rows take the sorted (coalescing) kernel paths.

    The thresholds are part of the ops' jit cache keys, so no cache clearing.
    """
    with tuning.override(sort_min_gathers=64, sort_min_adds=64):
        yield


def _np_dtype(dtype: str):
    return ml_dtypes.bfloat16 if dtype == "bfloat16" else np.dtype(dtype)


# --- numpy oracles, written as plainly as possible ------------------------------


def gather_oracle(x, indices, mode=None, fill_value=None):
    """jnp's get on jax 0.11.2, one row at a time.

    Negative rows wrap once; then "fill"/"drop" give fill_value for rows still
    out of range, and every other mode (None included) clamps, as XLA does.
    """
    flat = np.asarray(indices, np.int64).reshape(-1)
    num_rows = x.shape[0]
    out = np.empty((flat.size,) + x.shape[1:], x.dtype)
    for k, row in enumerate(flat.tolist()):
        if row < 0:
            row += num_rows
        if mode in ("fill", "drop"):
            if 0 <= row < num_rows:
                out[k] = x[row]
            else:
                out[k] = _default_fill(x.dtype) if fill_value is None else fill_value
        else:
            out[k] = x[min(max(row, 0), num_rows - 1)]
    return out.reshape(np.shape(indices) + x.shape[1:])


def _default_fill(dtype):
    if dtype == np.bool_:
        return True
    if np.issubdtype(dtype, np.integer):
        info = np.iinfo(dtype)
        return info.min if np.issubdtype(dtype, np.signedinteger) else info.max
    return np.nan


def add_oracle(x, indices, updates, mode=None):
    """Adds one update after another; 16-bit floats sum in float64, round once.

    The test data are small multiples of 1/4, so every sum is exact in
    float32 and the summation order cannot matter. Integers wrap.
    """
    wide = np.int64 if np.issubdtype(np.dtype(x.dtype), np.integer) else np.float64
    out = x.astype(wide)
    num_rows = x.shape[0]
    flat = np.asarray(indices, np.int64).reshape(-1)
    rows_of_updates = np.broadcast_to(updates, np.shape(indices) + x.shape[1:])
    rows_of_updates = rows_of_updates.reshape((flat.size,) + x.shape[1:])
    for row, update in zip(flat.tolist(), rows_of_updates, strict=True):
        if row < 0:
            row += num_rows
        if mode == "clip":
            row = min(max(row, 0), num_rows - 1)
        elif not 0 <= row < num_rows:
            continue
        out[row] += update.astype(wide)
    return out.astype(x.dtype)  # int64 -> int8 wraps, as jnp's int8 sums do.


def exact_values(rng, shape, dtype: str) -> np.ndarray:
    """Random non-zero data whose sums are exact: quarters in [-16, 16) for floats."""
    if np.issubdtype(np.dtype(_np_dtype(dtype)), np.integer):
        return make_values(rng, shape, dtype)  # Full range: sums wrap.
    quarters = rng.integers(-64, 64, size=shape)
    quarters[quarters == 0] = 1
    return (quarters / 4).astype(_np_dtype(dtype))


def _mixed_indices(rng, num_rows, shape):
    """Negative, out-of-range (both sides) and repeated rows, all in one batch."""
    idx = rng.integers(-num_rows - 3, num_rows + 3, size=shape)
    flat = idx.reshape(-1)
    if flat.size >= 3:
        flat[1] = flat[0]  # A sure duplicate.
        flat[2] = -1  # The last row, through wrapping.
    return idx


def _check_gather(out, x0, idx, mode=None, fill_value=None):
    """Device memory, jnp's answer, and the oracle's (which must agree with jnp)."""
    assert out.sharding.memory_kind == "device", out.sharding
    kwargs = {} if fill_value is None else {"fill_value": fill_value}
    expected = np.asarray(jnp.asarray(x0).at[jnp.asarray(idx)].get(mode=mode, **kwargs))
    assert_same(read(out), expected, what="vs jnp")
    assert_same(expected, gather_oracle(x0, np.asarray(idx), mode, fill_value), what="oracle")


def _run_add(rng, backend, x0, idx, upd, *, mode=None, kind="pinned_host", **kwargs):
    x = put(x0, kind)
    out = scatter_add_to_host(
        x, jnp.asarray(idx), jnp.asarray(upd), mode=mode, backend=backend, **kwargs
    )
    assert out.sharding.memory_kind == kind, out.sharding
    assert_same(read(out), add_oracle(x0, idx, upd, mode))
    return x, out


# --- gather_from_host ------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", GATHER_DTYPES)
@pytest.mark.parametrize("mode", GATHER_MODES)
def test_gather_dtypes_and_modes(rng, backend, dtype, mode):
    # Every jnp get mode on one batch of negative, out-of-range and repeated
    # rows, each dtype's default fill value included.
    x0 = make_values(rng, (17, 3), dtype)
    idx = _mixed_indices(rng, 17, (4, 5))
    out = gather_from_host(put(x0), jnp.asarray(idx), mode=mode, backend=backend)
    _check_gather(out, x0, idx, mode)


@pytest.mark.parametrize("backend", BACKENDS)
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
    idx = _mixed_indices(rng, 23, (11,))
    _check_gather(gather_from_host(put(x0), idx, mode="fill", backend=backend), x0, idx, "fill")


@pytest.mark.parametrize("backend", BACKENDS)
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
    idx = _mixed_indices(rng, 1500, (n,))
    _check_gather(gather_from_host(put(x0), idx, mode="fill", backend=backend), x0, idx, "fill")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("mode", ["fill", "clip"])
def test_gather_sorted_reads_come_back_in_callers_order(rng, backend, mode, small_sort_crossover):
    # Above the (patched) crossover the kernel reads in ascending row order
    # and stores each row at its caller position; out-of-range rows mixed in.
    x0 = make_values(rng, (300, 2), "int32")
    idx = _mixed_indices(rng, 300, (10, 20))
    _check_gather(gather_from_host(put(x0), idx, mode=mode, backend=backend), x0, idx, mode)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", ["device", "pinned_host"])
def test_gather_memory_kinds_and_x_is_kept(rng, backend, kind):
    # The result is in device memory whatever x's memory; x is not consumed.
    x0 = make_values(rng, (40, 4), "float32")
    x = put(x0, kind)
    idx = _mixed_indices(rng, 40, (9,))
    _check_gather(gather_from_host(x, idx, backend=backend), x0, idx)
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


@pytest.mark.parametrize("backend", BACKENDS)
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


@pytest.mark.parametrize("backend", BACKENDS)
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


@pytest.mark.parametrize("backend", BACKENDS)
def test_gather_fill_value_is_ignored_outside_fill_modes(rng, backend):
    x0 = make_values(rng, (9, 2), "float32")
    idx = np.array([3, 9, -10])
    out = gather_from_host(put(x0), idx, mode="clip", fill_value=7.0, backend=backend)
    assert_same(read(out), gather_oracle(x0, idx, "clip"))


@pytest.mark.parametrize("backend", BACKENDS)
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
    _check_gather(fn(put(x0), jnp.asarray(idx)), x0, idx)


# --- scatter_add_to_host ---------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", ADD_DTYPES)
@pytest.mark.parametrize("mode", ADD_MODES)
def test_add_dtypes_and_modes(rng, backend, dtype, mode):
    # Negative, out-of-range and repeated rows in one batch, every dtype.
    x0 = exact_values(rng, (13, 3), dtype)
    idx = _mixed_indices(rng, 13, (4, 5))
    upd = exact_values(rng, (4, 5, 3), dtype)
    _run_add(rng, backend, x0, idx, upd, mode=mode)


@pytest.mark.parametrize("backend", BACKENDS)
def test_add_promise_in_bounds_with_valid_indices(rng, backend):
    # Unchecked mode is defined for in-range indices only (negatives wrap).
    x0 = exact_values(rng, (30, 4), "float32")
    idx = np.array([3, -1, 7, 3, 0, -30, 29])
    upd = exact_values(rng, (7, 4), "float32")
    _run_add(rng, backend, x0, idx, upd, mode="promise_in_bounds")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("row_shape", [(), (3,), (100,), (4, 25), (0,)])  # as for gather
def test_add_row_shapes(rng, backend, row_shape):
    x0 = exact_values(rng, (23, *row_shape), "float32")
    idx = _mixed_indices(rng, 23, (11,))
    upd = exact_values(rng, (11, *row_shape), "float32")
    _run_add(rng, backend, x0, idx, upd)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("n", [0, 1, 5, 1027])  # as for gather
def test_add_counts(rng, backend, n):
    x0 = exact_values(rng, (1500, 3), "bfloat16")
    idx = _mixed_indices(rng, 1500, (n,))
    upd = exact_values(rng, (n, 3), "bfloat16")
    _run_add(rng, backend, x0, idx, upd)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("promise", ["unique", "sorted", "both"])
def test_add_honest_promises(rng, backend, promise, small_sort_crossover):
    # unique_indices skips combining (and, unsorted, takes the coalescing
    # sort above the patched crossover); sorted skips the sorts.
    x0 = exact_values(rng, (400, 3), "float32")
    idx = rng.permutation(450)[:200]  # Distinct; some past the end are dropped.
    if promise != "unique":
        idx = np.sort(idx)
    upd = exact_values(rng, (200, 3), "float32")
    kwargs = {
        "unique_indices": promise in ("unique", "both"),
        "indices_are_sorted": promise in ("sorted", "both"),
    }
    _run_add(rng, backend, x0, idx, upd, **kwargs)


@pytest.mark.parametrize("backend", BACKENDS)
def test_add_unique_promise_with_clip_still_combines(rng, backend):
    # Distinct indices can clip onto the same edge row; both additions count.
    x0 = exact_values(rng, (5, 2), "float32")
    idx = np.array([7, 9, -8, 2])
    upd = exact_values(rng, (4, 2), "float32")
    _run_add(rng, backend, x0, idx, upd, mode="clip", unique_indices=True)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_add_half_precision_sums_in_float32(backend, dtype):
    # 300 ones into one row: float32 sums give 300 (exact in both types);
    # jnp's running 16-bit sum stalls at 256 in bfloat16.
    x0 = np.zeros((2, 1), _np_dtype(dtype))
    out = scatter_add_to_host(
        put(x0), jnp.zeros(300, jnp.int32), jnp.ones((300, 1), dtype), backend=backend
    )
    assert read(out)[0, 0] == 300 and read(out)[1, 0] == 0


@pytest.mark.parametrize("backend", BACKENDS)
def test_add_int8_wraps_like_jnp(backend):
    x0 = np.array([[120], [-128]], np.int8)
    out = scatter_add_to_host(
        put(x0), jnp.array([0, 0, 1]), jnp.array([[10], [10], [-1]], jnp.int8), backend=backend
    )
    expected = jnp.asarray(x0).at[jnp.array([0, 0, 1])].add(jnp.array([[10], [10], [-1]], jnp.int8))
    assert_same(read(out), np.asarray(expected))


def test_add_is_deterministic_and_backends_agree(rng):
    # Random float32 values with heavy duplication: not exact, so the
    # summation order shows. Same bits every run, kernel and XLA alike, and
    # close to jnp's (unordered) sums.
    x0 = make_values(rng, (16, 3), "float32")
    idx = rng.integers(0, 16, size=200)
    upd = make_values(rng, (200, 3), "float32")
    results = [
        read(scatter_add_to_host(put(x0), jnp.asarray(idx), jnp.asarray(upd), backend=backend))
        for backend in ("xla", "xla", "interpret", "interpret")
    ]
    for other in results[1:]:
        assert_same(other, results[0])
    expected = jnp.asarray(x0).at[idx].add(upd)
    np.testing.assert_allclose(results[0], expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("backend", BACKENDS)
def test_add_updates_broadcast_and_cast(rng, backend):
    # A scalar broadcasts to every indexed row; int updates go into floats.
    x0 = exact_values(rng, (10, 4), "float32")
    idx = np.array([1, 8, 1])
    _run_add(rng, backend, x0, idx, np.float32(2.5))
    _run_add(rng, backend, x0, idx, np.arange(12, dtype=np.int32).reshape(3, 4))


@pytest.mark.parametrize("backend", BACKENDS)
def test_add_index_forms(rng, backend):
    x0 = exact_values(rng, (40, 3), "float32")
    x = put(x0)
    out = scatter_add_to_host(x, slice(None, 36, 7), 1.0, backend=backend)
    assert_same(read(out), add_oracle(x0, np.arange(40)[:36:7], np.float32(1.0)))
    out = scatter_add_to_host(out, -1, np.full(3, 2.0, np.float32), backend=backend)
    expected = add_oracle(
        add_oracle(x0, np.arange(40)[:36:7], np.float32(1.0)),
        [-1],
        np.full((1, 3), 2.0, np.float32),
    )
    assert_same(read(out), expected)


@pytest.mark.parametrize("backend", BACKENDS)
def test_add_eager_call_consumes_x_and_jit_without_donation_keeps_it(rng, backend):
    x0 = exact_values(rng, (8, 2), "float32")
    idx, upd = jnp.array([1, 1]), jnp.ones((2, 2), jnp.float32)
    x = put(x0)
    scatter_add_to_host(x, idx, upd, backend=backend)
    assert x.is_deleted()
    x = put(x0)
    out = jax.jit(lambda x, i, u: scatter_add_to_host(x, i, u, backend=backend))(x, idx, upd)
    assert_same(read(x), x0)
    assert_same(read(out), add_oracle(x0, np.asarray(idx), np.asarray(upd)))


# --- bad input: raised before anything runs, x left untouched -------------------


def _x():
    return put(np.arange(12, dtype=np.float32).reshape(6, 2))


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"mode": "wrap"}, ValueError, "'wrap'"),  # not a jnp get mode
        ({"backend": "cuda"}, ValueError, "'cuda'"),
        ({"indices": np.array([1.0])}, TypeError, "float64"),
        ({"indices": (1, 0)}, NotImplementedError, "Tuples"),
        ({"indices": True}, TypeError, "bool"),
        ({"mode": "fill", "fill_value": np.array([1.0, 2.0])}, ValueError, r"\(2,\)"),
        ({"mode": "fill", "fill_value": "zero"}, TypeError, "'zero'"),
        ({"mode": "fill", "fill_value": 1j}, TypeError, "1j"),
        ({"backend": "pallas"}, NotImplementedError, "'cpu'"),  # no GPU here
    ],
)
def test_gather_bad_input(kwargs, error, match):
    if kwargs.get("backend") == "pallas" and jax.default_backend() == "gpu":
        pytest.skip("the pallas backend exists on a GPU")
    kwargs = {"indices": np.array([1, 2]), **kwargs}
    with pytest.raises(error, match=match):
        gather_from_host(_x(), **kwargs)


def test_gather_bad_buffers():
    with pytest.raises(TypeError, match="ndarray"):
        gather_from_host(np.zeros((4, 2)), [1])
    with pytest.raises(ValueError, match=r"shape \(\)"):
        gather_from_host(jnp.float32(1.0), [0])
    with pytest.raises(ValueError, match=r"mode='clip'"):  # No row to clamp to.
        gather_from_host(put(np.zeros((0, 2), np.float32)), [0], mode="clip")


def test_gather_traced_fill_value_is_refused():
    with pytest.raises(TypeError, match="static scalar"):
        jax.jit(lambda v: gather_from_host(_x(), [9], mode="fill", fill_value=v))(1.0)


def test_gather_indices_on_another_device():
    other = jax.devices()[1] if len(jax.devices()) > 1 else None
    if other is None:
        pytest.skip("needs two devices")
    with pytest.raises(ValueError, match="indices is on"):
        gather_from_host(_x(), jax.device_put(jnp.array([1]), other))


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"mode": "fill"}, ValueError, "'fill'"),  # an add mode list, as for scatter_to_host
        ({"updates": np.ones((3, 2))}, ValueError, r"\(3, 2\)"),
        ({"updates": np.array(["a", "b"])}, TypeError, "<U1"),
        ({"indices": np.array([0.5, 1.0])}, TypeError, "float64"),
        ({"backend": "pallas"}, NotImplementedError, "'cpu'"),
    ],
)
def test_add_bad_input_leaves_x_alone(kwargs, error, match):
    if kwargs.get("backend") == "pallas" and jax.default_backend() == "gpu":
        pytest.skip("the pallas backend exists on a GPU")
    x = _x()
    kwargs = {"indices": np.array([1, 2]), "updates": np.ones((2, 2), np.float32), **kwargs}
    with pytest.raises(error, match=match):
        scatter_add_to_host(x, **kwargs)
    assert not x.is_deleted()


def test_add_into_bool_is_refused_as_in_jnp():
    with pytest.raises(TypeError, match="bool"):
        scatter_add_to_host(put(np.ones((4, 2), bool)), [1], True)


def test_add_updates_on_another_device():
    if len(jax.devices()) < 2:
        pytest.skip("needs two devices")
    x = _x()
    with pytest.raises(ValueError, match="updates is on"):
        scatter_add_to_host(x, [1], jax.device_put(jnp.ones((1, 2)), jax.devices()[1]))
    assert not x.is_deleted()


# --- transformations ---------------------------------------------------------------

X0 = np.arange(12.0, dtype=np.float32).reshape(6, 2) + 1
WEIGHTS = jnp.arange(12.0, dtype=jnp.float32).reshape(6, 2) + 1


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", ["device", "pinned_host"])
def test_vmap_of_gather_over_indices_is_one_call(backend, kind):
    idx = jnp.array([[0, -1, 3], [12, -13, 5]])
    x = put(X0, kind)
    out = jax.vmap(lambda i: gather_from_host(x, i, mode="fill", backend=backend))(idx)
    _check_gather(out, X0, np.asarray(idx), "fill")
    out = jax.jit(jax.vmap(lambda i: gather_from_host(x, i, backend=backend), 1, 1))(idx)
    _check_gather(out, X0, np.asarray(idx))


def test_vmap_of_gather_over_device_buffers_works_and_over_host_buffers_is_refused():
    xs = np.stack([X0, X0 + 100])
    idx = jnp.array([[0, 5], [-1, 2]])
    out = jax.vmap(lambda x, i: gather_from_host(x, i))(jnp.asarray(xs), idx)
    assert_same(read(out), np.stack([gather_oracle(xs[b], np.asarray(idx[b])) for b in (0, 1)]))
    with pytest.raises(NotImplementedError, match="vmap over the indices"):
        jax.vmap(lambda x, i: gather_from_host(x, i))(put(xs), idx)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("mode", ["fill", "clip"])
def test_grad_of_gather_for_a_device_buffer(backend, mode):
    # Clamped rows receive the cotangent of the rows they read; filled ones none.
    idx = jnp.array([[0, -1, 3], [9, -13, 3]])
    weights = jnp.arange(12.0).reshape(2, 3, 2)

    def loss(gather, x):
        return jnp.sum(gather(x) * weights)

    ours = jax.grad(
        lambda x: loss(
            lambda x: gather_from_host(x, idx, mode=mode, fill_value=0.0, backend=backend), x
        )
    )(jnp.asarray(X0))
    jnps = jax.grad(lambda x: loss(lambda x: x.at[idx].get(mode=mode, fill_value=0.0), x))(
        jnp.asarray(X0)
    )
    assert_same(ours, np.asarray(jnps))


def test_grad_of_gather_for_a_host_buffer_is_refused_but_stop_gradient_works():
    x = put(X0)
    with pytest.raises(TypeError, match="stop_gradient"):
        jax.grad(lambda x: jnp.sum(gather_from_host(x, [1, 2])))(x)
    with pytest.raises(TypeError, match="pinned_host"):
        jax.jvp(lambda x: gather_from_host(x, [1]), (x,), (jnp.ones_like(X0),))
    # Differentiating with respect to something else is fine.
    grad = jax.grad(lambda w: jnp.sum(gather_from_host(jax.lax.stop_gradient(x), [1, 2]) * w))(
        jnp.ones((2, 2))
    )
    assert_same(grad, X0[1:3])


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", ["device", "pinned_host"])
@pytest.mark.parametrize("mode", [None, "clip"])
def test_grad_of_add_with_respect_to_updates(backend, kind, mode):
    # Every update that lands gets its row's cotangent (duplicates too);
    # dropped ones none, clipped ones that of the edge row.
    idx = jnp.array([1, 4, 1, -1, 9, -9])
    upd = jnp.arange(12.0, dtype=jnp.float32).reshape(6, 2) + 100

    def loss(u):
        out = scatter_add_to_host(put(X0, kind), idx, u, mode=mode, backend=backend)
        return jnp.sum(jax.device_put(out, jax.memory.Space.Device) * WEIGHTS)

    expected = jax.grad(lambda u: jnp.sum(jnp.asarray(X0).at[idx].add(u, mode=mode) * WEIGHTS))(upd)
    assert_same(jax.grad(loss)(upd), np.asarray(expected))


def test_grad_of_add_of_a_broadcast_scalar():
    def loss(value):
        return jnp.sum(scatter_add_to_host(jnp.asarray(X0), jnp.array([0, 0, 9]), value))

    assert jax.grad(loss)(2.0) == 4.0  # Two landing rows of two elements; 9 is dropped.


def test_grad_of_add_with_respect_to_the_buffer_is_refused():
    with pytest.raises(TypeError, match="stop_gradient"):
        jax.grad(lambda x: jnp.sum(scatter_add_to_host(x, 1, 0.0)))(jnp.asarray(X0))


def test_vmap_of_add_is_refused_with_the_alternative():
    x = jnp.asarray(X0)
    with pytest.raises(NotImplementedError, match=r"indices.reshape\(-1\)"):
        jax.vmap(lambda i: scatter_add_to_host(x, i, 1.0))(jnp.array([[1], [2]]))


# --- GPU only: the compiled kernels really work in place on host memory -----------

GPU = pytest.mark.gpu


def _compiled_hlo(fn, *args, donate=False) -> str:
    jitted = jax.jit(fn, donate_argnums=(0,) if donate else ())
    return jitted.lower(*args).compile().as_text()


def _triton_calls(hlo: str) -> list[str]:
    return [line for line in hlo.splitlines() if "__gpu$xla.gpu.triton" in line]


@GPU
@pytest.mark.parametrize("n", [100, 20000])  # below and above the sort crossover
def test_gpu_gather_hlo_reads_the_host_buffer_in_place(n):
    x = put(np.ones((32768, 64), np.float32))
    idx = (jnp.arange(n, dtype=jnp.int32) * 7919) % 32768
    hlo = _compiled_hlo(lambda x, i: gather_from_host(x, i), x, idx)
    calls = _triton_calls(hlo)
    assert len(calls) == 1, hlo
    # The kernel's operand is the buffer parameter itself, which lives in
    # pinned host memory, S(5); the result does not. (The call line lists
    # operands by name; their memory space shows on the parameter's line.)
    param = re.search(r"(%[\w.]+) = f32\[32768,64\]\{1,0:S\(5\)\} parameter\(0\)", hlo)
    assert param, hlo
    assert re.search(rf"custom-call\([^)]*{re.escape(param.group(1))}\)", calls[0]), calls[0]
    assert re.search(rf"=\s*f32\[{n},64\]\{{1,0\}}\s*custom-call", calls[0]), calls[0]
    # Nothing but the parameter has the buffer's shape: no copy of it anywhere.
    full = [ln for ln in hlo.splitlines() if re.search(r"=\s*f32\[32768,64\]", ln)]
    assert all("parameter(" in ln for ln in full), full
    assert "host-compute" not in hlo.lower()


@GPU
def test_gpu_add_hlo_updates_the_host_buffer_in_place():
    x = put(np.ones((4096, 64), np.float32))
    idx = jnp.arange(100, dtype=jnp.int32) % 37  # duplicates: combined first
    upd = jnp.ones((100, 64), jnp.float32)
    hlo = _compiled_hlo(lambda x, i, u: scatter_add_to_host(x, i, u), x, idx, upd, donate=True)
    calls = _triton_calls(hlo)
    assert len(calls) == 1, hlo
    assert re.search(r"=\s*f32\[4096,64\]\{1,0:S\(5\)\}\s*custom-call", calls[0]), calls[0]
    assert "output_to_operand_aliasing={{}: (2, {})}" in calls[0], calls[0]
    assert not re.search(r"f32\[4096,64\]\{[^}]*\}\s+copy\(", hlo), "the buffer was copied"
    assert "host-compute" not in hlo.lower()


@GPU
def test_gpu_gather_does_not_grow_device_memory_with_the_buffer():
    x = put(np.zeros((1 << 27,), np.float32))  # 512 MiB on the host
    jax.block_until_ready(x)
    before = jax.devices()[0].memory_stats()["bytes_in_use"]
    out = gather_from_host(x, jnp.arange(1000) * 1000)
    jax.block_until_ready(out)
    grown = jax.devices()[0].memory_stats()["bytes_in_use"] - before
    assert grown < 64 * 2**20, grown


@GPU
def test_gpu_add_eager_call_updates_in_place():
    x = put(np.zeros((1000, 16), np.float32))
    pointer = x.unsafe_buffer_pointer()
    out = scatter_add_to_host(x, jnp.array([3, 3, 999]), jnp.ones((3, 16), jnp.float32))
    assert x.is_deleted()
    assert out.unsafe_buffer_pointer() == pointer
    rows = read(out)
    assert (rows[3] == 2).all() and (rows[999] == 1).all() and (rows[4] == 0).all()


@GPU
def test_gpu_compiles_with_automatic_host_compute_offload_disabled():
    # If either op were turned into host compute, XLA would refuse here.
    script = textwrap.dedent(
        """
        import jax, jax.numpy as jnp, numpy as np
        from pallas_pinned.scatter_add import scatter_add_to_host
        from pallas_pinned.gather import gather_from_host
        host = jax.sharding.SingleDeviceSharding(jax.devices()[0], memory_kind="pinned_host")
        x = jax.device_put(np.zeros((1 << 20,), np.float32), host)
        add = jax.jit(lambda x, i: scatter_add_to_host(x, i, 1.0), donate_argnums=(0,))
        x = add(x, jnp.array([0, 0, 3]))
        got = jax.jit(lambda x, i: gather_from_host(x, i, mode="fill"))(x, jnp.array([0, 3, 9, -1]))
        assert np.asarray(got).tolist() == [2, 1, 0, 0], np.asarray(got)
        print("ok", x.sharding.memory_kind, got.sharding.memory_kind)
        """
    )
    env = dict(os.environ)
    env["XLA_FLAGS"] = (
        env.get("XLA_FLAGS", "") + " --xla_disable_automatic_host_compute_offload=true"
    ).strip()
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "ok pinned_host device" in done.stdout
