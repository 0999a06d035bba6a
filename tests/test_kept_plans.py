"""Eager calls of one signature reuse its checked index plan, and still refuse what changes.

``_front`` keeps the plan of a call whose index is one concrete array and whose updates
have the buffer's dtype. A kept signature must give the same results as a full check
and must still refuse, on every call, a deleted buffer, a buffer passed as its own
updates or indices, and an explicit kernel backend that cannot run now.
"""

from __future__ import annotations

import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallas_pinned as pp
from pallas_pinned import _availability, _front, _placement, _registry, _validation
from tests.helpers import AUTO_REPEATS_XLA, has_gpu, put, read

X0 = np.arange(24, dtype=np.float32).reshape(8, 3) + 0.5
IDX = jnp.array([1, 5, 1], jnp.int32)
UPD = jnp.arange(9, dtype=jnp.float32).reshape(3, 3)


@pytest.fixture(autouse=True)
def no_kept_plans():
    _front._PLANS.clear()
    yield
    _front._PLANS.clear()


def test_a_kept_signature_gives_what_a_full_check_gives():
    want = X0.copy()
    want[1], want[5] = UPD[2], UPD[1]
    x = pp.scatter_to_host(put(X0), IDX, UPD)
    assert len(_front._PLANS) == 1
    kept = pp.scatter_to_host(put(X0), IDX, UPD)  # The same signature: the kept plan.
    assert len(_front._PLANS) == 1
    np.testing.assert_array_equal(read(x), want)
    np.testing.assert_array_equal(read(kept), want)
    rows = pp.gather_from_host(kept, IDX)
    rows_again = pp.gather_from_host(kept, IDX)
    assert len(_front._PLANS) == 2  # One write signature, one read signature.
    np.testing.assert_array_equal(np.asarray(rows), np.asarray(rows_again))
    np.testing.assert_array_equal(np.asarray(rows), want[[1, 5, 1]])


def test_a_kept_signature_still_refuses_a_deleted_buffer():
    x = put(X0)
    y = pp.scatter_to_host(x, IDX, UPD)  # Keeps the signature; x is consumed.
    with pytest.raises(ValueError, match="deleted"):
        pp.scatter_to_host(x, IDX, UPD)
    pp.gather_from_host(y, IDX)  # Keeps the read's signature.
    with pytest.raises(ValueError, match="deleted"):
        pp.gather_from_host(x, IDX)
    np.testing.assert_array_equal(read(y)[0], X0[0])


def test_a_kept_signature_still_refuses_the_buffer_as_its_own_updates(monkeypatch):
    square = np.arange(9, dtype=np.float32).reshape(3, 3)
    idx = jnp.array([0, 1, 2], jnp.int32)
    # Updates placed as x is (pinned host, committed): the very signature of x as updates.
    x = pp.scatter_to_host(put(square), idx, put(np.ones((3, 3), np.float32)))
    full_checks = []
    real_check = _validation.check_write
    monkeypatch.setattr(_validation, "check_write",
                        lambda *a, **k: full_checks.append(1) or real_check(*a, **k))
    with pytest.raises(ValueError, match="buffer x itself"):
        pp.scatter_to_host(x, idx, x)
    assert not full_checks  # Refused on the kept plan, not by a full check.
    np.testing.assert_array_equal(read(x), np.ones((3, 3), np.float32))  # Unchanged.


def test_a_kept_signature_still_asks_whether_the_kernel_backend_can_run(monkeypatch):
    x = pp.scatter_to_host(put(X0), IDX, UPD, backend="interpret")
    monkeypatch.setattr(_availability, "pallas_triton_importable", lambda: "removed for the test")
    with pytest.raises(NotImplementedError, match="removed for the test"):
        pp.scatter_to_host(x, IDX, UPD, backend="interpret")
    np.testing.assert_array_equal(read(x)[5], np.asarray(UPD[1]))  # The buffer survives.


