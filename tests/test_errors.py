"""Bad input is rejected before anything runs, and the buffer survives intact."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallas_pinned as pp
from tests.helpers import put, read

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
    "unknown mode": (1, 0.0, {"mode": "wrap"}, ValueError, "'wrap'"),
    "fill is a gather mode": (1, 0.0, {"mode": "fill"}, ValueError, "'fill'"),
    "unknown backend": (1, 0.0, {"backend": "cuda"}, ValueError, "'cuda'"),
    "tuple index (several axes)": ((1, 2), 0.0, {}, NotImplementedError, r"\(1, 2\)"),
    "None index": (None, 0.0, {}, NotImplementedError, "None"),
    "Ellipsis index": (Ellipsis, 0.0, {}, NotImplementedError, "Ellipsis"),
    "dynamic slice bound": (slice(jnp.int32(1), 4), 0.0, {}, NotImplementedError, "slice"),
    "zero slice step": (slice(0, 4, 0), 0.0, {}, ValueError, "step"),
}


@pytest.mark.parametrize("case", BAD_CALLS, ids=list(BAD_CALLS))
def test_bad_call_raises_and_leaves_x_alive(x, case):
    indices, updates, kwargs, error, text = BAD_CALLS[case]
    with pytest.raises(error, match=text):
        pp.scatter_to_host(x, indices, updates, **kwargs)
    assert not x.is_deleted()
    np.testing.assert_array_equal(read(x), X0)


def test_rank0_buffer():
    x = put(np.float32(3.0))
    with pytest.raises(ValueError, match=r"shape \(\)"):
        pp.scatter_to_host(x, 0, 1.0)
    assert not x.is_deleted()


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
