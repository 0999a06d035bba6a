"""scatter_add_to_host against jnp and the numpy oracle, on every backend.

Every case runs through the XLA fallback, the Pallas kernel in interpret mode,
"auto", and (marker ``gpu``) the compiled kernels; off CUDA, auto skips the
grids of values, where it would repeat the xla case (``VALUE_BACKENDS``,
tests/helpers.py). Buffers hold fresh random data, never zeros; rows the
kernel added into twice or not at all show up as mismatches. Values are
multiples of 1/4 (``exact_values``), so sums are exact and their order cannot
matter. Bad input: tests/test_errors.py; vmap and grad:
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
from pallas_pinned.scatter_add import scatter_add_to_host
from pallas_pinned.testing import assert_same, make_values, scatter_add_oracle
from tests.helpers import (
    BACKENDS,
    PALLAS,
    TRITON,
    VALUE_BACKENDS,
    exact_values,
    examples,
    mixed_indices,
    np_dtype,
    put,
    read,
    row_cases,
    run_row_op,
)

ADD_DTYPES = ["float32", "bfloat16", "float16", "int32", "int8", "uint8"]
# "drop" is what None does for a write (the same code); fill and drop against
# jnp's: tests/test_semantics.py.
ADD_MODES = [None, "clip", "drop"]


@pytest.fixture
def small_sort_crossover():
    """Makes batches of 64+ distinct rows take the sorted (coalescing) kernel path.

    The thresholds are part of the ops' jit cache keys, so no cache clearing.
    """
    with tuning.override(sort_from=64):
        yield


def _run_add(backend, x0, idx, upd, *, mode=None, kind="pinned_host", **kwargs):
    x = put(x0, kind)
    out = scatter_add_to_host(
        x, jnp.asarray(idx), jnp.asarray(upd), mode=mode, backend=backend, **kwargs
    )
    assert out.sharding.memory_kind == kind, out.sharding
    assert_same(read(out), scatter_add_oracle(x0, idx, upd, mode))
    return x, out


@pytest.mark.parametrize("backend", VALUE_BACKENDS)
@examples(25)
@given(case=row_cases(ADD_DTYPES, ADD_MODES), scalar=st.booleans())
def test_add_follows_the_oracle_and_jnp(backend, case, scalar):
    # Every dtype, row shape (rows of no elements too), count, mode, index dtype, honest
    # promise, memory kind; 1-D and 2-D indices; eagerly and under a donating jit.
    rng = case.rng()
    x0 = exact_values(rng, (case.num_rows, *case.row_shape), case.dtype)
    upd = exact_values(rng, () if scalar else case.indices.shape + case.row_shape, case.dtype)
    _, out = run_row_op(scatter_add_to_host, case, x0, jnp.asarray(upd), backend=backend)
    assert out.sharding.memory_kind == case.kind, out.sharding
    assert_same(read(out), scatter_add_oracle(x0, case.indices, upd, case.mode))
    jnp_indices = case.jnp_indices()
    if jnp_indices is not None and case.dtype not in ("bfloat16", "float16"):
        # (jnp sums 16-bit floats in their own type: tests/test_scatter_add.py's
        # half-precision test; the oracle rounds once per row.)
        want = jnp.asarray(x0).at[jnp_indices].add(upd, mode=case.mode)
        assert_same(read(out), np.asarray(want), what="vs jnp")


# The Pallas family's ways of summing duplicates, as the thresholds select them.
ADD_PATHS = {
    "one_launch": {"fused_max_updates": 4096, "fused_max_unpromised_adds": 4096},
    "unfused": {"fused_max_updates": 0, "fused_max_unpromised_adds": 0},
    "unfused_sorted": {"fused_max_updates": 0, "fused_max_unpromised_adds": 0, "sort_from": 0},
}


@pytest.mark.parametrize("backend", ["interpret", PALLAS])
@pytest.mark.parametrize("path", list(ADD_PATHS))
@pytest.mark.parametrize("n, width", [(300, 1), (200, 300), (40, 1100)])
def test_add_one_launch_and_unfused_paths(rng, backend, path, n, width):
    # Heavy duplicates over a few rows: the duplicate search and the chunked
    # sums cross chunk boundaries, runs span many programs (1100 floats also
    # split a row over two column programs), and dropped indices leave skip
    # markers. Exact values, so every path equals jnp's.
    x0 = exact_values(rng, (9, width), "float32")
    idx = mixed_indices(rng, 9, (n,))
    upd = exact_values(rng, (n, width), "float32")
    with tuning.override(**ADD_PATHS[path]):
        _run_add(backend, x0, idx, upd)
        # The same path traced inside a jit, the buffer donated.
        add = jax.jit(lambda x, i, u: scatter_add_to_host(x, i, u, backend=backend),
                      donate_argnums=0)
        out = add(put(x0), jnp.asarray(idx), jnp.asarray(upd))
    assert out.sharding.memory_kind == "pinned_host", out.sharding
    assert_same(read(out), scatter_add_oracle(x0, idx, upd))


@pytest.mark.parametrize("backend", ["xla", "interpret", PALLAS, TRITON])
@pytest.mark.parametrize("path", [*ADD_PATHS, "distinct_rows"])
def test_add_keeps_the_sign_of_zero_as_jnp_does(rng, backend, path):
    # Zeros of both signs only: jnp's fold x + u0 + u1 ... gives -0.0 exactly
    # where x and all of a position's updates are -0.0 (IEEE), whatever the
    # order. Sums that start from +0.0, or absent entries that add +0.0, turn
    # those into +0.0 (the Pallas add did, in rows with duplicates and from
    # 1025 entries on).
    x0 = np.where(rng.random((40, 3)) < 0.8, np.float32(-0.0), np.float32(0.0))
    if path == "distinct_rows":
        idx = rng.permutation(40)[:30] - 20  # Negative ones wrap.
        kwargs, limits = {"unique_indices": True}, {"fused_max_updates": 0}
    else:
        idx = mixed_indices(rng, 40, (300,))
        kwargs, limits = {}, ADD_PATHS[path]
    upd = np.where(rng.random((idx.shape[0], 3)) < 0.97, np.float32(-0.0), np.float32(0.0))
    expected = np.asarray(jnp.asarray(x0).at[jnp.asarray(idx)].add(jnp.asarray(upd)))
    assert np.signbit(expected).any() and not np.signbit(expected).all()
    for atomic_from in (0, 10**9):
        with tuning.override(**limits, atomic_add_from=atomic_from):
            out = scatter_add_to_host(put(x0), jnp.asarray(idx), jnp.asarray(upd),
                                      backend=backend, **kwargs)
        np.testing.assert_array_equal(read(out).view(np.uint32), expected.view(np.uint32),
                                      err_msg=f"atomic_add_from={atomic_from}")


def _edge_rows(x0, idx, upd, rng):
    """Rows where an atomic add would differ from the store (the GPU flushes subnormals).

    Buffer rows 0-5 hold subnormals; the entries that hit rows 0-1 add zeros
    (a zero total), rows 2-3 tiny values (subnormal totals), row 4 one inf,
    row 5 a normal total. Other rows keep their random values.
    """
    rows = np.where((idx >= -x0.shape[0]) & (idx < x0.shape[0]), idx % x0.shape[0], -1)
    x0[:6] = rng.choice([-1, 1], size=(6, x0.shape[1])) * np.float32(3e-39)
    upd[np.isin(rows, [0, 1])] = 0.0
    upd[np.isin(rows, [2, 3])] = np.float32(1e-40)
    hits_4 = np.flatnonzero(rows == 4)
    if hits_4.size:
        upd[hits_4[0], 0] = np.inf


@pytest.mark.parametrize("backend", ["interpret", PALLAS])
@pytest.mark.parametrize("path", [*ADD_PATHS, "distinct_rows"])
def test_add_atomic_owner_write_gives_the_same_bits(rng, backend, path):
    # Random float32 values (not exact): the owner's one atomic add of its
    # total must give the bits of its read-add-store on every path, and both
    # must be the oracle's up to the rounding order of duplicates. Rows of
    # subnormals, zero, tiny and infinite totals take the store instead of the
    # atomic (the GPU's float32 atomics flush subnormals). The atomics are
    # acquire-release. In interpret mode
    # the same rows take an emulated atomic (the Pallas interpreter has no
    # masked atomics), so the GPU case is the real check of the bits.
    x0 = make_values(rng, (700, 70), "float32")
    if path == "distinct_rows":
        # The edge rows 0-5 once each, then others; half of them negative (they
        # wrap), none repeating.
        idx = np.concatenate([np.arange(6), 6 + rng.permutation(694)[:594]])
        idx = np.where(rng.random(600) < 0.5, idx - 700, idx)
        kwargs, limits = {"unique_indices": True}, {"fused_max_updates": 0}
    else:
        idx = mixed_indices(rng, 700, (1500,))
        idx[-12:] = np.repeat(np.arange(6), 2)  # The edge rows, twice each at least.
        kwargs, limits = {}, ADD_PATHS[path]
    upd = make_values(rng, (idx.shape[0], 70), "float32")
    _edge_rows(x0, idx, upd, rng)
    outs = {}
    owner_writes = {"read_store": {"atomic_add_from": 10**9}, "atomic": {"atomic_add_from": 0}}
    for write, setting in owner_writes.items():
        with tuning.override(**limits, **setting):
            add = jax.jit(
                lambda x, i, u: scatter_add_to_host(x, i, u, backend=backend, **kwargs),
                donate_argnums=0,
            )
            outs[write] = read(add(put(x0), jnp.asarray(idx), jnp.asarray(upd)))
    np.testing.assert_array_equal(outs["atomic"].view(np.uint32),
                                  outs["read_store"].view(np.uint32))
    expected = scatter_add_oracle(x0, idx, upd, None)
    np.testing.assert_allclose(outs["atomic"], expected, rtol=1e-5, atol=1e-5)
    # (Whether x + 0 keeps a subnormal is the platform's: XLA on the CPU flushes
    # it, the GPU's kernels keep it. Both writes must agree either way.)
    assert np.isinf(outs["atomic"][4, 0])


def test_atomic_owner_write_takes_only_rows_it_adds_exactly():
    # A row takes the atomic only if every total it writes is finite and at
    # least 2**-102 in magnitude; columns outside the row (mask off) do not count.
    from pallas_pinned.kernels.owner_write import ATOMIC_EXACT_FROM, atomic_rows

    small = ATOMIC_EXACT_FROM / 2
    total = jnp.array([
        [1.0, -2.0, 3.0],
        [1.0, 0.0, 3.0],               # A zero total.
        [1.0, small, 3.0],              # Too small: the sum could be subnormal.
        [1.0, jnp.nan, 3.0],
        [1.0, -jnp.inf, 3.0],
        [ATOMIC_EXACT_FROM, -ATOMIC_EXACT_FROM, 1e30],
        [1.0, 2.0, 0.0],               # The zero lies outside the row.
    ], jnp.float32)
    mask = jnp.ones(total.shape, bool).at[6, 2].set(False)
    got = np.asarray(atomic_rows(total, mask))
    assert got.shape == (7, 1)
    assert got[:, 0].tolist() == [True, False, False, False, False, True, True]


def test_atomic_owner_write_refuses_other_accumulators():
    # The atomic adds the total in the buffer's type: a bfloat16 buffer summed
    # in float32 would round twice, so the kernels refuse rather than differ.
    from pallas_pinned.kernels import scatter_add_pallas

    x = jnp.zeros((8, 4), jnp.bfloat16)
    rows = jnp.arange(3, dtype=jnp.int32)
    with pytest.raises(ValueError, match="float32 buffer summed in float32"):
        scatter_add_pallas.scatter_add_rows(
            x, rows, None, jnp.ones((3, 4), jnp.bfloat16), acc_dtype=jnp.float32,
            atomic_write=True, interpret=True,
        )
    assert scatter_add_pallas.atomic_write_allowed(jnp.float32, jnp.float32)
    assert not scatter_add_pallas.atomic_write_allowed(jnp.bfloat16, jnp.float32)


@pytest.mark.parametrize("backend", ["interpret", PALLAS])
@pytest.mark.parametrize("path", ["unfused", "unfused_sorted"])
def test_add_sorted_promise_with_duplicates(rng, backend, path):
    # Rows that ascend as promised, with long runs: the kernel takes them as
    # they are (no sort, no permutation); out-of-range ones are dropped.
    x0 = exact_values(rng, (50, 70), "float32")
    idx = np.sort(rng.integers(0, 60, size=700))  # Rows 50 on are past the end.
    upd = exact_values(rng, (700, 70), "float32")
    with tuning.override(**ADD_PATHS[path]):
        _run_add(backend, x0, idx, upd, indices_are_sorted=True)


@pytest.mark.parametrize("backend", VALUE_BACKENDS)
def test_add_promise_in_bounds_with_valid_indices(rng, backend):
    # Unchecked mode is defined for in-range indices only (negatives wrap).
    x0 = exact_values(rng, (30, 4), "float32")
    idx = np.array([3, -1, 7, 3, 0, -30, 29])
    upd = exact_values(rng, (7, 4), "float32")
    _run_add(backend, x0, idx, upd, mode="promise_in_bounds")


@pytest.mark.parametrize("backend", VALUE_BACKENDS)
def test_add_unique_promise_with_clip_still_combines(rng, backend):
    # Distinct indices can clip onto the same edge row; both additions count.
    x0 = exact_values(rng, (5, 2), "float32")
    idx = np.array([7, 9, -8, 2])
    upd = exact_values(rng, (4, 2), "float32")
    _run_add(backend, x0, idx, upd, mode="clip", unique_indices=True)


@pytest.mark.parametrize("backend", VALUE_BACKENDS)
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("num", [3, 100])  # the one-launch add, and the runs of an order
def test_add_half_precision_sums_in_float32(backend, dtype, num):
    # Ones around one large value (256 in bfloat16, 2048 in float16: spacing 2 there) into
    # one row: summed in float32 (exact) and rounded once. A sum in the 16-bit type rounds
    # at more steps and lands elsewhere (bfloat16: 256 for 3 entries, 354 for 100, against
    # 258 and 356). 300 ones alone (the earlier test) sum exactly in 16 bits in a tree.
    big = {"bfloat16": 256, "float16": 2048}[dtype]
    updates = np.ones((num, 1), np.float32)
    updates[1] = big
    x0 = np.zeros((2, 1), np_dtype(dtype))
    out = scatter_add_to_host(put(x0), jnp.zeros(num, jnp.int32),
                              jnp.asarray(updates, dtype), backend=backend)
    want = np.float32(big + num - 1).astype(np_dtype(dtype))
    assert read(out)[0, 0] == want and read(out)[1, 0] == 0
    ones_only = scatter_add_to_host(put(x0), jnp.zeros(300, jnp.int32),
                                    jnp.ones((300, 1), dtype), backend=backend)
    assert read(ones_only)[0, 0] == 300  # jnp's running 16-bit sum stalls at 256 (bfloat16)


@pytest.mark.parametrize("backend", VALUE_BACKENDS)
def test_add_int8_wraps_like_jnp(backend):
    x0 = np.array([[120], [-128]], np.int8)
    out = scatter_add_to_host(
        put(x0), jnp.array([0, 0, 1]), jnp.array([[10], [10], [-1]], jnp.int8), backend=backend
    )
    expected = jnp.asarray(x0).at[jnp.array([0, 0, 1])].add(jnp.array([[10], [10], [-1]], jnp.int8))
    assert_same(read(out), np.asarray(expected))


def test_add_is_deterministic_and_backends_agree(rng):
    # Random float32 values with heavy duplication: not exact, so the
    # summation order shows. Same bits every run of each path (XLA, and each
    # kernel path the thresholds select); all close to jnp's one-after-another sums.
    x0 = make_values(rng, (16, 3), "float32")
    idx = rng.integers(0, 16, size=200)
    upd = make_values(rng, (200, 3), "float32")

    def run(backend, **thresholds):
        with tuning.override(**thresholds):
            return read(scatter_add_to_host(
                put(x0), jnp.asarray(idx), jnp.asarray(upd), backend=backend))

    groups = [[run("xla"), run("xla")]] + [
        [run("interpret", **limits) for _ in range(2)] for limits in ADD_PATHS.values()]
    for group in groups:
        assert_same(group[1], group[0])
    expected = jnp.asarray(x0).at[idx].add(upd)
    for result in (group[0] for group in groups):
        np.testing.assert_allclose(result, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("backend", VALUE_BACKENDS)
def test_add_updates_broadcast_and_cast(rng, backend):
    # A scalar broadcasts to every indexed row; int updates go into floats.
    x0 = exact_values(rng, (10, 4), "float32")
    idx = np.array([1, 8, 1])
    _run_add(backend, x0, idx, np.float32(2.5))
    _run_add(backend, x0, idx, np.arange(12, dtype=np.int32).reshape(3, 4))


@pytest.mark.parametrize("backend", BACKENDS)
def test_add_index_forms(rng, backend):
    x0 = exact_values(rng, (40, 3), "float32")
    x = put(x0)
    out = scatter_add_to_host(x, slice(None, 36, 7), 1.0, backend=backend)
    assert_same(read(out), scatter_add_oracle(x0, np.arange(40)[:36:7], np.float32(1.0)))
    out = scatter_add_to_host(out, -1, np.full(3, 2.0, np.float32), backend=backend)
    expected = scatter_add_oracle(
        scatter_add_oracle(x0, np.arange(40)[:36:7], np.float32(1.0)),
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
    assert_same(read(out), scatter_add_oracle(x0, np.asarray(idx), np.asarray(upd)))
