"""Advanced indexing through ``pallas_pinned.at``: integer arrays, alone and mixed with slices.

The forms follow the families of JAX's indexing tests (one and two index
arrays, broadcasting, lists of ints in a tuple, arrays with ints, arrays
around slices / ``...`` / ``None``, repeated positions), as (shape, index)
pairs of this file, plus arrays out of range for every mode. numpy's rules
place the advanced axes: together where the arrays are adjacent, first
otherwise. jnp is the oracle for values and result shapes.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallas_pinned
from tests.index_support import (
    Batches,
    Case,
    assert_matches,
    buffer_values,
    case_ids,
    check_case,
    check_eager,
    jnp_call,
    pinned,
    run_batch,
    update_values,
)

A = np.array
S = slice
ALL = ("get", "set", "add")

# (shape, index): positions in range; some repeat (set's last writer, add's sum).
ADVANCED = [
    # one index array, 1-D and 2-D
    ((3,), A([0, 1])), ((3, 3), A([1, 2, 1])), ((3, 4, 5), A([0, 2, 0, 1])),
    ((3,), A([-1, 1])), ((3,), A([-2, -1])), ((0,), A([], np.int32)), ((3,), A([0, 1, 0])),
    ((3,), A([[0, 0]])), ((3, 3), A([[1, 2, 1], [0, 1, -1]])),
    ((3, 4, 5), A([[0, 2, 0, 1], [-1, -2, 1, 0]])), ((6, 6), A([[1, 2, 0], [3, 4, -1]])),
    # two arrays, same shape or broadcast
    ((3, 3), (A([0, 1]), A([1, 2]))), ((3, 4, 5), (A([0, 2, 0, 1]), A([-1, 0, -1, 2]))),
    ((3, 3), (A([[0, 1]]), A([1, 2]))), ((3, 4, 5), (A([[0, 2, 0, 1]]), A([-1, 0, -1, 2]))),
    ((4, 5, 6), (A([[0], [3]]), A([[1, -1, 2]]), A([5]))),
    # lists of ints inside a tuple (empty ones too)
    ((3, 4), ([],)), ((3, 4), ([], 0)), ((3, 4), ([], [])), ((3, 4, 5), ([0, 1],)),
    ((3, 4, 5), ([[0], [-1]], [[2, 3, 0, 3]])),
    # arrays with ints
    ((3, 4, 5), (0, A([0, 1]))), ((3, 4, 5), (0, 1, A([[2, 3, 0, 3]]))),
    ((3, 4, 5), ([0, 1], A([0]))), ((3, 4, 5), ([[0], [-1]], A([[2, 3, 0, 3]]))),
    ((3, 4, 5), (A(1, np.int32), A([3, 0]))), ((3, 4), (..., A(1, np.int32))),
    # arrays and slices: adjacent arrays stay in place, split arrays go first
    ((2, 3), (A([0, 1]), S(1, 2))), ((2, 3), (S(0, 2), A([0, 2]))),
    ((3, 4, 5), (..., A([0, 2]), S(None))), ((3, 4, 5), (..., A([[0, 2], [1, 3]]), S(None))),
    ((3, 4, 5), (..., A([[0, 2], [1, 1]]), S(None))),
    ((3, 4, 5), (..., A([0, 2]), A([-1, 2]))), ((3, 4, 5), (A([0, 2]), ..., A([-1, 2]))),
    ((3, 4, 5), (A([0, 2]), A([-1, 2]), ...)), ((3, 4, 5), (A([0, 2]), A([-1, 2]), S(1, 3))),
    ((3, 4, 5), (A([0, 2]), S(1, 3), A([-1, 2]))),
    ((3, 4, 5), (A([0, 2, -2]), S(None, None, 2), A([-1, 2, 1]))),
    ((3, 4, 5), (A([0, 2, -2]), S(None, None, 2), A([-1, 2, -1]))),
    ((3, 4, 5), (A([[0, 2], [2, 0]]), ..., A([[1, 0], [1, 0]]))),
    ((3, 4, 5), (A([0, 1]), ..., A([0, 1]))), ((3, 4, 5), (S(None), A([0, 1]), ..., A([0, 1]))),
    ((3, 4, 5), (S(None), ..., A([0, 1]), A([0, 1]))),
    ((5, 4, 3), (S(4, None, -2), A([[3], [0]]), S(None, None, -1))),
    ((5, 4, 3), (S(1, 4, 2), 2, A([2, 0, 2]))),
    # arrays and None
    ((3, 4, 5), (A([0, 2]), None, A([-1, 2]))), ((3, 4, 5), (A([0, 2]), None, None, A([-1, 2]))),
    ((3, 4, 5), (..., A([0, 2]), None, None, A([-1, 2]))),
    ((3, 4, 5), (None, A([1, 2]), A([0, 3]), None)),
    # a static jax.ds next to an array
    ((6, 5), (A([4, 1, 4]), jax.ds(1, 3))), ((6, 5, 2), (jax.ds(2, 3), A([0, -1]))),
]

# Index arrays reaching outside their axes, for every mode but the unchecked one.
OUT_OF_RANGE = [
    ((5,), A([0, 5, -6, 7, -1])), ((5, 3), A([[9, -1], [2, -8]])),
    ((4, 3), (A([1, 4, -5]), A([-4, 3, 0]))), ((4, 3, 2), (S(None), A([[3, -4], [5, 0]]))),
    ((6, 4), (A([7, 1]), S(1, 3))), ((4, 5, 3), (A([0, 9]), S(None, None, 2), A([-7, 1]))),
    ((4, 6), (2, A([-7, 6, 11]))),
    # a static window past either end next to an index array (jnp: a clamped window)
    ((4, 3), (A([0, 1]), jax.ds(2, 2))), ((4, 3), (A([3, 1]), jax.ds(-1, 2))),
]
# "drop" is jnp's (and our) other name for "fill": the eager tests keep it.
MODES = [None, "fill", "clip", "wrap"]

EAGER = [
    ((3, 3), A([1, 2, 1])), ((3, 4, 5), ([[0], [-1]], [[2, 3, 0, 3]])),
    ((3, 4, 5), (A([0, 2]), None, None, A([-1, 2]))),
]
INTERPRET = [
    ((3, 3), A([1, 2, 1])), ((3, 4, 5), (A([0, 2, 0, 1]), A([-1, 0, -1, 2]))),
    ((3, 4, 5), (..., A([[0, 2], [1, 1]]), S(None))),
    ((3, 4, 5), (A([0, 2, -2]), S(None, None, 2), A([-1, 2, -1]))),
    ((4, 5, 6), (A([[0], [3]]), A([[1, -1, 2]]), A([5]))),
    *OUT_OF_RANGE[2:4],  # in range under the default mode's rules: dropped rows
]


@pytest.fixture(scope="module")
def batches():
    return Batches(ALL)


@pytest.mark.parametrize("shape,index", ADVANCED, ids=case_ids(ADVANCED))
def test_advanced_jit(batches, shape, index):
    check_case(batches.case(ADVANCED, shape, index), ALL)


@pytest.mark.parametrize("shape,index", EAGER, ids=case_ids(EAGER))
def test_advanced_eager(rng, shape, index):
    check_eager(rng, shape, index, ALL)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("shape,index", OUT_OF_RANGE, ids=case_ids(OUT_OF_RANGE))
def test_out_of_range_arrays_jit(batches, shape, index, mode):
    check_case(batches.case(OUT_OF_RANGE, shape, index, mode, modes=MODES), ALL)


@pytest.mark.parametrize("mode", ["drop", "clip", "wrap"])
def test_out_of_range_arrays_eager(rng, mode):
    check_eager(rng, (4, 5, 3), (A([0, 9]), S(None, None, 2), A([-7, 1])), ALL, mode=mode)


@pytest.mark.parametrize("shape,index", INTERPRET, ids=case_ids(INTERPRET))
def test_advanced_interpret_jit(batches, shape, index):
    check_case(batches.case(INTERPRET, shape, index, backend="interpret"), ALL, backend="interpret")


@pytest.mark.parametrize("mode", [None, "wrap"])
def test_advanced_interpret_eager(rng, mode):
    check_eager(rng, (4, 3), (A([1, 4, -5, 1]), A([-4, 3, 0, 2])), ALL, mode=mode,
                backend="interpret")


def test_min_max_multiply_on_mixed_forms():
    # The other combining methods on a cross-section: in range, repeated, out of range.
    methods = ("min", "max", "multiply")  # .mul is .multiply: tests/test_index_methods.py
    cases = [Case((3, 4, 5), (A([0, 2, 0]), S(None, None, 2), A([-1, 2, -1]))),
             Case((3, 3), A([[1, 2, 1], [0, 1, -1]])),
             Case((4, 3, 2), (S(None), A([[3, -4], [5, 0]])), "drop"),
             Case((4, 3, 2), (S(None), A([[3, -4], [5, 0]])), "clip"),
             Case((4, 3, 2), (S(None), A([[3, -4], [5, 0]])), "wrap")]
    for case in run_batch(cases, methods).values():
        check_case(case, methods)


@pytest.mark.parametrize("kind", ["device", "pinned_host"])
def test_jax_array_indices(rng, kind):
    # Index arrays as jax arrays in either memory, outside jit.
    a = buffer_values(rng, (5, 4, 3), np.float32)
    idx_np = (A([[4], [0]]), S(None), A([2, -1, 0]))
    sharding = jax.sharding.make_single_device_sharding(jax.devices("cpu")[0], memory_kind=kind)
    idx = tuple(jax.device_put(i, sharding) if isinstance(i, np.ndarray) else i for i in idx_np)
    values = update_values(rng, (2, 3, 4), np.float32)
    for method in ALL:
        v = None if method == "get" else values
        got = pallas_pinned.at(pinned(a))[idx]
        got = got.get(backend="xla") if v is None else getattr(got, method)(v, backend="xla")
        assert_matches(got, jnp_call(a, idx_np, method, v), f"{method} {kind} indices")


@pytest.mark.parametrize(
    "dtype", [np.int8, np.uint8, np.int16, np.uint32, np.int64, "int4", "uint4", "int2", "uint2"]
)
def test_index_dtypes(rng, dtype):
    # Every integer type indexes (unsigned ones have no negative values to wrap).
    a = buffer_values(rng, (6, 5), np.float32)
    # Sub-byte types (numpy's integer tools do not know them) as numpy and as jax arrays.
    small = {"int2": [1, 0, -1], "uint2": [1, 0, 3]}
    rows = A(small.get(dtype, [5, 0, 3]), jnp.dtype(dtype))
    values = update_values(rng, (3, 2), np.float32)
    index = (rows, S(1, 5, 2))
    for method in ALL:
        v = None if method == "get" else values
        got = pallas_pinned.at(pinned(a))[index]
        got = got.get() if v is None else getattr(got, method)(v)
        assert_matches(got, jnp_call(a, (rows.astype(np.int32), S(1, 5, 2)), method, v),
                       f"{method} {jnp.dtype(dtype).name}")
        if jnp.iinfo(dtype).bits < 8:
            want = jnp_call(a, (rows.astype(np.int32), S(1, 5, 2)), method, v)
            ref = pallas_pinned.at(pinned(a))[(jnp.asarray(rows), S(1, 5, 2))]
            got = ref.get() if v is None else getattr(ref, method)(v)
            assert_matches(got, want, f"{method} jax {jnp.dtype(dtype).name}")

            def jitted(x, r, m=method, v=v):  # the sub-byte index traced
                ref = pallas_pinned.at(x)[(r, S(1, 5, 2))]
                return ref.get() if v is None else getattr(ref, m)(v)

            got = jax.jit(jitted)(pinned(a), jnp.asarray(rows))
            assert_matches(got, want, f"{method} jax {jnp.dtype(dtype).name} under jit")


_LIST_OF_JAX_SCALARS = """
import jax, jax.numpy as jnp, numpy as np
import pallas_pinned
pinned = jax.sharding.make_single_device_sharding(jax.devices()[0], memory_kind="pinned_host")
for scalars in ([jnp.int4(1), jnp.int4(-2)], [jnp.uint2(1), jnp.uint2(3)], [jnp.int32(2)]):
    want = jnp.arange(8.0)[np.array([int(v) for v in scalars])]
    x = jax.device_put(np.arange(8.0), pinned)
    got = pallas_pinned.at(x)[scalars].get()
    assert np.asarray(got).tolist() == np.asarray(want).tolist(), (scalars, got, want)
    got = jax.jit(lambda x: pallas_pinned.at(x)[scalars].get())(x)  # concrete in a trace
    assert np.asarray(got).tolist() == np.asarray(want).tolist(), (scalars, got, want)
