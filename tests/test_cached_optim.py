"""The cached table's optimizers against independent references on a device table.

Each optimizer trains a pinned table through a small cache (rows move in and out at a
refresh half way) with per-entry gradients handed back as ``Grads``, the five tables in
one scan (one program, so that each is also a check of many tables); batches of distinct
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


def _data():
    rng = np.random.default_rng(0)
    table = rng.standard_normal((N, D)).astype(np.float32)
    ids = np.stack([rng.choice(N, B, replace=False) for _ in range(S)]).astype(np.int32)
    grads = rng.standard_normal((S, B, D)).astype(np.float32)
    return table, ids, grads


def _signum(rows, g, state):  # sign SGD with a per-row count of its updates
    (count,) = state
    return rows - LR * jnp.sign(g), (count + 1,)


EPS, INIT = 1e-3, 0.5
OPTIMIZERS = {"sgd": ct.sgd(LR), "adagrad": ct.adagrad(LR), "adam": ct.adam(LR),
              "rowwise": ct.rowwise_adagrad(LR, eps=EPS, initial_accumulator_value=INIT),
              "custom": ct.custom_optimizer(_signum, (ct.StateSpec((), jnp.int32, 7),))}


@pytest.fixture(scope="module")
def trained():
    """Each optimizer's pinned table and state after the steps, through a cache of C rows;
    all five tables in one scan (one program)."""
    table, ids, grads = _data()
    caches = {k: ct.create(_pinned(table), C, optimizer=o) for k, o in OPTIMIZERS.items()}
    step = lambda carry, rows, g: (carry, {k: ct.Grads(g) for k in rows}, None)  # noqa: E731
    for part in (slice(0, S // 2), slice(S // 2, S)):
        caches, _, _ = ct.scan(step, caches, 0, {k: ids[part] for k in caches}, grads[part])
        caches = ct.refresh(caches)
    assert all(s.hits > 0 for s in ct.stats(caches).values())
    caches = ct.flush(caches)
    return {k: (_np(c.table), [_np(s) for s in c.state]) for k, c in caches.items()}


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
def test_sgd_and_adagrad_are_optax_on_the_whole_device_table(trained, name):
    table, ids, grads = _data()
    tx = {"sgd": optax.sgd(LR), "adagrad": optax.adagrad(LR)}[name]
    got, state = trained[name]
    params, opt_state = _optax_run(tx, table, _dense(ids, grads))
    _same(got, params[-1])
    if name == "adagrad":
        _same(state[0], opt_state[0].sum_of_squares[-1])


def test_lazy_adam_is_optax_adam_on_each_rows_own_gradients(trained):
    table, ids, grads = _data()
    got, (mu, nu, count) = trained["adam"]
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


def test_rowwise_adagrad_is_fbgemms_within_float32_ulps(trained):
    table, ids, grads = _data()
    got, (acc,) = trained["rowwise"]
    want, want_acc = jnp.asarray(table), jnp.full((N,), INIT, jnp.float32)
    for g in _dense(ids, grads):  # one accumulator per row: the mean of the squared gradient
        want_acc = want_acc + jnp.mean(g * g, axis=1)
        want = want - (LR / (jnp.sqrt(want_acc) + EPS))[:, None] * g
    np.testing.assert_allclose(acc, want_acc, rtol=2e-6)
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-7)
    assert acc.shape == (N,) and not np.array_equal(acc, np.full(N, INIT, np.float32))


def test_a_custom_optimizer_gets_the_rows_summed_gradients_and_its_state(trained):
    table, ids, grads = _data()
    got, (count,) = trained["custom"]
    want, want_count = table.copy(), np.full(N, 7)
    for s in range(S):
        want[ids[s]] -= np.float32(LR) * np.sign(grads[s])
        want_count[ids[s]] += 1
    np.testing.assert_allclose(got, want, rtol=1e-6)
    np.testing.assert_array_equal(count, want_count)
    with pytest.raises(TypeError, match="StateSpec"):
        ct.custom_optimizer(_signum, ((), jnp.int32))
