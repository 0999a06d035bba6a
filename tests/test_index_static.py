"""Basic indexing through ``pallas_pinned.at``: ints, slices of any step, ``...``, ``None``.

The forms follow the families of JAX's own indexing tests
(tests/lax_numpy_indexing_test.py: static slices, negative and non-unit
strides, clamping, ellipsis, None, empty index, int-slice-array), written
here as (shape, index) pairs, plus static ``jax.ds`` windows. Each runs
get/set/add against jnp outside and inside jit, on a pinned_host buffer.
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
    case_ids,
    check_case,
    check_eager,
    pinned,
    run_batch,
)

A = np.array
S = slice

# (shape, index): in-bounds basic forms.
STATIC = [
    # one int, several ints
    ((3,), 1), ((3, 3), 0), ((3, 4, 5), 2), ((3,), -1), ((3,), -2),
    ((3, 3), (2, 1)), ((3, 4, 5), (1, 2)), ((3, 4, 5), (-1, 2)), ((3, 4, 5), (1, 2, 3)),
    # one slice, step 1
    ((10,), S(1, 3)), ((10,), S(1, -1)), ((10,), S(None, -1)), ((10,), S(None)),
    ((10, 8), S(1, 3)), ((10, 8), S(1, None)), ((10, 8), S(None, 3)), ((10, 8), S(-3, None)),
    # negative steps
    ((10,), S(3, 1, -1)), ((10,), S(1, 8, -1)), ((10,), S(None, 1, -2)),
    ((10,), S(None, None, -1)), ((10, 8), S(3, 1, -1)), ((10, 8), S(0, 8, -1)),
    ((10, 8), S(None, None, -1)), ((10, 8), S(12, 12, -4)), ((10, 8), S(12, 4, -4)),
    # steps above one
    ((10,), S(0, 8, 2)), ((10,), S(0, 8, 3)), ((10,), S(1, 3, 2)), ((10,), S(1, None, 2)),
    ((10, 8), S(1, 8, 3)), ((10, 8), S(None, None, 2)), ((10, 8), S(None, 1, -2)),
    ((10, 8), S(None, None, -2)),
    # two slices, on inner axes too
    ((10, 8), (S(1, 3), S(0, 2))), ((10, 8), (S(1, None), S(None, 2))),
    ((10, 8), (S(None, None, -1), S(None, 2))), ((10, 8, 3), (S(1, 3), S(0, 2))),
    ((10, 8, 3), (S(1, 3), S(0, None))), ((10, 8, 3), (S(1, None), S(0, 2))),
    ((6, 7, 4), (S(None), S(5, 0, -2), S(1, 3))), ((6, 7, 4), (S(1, 6, 2), 3, S(None, None, -1))),
    # colons, mixed ints and slices
    ((3,), S(None)), ((3, 4), S(None)), ((3, 4), (S(None), S(None))),
    ((3, 4, 5), (S(None), S(None))), ((10, 4), (S(None), S(0, 2))), ((10, 4), (1, S(None))),
    ((5, 6, 3), (S(None), 4)), ((5, 6, 3), (S(None), -2, 1)),
    # Ellipsis
    ((3,), ...), ((3, 4), ...), ((3, 4, 5), (0, ...)), ((3, 4, 5), (..., 2, 3)),
    ((3, 4, 5), (..., S(1, 4, 2))), ((3, 4, 5), (1, ..., S(None, None, -2))),
    # clamped bounds
    ((10,), S(2, 11, 1)), ((10,), S(11, 12, 1)), ((10,), S(-11, -2, 1)),
    ((10,), S(-2, -12, -1)), ((10,), S(12, -12, -1)),
    # None (new axes)
    ((3,), None), ((3, 4), None), ((3, 4), (..., None)), ((3, 4), (0, None, ...)),
    ((3, 4, 5), (1, None, ...)), ((3, 4, 5), (1, None, S(None), None)),
    ((3, 4, 5), (None, S(1, 3), None, 2)),
    # the empty index
    ((3,), ()), ((3, 4), ()),
    # ints, a slice and an int array (advanced axes around a slice)
    ((3, 2, 3), (0, S(None), np.arange(3))), ((3, 2, 3), (np.int32(1), S(None), np.arange(3))),
    ((3, 2, 3), (A(2), S(None), np.arange(3))),
    # static jax.ds windows (ds with a static start is a slice to jnp)
    ((10,), jax.ds(1, 3)), ((6, 5), (S(None), jax.ds(2, 2))), ((6, 5), (jax.ds(4, 2), 1)),
    ((4, 6, 3), (1, jax.ds(1, 4), S(None, None, 2))),
]

# 0-d buffers: jnp takes (), None and ... on them.
ZERO_D = [((), ()), ((), None), ((), (None, None)), ((), (..., None)), ((), ...)]

# Ints out of range, for the modes (promise_in_bounds is unchecked: left out).
OUT_OF_RANGE = [
    ((3,), -4), ((3, 3), 3), ((3, 4, 5), 4), ((3, 3), (2, -4)), ((3, 4, 5), (3, 2)),
    ((3, 4, 5), (-4, 4)), ((4, 5), (S(None), 7)), ((4, 5, 2), (1, -9, S(None, None, -1))),
]
# "drop" is jnp's (and our) other name for "fill": the eager tests keep it.
MODES = [None, "fill", "clip", "wrap"]
ALL = ("get", "set", "add")

# The kernels in interpret mode are slow on CPU: a cross-section of the kinds of plan.
INTERPRET = [
    ((3, 4, 5), (1, 2)), ((10, 8), S(1, 3)), ((10, 8), S(12, 4, -4)), ((10,), S(1, None, 2)),
    ((10, 8, 3), (S(1, 3), S(0, 2))), ((3, 4, 5), (1, None, S(None), None)),
    ((3, 2, 3), (0, S(None), np.arange(3))), ((6, 7, 4), (S(1, 6, 2), 3, S(None, None, -1))),
]


# Outside jit (each call compiles on its own): a cross-section of the plans.
EAGER = [
    ((3, 4, 5), (1, 2)), ((10, 8), S(1, 8, 3)), ((10, 8, 3), (S(1, 3), S(0, 2))),
    ((3, 4, 5), (1, None, S(None), None)), ((3, 2, 3), (A(2), S(None), np.arange(3))),
    ((10,), S(-2, -12, -1)),
]


@pytest.fixture(scope="module")
def batches():
    return Batches(ALL)


@pytest.mark.parametrize("shape,index", STATIC, ids=case_ids(STATIC))
def test_static_jit(batches, shape, index):
    check_case(batches.case(STATIC, shape, index), ALL)


@pytest.mark.parametrize("shape,index", EAGER, ids=case_ids(EAGER))
def test_static_eager(rng, shape, index):
    check_eager(rng, shape, index, ALL)


@pytest.mark.parametrize("shape,index", ZERO_D, ids=case_ids(ZERO_D))
def test_zero_d_buffer(rng, shape, index):
    check_eager(rng, shape, index, ALL)


@pytest.mark.parametrize("shape,index", INTERPRET, ids=case_ids(INTERPRET))
def test_static_interpret_jit(batches, shape, index):
    check_case(batches.case(INTERPRET, shape, index, backend="interpret"), ALL, backend="interpret")


def test_static_interpret_eager(rng):
    check_eager(rng, (6, 7, 4), (S(1, 6, 2), 3, S(None, None, -1)), ALL, backend="interpret")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("shape,index", OUT_OF_RANGE, ids=case_ids(OUT_OF_RANGE))
def test_out_of_range_ints_jit(batches, shape, index, mode):
    check_case(batches.case(OUT_OF_RANGE, shape, index, mode, modes=MODES), ALL)


@pytest.mark.parametrize("mode", ["drop", "clip", "wrap"])
def test_out_of_range_ints_eager(rng, mode):
    check_eager(rng, (4, 5, 2), (1, -9, S(None, None, -1)), ALL, mode=mode)


@pytest.mark.parametrize("mode", ["clip", "wrap"])
def test_out_of_range_ints_interpret(rng, mode):
    check_eager(rng, (3, 4, 5), (-4, 4), ALL, mode=mode, backend="interpret")


@pytest.mark.parametrize("dtype", [np.int32, np.int8, np.float16])
def test_other_dtypes(dtype):
    cases = [Case((6, 5), (S(1, 6, 2), 3), dtype=dtype),
             Case((6, 5), (S(None, None, -1), S(1, 3)), dtype=dtype)]
    for case in run_batch(cases, ALL).values():
        check_case(case, ALL)


def test_zero_d_buffer_stays_in_host_memory_under_donating_jit():
    # JAX types a whole rank-0 array's replacement in device memory; the write
    # puts the value back in host memory, so a donating jit keeps the buffer's
    # placement instead of aborting the process (run in a child for that reason).
    from tests.benchmark_helpers import explain, run_cli

    code = """
