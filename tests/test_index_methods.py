"""The methods of ``at(x)[index]`` with repeated positions, their functional forms, the keywords.

set: the last occurrence (row-major order of the broadcast index) wins.
add/min/max/multiply: duplicates combined deterministically; the values here
(small integers, powers of two) make every order give the same bits, so jnp
is the oracle exactly. Unsupported jnp names (divide, power, apply) are
absent to ``hasattr``/``getattr`` and say so when called.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallas_pinned
from tests.index_support import (
    Case,
    assert_matches,
    buffer_values,
    case_rng,
    check_case,
    describe,
    jnp_call,
    join,
    pinned,
    pp_call,
    run_batch,
    run_jit,
    split,
)

A = np.array
S = slice
# .mul is .multiply itself (one method, two names): test_multiply_of_many_duplicates_is_exact
# calls both.
COMBINING = ("add", "min", "max", "multiply")

# (shape, index) whose positions repeat, over one or several axes.
REPEATS = [
    ((5, 3), A([1, 3, 1, 1, 4])),
    ((5, 3), A([[0, 4, 0], [4, 0, 4]])),
    ((4, 5), (A([0, 2, 0, 2]), A([1, 1, 1, 3]))),
    ((4, 5), (A([[3], [3]]), A([2, -3, 2]))),
    ((3, 4, 5), (A([0, 2, 0]), S(None, None, 2), A([-1, 2, -1]))),
    ((3, 4, 5), (..., A([[0, 3], [3, 3]]), S(1, 4))),
    ((3, 4, 5), (1, A([0, 0, 2]), None, A([4, 4, 4]))),
    ((6, 2), (A([7, -1, 5, -7]), 1)),  # out of range: dropped by default
]


def _ids(cases):
    return [f"{shape}-{describe(index)}" for shape, index in cases]


def _factors(rng, shape, dtype=np.float32):
    """Powers of two with signs: products and sums of a few are exact in any order."""
    return (rng.choice([-2.0, -1.0, 0.5, 1.0, 2.0, 4.0], size=shape)).astype(dtype)


def _last_writer_wins(a, index, values):
    """numpy's a.at[index].set with the last occurrence winning, position by position."""
    out = a.copy()
    flat = np.arange(a.size).reshape(a.shape)[index]
    values = np.broadcast_to(values, flat.shape)
    view = out.reshape(-1)
    for p, v in zip(flat.reshape(-1), values.reshape(-1), strict=True):
        view[p] = v
    return out


@pytest.fixture(scope="module")
def repeats_batch():
    return run_batch([Case(shape, index) for shape, index in REPEATS], COMBINING)


@pytest.mark.parametrize("shape,index", REPEATS, ids=_ids(REPEATS))
def test_combining_methods_with_repeats_jit(repeats_batch, shape, index):
    check_case(repeats_batch[Case(shape, index).name], COMBINING)


@pytest.mark.parametrize("backend,dtype", [("interpret", np.int32)])
def test_combining_methods_with_repeats_eager(rng, backend, dtype):
    shape, index = (3, 4, 5), (A([0, 2, 0]), S(None, None, 2), A([-1, 2, -1]))
    a = buffer_values(rng, shape, dtype)
    for method in COMBINING:
        values = _factors(rng, (3, 2), dtype) if method in ("multiply", "mul") else (
            -rng.integers(1, 99, size=(3, 2)).astype(dtype))
        got = pp_call(pinned(a), index, method, values, backend=backend)
        assert_matches(got, jnp_call(a, index, method, values),
                       f"{method} {describe(index)} {np.dtype(dtype).name} {backend}")


LAST_WINS = REPEATS[:-1]


def _distinct_updates(shape, index):
    out_shape = np.arange(math.prod(shape)).reshape(shape)[index].shape
    return (-1 - np.arange(math.prod(out_shape))).reshape(out_shape).astype(np.float32)


@pytest.fixture(scope="module")
def sets_under_jit():
    """Every LAST_WINS set in one jitted function, the index arrays traced."""
    rng = case_rng("last wins")
    buffers = [buffer_values(rng, shape, np.float32) for shape, _ in LAST_WINS]
    splits = [split(index) for _, index in LAST_WINS]
    values = [_distinct_updates(shape, index) for shape, index in LAST_WINS]

    def run(xs, arrays):
        return [pallas_pinned.at(x)[join(t, a)].set(v)
                for x, (t, _), a, v in zip(xs, splits, arrays, values, strict=True)]

    got = run_jit(run, [pinned(a) for a in buffers], [t[1] for t in splits])
    return {describe(index): (got[k], _last_writer_wins(buffers[k], index, values[k]))
            for k, (_, index) in enumerate(LAST_WINS)}


@pytest.mark.parametrize("shape,index", LAST_WINS, ids=_ids(LAST_WINS))
def test_set_last_occurrence_wins_jit(sets_under_jit, shape, index):
    got, expected = sets_under_jit[describe(index)]
    assert_matches(got, expected, f"set {describe(index)} jit (last wins)")


