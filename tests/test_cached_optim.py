"""The cached table's optimizers against independent references on a device table.

Each optimizer trains a pinned table through a small cache (rows move in and out at a
refresh half way) with per-entry gradients handed back as ``Grads``; batches of distinct
ids, so that no sum order is involved. SGD and Adagrad: optax on the whole device table
(untouched rows see a zero gradient, a no-op for both). Adam, lazy: each row equals
optax.adam run on that row's own gradients. Bit for bit on CPU (with XLA's optimizations
and without); elsewhere the documented bound, one float32 rounding per step (ULPS): XLA
may fuse a multiply and an add into one FMA inside optax's program. Row-wise Adagrad: a
plain-jnp reference, within a few ulps (its row mean is summed in a fixed order,
``jnp.mean``'s in XLA's). A custom optimizer: a numpy replay.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from pallas_pinned import cached_table as ct

N, D, B, S, C = 12, 3, 5, 6, 4
LR = 0.1
ULPS = S if jax.default_backend() != "cpu" else 0


def _same(got, want):
    if ULPS:
        np.testing.assert_array_max_ulp(got, want, maxulp=ULPS)
    else:
        np.testing.assert_array_equal(got, want)


def _pinned(a):
    return jax.device_put(np.asarray(a), jax.sharding.make_single_device_sharding(
        jax.devices()[0], memory_kind="pinned_host"))


def _np(a):
    return np.asarray(jax.device_put(a, jax.memory.Space.Device))


def _data(seed=0):
    rng = np.random.default_rng(seed)
    table = rng.standard_normal((N, D)).astype(np.float32)
    ids = np.stack([rng.choice(N, B, replace=False) for _ in range(S)]).astype(np.int32)
    grads = rng.standard_normal((S, B, D)).astype(np.float32)
    return table, ids, grads


def _cached(optimizer, table, ids, grads):
    """The pinned table and state after the steps, through a cache of C rows."""
    cache = ct.create(_pinned(table), C, optimizer=optimizer)
    step = lambda carry, rows, g: (carry, ct.Grads(g), None)  # noqa: E731
    for part in (slice(0, S // 2), slice(S // 2, S)):
        cache, _, _ = ct.scan(step, cache, 0, ids[part], grads[part])
        cache = ct.refresh(cache)
    assert ct.stats(cache).hits > 0
    cache = ct.flush(cache)
    return _np(cache.table), [_np(s) for s in cache.state]


def _dense(ids, grads):
    """Each step's gradient of the whole table (zero on untouched rows)."""
    dense = np.zeros((S, N, D), np.float32)
    for s in range(S):
        dense[s, ids[s]] = grads[s]
    return dense


def _optax_run(tx, table, dense):
    """optax on a device table; the params and state after each step."""
    def body(carry, g):
        params, state = carry
        updates, state = tx.update(g, state, params)
        params = optax.apply_updates(params, updates)
        return (params, state), (params, state)

    p = jnp.asarray(table)
    _, history = jax.lax.scan(body, (p, tx.init(p)), dense)
    return jax.tree.map(np.asarray, history)


@pytest.mark.parametrize("name", ["sgd", "adagrad"])
def test_sgd_and_adagrad_are_optax_on_the_whole_device_table(name):
    table, ids, grads = _data(1)
    ours, tx = {"sgd": (ct.sgd(LR), optax.sgd(LR)),
                "adagrad": (ct.adagrad(LR), optax.adagrad(LR))}[name]
    got, state = _cached(ours, table, ids, grads)
    params, opt_state = _optax_run(tx, table, _dense(ids, grads))
    _same(got, params[-1])
    if name == "adagrad":
        _same(state[0], opt_state[0].sum_of_squares[-1])


def test_lazy_adam_is_optax_adam_on_each_rows_own_gradients():
    table, ids, grads = _data(2)
    got, (mu, nu, count) = _cached(ct.adam(LR), table, ids, grads)
    # Row r's k-th gradient at position k: optax's step k + 1 is then row r's (k + 1)-th.
    touches = np.zeros(N, np.int64)
    own = np.zeros((S, N, D), np.float32)
    for s in range(S):
        for b, r in enumerate(ids[s]):
            own[touches[r], r] = grads[s, b]
            touches[r] += 1
    params, (adam_state, _) = _optax_run(optax.adam(LR), table, own)
    last, rows = np.maximum(touches - 1, 0), np.arange(N)
    seen = touches > 0
    np.testing.assert_array_equal(count, touches)
    _same(got, np.where(seen[:, None], params[last, rows], table))
    _same(mu[seen], adam_state.mu[last, rows][seen])
    _same(nu[seen], adam_state.nu[last, rows][seen])
    np.testing.assert_array_equal(mu[~seen], 0)


def test_rowwise_adagrad_is_fbgemms_within_float32_ulps():
    table, ids, grads = _data(3)
    eps, init = 1e-3, 0.5
    got, (acc,) = _cached(ct.rowwise_adagrad(LR, eps=eps, initial_accumulator_value=init),
                          table, ids, grads)
    want, want_acc = jnp.asarray(table), jnp.full((N,), init, jnp.float32)
    for g in _dense(ids, grads):  # one accumulator per row: the mean of the squared gradient
        want_acc = want_acc + jnp.mean(g * g, axis=1)
        want = want - (LR / (jnp.sqrt(want_acc) + eps))[:, None] * g
    np.testing.assert_allclose(acc, want_acc, rtol=2e-6)
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-7)
    assert acc.shape == (N,) and not np.array_equal(acc, np.full(N, init, np.float32))


def test_a_custom_optimizer_gets_the_rows_summed_gradients_and_its_state():
    table, ids, grads = _data(4)

    def signum(rows, g, state):  # sign SGD with a per-row count of its updates
        (count,) = state
        return rows - LR * jnp.sign(g), (count + 1,)

    spec = ct.StateSpec(shape=(), dtype=jnp.int32, init=7)
    got, (count,) = _cached(ct.custom_optimizer(signum, (spec,)), table, ids, grads)
    want, want_count = table.copy(), np.full(N, 7)
    for s in range(S):
        want[ids[s]] -= np.float32(LR) * np.sign(grads[s])
        want_count[ids[s]] += 1
    np.testing.assert_allclose(got, want, rtol=1e-6)
    np.testing.assert_array_equal(count, want_count)
    with pytest.raises(TypeError, match="StateSpec"):
        ct.custom_optimizer(signum, ((), jnp.int32))