print("ok")
"""


def test_a_list_of_jax_scalars_of_sub_byte_types_indexes_at_their_values():
    # numpy cannot build an array of jax int4 scalars, and stacking uint2 ones in jax aborts
    # XLA's CPU compiler: a child process, so that an abort fails this test alone.
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", _LIST_OF_JAX_SCALARS], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


@pytest.mark.parametrize("empty", [[], [[]], [[], []]], ids=["[]", "[[]]", "[[], []]"])
def test_an_empty_nested_list_is_an_empty_index_as_in_jnp(rng, empty):
    a = buffer_values(rng, (6, 5), np.float32)
    want = jnp.asarray(a).at[np.zeros(np.shape(empty), np.int32)].get()
    got = pallas_pinned.at(pinned(a))[empty].get()
    assert got.shape == want.shape == np.shape(empty) + (5,)
    got = jax.jit(lambda x: pallas_pinned.at(x)[empty].get())(pinned(a))
    assert got.shape == want.shape
    out = pallas_pinned.at(pinned(a))[empty].set(1.0)
    np.testing.assert_array_equal(np.asarray(out), a)
    out = jax.jit(lambda x: pallas_pinned.at(x)[empty].set(1.0))(pinned(a))
    np.testing.assert_array_equal(np.asarray(out), a)


@pytest.mark.parametrize("jitted", [False, True], ids=["eager", "jit"])
def test_a_list_of_ints_past_int64_beside_smaller_ones_is_their_uint64_array(rng, jitted):
    # numpy makes float64 of [1, 2**64 - 2]: it was refused as "an array of dtype float64".
    a = buffer_values(rng, (6, 5), np.float32)
    rows = [[1, 2**64 - 2], [2**63, 4]]
    as_array = np.array(rows, np.uint64)

    def calls(index):
        ref = pallas_pinned.at(pinned(a))[index]
        return ref.get(mode="fill", fill_value=-1.0), ref.set(7.0, mode="wrap")

    run = (lambda f, i: jax.jit(lambda: f(i))()) if jitted else (lambda f, i: f(i))
    for got, want in zip(run(calls, rows), run(calls, as_array), strict=True):
        assert np.asarray(got).tobytes() == np.asarray(want).tobytes()
    with pytest.raises(OverflowError, match="from -1 to 9223372036854775808"):
        pallas_pinned.at(pinned(a))[[-1, 2**63]].get(mode="drop")
    with pytest.raises(OverflowError, match="no one 64-bit integer type holds"):
        pallas_pinned.at(pinned(a))[[1, 2**70]].get(mode="drop")


def test_traced_int_scalars_under_jit(rng):
    # 0-d traced ints on several axes: a block at a traced position (jnp's int rules).
    a = buffer_values(rng, (4, 5, 6), np.float32)
    v = update_values(rng, (6,), np.float32)

    @jax.jit
    def f(x, i, j):
        ref = pallas_pinned.at(x)[i, j]
        return ref.get(), ref.set(v), ref.add(v)

    @jax.jit
    def g(x, i):  # beside a traced int, a static window past the end
        ref = pallas_pinned.at(x)[i, jax.ds(3, 3)]
        return ref.get(), ref.set(-1.0), ref.add(-1.0)

    for i in (2, -1):
        for got, m in zip(g(pinned(a), jnp.int32(i)), ALL, strict=True):
            want = jax.jit(lambda a, i, m=m: jnp_call(
                a, (i, jax.ds(3, 3)), m, None if m == "get" else -1.0))(a, jnp.int32(i))
            assert_matches(got, want, f"{m} [traced {i}, ds(3, 3)]")

    for i, j in [(1, 2), (-1, -5), (3, 5), (-5, 0)]:
        got = f(pinned(a), jnp.int32(i), jnp.int32(j))
        for g, m in zip(got, ALL, strict=True):
            assert_matches(g, jnp_call(a, (jnp.int32(i), jnp.int32(j)), m,
                                       None if m == "get" else v), f"{m} [{i}, {j}] traced")
