"""An eager write's result dropped at once cannot free memory its kernel still writes.

jax 0.11.2 frees a pinned_host array dropped while the computation writing it runs, and
the next pinned_host array may get that memory: the late write then lands in the new array
(docs/lab/freed_result_race_probe.py). The eager writes hand their result to
``_placement.hold_until_computed``, whose thread keeps it until it is computed.
"""

from __future__ import annotations

import gc
import threading
import time
import weakref

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import pallas_pinned as pp
from pallas_pinned import _placement
from tests.helpers import put


class _Pending:
    """Stands in for an array whose computation ends when ``done`` is set."""

    def __init__(self, error: Exception | None = None):
        self.done = threading.Event()
        self.error = error

    def block_until_ready(self):
        self.done.wait(10)
        if self.error is not None:
            raise self.error
        return self


def _gone(ref: weakref.ref, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        gc.collect()
        if ref() is None:
            return True
        time.sleep(0.01)
    return False


def test_the_holder_keeps_an_array_until_it_is_computed():
    holder = _placement._Holder()
    array = _Pending()
    done, ref = array.done, weakref.ref(array)
    holder.hold(array)
    del array
    time.sleep(0.05)
    gc.collect()
    assert ref() is not None, "released before its computation finished"
    done.set()
    assert _gone(ref), "still held after its computation finished"


def test_the_holder_goes_on_after_an_array_that_raises():
    # A result donated on to a later call is deleted, and waiting on it raises; so does one
    # whose computation failed. The holder must keep serving the arrays after it.
    holder = _placement._Holder()
    failed, later = _Pending(RuntimeError("Array has been deleted")), _Pending()
    failed.done.set()
    ref = weakref.ref(later)
    holder.hold(failed)
    holder.hold(later)
    later.done.set()
    del failed, later
    assert _gone(ref)


def _sharded_put(x0):
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("rows",))
    return jax.device_put(x0, NamedSharding(mesh, P("rows"), memory_kind="pinned_host"))


WRITES = {
    "set": lambda x: pp.scatter_to_host(x, jnp.array([1, 3]), jnp.ones((2, 3), jnp.float32)),
    "add": lambda x: pp.scatter_add_to_host(x, jnp.array([1, 1]), 2.0),
    "at max of a block": lambda x: pp.at(x)[2:4].max(7.0),
}


@pytest.mark.parametrize("placement", ["one device", "sharded"])
@pytest.mark.parametrize("name", sorted(WRITES))
def test_an_eager_write_hands_its_result_to_the_holder(monkeypatch, name, placement):
    held = []
    monkeypatch.setattr(_placement._HOLDER, "hold", held.append)
    x0 = np.arange(24, dtype=np.float32).reshape(8, 3)
    x = put(x0) if placement == "one device" else _sharded_put(x0)
    out = WRITES[name](x)
    assert len(held) == 1 and held[0] is out
    held.clear()
    jax.jit(WRITES[name])(put(x0) if placement == "one device" else _sharded_put(x0))
    assert not held, "under jit the caller's own jit owns the result"
    empty = pp.scatter_to_host(out, jnp.zeros((0,), jnp.int32), 1.0)
    assert empty is out and not held, "a write of nothing returns x and dispatches nothing"


@pytest.mark.gpu
def test_a_dropped_late_write_leaves_the_next_pinned_array_alone():
    # The probe's case: a write queued behind ~20 ms of device work, its result dropped at
    # once, then a new pinned array copied in by the CPU. Without the holder, 100 of 100
    # such trials changed the new array on an H100 (2026-12-06).
    rows, width = 1 << 14, 256
    idx = jnp.asarray(np.random.default_rng(0).permutation(rows).astype(np.int32))
    upd = jnp.ones((rows, width), jnp.float32)
    source = np.full((rows, width), 5.0, np.float32)
    square = jnp.ones((4096, 4096), jnp.float32)
    busy = jax.jit(lambda a: jax.lax.fori_loop(0, 40, lambda _, b: b @ a / 4096.0, a))
    jax.block_until_ready(busy(square))
    for _ in range(10):
        busy(square)
        pp.scatter_add_to_host(put(np.zeros((rows, width), np.float32)), idx, upd)
        fresh = put(source)
        jax.block_until_ready(busy(square))  # The dropped write has run by now.
        np.testing.assert_array_equal(np.asarray(fresh), source)