def test_calls_that_are_not_kept():
    x = put(X0)
    x = pp.scatter_to_host(x, np.array([1, 2]), np.ones((2, 3), np.float32))  # numpy index
    x = pp.scatter_to_host(x, IDX, np.ones((3, 3), np.float32))  # numpy updates
    x = pp.scatter_to_host(x, (IDX, 0), jnp.ones((3,), jnp.float32))  # two index entries
    counts = put(np.zeros((8, 3), np.int32))
    for _ in range(2):  # A lossy cast warns on every call: never kept.
        with pytest.warns(FutureWarning, match="cast"):
            counts = pp.scatter_to_host(counts, IDX, jnp.full((3, 3), 1.5, jnp.float32))
    assert not _front._PLANS
    assert read(x)[1, 0] == 1 and read(counts)[1, 0] == 1


def test_the_kept_plans_are_bounded(monkeypatch):
    monkeypatch.setattr(_front, "_MAX_PLANS", 3)
    x = put(np.zeros((8, 2), np.float32))
    for n in range(1, 6):
        x = pp.scatter_to_host(x, jnp.zeros((n,), jnp.int32), jnp.ones((n, 2), jnp.float32))
    assert len(_front._PLANS) == 3
    # The oldest signatures went first: those of 3, 4 and 5 entries are kept.
    assert sorted(key[-2][0] for key in _front._PLANS) == [(3,), (4,), (5,)]


def test_fill_values_are_kept_by_their_bits():
    x = put(X0)
    out_of_range = jnp.array([0, 99], jnp.int32)
    for fill in (float("nan"), float("nan"), 0.0, -0.0, 0, False):
        got = np.asarray(pp.gather_from_host(x, out_of_range, mode="fill", fill_value=fill))
        want = np.full(3, fill, np.float32)
        assert got[1].tobytes() == want.tobytes() or (np.isnan(fill) and np.isnan(got[1]).all())
    # Two NaNs share one signature; 0.0 and -0.0 do not; 0 (int) and False (bool) neither.
    assert len(_front._PLANS) == 5


@pytest.mark.parametrize("index", ["rows", "block"])
def test_each_fill_value_keeps_its_own_read_from_call_to_call(index):
    # The compiled read is keyed on the fill value too: a float by its bits, so -nan after
    # nan (whose reprs are equal) is another program, and an int by its value, so 2**64 - 1
    # after -1 (whose numpy bytes are equal) is too.
    x = put(X0)
    out_of_range = jnp.array([99], jnp.int32) if index == "rows" else jnp.int32(99)
    fills = (float("nan"), -float("nan"), float("nan"), -1, 2**64 - 1, 2**63, -(2**63))
    for fill in fills:
        got = pp.gather_from_host(x, out_of_range, mode="fill", fill_value=fill)
        want = jnp.asarray(X0).at[out_of_range].get(mode="fill", fill_value=fill)
        assert np.asarray(got).tobytes() == np.asarray(want).tobytes(), fill


_FIRST_CALLS = """
import logging, sys
import jax, jax.numpy as jnp, numpy as np
import pallas_pinned as pp

compiled = []


class Compiles(logging.Handler):
    def emit(self, record):
        if record.getMessage().startswith("Finished XLA compilation"):
            compiled.append(record.getMessage().split(" in ")[0])


logging.getLogger("jax").addHandler(Compiles())
jax.config.update("jax_log_compiles", True)
pinned = jax.sharding.make_single_device_sharding(jax.devices()[0], memory_kind="pinned_host")
x = jax.device_put(np.zeros((64, 4), np.float32), pinned)
i, y = jnp.array([1, 3]), jnp.ones((2, 4))
jax.block_until_ready((x, i, y))


@jax.jit
def step(x, i, y):  # A user's jit around the ops.
    x = pp.at(x)[i].add(y, backend=sys.argv[1])
    return x, pp.at(x)[i].get(backend=sys.argv[1])


for call in range(3):
    compiled.clear()
    if sys.argv[2] == "eager":
        x = pp.at(x)[i].add(y, backend=sys.argv[1])
        rows = pp.at(x)[i].get(backend=sys.argv[1])
    else:
        x, rows = step(x, i, y)
    print(call, compiled)
assert np.asarray(rows).tolist() == [[3.0] * 4] * 2
"""


@pytest.mark.parametrize("where", ["eager", "in a jit"])
@pytest.mark.parametrize("backend", [
    # Off CUDA, auto's add and get of rows are the xla case's programs.
    pytest.param("auto", marks=pytest.mark.skipif(not has_gpu(), reason=AUTO_REPEATS_XLA)),
    "xla", "interpret"])
