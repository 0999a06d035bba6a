"""jax transformations around scatter_to_host: grad w.r.t. updates, and clear refusals."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallas_pinned as pp
from tests.helpers import BACKENDS, put

X0 = np.arange(12.0, dtype=np.float32).reshape(6, 2)
WEIGHTS = jnp.arange(12.0, dtype=jnp.float32).reshape(6, 2) + 1


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", ["device", "pinned_host"])
def test_grad_with_respect_to_updates(backend, kind):
    # Duplicates (1 twice), a negative index and a dropped one: only the
    # surviving update of each row receives gradient.
    idx = jnp.array([1, 4, 1, -1, 9])
    upd = jnp.arange(10.0, dtype=jnp.float32).reshape(5, 2) + 100

    def loss(u):
        out = pp.scatter_to_host(put(X0, kind), idx, u, backend=backend)
        return jnp.sum(jax.device_put(out, jax.memory.Space.Device) * WEIGHTS)

    expected = np.zeros((5, 2), np.float32)
    expected[1], expected[2], expected[3] = WEIGHTS[4], WEIGHTS[1], WEIGHTS[5]
    np.testing.assert_array_equal(jax.grad(loss)(upd), expected)


def test_grad_of_a_broadcast_scalar_update():
    def loss(value):
        return jnp.sum(pp.scatter_to_host(jnp.array(X0), jnp.array([0, 0, 3]), value))

    assert jax.grad(loss)(2.0) == 4.0  # Two surviving rows of two elements.


def test_grad_with_respect_to_the_buffer_is_refused():
    with pytest.raises(TypeError, match="stop_gradient"):
        jax.grad(lambda x: jnp.sum(pp.scatter_to_host(x, 1, 0.0)))(jnp.array(X0))


def test_vmap_is_refused_with_the_alternative():
    x = jnp.array(X0)
    with pytest.raises(NotImplementedError, match=r"indices.reshape\(-1\)"):
        jax.vmap(lambda i: pp.scatter_to_host(x, i, 1.0))(jnp.array([[1], [2]]))
