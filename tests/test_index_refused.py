"""Forms the grammar refuses: they raise before anything runs, and ``x`` stays alive and unchanged.

Outside jit the writes consume ``x`` as if donated, but only on success: after
a refused call ``x.is_deleted()`` is False and its values are what they were.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallas_pinned
from pallas_pinned._index import DS_STARTS_WRAP
from tests.index_support import buffer_values, describe, pinned

A = np.array
S = slice
METHODS = ("get", "set", "add", "min", "max", "multiply", "mul")
SHAPE = (4, 5, 3)

# (index, the exception types jnp's own refusal would be among, what it is)
REFUSED = [
    (1.5, (TypeError, IndexError), "a float"),
    ((0, 2.0), (TypeError, IndexError), "a float on axis 1"),
    (A([1.0, 2.0]), (TypeError, IndexError), "a float array"),
    ((S(None), A([0.5])), (TypeError, IndexError), "a float array on axis 1"),
    (A([1 + 2j]), (TypeError, IndexError), "a complex array"),
    ((0, 1, 2, 0), (IndexError,), "too many indices"),
    ((..., 0, ...), (IndexError,), "two ellipses"),
    (S(0.5, 2), (TypeError,), "a float slice bound"),
    (S(0, 3, 0), (ValueError,), "a slice step of zero"),
    (A([True, False, True, False]), (TypeError,), "a boolean mask"),
    ((0, A([True, False, True, True, False])), (TypeError,), "a boolean mask on axis 1"),
    (A([[True] * 5] * 4), (TypeError,), "a 2-D boolean mask"),
    (True, (TypeError,), "a Python bool"),
    ((S(None), np.bool_(False)), (TypeError,), "a numpy bool"),
    ("0", (TypeError, IndexError), "a string"),
    ((0, jax.ds(1.5, 2)), (TypeError, IndexError, ValueError), "a float ds start"),
    (S(np.bool_(True), 3), (TypeError,), "a numpy bool slice bound"),  # jnp: TypeError too
]


def _call(x, index, method, **kw):
    ref = pallas_pinned.at(x)[index]
    if method == "get":
        return ref.get(**kw)
    return getattr(ref, method)(np.float32(-1.0), **kw)


def _assert_untouched(x, a, what):
    assert not x.is_deleted(), f"{what}: x was consumed by a refused call"
    np.testing.assert_array_equal(np.asarray(x), a, err_msg=f"{what}: x changed")


@pytest.mark.parametrize("index,errors,what", REFUSED, ids=[r[2] for r in REFUSED])
def test_refused_outside_jit_leaves_x(rng, index, errors, what):
    a = buffer_values(rng, SHAPE, np.float32)
    x = pinned(a)
    for method in METHODS:
        with pytest.raises(errors):
            _call(x, index, method)
        _assert_untouched(x, a, f"{method} with {what} ({describe(index)})")
    assert jax.block_until_ready(pallas_pinned.at(x)[0, 1].set(7.0))[0, 1, 0] == 7.0


@pytest.mark.parametrize("index,errors,what", REFUSED[:6] + REFUSED[9:12],
                         ids=[r[2] for r in REFUSED[:6] + REFUSED[9:12]])
def test_refused_under_jit(rng, index, errors, what):
    # Raised while tracing: nothing is compiled or run.
    a = buffer_values(rng, SHAPE, np.float32)
    for method in ("get", "set", "add"):
        with pytest.raises(errors):
            jax.jit(lambda x, m=method: _call(x, index, m))(pinned(a))


def test_jnp_refuses_them_too():
    # The refusals mirror jnp's (masks aside, which jnp takes eagerly and we never do).
    x = jnp.zeros(SHAPE)
    for index, errors, what in REFUSED:
        if "bool" in what or "mask" in what or "ds" in what or "zero" in what:
            continue
        with pytest.raises(errors):
            x.at[index].get()


def test_traced_slice_bound_is_refused(rng):
    a = buffer_values(rng, SHAPE, np.float32)
    for method in ("get", "set", "add"):
        with pytest.raises(IndexError, match="jax.ds"):
            jax.jit(lambda x, s, m=method: _call(x, S(s, s + 2), m))(pinned(a), jnp.int32(1))
        with pytest.raises(IndexError, match="jax.ds"):  # A traced step too (not JAX's error).
            jax.jit(lambda x, s, m=method: _call(x, S(None, None, s), m))(pinned(a), 2)
    with pytest.raises(IndexError):  # jnp refuses it too
        jax.jit(lambda x, s: x.at[s:s + 2].get())(a, jnp.int32(1))


def test_a_traced_ds_size_is_refused_naming_static_and_a_concrete_one_is_taken(rng):
    a = buffer_values(rng, SHAPE, np.float32)
    with pytest.raises(TypeError, match="a ds size must be static"):
        jax.jit(lambda x, n: _call(x, jax.ds(0, n), "get"))(pinned(a), 2)
    # (jax.ds itself refuses a traced stride.)
    # A concrete jax scalar is a static size. Before jax 0.12.1 it reads as the int would
    # (jnp's own indexing asserts on it): a static window past the end is a slice, as in
    # jnp. From 0.12.1 jnp takes the array size itself, as a dynamic slice (the window
    # clamped inside), and so do we.
    for start, size, stride in ((1, 2, 1), (SHAPE[0] - 2, 4, 1), (0, 4, 2)):
        got = _call(pinned(a), jax.ds(start, jnp.int32(size), stride), "get")
        as_jnp_takes = jnp.int32(size) if DS_STARTS_WRAP else size
        want = jnp.asarray(a).at[jax.ds(start, as_jnp_takes, stride)].get()
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


@pytest.mark.parametrize("method", METHODS[1:])
def test_bad_values_leave_x(rng, method):
    a = buffer_values(rng, SHAPE, np.float32)
    x = pinned(a)
    index = (A([0, 3]), S(None), A([2, 1]))  # selects shape (2, 5)
    with pytest.raises(ValueError):
        getattr(pallas_pinned.at(x)[index], method)(np.ones((3, 5), np.float32))
    _assert_untouched(x, a, f"{method} with values of the wrong shape")


@pytest.mark.parametrize("method", METHODS)
def test_unknown_mode_leaves_x(rng, method):
    a = buffer_values(rng, SHAPE, np.float32)
    x = pinned(a)
    with pytest.raises(ValueError, match="mode"):
        _call(x, (1, A([0, 2])), method, mode="nearest")
    _assert_untouched(x, a, f"{method} with an unknown mode")


def test_index_array_on_another_device_leaves_x(rng):
    a = buffer_values(rng, SHAPE, np.float32)
    x = pinned(a)
    other = jax.device_put(A([0, 1]), jax.devices("cpu")[1])
    for method in ("get", "set", "add"):
        with pytest.raises(ValueError):
            _call(x, (S(None), other), method)
        _assert_untouched(x, a, f"{method} with indices on another device")


def test_a_deleted_buffer_is_refused(rng):
    a = buffer_values(rng, SHAPE, np.float32)
    x = pinned(a)
    y = pallas_pinned.at(x)[1, A([0, 2])].set(-1.0)
    assert x.is_deleted() and not y.is_deleted()  # consumed on success, as if donated
    with pytest.raises(ValueError, match="deleted"):
        pallas_pinned.at(x)[0].get()


@pytest.mark.parametrize("index", [(S(None), 0), (S(None), jnp.int32(0)), (1, -1)])
@pytest.mark.parametrize("method", ["get", "set"])
def test_a_single_index_into_an_empty_axis_is_refused_like_jnp(method, index):
    # jnp (XLA) raises IndexError for one index into an axis of length 0, in every
    # mode; a write used to do nothing, a read to raise a ValueError.
    a = np.zeros((3, 0), np.float32)
    for mode in (None, "fill"):
        with pytest.raises(IndexError, match="out of bounds for axis 1 with size 0"):
            ref = jnp.asarray(a).at[index]
            ref.get(mode=mode) if method == "get" else ref.set(1.0, mode=mode)
        x = pinned(a)
        with pytest.raises(IndexError, match="out of bounds for axis 1 with size 0"):
            ref = pallas_pinned.at(x)[index]
            ref.get(mode=mode) if method == "get" else ref.set(1.0, mode=mode)
        assert not x.is_deleted()


@pytest.mark.parametrize("index", [(0, True, 1), (np.bool_(False), 0, 1, 2), (True, ...)])
def test_a_bool_anywhere_in_a_tuple_is_refused_as_a_mask(rng, index):
    # numpy's bool scalar uses no axis: counted as one, (0, True, 1) would be
    # refused as "too many indices" on this 3-D buffer, naming the wrong fault.
    a = buffer_values(rng, SHAPE, np.float32)
    x = pinned(a)
    for method in ("get", "set", "add"):
        with pytest.raises(TypeError, match="boolean masks are not supported"):
            _call(x, index, method)
        _assert_untouched(x, a, f"{method} with {describe(index)}")
        with pytest.raises(TypeError, match="boolean masks are not supported"):
            jax.jit(lambda x, m=method: _call(x, index, m))(x)
        _assert_untouched(x, a, f"{method} under jit with {describe(index)}")