def test_a_process_compiles_its_first_call_once(backend, where):
    # Pallas adds configuration options when it first imports, and JAX keys its trace
    # caches on them: a first call that imported it while tracing (the op's own, or a
    # user's jit around it) compiled again on the second call. So did the interpreter's
    # first lowering, which imports Pallas's fuser and its option. A fresh process, so
    # that nothing but pallas_pinned's own import has imported Pallas.
    done = subprocess.run(
        [sys.executable, "-c", _FIRST_CALLS, backend, where.split()[0]], capture_output=True,
        text=True, timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.strip().splitlines()
    first = "jit(run)" if where == "eager" else "jit(step)"
    assert lines[0].startswith("0 [") and first in lines[0], lines
    assert lines[1:] == ["1 []", "2 []"], lines


def test_an_eager_position_compiles_once_whether_a_jax_scalar_or_an_in_range_python_int(
    caplog,
):
    # Outside jit, an in-range Python int is passed as a value (_front._positions_as_values);
    # out of range, or a static slice's bounds, it stays part of the program. A lifted int
    # was seen in range, which its program knows (no run-time check): a program of its own,
    # compiled once for every in-range int.
    x = put(np.zeros((64, 2), np.float32))
    y = jnp.ones(2, jnp.float32)

    def compiles_over(positions):
        nonlocal x
        caplog.clear()
        with jax.log_compiles(True), caplog.at_level("WARNING", logger="jax"):
            for k in positions:
                x = pp.at(x)[k].set(y)
        return sum(r.getMessage().startswith("Finished XLA compilation of jit(run)")
                   for r in caplog.records)

    compiles_over([jnp.int32(40)])  # the first call of the signature compiles
    assert compiles_over([jnp.int32(k) for k in (41, 42, 43)]) == 0
    assert compiles_over([50, 51, 52, 53]) == 1
    assert compiles_over([-1, -2]) == 2  # Negative: static, as jnp wraps it at trace time.
    assert np.asarray(x)[[40, 41, 42, 43, 50, 51, 52, 53, 63, 62]].tolist() == [[1.0, 1.0]] * 10


GRID = np.arange(4 * 5 * 3, dtype=np.float32).reshape(4, 5, 3) - 20.5
LIFT_INDICES = {  # index: how many of its ints are passed as values (in range, >= 0)
    0: 1, 3: 1, 4: 0, -1: 0, 7: 0, (1, 2): 2, (3, 4, 2): 3, (1, slice(1, 4)): 1,
    (slice(None), 2): 1, (Ellipsis, 2): 1, (2, Ellipsis): 1, (None, 1, None, 4): 2,
    (1, Ellipsis, 0): 2, (slice(0, 2), 4, slice(None)): 1, (5, 1): 1, (1, 5): 1, (0, -5): 1,
    (np.int64(2), np.uint8(1)): 2, np.int32(-2): 0,
}


LIFT_MODES = [None, "clip", "drop", "fill", "promise_in_bounds"]
COMBINERS = ("add", "min", "max", "multiply")


@pytest.mark.parametrize("mode", LIFT_MODES)
@pytest.mark.parametrize("index", list(LIFT_INDICES), ids=repr)
def test_eager_positions_passed_as_values_give_jnps_results(index, mode):
    # In range, each int becomes a 0-d array (_front._positions_as_values); out of range or
    # negative it stays static. Either way every op and the read give jnp's result.
    # Each case writes with set and one combiner, turning with the index and the mode: an
    # index meets each combiner once over the four writing modes (an out-of-range one under
    # the promise writes nothing), and each mode meets every combiner. The lifting is the
    # index's; the combiner only decides what lands where the positions point.
    lifted, axes = _front._positions_as_values(index, None, GRID.shape)
    items = lifted if isinstance(lifted, tuple) else (lifted,)
    assert sum(isinstance(it, jax.Array) for it in items) == LIFT_INDICES[index] == len(axes)
    want_get = jnp.asarray(GRID).at[index].get(
        mode=mode, **({"fill_value": -1.0} if mode == "fill" else {}))
    out_of_range = repr(index) in {repr(i) for i in (4, 7, (5, 1), (1, 5))}
    if mode != "promise_in_bounds" or not out_of_range:
        got = pp.at(put(GRID))[index].get(
            mode=mode, **({"fill_value": -1.0} if mode == "fill" else {}))
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want_get))
    if mode == "fill":
        return  # A read-only mode.
    updates = jnp.full(want_get.shape, 2.5, jnp.float32)
    turn = [repr(i) for i in LIFT_INDICES].index(repr(index))
    turn += [m for m in LIFT_MODES if m != "fill"].index(mode)
    for op in ("set", COMBINERS[turn % len(COMBINERS)]):
        if mode == "promise_in_bounds" and out_of_range:
            continue  # Out of range under a promise: undefined.
        want = getattr(jnp.asarray(GRID).at[index], op)(updates, mode=mode)
        got = getattr(pp.at(put(GRID))[index], op)(updates, mode=mode)
        np.testing.assert_array_equal(read(got), np.asarray(want), err_msg=op)


