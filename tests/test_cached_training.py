"""The cached table in a training: many tables in one scan, bit-reproducible whatever the
cache holds, ids of every width, and the refusals that name their fix.

Reproducible: a training of two tables (float32 row-wise Adagrad; bfloat16 lazy Adam, with
ids out of range) in one scan gives the same bits of tables, state and losses run after
run, with prefetch on and off, with caches of one row, a few rows and all rows; and it
matches the same training on device tables within the module's bound.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_pinned import cached_table as ct

S, LR = 6, 0.1
# name: rows, width, dtype, ids per batch, optimizer
TABLES = {"users": (30, 4, jnp.float32, 8, ct.rowwise_adagrad(0.5)),
          "items": (50, 3, jnp.bfloat16, 6, ct.adam(0.05))}


def _pinned(a):
    return jax.device_put(np.asarray(a), jax.sharding.make_single_device_sharding(
        jax.devices()[0], memory_kind="pinned_host"))


def _np(a):
    return np.asarray(jax.device_put(a, jax.memory.Space.Device)).astype(np.float32)


def _data():
    rng = np.random.default_rng(0)
    tables, ids, dense = {}, {}, {}
    for name, (n, d, dtype, b, _) in TABLES.items():
        tables[name] = rng.standard_normal((n, d)).astype(dtype)
        ids[name] = np.minimum(rng.zipf(1.3, (S, b)) - 1, n - 1).astype(np.int32)
        dense[name] = rng.standard_normal((d, 2)).astype(np.float32)
    ids["items"][:, -1] = [-1, 50, 2**31 - 1, 49, -5, 0]  # four out of range
    # Committed, as the scan's outputs are: its second call then reuses the first's program.
    dense, targets = jax.device_put((dense, rng.standard_normal((S, 2)).astype(np.float32)),
                                    jax.devices()[0])
    return tables, ids, dense, targets


def _loss(dense, embs, target):
    z = sum(jnp.mean(embs[k].astype(jnp.float32) @ dense[k], 0) for k in sorted(embs))
    return jnp.sum((z - target) ** 2)


def _step(dense, rows, target):
    embs = {k: r.per_entry() for k, r in rows.items()}
    loss, (g_dense, g_embs) = jax.value_and_grad(_loss, argnums=(0, 1))(dense, embs, target)
    dense = jax.tree.map(lambda w, g: w - LR * g, dense, g_dense)
    return dense, {k: ct.Grads(g) for k, g in g_embs.items()}, loss


def _cached(cache_rows: dict, prefetch, traces):
    tables, ids, dense, targets = _data()

    def step(*args):
        traces.append(1)
        return _step(*args)

    caches = {k: ct.create(_pinned(t), cache_rows[k], optimizer=TABLES[k][4])
              for k, t in tables.items()}
    losses = []
    for part in (slice(0, S // 2), slice(S // 2, S)):
        part_ids = {k: v[part] for k, v in ids.items()}
        caches, dense, loss = ct.scan(step, caches, dense, part_ids, targets[part],
                                      prefetch=prefetch)
        caches = ct.refresh(caches)
        losses.append(np.asarray(loss))
    stats = ct.stats(caches)
    caches = ct.flush(caches)
    return ({k: [_np(t) for t in c.tables] for k, c in caches.items()},
            np.concatenate(losses), stats)


def _device():
    """The same training on device tables: jax.grad through table[ids] (zeros out of range),
    the optimizer on the touched rows."""
    tables, ids, dense, targets = _data()
    state = {k: [jnp.full(s.full_shape(t.shape), s.init, s.dtype) for s in TABLES[k][4].state]
             for k, t in tables.items()}

    def step(carry, xs):
        tables, state, dense = carry
        batch, target = xs

        def loss(dense, tables):
            embs = {k: jnp.where(((i >= 0) & (i < tables[k].shape[0]))[:, None],
                                 tables[k][jnp.clip(i, 0, tables[k].shape[0] - 1)], 0)
                    for k, i in batch.items()}
            return _loss(dense, embs, target)

        value, (g_dense, g_tables) = jax.value_and_grad(loss, argnums=(0, 1))(dense, tables)
        for k, t in tables.items():
            inside = (batch[k] >= 0) & (batch[k] < t.shape[0])
            touched = jnp.zeros(t.shape[0], bool).at[jnp.where(inside, batch[k], t.shape[0])].set(
                True, mode="drop")
            opt = TABLES[k][4]
            rows, new = opt.update(t.astype(jnp.float32), g_tables[k].astype(jnp.float32),
                                   tuple(state[k]))
            tables[k] = jnp.where(touched[:, None], rows, t).astype(t.dtype)
            state[k] = [jnp.where(touched.reshape(-1, *(1,) * (s.ndim - 1)), n, s)
                        for n, s in zip(new, state[k], strict=True)]
        dense = jax.tree.map(lambda w, g: w - LR * g, dense, g_dense)
        return (tables, state, dense), value

    tables = {k: jnp.asarray(t) for k, t in tables.items()}
    (tables, state, _), losses = jax.lax.scan(step, (tables, state, dense), (ids, targets))
    return {k: [_np(t), *map(_np, state[k])] for k, t in tables.items()}, np.asarray(losses)


def test_many_tables_train_bit_identically_whatever_the_cache_holds_and_match_device_tables():
    traces, few = [], {"users": 3, "items": 3}
    first, losses, stats = _cached(few, True, traces)
    assert len(traces) == 1  # two tables, two scans: one compiled step
    assert stats["users"].hits > 0 and stats["items"].lookups == S * 6 - 4
    # One program more: a cache of one row, one of all rows, no prefetch.
    runs = {"again": _cached(few, True, []),
            "one row, all rows, no prefetch": _cached({"users": 1, "items": 50}, False, [])}
    for name, (tables, run_losses, _) in runs.items():
        np.testing.assert_array_equal(run_losses, losses, err_msg=name)
        for k in TABLES:
            for got, want in zip(tables[k], first[k], strict=True):
                np.testing.assert_array_equal(got, want, err_msg=f"{name}: {k}")
    device, device_losses = _device()
    np.testing.assert_allclose(losses, device_losses, rtol=1e-5)
    for k, (_, _, dtype, _, _) in TABLES.items():
        # Repeats summed in another order: float32's last bits, or a bfloat16 rounding.
        tol = 2e-2 if dtype == jnp.bfloat16 else 1e-5
        for got, want in zip(first[k], device[k], strict=True):
            np.testing.assert_allclose(got, want, atol=tol, err_msg=k)


def test_add_rows_gives_a_cached_and_a_pinned_row_the_same_sum_in_float32_and_bfloat16():
    # Four equal rows, row 0 cached: ids 0 and 1 each get the same five deltas, in a
    # float32 table and a bfloat16 companion.
    cache = ct.create(_pinned(np.ones((4, 3), np.float32)), 1,
                      companions=(_pinned(np.ones((4, 3), jnp.bfloat16)),))
    _, cache = ct.lookup(cache, np.zeros(2, np.int32))
    cache = ct.refresh(cache)
    assert np.asarray(cache.id_of).tolist() == [0]
    # Seed 2: the tree before this sum order differed by 2e-7 (float32), 0.016 (bfloat16).
    deltas = np.random.default_rng(2).standard_normal((5, 3)).astype(np.float32)
    both = np.concatenate([deltas, deltas])
    cache = ct.add_rows(cache, np.array([0] * 5 + [1] * 5),
                        (both, both.astype(jnp.bfloat16)))
    for table in ct.flush(cache).tables:
        rows = _np(table)
        np.testing.assert_array_equal(rows[0], rows[1], err_msg=str(table.dtype))
        np.testing.assert_allclose(rows[0], 1 + deltas.sum(0), rtol=2e-2)


def test_ids_of_every_width_past_the_table_read_zeros_and_drop_their_updates():
    n = 6
    t0 = np.arange(n * 2, dtype=np.float32).reshape(n, 2)
    with jax.enable_x64(True):
        bad = [2**32 + 1, 2**32 + 3, 2**31, -1, 2**63 - 1, -(2**32) + 2]
        ids = np.array([1, 3, *bad], np.int64)
        valid = np.arange(ids.size) < 2
        rows, _ = ct.lookup(ct.create(_pinned(t0), 2), ids)  # a host array: narrowed there
        np.testing.assert_array_equal(_np(rows), np.where(valid[:, None], t0[ids % n], 0))
        for batch in (jnp.asarray(ids),):
            cache = ct.create(_pinned(t0), 2)
            _, cache = ct.lookup(cache, np.array([3, 5], np.int64))
            cache = ct.refresh(cache)  # 3 cached, 1 not: both paths
            rows, cache = ct.lookup(cache, batch)
            np.testing.assert_array_equal(_np(rows), np.where(valid[:, None], t0[ids % n], 0))
            cache = ct.add_rows(cache, batch, np.ones((ids.size, 2), np.float32))
            cache = ct.set_rows(cache, batch[::-1], np.full((ids.size, 2), 50, np.float32))
            step = lambda c, r, x: (c, ct.Deltas(jnp.ones_like(r.values[0])), None)  # noqa: E731
            cache, _, _ = ct.scan(step, cache, 0, batch[None])
            want = t0.copy()
            want[[1, 3]] = 51
            np.testing.assert_array_equal(_np(ct.flush(cache).table), want)
    for dtype, ids in ((np.uint32, [2**31 + 1, 2**32 - 1, 4]), (np.int8, [-128, 127, 4]),
                       (np.uint8, [255, 6, 4])):
        cache = ct.create(_pinned(t0), 2)
        rows, cache = ct.lookup(cache, jnp.asarray(ids, dtype))
        np.testing.assert_array_equal(_np(rows), [[0, 0], [0, 0], t0[4]])


def test_frictions_name_their_fix_and_consume_nothing():
    t0 = np.zeros((8, 2), np.float32)
    acc = _pinned(np.zeros((8, 1), np.float32))
    with pytest.raises(TypeError, match=r"companions=\(t,\)"):
        ct.create(_pinned(t0), 2, companions=acc)
    with pytest.raises(ValueError, match="state has 0 tables.*keeps 3"):
        ct.create(_pinned(t0), 2, optimizer=ct.adam(0.1), state=())
    cache = ct.create(_pinned(t0), 2, optimizer=ct.sgd(0.1))
    assert isinstance(cache.stats, ct.CacheStats) and isinstance(ct.stats(cache), ct.CacheStats)
    ids = np.arange(4, dtype=np.int32)
    pinned_ids = _pinned(ids)
    bad = [
        (ValueError, r"jax.device_put\(ids, jax.memory.Space.Device\)",
         lambda: ct.lookup(cache, pinned_ids)),
        (TypeError, r"return \(carry, update, y\).*returned 2 values",
         lambda: ct.scan(lambda c, r, x: (c, None), cache, 0, ids[None])),
        (TypeError, r"Grads\(g\) for per-entry gradients.*Deltas\(d\)",
         lambda: ct.scan(lambda c, r, x: (c, r.per_entry(), None), cache, 0, ids[None])),
        (ValueError, r"Grads must be \(4, 2\).*per_entry",
         lambda: ct.scan(lambda c, r, x: (c, ct.Grads(jnp.ones((4, 3))), None), cache, 0,
                         ids[None])),
        (ValueError, "ids must match the caches",
         lambda: ct.scan(lambda c, r, x: (c, None, None), (cache,), 0, ids[None])),
    ]
    for error, match, call in bad:
        with pytest.raises(error, match=match):
            call()
    plain = ct.create(_pinned(t0), 2)
    with pytest.raises(ValueError, match="optimizer=cached_table.sgd"):
        ct.scan(lambda c, r, x: (c, ct.Grads(jnp.ones((4, 2))), None), plain, 0, ids[None])
    assert not cache.table.is_deleted() and not plain.table.is_deleted()
    _, cache = ct.lookup(cache, ids)
    old, cache = cache, ct.reset_stats(cache)
    assert old.slot_of.is_deleted() and ct.stats(cache).lookups == 0  # consumed
    assert ct.stats(cache).steps == 1 and ct.stats(cache).hit_rate == 0.0
