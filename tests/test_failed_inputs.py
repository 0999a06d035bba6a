"""An eager write whose index or updates array failed to compute leaves ``x`` alive.

Validation sees shapes only, and JAX reports a failed computation when its result is
used. An eager write donates ``x`` as it is dispatched, so before it waits for its
inputs, a failed input consumed the buffer; jnp's copying ``x.at`` keeps it.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import pallas_pinned as pp
from tests.helpers import put, read

X0 = np.arange(24, dtype=np.float32).reshape(8, 3) + 0.5


@jax.jit
def _fails_when_run(s):
    # Asks for a 4 TB temporary: dispatched without complaint, fails as it runs.
    return jnp.cumsum(jnp.full((10**12,), s))[:3]


CALLS = {
    "set, updates failed": lambda x, bad: pp.scatter_to_host(x, jnp.array([1]), bad),
    "add, indices failed": lambda x, bad: pp.scatter_add_to_host(
        x, bad[:2].astype(jnp.int32), 5.0),
    "at min, updates failed": lambda x, bad: pp.at(x)[1].min(bad),
    "at set of a block, updates failed": lambda x, bad: pp.at(x)[2:3].set(bad[None]),
}


@pytest.mark.parametrize("placement", ["one device", "sharded"])
@pytest.mark.parametrize("name", sorted(CALLS))
def test_a_failed_input_leaves_the_buffer_alive_and_unchanged(name, placement):
    if placement == "sharded":
        mesh = jax.make_mesh((2,), ("data",), devices=jax.devices()[:2])
        x = jax.device_put(X0, NamedSharding(mesh, P("data"), memory_kind="pinned_host"))
    else:
        x = put(X0)
    bad = _fails_when_run(1.0)
    with pytest.raises(jax.errors.JaxRuntimeError) as caught:
        read(CALLS[name](x, bad))
    assert not x.is_deleted(), "the write consumed x although its input had failed"
    np.testing.assert_array_equal(read(x), X0)
    assert any("x was not consumed" in note for note in getattr(caught.value, "__notes__", []))


def test_a_write_after_a_failed_input_still_updates_in_place():
    x = put(X0)
    with pytest.raises(jax.errors.JaxRuntimeError):
        pp.scatter_to_host(x, jnp.array([1]), _fails_when_run(1.0))
    out = pp.scatter_to_host(x, jnp.array([1]), jnp.ones(3, jnp.float32))
    assert x.is_deleted(), "an eager write with good inputs donates x"
    expected = X0.copy()
    expected[1] = 1.0
    np.testing.assert_array_equal(read(out), expected)