def test_positions_stay_static_inside_a_trace():
    seen = []

    def write(x, u):
        shape = x.shape if _placement.facts(x).concrete else None
        seen.append(_front._positions_as_values((1, 2), u, shape))
        return pp.at(x)[1, 2].set(u)

    x = jax.jit(write, donate_argnums=0)(put(GRID), jnp.ones(3, jnp.float32))
    # x is a tracer there: a user's jit compiles its positions once.
    assert seen == [((1, 2), frozenset())]
    want = GRID.copy()
    want[1, 2] = 1.0
    np.testing.assert_array_equal(read(x), want)
    # Concrete x with traced updates (a closed-over buffer): static too.
    jax.jit(lambda u: seen.append(_front._positions_as_values(3, u, GRID.shape)))(1.0)
    assert seen[-1] == (3, frozenset())


@pytest.mark.parametrize("guard", [jax.transfer_guard, jax.transfer_guard_host_to_device])
def test_under_a_transfer_guard_positions_stay_static(guard):
    # Passing the int as a value would be a host-to-device transfer the call never made.
    x = put(GRID)
    u = jnp.full((5, 3), 1.5, jnp.float32)
    with guard("disallow"):
        assert _front._positions_as_values(2, u, x.shape) == (2, frozenset())
        x = pp.at(x)[2].set(u)
        got = pp.at(x)[2].get()
    want = GRID.copy()
    want[2] = 1.5
    np.testing.assert_array_equal(read(x), want)
    np.testing.assert_array_equal(np.asarray(got), want[2])


@pytest.mark.parametrize("mode", [None, "drop"])
def test_an_eager_int_takes_the_path_its_static_int_takes(monkeypatch, mode):
    # A lifted int was seen in range, so its block needs no run-time check: an eager set
    # of a KV cache's slot is one copy, as the same call is inside jit (where the int is
    # static), not the rows the checked block would take. Reads and writes keep jnp's result.
    seen = []
    real_choose = _registry.choose

    def spy(call, x, *args):
        chosen = real_choose(call, x, *args)
        seen.append((call.op, chosen.name))
        return chosen

    monkeypatch.setattr(_registry, "choose", spy)
    cache = np.arange(16 * 9 * 3, dtype=np.float32).reshape(16, 9, 3)  # No other test's shape.
    for jitted in (False, True):
        def write(x):
            return pp.at(x)[:, 5].set(-1.0, mode=mode)

        got = (jax.jit(write, donate_argnums=0) if jitted else write)(put(cache))
        np.testing.assert_array_equal(read(got), np.asarray(jnp.asarray(cache).at[:, 5].set(
            -1.0, mode=mode)))
        np.testing.assert_array_equal(
            np.asarray(pp.at(put(cache))[:, 5].get(mode="fill", fill_value=0.0)), cache[:, 5])
    # The read's plan may be kept from an earlier case; where it is traced, it is a copy too.
    assert [chosen for op, chosen in seen if op == "set"] == ["block", "block"], seen
    assert all(chosen == "block" for _, chosen in seen), seen
    # Both ends of the axis, eager: the lifted value is the only thing that changes.
    for pos in (0, 8):
        got = pp.at(put(cache))[:, pos].set(-2.0, mode=mode)
        np.testing.assert_array_equal(read(got), np.asarray(jnp.asarray(cache).at[:, pos].set(
            -2.0, mode=mode)))