import jax, jax.numpy as jnp, numpy as np, pallas_pinned as pp
PIN = jax.sharding.make_single_device_sharding(jax.devices("cpu")[0], memory_kind="pinned_host")
for op in ("set", "add", "max", "min", "multiply"):
    for idx in ((), ..., None):
        out = jax.jit(lambda x: getattr(pp.at(x)[idx], op)(2.0), donate_argnums=0)(
            jax.device_put(np.float32(3), PIN))
        assert out.sharding.memory_kind == "pinned_host", (op, idx, out.sharding)
        assert float(out) == float(getattr(jnp.float32(3).at[idx], op)(2.0)), (op, idx)
print("ok")
"""
    done = run_cli([], code=code)
    assert done.returncode == 0 and done.stdout.strip() == "ok", explain(done)


@pytest.mark.parametrize("index", [((0, 1),), ((0, 1), 2), ((0, 1), (2, 3)),
                                   (((0, 1), (1, 2)),), ([0, 1], (2, 3))])
def test_a_tuple_inside_the_index_is_a_sequence_of_positions_as_in_jnp(index):
    a = np.arange(4 * 6 * 3, dtype=np.float32).reshape(4, 6, 3)
    for method in ("get", "set"):
        ref, theirs = pallas_pinned.at(pinned(a))[index], jnp.asarray(a).at[index]
        got = ref.get() if method == "get" else ref.set(-1.0)
        want = theirs.get() if method == "get" else theirs.set(-1.0)
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


@pytest.mark.parametrize(
    "shape, index, contiguous",
    [
        ((10, 8), jax.ds(2, 3), True),  # rows 2-4, whole
        ((10, 8), (4, S(1, 5)), True),  # part of one row
        ((10, 8), (4,), True),
        ((4, 10, 8), (1, jax.ds(2, 3)), True),  # whole rows of one layer
        ((4, 10, 8), (S(None), 3), False),  # one row of every layer: a KV slot
        ((10, 8), (S(None), S(1, 5)), False),  # a column band
        ((10, 8), (S(None), S(None)), True),
        ((1, 10, 8), (S(None), 2), True),  # a leading axis of length 1
    ],
)
def test_block_is_contiguous_says_whether_the_block_is_one_run(shape, index, contiguous):
    from pallas_pinned import _index_parse

    plan, _ = _index_parse.parse(index, shape)
    assert plan.kind == "block"
    assert plan.block_is_contiguous is contiguous
