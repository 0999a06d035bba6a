"""Every internal path of an op gives the same bits (the thresholds only choose speed).

``tuning.override`` forces each path in turn: the one-launch scatter for small
batches (normalization and de-duplication inside the kernel), the sort then the row
kernel; for add, the stable order by the order kernel or by XLA's sort, and distinct
rows by the sorted-runs kernel or the plain add kernel. Fresh random data with
duplicates and out-of-range indices, buffers poisoned with random values so that
unwritten rows show.
"""

from __future__ import annotations

import zlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallas_pinned as pp
from pallas_pinned import _rows, tuning
from pallas_pinned.testing import assert_same, scatter_add_oracle, scatter_oracle

KERNEL_BACKENDS = ["interpret", pytest.param("pallas", marks=pytest.mark.gpu)]
NEVER = 2**62  # A threshold no batch reaches.

SET_PATHS = {
    "fused": dict(fused_max_updates=NEVER),
    "sorted": dict(fused_max_updates=0, sort_from=0),
    "unsorted_unique": dict(fused_max_updates=0, sort_from=NEVER),
}


def _host(array):
    sharding = jax.sharding.make_single_device_sharding(jax.devices()[0], memory_kind="pinned_host")
    return jax.device_put(array, sharding)


def _rng(request):
    return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))


