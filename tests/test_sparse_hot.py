"""The sparse client's device cache of hot rows (``benchmarks.sparse_hot``), on CPU.

Each provider trains as the device table does, whatever the cache holds; the hot
rows live in device memory and reach the pinned table only when flushed.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tests.benchmark_helpers  # noqa: F401  (puts the repository root on sys.path)
from benchmarks import sparse_hot, sparse_steps, sparse_training

ROWS, DIM, BATCH, STEPS, LR = 512, 8, 64, 4, 0.5


def test_most_frequent_takes_the_most_seen_ids_ties_to_the_smaller_then_unseen_ids():
    ids = np.array([[5, 5, 5, 2, 2, 9], [9, 7, 2, 5, 0, 0]])  # 5: 4, 2: 3, 9: 2, 0: 2, 7: 1
    assert sparse_hot.most_frequent(ids, 3, 10).tolist() == [0, 2, 5]  # 0 ties 9, wins
    assert sparse_hot.most_frequent(ids, 7, 10).tolist() == [0, 1, 2, 3, 5, 7, 9]  # 1, 3 unseen
    assert sparse_hot.most_frequent(ids, 50, 10).tolist() == list(range(10))  # at most the rows
    assert sparse_hot.most_frequent(ids, 3, 10).dtype == np.int32


def test_cold_stats_counts_hot_entries_and_distinct_cold_ids_per_step():
    ids = np.array([[1, 1, 2, 3], [4, 4, 4, 1]])
    stats = sparse_hot.cold_stats(ids, np.array([1]))
    assert stats == {"hot_entry_fraction": 3 / 8, "cold_distinct_mean": 1.5}  # {2, 3}, {4}


def _inputs():
    rng = np.random.default_rng(3)
    ids = sparse_training.zipf_ids(rng, ROWS, (STEPS, BATCH), 1.1)
    targets = rng.standard_normal((STEPS, BATCH, DIM)).astype(np.float32)
    table = jnp.asarray(rng.standard_normal((ROWS, DIM)).astype(np.float32))
    return table, ids, jnp.asarray(ids), jnp.asarray(targets)


def _pinned(table):
    return jax.device_put(table, jax.sharding.make_single_device_sharding(
        jax.devices()[0], memory_kind="pinned_host"))


@pytest.mark.parametrize("provider", sparse_hot.PROVIDERS)
@pytest.mark.parametrize("hot_rows", [1, 40, ROWS])
def test_each_provider_trains_as_the_device_table_whatever_the_cache_holds(provider, hot_rows):
    table, ids_np, ids, targets = _inputs()
    want = sparse_steps.step_fns(LR)["device"](jnp.copy(table), ids, targets)
    hot_ids = sparse_hot.most_frequent(ids_np, hot_rows, ROWS)
    state = sparse_hot.start(_pinned(table), hot_ids)
    state = sparse_hot.step_fns(LR)[provider](state, ids, targets)
    assert state["hot"].sharding.memory_kind == "device"
    before_flush = np.asarray(jax.device_put(state["table"], jax.memory.Space.Device))
    # The hot rows were trained on the device only: the pinned table still has their old values.
    np.testing.assert_array_equal(before_flush[hot_ids], np.asarray(table)[hot_ids])
    state = sparse_hot.flush(state)
    got = sparse_hot.table_of(state)
    assert got.sharding.memory_kind == "pinned_host"
    np.testing.assert_allclose(np.asarray(jax.device_put(got, jax.memory.Space.Device)),
                               np.asarray(want), rtol=0, atol=1e-5)
    assert int(state["step"]) == 1 + STEPS * (provider == "ours_hot_distinct")


def test_a_cache_that_is_never_flushed_fails_the_check():
    """The check sees the pinned table only: without the flush the hot rows' training is
    missing from it, so a provider that kept its hot rows to itself would be caught."""
    table, ids_np, ids, targets = _inputs()
    want = np.asarray(sparse_steps.step_fns(LR)["device"](jnp.copy(table), ids, targets))
    state = sparse_hot.start(_pinned(table), sparse_hot.most_frequent(ids_np, 40, ROWS))
    state = sparse_hot.step_fns(LR)["ours_hot"](state, ids, targets)
    stale = np.asarray(jax.device_put(state["table"], jax.memory.Space.Device))
    assert np.max(np.abs(stale - want)) > 1e-3
