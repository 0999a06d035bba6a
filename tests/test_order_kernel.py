"""The Pallas stable-order kernel against ``lax.sort``: the same permutation, ties in input order.

The add of rows that may repeat sums the runs of this order (tests/test_paths.py
checks the sums); here the order itself, on fresh random rows with many ties,
negatives and the skip marker, at sizes around its block and chunk (64, 256).
Outputs are fresh arrays: a permutation equal to the sort's shows that every
element was stored exactly once.
"""

from __future__ import annotations

import zlib

import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

BACKENDS = ["interpret", pytest.param("pallas", marks=pytest.mark.gpu)]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("n", [1, 2, 63, 64, 65, 256, 257, 1000, 3000])
@pytest.mark.parametrize("spread", ["few rows", "distinct-ish", "wide"])
def test_stable_order_matches_a_stable_sort(request, backend, n, spread):
    from pallas_pinned.kernels import order_pallas

    rng = np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))
    low, high = {"few rows": (-1, 3), "distinct-ish": (0, n + 1), "wide": (-2**31, 2**31 - 1)}[
        spread]
    rows = jnp.asarray(rng.integers(low, high, n, endpoint=True), jnp.int32)
    ordered, perm = order_pallas.stable_order(rows, interpret=backend == "interpret")
    want_ordered, want_perm = lax.sort((rows, lax.iota(jnp.int32, n)), num_keys=1,
                                       is_stable=True)
    np.testing.assert_array_equal(np.asarray(perm), np.asarray(want_perm))
    np.testing.assert_array_equal(np.asarray(ordered), np.asarray(want_ordered))
    assert ordered.dtype == rows.dtype and perm.dtype == jnp.int32