@pytest.mark.parametrize("backend", KERNEL_BACKENDS)
@pytest.mark.parametrize("path", sorted(SET_PATHS))
@pytest.mark.parametrize("mode", [None, "clip", "promise_in_bounds"])  # "fill": None's code
@pytest.mark.parametrize(("n", "width"), [(1, 1), (7, 3), (200, 5), (1500, 2)])
def test_set_paths_agree_with_the_oracle(request, backend, path, mode, n, width):
    rng = _rng(request)
    rows = 300
    x0 = rng.standard_normal((rows, width)).astype(np.float32)
    low, high = (-rows, rows) if mode == "promise_in_bounds" else (-rows - 20, rows + 20)
    idx = rng.integers(low, high, n).astype(np.int32)
    idx[: n // 4] = idx[n // 2 : n // 2 + n // 4]  # Duplicates, some far apart.
    unique = path == "unsorted_unique"
    if unique:  # A true promise: distinct in-range rows.
        idx = rng.permutation(rows)[: min(n, rows)].astype(np.int32)
    upd = rng.standard_normal((idx.size, width)).astype(np.float32)
    with tuning.override(**SET_PATHS[path]):
        out = pp.scatter_to_host(
            _host(x0), jnp.asarray(idx), jnp.asarray(upd), mode=mode,
            unique_indices=unique, backend=backend,
        )
    assert out.sharding.memory_kind == "pinned_host"
    assert_same(np.asarray(out), scatter_oracle(x0, idx, upd, mode))


@pytest.mark.parametrize("backend", KERNEL_BACKENDS)
@pytest.mark.parametrize("n", [65, 700, 3000])
def test_add_order_kernel_gives_xlas_order_bits(request, monkeypatch, backend, n):
    # The runs path's stable order formed by the Pallas kernel (one launch) or by XLA's
    # sort: the same permutation, so the same sums. Many duplicates, negatives, dropped rows.
    rng = _rng(request)
    x0 = rng.standard_normal((50, 3)).astype(np.float32)
    idx = rng.integers(-60, 60, n).astype(np.int32)
    upd = rng.standard_normal((n, 3)).astype(np.float32)
    xla_orders = []
    real_order = _rows.stable_order
    monkeypatch.setattr(_rows, "stable_order",
                        lambda rows: xla_orders.append(rows.shape[0]) or real_order(rows))
    results = []
    for kernel_max in (NEVER, 0):
        xla_orders.clear()
        with tuning.override(fused_max_unpromised_adds=0, order_kernel_max=kernel_max):
            out = pp.scatter_add_to_host(
                _host(x0), jnp.asarray(idx), jnp.asarray(upd), backend=backend
            )
        results.append(np.asarray(out))
        # On a GPU the call also traces the XLA branch of lax.platform_dependent, which
        # orders with XLA's sort: only the kernel's arm is checked there.
        if kernel_max == 0:
            assert xla_orders, "order_kernel_max=0 must leave the order to XLA"
        elif backend == "interpret":
            assert not xla_orders, "the order kernel must form the order"
    assert_same(results[0], results[1], what="order kernel vs XLA's order")
    expected = x0.copy()
    keep = (idx >= -50) & (idx < 50)
    np.add.at(expected, np.where(idx[keep] < 0, idx[keep] + 50, idx[keep]), upd[keep])
    np.testing.assert_allclose(results[0], expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("backend", KERNEL_BACKENDS)
@pytest.mark.parametrize("mode", [None, "fill", "promise_in_bounds"])
@pytest.mark.parametrize(("dtype", "width", "atomic_from"),
                         [(np.float32, 64, NEVER), (np.float32, 64, 0), (jnp.bfloat16, 128, NEVER),
                          (np.float32, 3, NEVER)])
def test_distinct_adds_give_the_same_bits_by_runs_as_by_the_add_kernel(
        request, backend, mode, dtype, width, atomic_from):
    # Distinct rows sorted for locality (from sort_from) are summed by the sorted-runs
    # kernel, runs of one entry; below sort_from by the plain add kernel. The jaxpr says
    # which ran; the bits are the same.
    rng = _rng(request)
    rows, n = 300, 150
    x0 = rng.standard_normal((rows, width)).astype(dtype)
    # Unsigned: the promise is taken at its word (of a signed type it is used only where
    # a kernel checks for negatives: tests/test_promises.py).
    idx = rng.permutation(rows)[:n].astype(np.uint32)
    if mode != "promise_in_bounds":
        idx[1::7] = rows + 7 * np.arange(idx[1::7].size)  # Dropped, distinct too.
    upd = rng.standard_normal((n, width)).astype(dtype)
    results = []
    for sort_from in (NEVER, 0):
        def add(x, i, u):  # A new function per arm: make_jaxpr caches by function.
            return pp.scatter_add_to_host(x, i, u, mode=mode, unique_indices=True,
                                          backend=backend)

        with tuning.override(fused_max_updates=0, atomic_add_from=atomic_from, sort_from=sort_from):
            args = (_host(x0), jnp.asarray(idx), jnp.asarray(upd))
            ran_runs = "scatter_add_sorted_runs" in str(jax.make_jaxpr(add)(*args))
            assert ran_runs == (sort_from == 0), f"sort_from={sort_from}"
            results.append(np.asarray(add(*args)))
    assert_same(results[0], results[1], what="runs kernel vs add kernel")
    assert_same(results[1], scatter_add_oracle(x0, idx, upd, "drop" if mode == "fill" else mode))


def test_fused_path_duplicate_search_spans_many_chunks(request):
    # More than one chunk of 1 Ki entries and programs of 8 entries: the last
    # writer of a row can sit thousands of entries later, in another program.
    rng = _rng(request)
    n, rows = 3000, 40
    x0 = rng.standard_normal((rows, 2)).astype(np.float32)
    idx = rng.integers(0, rows, n).astype(np.int32)
    upd = rng.standard_normal((n, 2)).astype(np.float32)
    with tuning.override(fused_max_updates=NEVER):
        out = pp.scatter_to_host(_host(x0), jnp.asarray(idx), jnp.asarray(upd), backend="interpret")
    assert_same(np.asarray(out), scatter_oracle(x0, idx, upd))


@pytest.mark.parametrize("method", ["set", "add", "get"])
def test_a_buffer_of_more_rows_than_int32_needs_x64_indices(method):
    # Without x64 the indices are int32: rows past 2**31 - 1 have no number, a negative
    # index cannot wrap onto them and a uint32 one would saturate onto row 2**31 - 1
    # (jnp refuses such an axis too). Refused at trace time; with x64 it traces. Traced
    # only (the buffer would be 8 GiB); tests/test_gpu.py runs it.
    pinned = jax.sharding.make_single_device_sharding(jax.devices()[0], memory_kind="pinned_host")
    x = jax.ShapeDtypeStruct((2**31 + 5, 1), jnp.float32, sharding=pinned)

    def call(x, rows):
        at = pp.at(x)[rows]
        if method == "get":
            return at.get(backend="interpret")
        return getattr(at, method)(jnp.ones((4, 1), jnp.float32), backend="interpret")

    for dtype in (jnp.int32, jnp.uint32):
        with pytest.raises(OverflowError, match="jax_enable_x64"):
            jax.eval_shape(call, x, jnp.array([0, 1, 7, 7], dtype))
    with jax.enable_x64(True):
        out = jax.eval_shape(call, x, jnp.array([0, -1, 7, 7], jnp.int64))
    assert out.shape == ((4, 1) if method == "get" else x.shape)
