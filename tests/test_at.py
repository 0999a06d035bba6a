"""The jnp-style front end: ``at(x)[indices].set/add/get`` mirrors ``x.at[...]``."""

from __future__ import annotations

import importlib
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_pinned.at import at
from pallas_pinned.testing import assert_same, make_values
from tests.helpers import BACKENDS, put, read


def _quarters(rng, shape):
    # Exact in float32, so sums do not depend on their order.
    return (rng.integers(-64, 64, size=shape) / 4 + 0.125).astype(np.float32)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", ["device", "pinned_host"])
def test_set_add_get_chain_matches_jnp(rng, backend, kind):
    # One chain of all three, with duplicates, a negative and a dropped row.
    x0 = _quarters(rng, (12, 3))
    idx = jnp.array([[2, -1], [2, 40]])
    y_set = _quarters(rng, (2, 2, 3))
    y_add = _quarters(rng, (2, 2, 3))
    x = put(x0, kind)
    x = at(x)[idx].set(y_set, backend=backend)
    x = at(x)[idx].add(y_add, backend=backend)
    got = at(x)[idx].get(mode="fill", fill_value=-1.0, backend=backend)
    assert x.sharding.memory_kind == kind
    assert got.sharding.memory_kind == "device"

    # jnp leaves the winner among duplicate .set rows unspecified; the last
    # wins here: row 2 takes y_set[1, 0], row -1 y_set[0, 1]; row 40 is dropped.
    expected = jnp.asarray(x0).at[jnp.array([2, -1])].set(y_set[[1, 0], [0, 1]])
    expected = expected.at[idx].add(y_add)
    assert_same(read(x), np.asarray(expected))
    assert_same(read(got), np.asarray(expected.at[idx].get(mode="fill", fill_value=-1.0)))


def test_every_keyword_reaches_the_op(rng, monkeypatch):
    # The values above show mode only: a promise or a backend dropped on the way would
    # leave them as they are. So the op layer under at() is watched.
    at_module = importlib.import_module("pallas_pinned.at")  # the package's `at` is the function
    real, seen = at_module._front, []

    class Watched:
        @staticmethod
        def write(op, x, index, values, **keywords):
            seen.append((op, keywords))
            return real.write(op, x, index, values, **keywords)

        @staticmethod
        def read(x, index, **keywords):
            seen.append(("get", keywords))
            return real.read(x, index, **keywords)

    monkeypatch.setattr(at_module, "_front", Watched)
    x = put(make_values(rng, (10, 2), "float32"))
    promises = {"unique_indices": True, "indices_are_sorted": True}
    x = at(x)[[1, 4]].add(1.0, mode="clip", backend="interpret", **promises)
    at(x)[[1, 4]].get(mode="fill", fill_value=-5.0, backend="xla", **promises)
    assert seen == [
        ("add", {"mode": "clip", "backend": "interpret", **promises}),
        ("get", {"mode": "fill", "fill_value": -5.0, "backend": "xla", **promises}),
    ]


@pytest.mark.parametrize("backend", BACKENDS)
def test_keywords_pass_through(rng, backend):
    x0 = make_values(rng, (10, 2), "int32")
    idx = np.array([1, 4, 12])
    # mode, unique_indices and indices_are_sorted reach the ops.
    out = at(put(x0))[idx].set(
        7, mode="clip", unique_indices=True, indices_are_sorted=True, backend=backend
    )
    expected = x0.copy()
    expected[[1, 4, 9]] = 7
    assert_same(read(out), expected)
    out = at(out)[idx].add(1, mode="drop", backend=backend)
    expected[[1, 4]] += 1
    assert_same(read(out), expected)
    got = at(out)[idx].get(mode="fill", fill_value=-5, indices_are_sorted=True, backend=backend)
    assert_same(read(got), np.array([expected[1], expected[4], [-5, -5]], np.int32))


