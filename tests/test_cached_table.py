"""``pallas_pinned.cached_table``: a pinned table with a device cache and a prefetch pipeline.

Checked against numpy models of the table on CPU: reads, adds and sets with repeated and
out-of-range ids, refresh and eviction (fuzzed), flush, the pipelined training against a
device table, the prefetch hazard and the refusals.
"""

from __future__ import annotations

import inspect

import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

from pallas_pinned import cached_table as ct

N, D, C, B = 40, 3, 6, 8
LR = 0.5
# Repeated ids sum their updates in another order than the device table's add: float32
# rounding of a few ulps of the rows (module doc), far below one lost update (~1e-2 here).
TOL = 1e-5


def _pinned(a):
    # A copy that only jax holds: on CPU, device_put may take an aligned numpy array without
    # a copy, and a test's numpy model changes while writes that read the table may still
    # be in flight (jax dispatches them asynchronously).
    return jax.device_put(np.array(a), jax.sharding.make_single_device_sharding(
        jax.devices()[0], memory_kind="pinned_host"))


def _aligned(a):
    """``a`` copied to a page-aligned address: memory jax on CPU can take without a copy."""
    raw = np.empty(a.nbytes + 4096, np.uint8)
    start = -raw.ctypes.data % 4096
    out = raw[start:start + a.nbytes].view(a.dtype).reshape(a.shape)
    out[...] = a
    return out


def _np(a):
    return np.asarray(jax.device_put(a, jax.memory.Space.Device))


def _table(seed=0, n=N, d=D):
    return np.random.default_rng(seed).standard_normal((n, d)).astype(np.float32)


def _check_invariants(cache):
    slot_of, id_of = np.asarray(cache.slot_of), np.asarray(cache.id_of)
    cached = np.flatnonzero(slot_of >= 0)
    assert sorted(id_of[id_of >= 0].tolist()) == cached.tolist()
    assert np.all(id_of[slot_of[cached]] == cached)
    assert not np.asarray(cache.dirty)[id_of < 0].any()


def test_lookup_add_set_match_numpy_with_repeats_companions_and_out_of_range_ids():
    t0, a0 = _table(), np.abs(_table(1, d=1))
    cache = ct.create(_pinned(t0), C, companions=(_pinned(a0),))
    ids = np.array([3, 3, 7, 39, -1, 40, 5, 3], np.int32)  # repeats, and two out of range
    valid = (ids >= 0) & (ids < N)
    rows, cache = ct.lookup(cache, ids)
    np.testing.assert_array_equal(_np(rows), np.where(valid[:, None], t0[ids % N], 0))
    cache = ct.refresh(cache)  # 3, 5, 7, 39 cached now
    assert sorted(np.asarray(cache.id_of)[np.asarray(cache.id_of) >= 0]) == [3, 5, 7, 39]
    ids2 = np.array([3, 11, 11, 7, 40, 3, 12, 39], np.int32)
    d = np.random.default_rng(2).standard_normal((B, D)).astype(np.float32)
    da = np.ones((B, 1), np.float32)
    cache = ct.add_rows(cache, ids2, (d, da))
    t, a = t0.copy(), a0.copy()
    keep = ids2 < N
    np.add.at(t, ids2[keep], d[keep])
    np.add.at(a, ids2[keep], da[keep])
    (rows, acc), cache = ct.lookup(cache, ids2, companions=True)
    np.testing.assert_allclose(_np(rows)[keep], t[ids2[keep]], atol=TOL)
    np.testing.assert_allclose(_np(acc)[keep], a[ids2[keep]], atol=TOL)
    v = np.arange(B * D, dtype=np.float32).reshape(B, D)
    cache = ct.set_rows(cache, ids2, v)  # the last entry of 3 and of 11 wins
    for i in range(B):
        if keep[i]:
            t[ids2[i]] = v[i]
    cache = ct.flush(cache)
    np.testing.assert_allclose(_np(cache.table), t, atol=TOL)
    np.testing.assert_allclose(_np(cache.companions[0]), a, atol=TOL)
    assert not np.asarray(cache.dirty).any()
    assert cache.table.sharding.memory_kind == "pinned_host"
    s = ct.stats(cache)
    assert (s.lookups, s.hits, s.misses, s.flushed) == (6 + 7, 4, 9, 3)
    _check_invariants(cache)


def test_refresh_lfu_takes_the_most_looked_up_and_lru_the_most_recent_writing_dirty_back():
    t0 = _table()
    for policy, expect in (("lfu", [1, 2]), ("lru", [8, 9])):
        cache = ct.create(_pinned(t0), 2, policy=policy)
        for ids in ([1, 1, 1, 1, 2, 2, 2, 3], [8, 9, -1, -1, -1, -1, -1, 40]):
            _, cache = ct.lookup(cache, np.array(ids, np.int32))
        cache = ct.refresh(cache)
        assert sorted(np.asarray(cache.id_of).tolist()) == expect, policy
        cache = ct.add_rows(cache, np.array(expect, np.int32), np.ones((2, D), np.float32))
        for _ in range(3):  # now other ids are the busiest and most recent: both leave
            _, cache = ct.lookup(cache, np.array([20, 21] * 4, np.int32))
        cache = ct.refresh(cache)
        assert sorted(np.asarray(cache.id_of).tolist()) == [20, 21], policy
        want = t0.copy()
        want[expect] += 1
        np.testing.assert_array_equal(_np(cache.table), want)  # written back at eviction
        s = ct.stats(cache)
        assert (s.evictions, s.writebacks, s.loads) == (2, 2, 4), policy
        _check_invariants(cache)


