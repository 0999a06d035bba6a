"""Bad input is rejected before anything runs, and the buffer survives intact.

scatter_to_host first, then gather_from_host and scatter_add_to_host, then the
rules all three share (masks, float indices, ragged lists, a consumed buffer,
a buffer passed as its own updates or indices).
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import pallas_pinned as pp
from pallas_pinned.gather import gather_from_host
from pallas_pinned.scatter_add import scatter_add_to_host
from pallas_pinned.testing import assert_same
from tests.helpers import has_gpu, put, read

X0 = np.arange(24, dtype=np.float32).reshape(8, 3) + 0.5


@pytest.fixture
def x():
    return put(X0)


# (indices, updates, keyword arguments, exception, text the message must show)
BAD_CALLS = {
    "float indices": (jnp.array([1.0, 2.0]), 0.0, {}, TypeError, "float32"),
    "bool index array": (np.array([True, False]), 0.0, {}, TypeError, "bool"),
    "python bool index": (True, 0.0, {}, TypeError, "True"),
    "updates not broadcastable": (jnp.array([1, 2]), np.ones((3, 3)), {}, ValueError, r"\(3, 3\)"),
    "updates with a wrong row width": (1, np.ones(4), {}, ValueError, r"\(4,\)"),
    "string updates": (1, np.array(["a", "b", "c"]), {}, TypeError, "<U1"),
    "unknown mode": (1, 0.0, {"mode": "wrapped"}, ValueError, "'wrapped'"),
    "a gather-only keyword": (1, 0.0, {"fill_value": 0.0}, TypeError, "fill_value"),
    "unknown backend": (1, 0.0, {"backend": "cuda"}, ValueError, "'cuda'"),
    "a promise given as a string": (1, 0.0, {"unique_indices": "False"}, TypeError, "'False'"),
    "too many indices": ((1, 0, 0), 0.0, {}, IndexError, "too many indices"),
    "two ellipses": ((Ellipsis, Ellipsis), 0.0, {}, IndexError, "single ellipsis"),
    "float in a tuple": ((1, 0.5), 0.0, {}, TypeError, "float"),
    "ds that does not fit": (jax.ds(0, 9), 0.0, {}, ValueError, "does not fit"),
    "string index": ("a", 0.0, {}, TypeError, "str"),
    "zero slice step": (slice(0, 4, 0), 0.0, {}, ValueError, "step"),
    "index arrays that do not broadcast": (
        (np.array([0, 1, 2]), np.array([0, 1])), 0.0, {}, ValueError, "do not broadcast"
    ),
    "ragged updates": (jnp.array([1, 2]), [[1.0, 2.0, 3.0], [1.0]], {}, ValueError, "ragged"),
    "None among listed positions": ([None, 1], 0.0, {}, TypeError, "indices holds None"),
    "strings in an updates list": (1, ["a", "b", "c"], {}, TypeError, "updates holds 'a'"),
    "None in an updates list": (1, [1.0, None, 2.0], {}, TypeError, "updates holds None"),
    "a promise given as an array": (
        jnp.array([1, 2]), 0.0, {"unique_indices": np.array([True, False])}, TypeError,
        r"unique_indices must be True or False, got array\(\[ True, False\]\)",
    ),
    "a ragged updates list of jax arrays": (
        jnp.array([1, 2]), [jnp.ones(3), jnp.ones(2)], {}, ValueError, "ragged"),
}


@pytest.mark.parametrize("updates", [None, ["a", "b", "c"]], ids=["None", "a list of strings"])
def test_subtract_names_updates_that_are_not_numbers(x, updates):
    with pytest.raises(TypeError, match="updates"):
        pp.at(x)[1].subtract(updates)
    assert not x.is_deleted()
    np.testing.assert_array_equal(read(x), X0)


def test_a_read_refuses_a_promise_given_as_an_array(x):
    with pytest.raises(TypeError, match="indices_are_sorted must be True or False"):
        gather_from_host(x, jnp.array([1, 2]), indices_are_sorted=jnp.array([True]))
    assert not x.is_deleted()


@pytest.mark.parametrize("case", BAD_CALLS, ids=list(BAD_CALLS))
def test_bad_call_raises_and_leaves_x_alive(x, case):
    indices, updates, kwargs, error, text = BAD_CALLS[case]
    with pytest.raises(error, match=text):
        pp.scatter_to_host(x, indices, updates, **kwargs)
    assert not x.is_deleted()
    np.testing.assert_array_equal(read(x), X0)


def test_rank0_buffer():
    # jnp indexes a 0-d array with (), None and ... only; an int is one index too many.
    x = put(np.float32(3.0))
    with pytest.raises(IndexError, match="too many indices"):
        pp.scatter_to_host(x, 0, 1.0)
    assert not x.is_deleted() and float(read(x)) == 3.0
    assert float(read(pp.scatter_to_host(x, (), 1.0))) == 1.0


def test_unsupported_dtype():
    x = put(np.ones((4, 2), np.complex64))
    with pytest.raises(TypeError, match="complex64"):
        pp.scatter_to_host(x, 0, 1.0)
    assert not x.is_deleted()


def test_buffer_must_be_a_jax_array():
    with pytest.raises(TypeError, match="ndarray"):
        pp.scatter_to_host(np.ones((4, 2)), 0, 1.0)


def test_inputs_on_different_devices(x):
    # conftest.py gives the CPU backend two devices for this.
    first, second = jax.devices("cpu")[:2]
    x = put(X0, "pinned_host", first)
    indices = jax.device_put(jnp.array([1]), second)
    with pytest.raises(ValueError, match="indices is on"):
        pp.scatter_to_host(x, indices, 0.0)
    updates = jax.device_put(jnp.ones((1, 3)), second)
    with pytest.raises(ValueError, match="updates is on"):
        pp.scatter_to_host(x, jnp.array([1]), updates)
    assert not x.is_deleted()


def test_errors_also_raise_inside_jit(x):
    # Validation looks at shapes and dtypes only, so tracing hits it too.
    with pytest.raises(TypeError, match="float32"):
        jax.jit(lambda x, i: pp.scatter_to_host(x, i, 0.0))(x, jnp.array([1.0]))
    assert not x.is_deleted()


def test_pallas_offsets_guard():
    # 1-byte buffers of 2-4 GiB would overflow Pallas's 32-bit signed offsets.
    from pallas_pinned.kernels.pallas_common import offsets_fit

    assert offsets_fit((2**31,), np.int8)  # Largest offset 2**31 - 1 still fits.
    assert not offsets_fit((2**31 + 1,), np.int8)
    assert not offsets_fit((2**16, 2**16), np.bool_)
    assert offsets_fit((2**32 + 1,), np.uint8)  # Over 2**32 bytes: 64-bit offsets.
    assert offsets_fit((2**31,), np.float16)


# --- gather_from_host and scatter_add_to_host -------------------------------------


def _x():
    return put(np.arange(12, dtype=np.float32).reshape(6, 2))


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"mode": "wrapped"}, ValueError, "'wrapped'"),
        ({"backend": "cuda"}, ValueError, "'cuda'"),
        ({"indices": np.array([1.0])}, TypeError, "float64"),
        ({"indices": (1, 0, 0)}, IndexError, "too many indices"),
        ({"indices": True}, TypeError, "bool"),
        ({"mode": "fill", "fill_value": np.array([1.0, 2.0])}, ValueError, r"\(2,\)"),
        ({"mode": "fill", "fill_value": "zero"}, TypeError, "'zero'"),
        ({"mode": "fill", "fill_value": 1j}, TypeError, "1j"),
        ({"backend": "pallas"}, NotImplementedError, "'cpu'"),  # no GPU here
    ],
)
def test_gather_bad_input(kwargs, error, match):
    if kwargs.get("backend") == "pallas" and has_gpu():
        pytest.skip("the pallas backend exists on a GPU")
    kwargs = {"indices": np.array([1, 2]), **kwargs}
    with pytest.raises(error, match=match):
        gather_from_host(_x(), **kwargs)


def test_gather_bad_buffers():
    with pytest.raises(TypeError, match="ndarray"):
        gather_from_host(np.zeros((4, 2)), [1])
    with pytest.raises(IndexError, match="too many indices"):
        gather_from_host(jnp.float32(1.0), [0])
    with pytest.raises(ValueError, match=r"mode='clip'"):  # No row to clamp to.
        gather_from_host(put(np.zeros((0, 2), np.float32)), [0], mode="clip")


def test_gather_traced_fill_value_is_refused():
    with pytest.raises(TypeError, match="static scalar"):
        jax.jit(lambda v: gather_from_host(_x(), [9], mode="fill", fill_value=v))(1.0)


def test_gather_indices_on_another_device():
    if len(jax.devices()) < 2:
        pytest.skip("needs two devices")
    with pytest.raises(ValueError, match="indices is on"):
        gather_from_host(_x(), jax.device_put(jnp.array([1]), jax.devices()[1]))


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"mode": "wrapped"}, ValueError, "'wrapped'"),
        ({"updates": np.ones((3, 2))}, ValueError, r"\(3, 2\)"),
        ({"updates": np.array(["a", "b"])}, TypeError, "<U1"),
        ({"indices": np.array([0.5, 1.0])}, TypeError, "float64"),
        ({"backend": "pallas"}, NotImplementedError, "'cpu'"),
    ],
)
def test_add_bad_input_leaves_x_alone(kwargs, error, match):
    if kwargs.get("backend") == "pallas" and has_gpu():
        pytest.skip("the pallas backend exists on a GPU")
    x = _x()
    kwargs = {"indices": np.array([1, 2]), "updates": np.ones((2, 2), np.float32), **kwargs}
    with pytest.raises(error, match=match):
        scatter_add_to_host(x, **kwargs)
    assert not x.is_deleted()
    np.testing.assert_array_equal(read(x), np.arange(12, dtype=np.float32).reshape(6, 2))


def test_add_into_bool_is_refused_as_in_jnp():
    with pytest.raises(TypeError, match="bool"):
        scatter_add_to_host(put(np.ones((4, 2), bool)), [1], True)


def test_uncommitted_inputs_move_to_a_buffer_on_another_device():
    # jnp.array(...) lands uncommitted on the default device; like jit, the ops
    # move it to the buffer's device, eagerly too. Committed ones are refused.
    if len(jax.devices()) < 2:
        pytest.skip("needs two devices")
    x0 = np.arange(12, dtype=np.float32).reshape(6, 2)
    x = put(x0, device=jax.devices()[1])
    got = gather_from_host(x, jnp.array([1, 2]))
    assert got.sharding.device_set == {jax.devices()[1]}
    np.testing.assert_array_equal(read(got), x0[[1, 2]])
    out = scatter_add_to_host(x, jnp.array([1, 1]), jnp.ones((2, 2), jnp.float32))
    assert out.sharding.device_set == {jax.devices()[1]}
    assert out.sharding.memory_kind == "pinned_host"
    np.testing.assert_array_equal(read(out)[1], x0[1] + 2)
    # The same signature with a committed index: refused, not taken from the kept plan.
    with pytest.raises(ValueError, match="indices is on"):
        gather_from_host(out, jax.device_put(jnp.array([1, 2]), jax.devices()[0]))
    assert not out.is_deleted()


def test_add_updates_on_another_device():
    if len(jax.devices()) < 2:
        pytest.skip("needs two devices")
    x = _x()
    with pytest.raises(ValueError, match="updates is on"):
        scatter_add_to_host(x, [1], jax.device_put(jnp.ones((1, 2)), jax.devices()[1]))
    assert not x.is_deleted()


@pytest.mark.parametrize("layout", ["one device", "replicated over a mesh",
                                    "sharded along axis 0"])
def test_the_other_device_refusal_names_a_move_that_works(layout):
    if len(jax.devices()) < 2:
        pytest.skip("needs two devices")
    x0 = np.arange(12, dtype=np.float32).reshape(6, 2)
    if layout == "one device":
        x, elsewhere = put(x0, device=jax.devices()[1]), jax.devices()[0]
    else:
        mesh = jax.make_mesh((2,), ("data",))
        spec = P() if layout.startswith("replicated") else P("data")
        x = jax.device_put(x0, NamedSharding(mesh, spec, memory_kind="pinned_host"))
        elsewhere = jax.devices()[1]
    indices = jax.device_put(jnp.array([1, 1]), elsewhere)
    with pytest.raises(ValueError, match=r"indices is on .*e\.g\. (jax\.device_put\(.*\))$") as err:
        scatter_add_to_host(x, indices, 1.0)
    assert not x.is_deleted()
    advice = re.search(r"e\.g\. (jax\.device_put\(.*\))$", str(err.value)).group(1)
    moved = eval(advice, {"jax": jax, "NamedSharding": NamedSharding, "P": P, "indices": indices,
                          "x": x})
    out = scatter_add_to_host(x, moved, 1.0)
    np.testing.assert_array_equal(read(out)[1], x0[1] + 2)


# --- rules the three ops share -------------------------------------------------------

# Each op called as users call it, with one index and the matching updates.
OPS = {
    "set": lambda x, i, **kw: pp.scatter_to_host(x, i, 1.0, **kw),
    "add": lambda x, i, **kw: pp.scatter_add_to_host(x, i, 1.0, **kw),
    "get": lambda x, i, **kw: pp.gather_from_host(x, i, **kw),
    "at.set": lambda x, i, **kw: pp.at(x)[i].set(1.0, **kw),
}

MASKS = {
    "numpy bool array": np.arange(8) % 3 == 0,
    "jax bool array": jnp.arange(8) % 3 == 0,
    "python True": True,
    "python False": False,
    "numpy bool scalar": np.bool_(True),
}


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("mask", MASKS, ids=list(MASKS))
def test_boolean_masks_point_to_nonzero_with_drop(x, op, mask):
    # A mask selects a data-dependent number of rows; the advice is the
    # fixed-size jnp.nonzero padded with an out-of-range row that mode="drop"
    # skips, not a cast (.astype would turn the mask into rows 0 and 1).
    with pytest.raises(TypeError) as raised:
        OPS[op](x, MASKS[mask])
    message = str(raised.value)
    assert "jnp.nonzero(mask, size=" in message and "fill_value=" in message, message
    assert "mode='drop'" in message, message
    assert ".astype" not in message, message
    assert not x.is_deleted()


FLOAT_INDICES = {
    "python float": 1.0,
    "numpy float64 scalar": np.float64(1.0),
    "numpy float32 scalar": np.float32(1.0),
    "numpy float array": np.array([1.0, 2.0]),
    "numpy float16 array": np.array([1.0], np.float16),
    "jax float array": jnp.array([1.0, 2.0]),
    "list of floats": [1.0, 2.0],
}


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("index", FLOAT_INDICES, ids=list(FLOAT_INDICES))
def test_every_float_index_is_a_type_error(x, op, index):
    with pytest.raises(TypeError, match="indices must be integers"):
        OPS[op](x, FLOAT_INDICES[index])
    assert not x.is_deleted()


@pytest.mark.parametrize("op", OPS)
def test_ragged_list_is_refused_by_name(x, op):
    with pytest.raises(ValueError, match="ragged"):
        OPS[op](x, [[1, 2], [3]])
    assert not x.is_deleted()


@pytest.mark.parametrize("op", OPS)
def test_a_consumed_buffer_is_refused_up_front(x, op):
    pp.scatter_to_host(x, 0, 2.0)  # Consumes x, as if donated.
    assert x.is_deleted()
    with pytest.raises(ValueError, match="earlier call"):
        OPS[op](x, 1)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("deleted", ["indices", "updates"])
def test_a_deleted_index_or_updates_array_is_refused_up_front(x, op, deleted):
    i, u = jnp.array([1, 2]), jnp.ones((2, 3), jnp.float32)
    (i if deleted == "indices" else u).delete()
    call = {
        "set": lambda: pp.scatter_to_host(x, i, u),
        "add": lambda: pp.scatter_add_to_host(x, i, u),
        "get": lambda: pp.gather_from_host(x, i),
        "at.set": lambda: pp.at(x)[i].set(u),
    }[op]
    if op == "get" and deleted == "updates":
        call()  # a read takes no updates
    else:
        with pytest.raises(ValueError, match=f"{deleted} holds an array that has been deleted"):
            call()
    assert not x.is_deleted()
    assert_same(read(x), X0)


def test_a_traced_promise_or_a_list_of_traced_ints_is_refused_by_name(x):
    i = jnp.array([1, 2])
    with pytest.raises(TypeError, match="unique_indices must be a Python bool"):
        jax.jit(lambda x, t: pp.at(x)[i].add(1.0, unique_indices=t))(x, True)
    with pytest.raises(TypeError, match="indices_are_sorted must be a Python bool"):
        jax.jit(lambda x, t: pp.at(x)[i].get(indices_are_sorted=t))(x, True)
    with pytest.raises(TypeError, match=r"jnp.stack"):
        jax.jit(lambda x, s: pp.at(x)[[s, s + 1]].get())(x, 1)
    with pytest.raises(TypeError):  # jnp refuses it too
        jax.jit(lambda x, s: x[[s, s + 1]])(X0, 1)
    assert not x.is_deleted()
    assert_same(read(x), X0)


def _int_buffer():
    return put(np.arange(8, dtype=np.int32)[::-1].copy())


def _same_buffer_other_object(x):
    return jax.make_array_from_single_device_arrays(
        x.shape, x.sharding, [shard.data for shard in x.addressable_shards]
    )


ALIASED = {
    # name: (indices, updates) built from the buffer x (int32, 8 rows of one element)
    "updates is x": lambda x: (slice(None), x),
    "indices is x": lambda x: (x, 1),
    "both are x": lambda x: (x, x),
    "updates share x's buffer": lambda x: (slice(None), _same_buffer_other_object(x)),
}
IN_PLACE_OPS = {"set": pp.scatter_to_host, "add": pp.scatter_add_to_host}


@pytest.mark.parametrize("op", IN_PLACE_OPS)
@pytest.mark.parametrize("case", ALIASED)
def test_the_buffer_as_its_own_updates_or_indices_is_refused(op, case):
    # x is consumed (donated) by the call, so it cannot also be read from.
    x = _int_buffer()
    indices, updates = ALIASED[case](x)
    with pytest.raises(ValueError, match="is the buffer x itself"):
        IN_PLACE_OPS[op](x, indices, updates)
    assert not x.is_deleted()
    np.testing.assert_array_equal(read(x), np.arange(8)[::-1])


@pytest.mark.parametrize("op", IN_PLACE_OPS)
def test_the_buffer_as_its_own_updates_is_refused_under_jit(op):
    x = _int_buffer()
    fn = jax.jit(lambda x: IN_PLACE_OPS[op](x, slice(None), x), donate_argnums=0)
    with pytest.raises(ValueError, match="updates is the buffer x itself"):
        fn(x)
    assert not x.is_deleted()


def test_fix_memory_space_names_what_it_takes():
    with pytest.raises(TypeError, match="takes a jax.Array, got ndarray.*jax.device_put"):
        pp.fix_memory_space(np.zeros(3, np.float32))
    with pytest.raises(TypeError, match="not a traced value"):
        jax.jit(pp.fix_memory_space)(jnp.zeros(3))
    x = put(np.zeros(3, np.float32))
    pp.scatter_to_host(x, 0, 1.0)  # Consumes x.
    with pytest.raises(ValueError, match="deleted"):
        pp.fix_memory_space(x)