@pytest.mark.parametrize("backend", BACKENDS)
def test_index_forms(rng, backend):
    x0 = make_values(rng, (20, 3), "float32")
    x = put(x0)
    assert_same(read(at(x)[3].get(backend=backend)), x0[3])  # int: row axis dropped
    assert_same(read(at(x)[(3,)].get(backend=backend)), x0[3])  # 1-tuple, as jnp reads it
    assert_same(read(at(x)[2:17:5].get(backend=backend)), x0[2:17:5])  # static slice
    assert_same(read(at(x)[[1, 1, 0]].get(backend=backend)), x0[[1, 1, 0]])  # list
    out = at(x)[::-4].set(0.5, backend=backend)
    expected = x0.copy()
    expected[::-4] = 0.5
    assert_same(read(out), expected)


def test_set_and_add_consume_x_get_keeps_it(rng):
    x0 = make_values(rng, (6, 2), "float32")
    x = put(x0)
    at(x)[1].get()
    assert not x.is_deleted()
    at(x)[1].add(1.0)
    assert x.is_deleted()
    x = put(x0)
    at(x)[1].set(1.0)
    assert x.is_deleted()


@pytest.mark.parametrize("updates_shape", [(), (3, 2), (5,)], ids=str)
@pytest.mark.parametrize("index", [slice(4, 2), np.zeros((0,), np.int32)], ids=["slice", "array"])
def test_a_write_that_selects_nothing_returns_x_alive(rng, index, updates_shape):
    # Updates of any shape, as jnp's scatter takes them when nothing is selected.
    x0 = make_values(rng, (6, 2), "float32")
    updates = np.ones(updates_shape, np.float32)
    want = np.asarray(jnp.asarray(x0).at[index].add(updates))
    x = put(x0)
    out = at(x)[index].add(updates)
    assert out is x and not x.is_deleted()
    np.testing.assert_array_equal(read(out), want)
    jitted = jax.jit(lambda x: at(x)[index].add(updates), donate_argnums=0)(put(x0))
    np.testing.assert_array_equal(read(jitted), want)


def test_updates_of_a_window_past_its_axis_take_the_windows_full_size(rng):
    # As jnp's scatter: x.at[0:1, jax.ds(2, 4)] reads (1, 2) but writes (1, 4), its start
    # moved back so that the window fits.
    x0 = make_values(rng, (2, 4), "float32")
    x = put(x0)
    with pytest.raises(ValueError, match=r"\(1, 2\) cannot be broadcast to \(1, 4\).*full size"):
        at(x)[0:1, jax.ds(2, 4)].set(np.ones((1, 2), np.float32))
    assert not x.is_deleted()
    updates = make_values(rng, (1, 4), "float32")
    out = at(x)[0:1, jax.ds(2, 4)].set(updates)
    assert_same(read(out), np.asarray(jnp.asarray(x0).at[0:1, jax.ds(2, 4)].set(updates)))


@pytest.mark.parametrize("method", ["set", "add", "subtract", "min", "max", "multiply"])
def test_a_misspelt_keyword_is_named_for_the_users_method_and_x_is_kept(rng, method):
    x0 = make_values(rng, (6, 2), "float32")
    x = put(x0)
    with pytest.raises(TypeError, match=rf"at\(x\)\[\.\.\.\]\.{method}\(\) got an "
                       r"unexpected keyword argument 'unique_indice'; it takes mode, "
                       r"unique_indices"):
        getattr(at(x)[1], method)(1.0, unique_indice=True)
    assert not x.is_deleted()
    np.testing.assert_array_equal(read(x), x0)


def test_under_jit_with_donation(rng):
    x0 = _quarters(rng, (8, 4))

    @jax.jit
    def step(x, i, y):
        x = at(x)[i].add(y)
        return x, at(x)[i].get()

    x, got = jax.jit(step, donate_argnums=(0,))(put(x0), jnp.array([0, 0, 5]), jnp.ones((3, 4)))
    expected = x0.copy()
    expected[0] += 2
    expected[5] += 1
    assert_same(read(x), expected)
    assert_same(read(got), expected[[0, 0, 5]])


def test_refusals_are_clear():
    x = put(np.zeros((4, 2), np.float32))
    with pytest.raises(AttributeError, match="not provided"):
        at(x)[1].divide(2.0)
    assert not hasattr(at(x)[1], "power")
    assert getattr(at(x)[1], "apply", None) is None
    with pytest.raises(AttributeError):
        at(x)[1].no_such_method  # noqa: B018
    with pytest.raises(IndexError, match="too many indices"):
        at(x)[1, 0, 0].get()
    with pytest.raises(TypeError, match="fill"):  # a keyword the op does not take
        at(x)[1].set(1.0, fill_value=0.0)
    with pytest.raises(TypeError, match="bool"):
        at(put(np.zeros(3, bool)))[0].add(True)
    assert not x.is_deleted()