def test_a_pinned_table_keeps_its_values_when_the_numpy_model_changes():
    model = _aligned(_table())
    want = model.copy()
    cache = ct.create(_pinned(model), C)
    model += 1  # as the fuzz's model does after each write
    np.testing.assert_array_equal(_np(ct.flush(cache).table), want)


OPS = st.sampled_from(["lookup", "add", "set", "refresh", "flush"])


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(policy=st.sampled_from(ct.POLICIES), seed=st.integers(0, 2**16),
       ops=st.lists(OPS, min_size=1, max_size=10))
def test_fuzz_refresh_eviction_and_flush_against_a_numpy_table(policy, seed, ops):
    rng = np.random.default_rng(seed)
    model = rng.integers(-8, 9, (N, D)).astype(np.float32)  # integers: every sum exact
    cache = ct.create(_pinned(model), C, policy=policy)
    for op in [*ops, "flush"]:
        # Few ids, so that repeats, hits and evictions all happen.
        ids = rng.integers(0, N // 3 if rng.random() < 0.5 else N, B).astype(np.int32)
        values = rng.integers(-4, 5, (B, D)).astype(np.float32)  # exact sums in float32
        if op == "lookup":
            rows, cache = ct.lookup(cache, ids)
            np.testing.assert_array_equal(_np(rows), model[ids])
        elif op == "add":
            cache = ct.add_rows(cache, ids, values)
            np.add.at(model, ids, values)
        elif op == "set":
            cache = ct.set_rows(cache, ids, values)
            model[ids] = values  # numpy: the last repeat wins, as set_rows promises
        elif op == "refresh":
            cache = ct.refresh(cache)
        else:
            cache = ct.flush(cache)
            np.testing.assert_array_equal(_np(cache.table), model)
        _check_invariants(cache)


def _sgd(carry, rows, targets):
    grad = jax.grad(lambda v: 0.5 * jnp.mean(jnp.sum((v[rows.inverse] - targets) ** 2, -1)))(
        rows.values[0])
    return carry + 1, ct.Deltas(-LR * grad), jnp.sum(rows.valid)


def _device_training(t0, ids, targets):
    def step(table, xs):
        i, t = xs
        grad = jax.grad(lambda r: 0.5 * jnp.mean(jnp.sum((r - t) ** 2, -1)))(table[i])
        return table.at[i].add(-LR * grad), None

    return np.asarray(jax.lax.scan(step, jnp.asarray(t0), (ids, targets))[0])


def _batches(seed, steps, n=N, batch=B):
    rng = np.random.default_rng(seed)
    ids = np.minimum(rng.zipf(1.3, (steps, batch)) - 1, n - 1).astype(np.int32)
    return ids, rng.standard_normal((steps, batch, D)).astype(np.float32)


# Each policy once, with prefetch and without (tests/test_cached_training.py has both with
# many tables).
@pytest.mark.parametrize(("policy", "prefetch"), [("lfu", True), ("lru", False)])
def test_pipelined_training_matches_the_device_table(policy, prefetch):
    t0 = _table(3)
    ids, targets = _batches(4, 12)
    cache = ct.create(_pinned(t0), C, policy=policy)
    train = jax.jit(lambda c, k, i, t: ct.scan(_sgd, c, k, i, t, prefetch=prefetch),
                    donate_argnums=0)
    carry = jnp.int32(0)
    for chunk in range(3):  # a refresh every 4 steps: rows move in and out of the cache
        part = slice(4 * chunk, 4 * chunk + 4)
        cache, carry, distinct = train(cache, carry, ids[part], targets[part])
        assert _np(distinct).tolist() == [np.unique(r).size for r in ids[part]]
        cache = ct.refresh(cache)
    assert int(carry) == 12
    s = ct.stats(cache)
    assert s.hits > 0 and s.evictions + s.loads > 0
    cache = ct.flush(cache)
    np.testing.assert_allclose(_np(cache.table), _device_training(t0, ids, targets), atol=TOL)


def test_hazard_a_row_updated_at_one_step_and_prefetched_for_the_next_keeps_the_update():
    # Nothing cached: every row is read from the pinned table, and row 5 by every step. The
    # pipeline reads step i+1's rows before step i writes them back.
    t0 = _table(5)
    ids = np.array([[5, 1, 2, 3], [5, 6, 7, 8], [9, 5, 5, 10]], np.int32)
    targets = np.random.default_rng(6).standard_normal((3, 4, D)).astype(np.float32)
    want = _device_training(t0, ids, targets)
    results = {}
    for patch in (True, False):
        cache = ct.create(_pinned(t0), C)
        cache, _, _ = ct.scan(_sgd, cache, jnp.int32(0), ids, targets, _patch_staged=patch)
        results[patch] = _np(ct.flush(cache).table)
    np.testing.assert_allclose(results[True], want, atol=TOL)
    lost = np.abs(results[False] - want).max(axis=1)
    assert lost[5] > 100 * TOL  # without the patch, step 0's and 1's updates of row 5 are lost
    np.testing.assert_allclose(np.delete(results[False], 5, 0), np.delete(want, 5, 0), atol=TOL)


def test_refusals_name_the_fix_and_leave_table_and_cache_unchanged():
    t0 = _table()
    table = _pinned(t0)
    with pytest.raises(ValueError, match="pinned_host.*device_put"):
        ct.create(jnp.asarray(t0), C)
    with pytest.raises(ValueError, match="cache_size must be between 1"):
        ct.create(table, N + 1)
    with pytest.raises(ValueError, match="policy"):
        ct.create(table, C, policy="fifo")
    with pytest.raises(ValueError, match="companion 0 has 3 rows"):
        ct.create(table, C, companions=(_pinned(np.zeros((3, 1), np.float32)),))
    cache = ct.create(table, C)
    _, cache = ct.lookup(cache, np.arange(B, dtype=np.int32))
    cache = ct.refresh(cache)
    before = jax.tree.map(np.asarray, (cache.rows, cache.slot_of, cache.score))
    ids = np.arange(B, dtype=np.int32)
    bad = [
        (TypeError, "integers.*astype", lambda: ct.lookup(cache, ids.astype(np.float32))),
        (ValueError, r"\(batch,\)", lambda: ct.lookup(cache, ids[None])),
        (ValueError, r"must be \(8, 3\)",
         lambda: ct.add_rows(cache, ids, np.ones((B, D + 1), np.float32))),
        (TypeError, "does not cast",
         lambda: ct.set_rows(cache, ids, np.ones((B, D), np.complex64))),
        (ValueError, "one per table", lambda: ct.add_rows(cache, ids, (None, None))),
        (ValueError, r"\(steps, batch\)", lambda: ct.scan(_sgd, cache, 0, ids, None)),
        (ValueError, "deltas of table must be",
         lambda: ct.scan(lambda c, r, x: (c, ct.Deltas(jnp.ones((2, D))), None), cache, 0,
                         ids[None])),
        (TypeError, "CachedTable", lambda: ct.flush(table)),
    ]
    for error, match, call in bad:
        with pytest.raises(error, match=match):
            call()
    assert not cache.table.is_deleted()
    after = jax.tree.map(np.asarray, (cache.rows, cache.slot_of, cache.score))
    jax.tree.map(np.testing.assert_array_equal, before, after)
    np.testing.assert_array_equal(_np(cache.table), t0)
    rows, cache = ct.lookup(cache, ids)  # still usable
    np.testing.assert_array_equal(_np(rows), t0[ids])
    old, cache = cache, ct.add_rows(cache, ids, np.ones((B, D), np.float32))
    with pytest.raises(ValueError, match="deleted.*returned"):  # consumed outside jit
        ct.lookup(old, ids)


def test_runs_under_a_users_jit_with_the_cache_donated():
    t0 = _table()
    cache = ct.create(_pinned(t0), C, policy="lru")
    table_pointer = cache.table.unsafe_buffer_pointer()

    @jax.jit
    def step(cache, ids):
        rows, cache = ct.lookup(cache, ids)
        return ct.refresh(ct.add_rows(cache, ids, -rows))  # zeroes the rows

    step = jax.jit(step.__wrapped__, donate_argnums=0)
    ids = np.array([1, 2, 3, 30, 31, 5, 0, 4], np.int32)
    cache = step(cache, ids)
    cache = step(cache, ids)
    want = t0.copy()
    want[ids] = 0
    cache = ct.flush(cache)
    np.testing.assert_allclose(_np(cache.table), want, atol=TOL)
    if jax.default_backend() == "gpu":
        # Updated in place. XLA's CPU client may copy a donated buffer instead (it did, now
        # and then, in a full run): there only the values are the promise.
        assert cache.table.unsafe_buffer_pointer() == table_pointer


def test_the_public_module_keeps_its_surface():
    # The implementation lives in private modules; users import this one module.
    surface = {"POLICIES", "CacheStats", "CachedTable", "Deltas", "Grads", "RowOptimizer",
               "Rows", "StateSpec", "adagrad", "adam", "add_rows", "create",
               "custom_optimizer", "flush", "lookup", "refresh", "reset_stats",
               "rowwise_adagrad", "scan", "set_rows", "sgd", "stats"}
    assert set(ct.__all__) == surface
    assert all(hasattr(ct, name) for name in surface)
    assert "_patch_staged" in inspect.signature(ct.scan).parameters