@pytest.mark.parametrize("backend", ["xla", "interpret"])
def test_set_last_occurrence_wins_eager(rng, backend):
    for shape, index in (LAST_WINS[2], LAST_WINS[5]):
        a = buffer_values(rng, shape, np.float32)
        values = _distinct_updates(shape, index)
        got = pp_call(pinned(a), index, "set", values, backend=backend)
        assert_matches(got, _last_writer_wins(a, index, values),
                       f"set {describe(index)} {backend} (last wins)")


def test_multiply_of_many_duplicates_is_exact(rng):
    # Sixteen factors on one position: a product tree, exact for powers of two.
    a = buffer_values(rng, (4, 3), np.float32)
    index = A([2] * 16)
    values = _factors(rng, (16, 3))
    for name in ("multiply", "mul"):
        got = pp_call(pinned(a), index, name, values)
        assert_matches(got, jnp_call(a, index, "multiply", values), f"{name} x16")


def test_min_max_with_nan_and_infinities(rng):
    a = buffer_values(rng, (4, 2), np.float32)
    index = A([1, 1, 3, 3])
    values = A([[np.inf, -np.inf], [-np.inf, 5.0], [2.0, np.nan], [1.0, -3.0]], np.float32)
    for method in ("min", "max"):
        got = pp_call(pinned(a), index, method, values)
        assert_matches(got, jnp_call(a, index, method, values), f"{method} with nan/inf")


# --- functional forms ------------------------------------------------------------

FUNCTIONAL = {
    "set": pallas_pinned.scatter_to_host,
    "add": pallas_pinned.scatter_add_to_host,
    "min": pallas_pinned.scatter_min_to_host,
    "max": pallas_pinned.scatter_max_to_host,
    "multiply": pallas_pinned.scatter_mul_to_host,
}


@pytest.mark.parametrize("index", [
    (A([0, 2, 1]), S(None, None, 2), jax.ds(1, 2)),  # no repeats: jnp's set is the oracle
], ids=describe)
def test_functional_forms_take_the_same_index(rng, index):
    shape = (3, 4, 5)
    a = buffer_values(rng, shape, np.float32)
    out_shape = jnp_call(a, index, "get").shape
    values = _factors(rng, out_shape)
    got = pallas_pinned.gather_from_host(pinned(a), index)
    assert_matches(got, jnp_call(a, index, "get"), f"gather_from_host {describe(index)}")
    for method, op in FUNCTIONAL.items():
        got = op(pinned(a), index, values)
        numpy_form = not any(type(i).__name__ == "Slice" for i in index)  # not a jax.ds
        expected = (_last_writer_wins(a, index, values) if method == "set" and numpy_form
                    else jnp_call(a, index, method, values))
        assert_matches(got, expected, f"{op.__name__} {describe(index)}")


# --- keywords -------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["xla", "interpret"])
def test_get_fill_value_on_several_axes(rng, backend):
    a = buffer_values(rng, (4, 5, 3), np.int32)
    index = (A([0, 9, -1]), S(None, None, 2), A([2, 1, -7]))
    got = pp_call(pinned(a), index, "get", mode="fill", fill_value=-5, backend=backend)
    assert_matches(got, jnp_call(a, index, "get", mode="fill", fill_value=-5),
                   f"get fill_value {backend}")


def test_sorted_unique_hints_on_several_axes(rng):
    # Hints that hold: results as without them.
    a = buffer_values(rng, (4, 5, 3), np.float32)
    index = (A([0, 1, 3]), S(1, 4), A([0, 1, 2]))
    values = -np.ones((3, 3), np.float32)
    for method in ("set", "add", "min", "max", "multiply"):
        got = pp_call(pinned(a), index, method, values, unique_indices=True,
                      indices_are_sorted=True)
        assert_matches(got, jnp_call(a, index, method, values), f"{method} with hints")
    got = pp_call(pinned(a), index, "get", unique_indices=True, indices_are_sorted=True)
    assert_matches(got, jnp_call(a, index, "get"), "get with hints")


# --- names jnp has and these do not -------------------------------------------


@pytest.mark.parametrize("name", ["divide", "power", "apply"])
def test_unsupported_methods_are_absent(name):
    ref = pallas_pinned.at(pinned(np.zeros((3, 2), np.float32)))[0]
    assert not hasattr(ref, name)
    assert getattr(ref, name, None) is None
    with pytest.raises(AttributeError, match=name) as err:
        getattr(ref, name)(2.0)
    assert "get" in str(err.value) and "set" in str(err.value)  # It names the alternatives.
    assert hasattr(jnp.zeros(3).at[0], name)  # jnp has it: the message explains why not here


def test_supported_methods_are_present():
    ref = pallas_pinned.at(pinned(np.zeros((3, 2), np.float32)))[1:, 0]
    for name in ("get", "set", "add", "min", "max", "multiply", "mul"):
        assert callable(getattr(ref, name)), name
    assert not hasattr(ref, "no_such_method")