def test_repr_names_the_buffer_and_index():
    x = put(np.zeros((4, 2), np.float32))
    assert "float32" in repr(at(x)) and "[4,2]" in repr(at(x))
    assert repr(at(x)[1:3]).endswith("[slice(1, 3, None)]")


_SUBTRACT_UPDATES = {
    # (the buffer's dtype, the updates: "own" for the buffer's, or a dtype that promotes
    # with it safely, or a Python scalar): no lossy cast, where jnp combines otherwise.
    "float32 own": ("float32", "own"),
    "bfloat16 own": ("bfloat16", "own"),
    "int8 own": ("int8", "own"),
    "uint8 own (wraps)": ("uint8", "own"),
    "uint8 python int": ("uint8", 7),
    "int32 from uint8": ("int32", "uint8"),
    "uint32 own (wraps)": ("uint32", "own"),
    "float32 from int8": ("float32", "int8"),
    "float16 python float": ("float16", 2.5),
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", list(_SUBTRACT_UPDATES))
def test_subtract_is_jnps(rng, backend, case):
    dtype, updates = _SUBTRACT_UPDATES[case]
    x0 = make_values(rng, (12, 3), dtype)
    if jnp.issubdtype(x0.dtype, jnp.floating):
        x0 = (np.round(x0.astype(np.float32) * 4) / 4).astype(x0.dtype)  # exact sums
    if updates == "own":
        updates = make_values(rng, (2, 3, 3), dtype)
    elif isinstance(updates, str):
        updates = make_values(rng, (2, 3, 3), updates)
    # Duplicates, a negative and an out-of-range row; quarters, so that the floats' sums
    # do not depend on their order.
    idx = jnp.array([[2, -1, 5], [2, 40, 0]])
    if jnp.issubdtype(np.asarray(updates).dtype, jnp.floating):
        updates = np.round(np.asarray(updates, np.float32) * 4) / 4
        updates = updates.astype(np.float32 if dtype == "float32" else dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)  # no lossy cast on either side
        expected = jnp.asarray(x0).at[idx].subtract(updates)
        got = at(put(x0))[idx].subtract(updates, backend=backend)
    assert_same(read(got), np.asarray(expected))


def test_subtract_warns_where_jnp_does_and_refuses_bool():
    x = put(np.zeros((4, 2), np.int32))
    with pytest.warns(FutureWarning):
        x = at(x)[1].subtract(jnp.float32(2.0))
    assert_same(read(x)[1], np.array([-2, -2], np.int32))
    # Cast first, then negated in the buffer's type, as add casts first: 2.0 is 2.
    small = put(np.array([5, 6, 7], np.uint8))
    with pytest.warns(FutureWarning):
        small = at(small)[jnp.array([0, 1])].subtract(2.0)
    assert_same(read(small), np.array([3, 4, 7], np.uint8))
    flags = put(np.zeros((4, 2), bool))
    with pytest.raises(TypeError, match="subtract from a bool buffer"):
        at(flags)[1].subtract(True)
    assert not flags.is_deleted()


def test_subtract_differentiates_as_jnps(rng):
    x0 = rng.standard_normal((8, 2)).astype(np.float32)
    weights = jnp.asarray(rng.standard_normal((8, 2)).astype(np.float32))
    idx, u = jnp.array([1, 6, 1]), jnp.ones((3, 2), jnp.float32)
    x = put(x0)

    def ours(u):
        out = at(x)[idx].subtract(u)
        return jnp.sum(jax.device_put(out, jax.memory.Space.Device) * weights)

    def theirs(u):
        return jnp.sum(jnp.asarray(x0).at[idx].subtract(u) * weights)

    assert_same(jax.grad(ours)(u), jax.grad(theirs)(u))
    assert_same(jax.jit(jax.grad(ours))(u), jax.grad(theirs)(u))
    assert not x.is_deleted()
    assert_same(read(x), x0)
