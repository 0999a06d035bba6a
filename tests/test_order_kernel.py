"""The Pallas stable-order kernel against ``lax.sort``: the same permutation, ties in input order.

The add of rows that may repeat sums the runs of this order (tests/test_paths.py
checks the sums); here the order itself, on fresh random rows with many ties,
negatives and the skip marker, at sizes around its tiling's steps (4-16 entries
a program, chunks of up to 1 Ki: one chunk up to 1024 entries, a loop beyond).
Outputs are fresh arrays: a permutation equal to the sort's shows that every
element was stored exactly once.
"""

from __future__ import annotations

import zlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

BACKENDS = ["interpret", pytest.param("pallas", marks=pytest.mark.gpu)]


def _check(rows, backend):
    """The kernel's order of ``rows`` equals a stable sort's, in the rows' dtype and int32."""
    from pallas_pinned.kernels import order_pallas

    ordered, perm = order_pallas.stable_order(rows, interpret=backend == "interpret")
    n = rows.shape[0]
    want_ordered, want_perm = lax.sort((rows, lax.iota(jnp.int32, n)), num_keys=1,
                                       is_stable=True)
    np.testing.assert_array_equal(np.asarray(perm), np.asarray(want_perm))
    np.testing.assert_array_equal(np.asarray(ordered), np.asarray(want_ordered))
    assert ordered.dtype == rows.dtype and perm.dtype == jnp.int32


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("n", [1, 2, 5, 63, 64, 65, 256, 257, 1000, 1024, 1025, 3000])
@pytest.mark.parametrize("spread", ["few rows", "distinct-ish", "wide"])
def test_stable_order_matches_a_stable_sort(request, backend, n, spread):
    rng = np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))
    low, high = {"few rows": (-1, 3), "distinct-ish": (0, n + 1), "wide": (-2**31, 2**31 - 1)}[
        spread]
    _check(jnp.asarray(rng.integers(low, high, n, endpoint=True), jnp.int32), backend)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("rows", [[0, 0, 0, 0, 1], [1, 0, 0, 0, 0], [5, 5, 5, 5, 5, 5, 5, -1, 9]])
def test_the_last_programs_lanes_past_the_batch_store_nothing(backend, rows):
    # The last program has lanes past the batch; a real entry of it takes a rank that
    # such a lane would also compute if it were not sent past the end.
    _check(jnp.asarray(rows, jnp.int32), backend)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("n", [1000, 3000])
def test_int64_rows_under_x64(request, backend, n):
    # Under x64 the add's rows are int64; the rank count stays int32 over the chunk loop.
    rng = np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))
    with jax.enable_x64(True):
        rows = jnp.asarray(rng.integers(-2**40, 2**40, n) // 2**30, jnp.int64)
        _check(rows, backend)


@pytest.mark.parametrize(("n", "programs"),
                         [(1, 1), (5, 2), (512, 128), (513, 65), (1024, 128), (1025, 65),
                          (4096, 256)])
def test_the_tiling_gives_the_programs_its_docstring_names(n, programs):
    from pallas_pinned.kernels import order_pallas

    block, chunk, _ = order_pallas.order_tiling(n)
    assert -(-n // block) == programs and chunk == min(1024, 1 << (n - 1).bit_length())


def test_an_empty_batch_launches_nothing():
    from pallas_pinned.kernels import order_pallas

    ordered, perm = order_pallas.stable_order(jnp.zeros((0,), jnp.int32), interpret=True)
    assert ordered.shape == perm.shape == (0,) and perm.dtype == jnp.int32
