"""``mode="wrap"`` at the ends of the index types: every position is its value modulo the axis.

jnp has no wrap mode; the oracle is Python's exact ``%``. The modulus must come before
anything that clamps, truncates or overflows: a uint32 index above 2**31 - 1 (without
x64 the wide type is int32), a ``jax.ds`` start near the top of its type (``start + k``
would overflow), numpy int64/uint64 and Python ints beyond the wide type. At the end, the
other modes with a strided window far outside its axis, whose positions overflowed alike.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallas_pinned as pp
from tests.helpers import KERNEL_BACKENDS, put, read

N = 5
X0 = np.arange(N, dtype=np.float32) * 10
GRID = np.arange(4 * N, dtype=np.float32).reshape(4, N)
BACKENDS = ["xla", *KERNEL_BACKENDS]
TOP = 2**31 - 2  # A jax.ds start whose window passes the top of int32.


def _window(start: int, size: int, stride: int = 1, dim: int = N) -> list[int]:
    return [(start + k * stride) % dim for k in range(size)]


def _reads():
    """name: (index maker, the traced operand or None, expected positions)."""
    return {
        "uint32 array": (lambda i: i, jnp.array([2**32 - 1, 2**31, 7], jnp.uint32),
                         [(2**32 - 1) % N, 2**31 % N, 7 % N]),
        "int32 extremes": (lambda i: i, jnp.array([-(2**31), 2**31 - 1, -7], jnp.int32),
                           [(-(2**31)) % N, (2**31 - 1) % N, (-7) % N]),
        "ds near the top": (lambda s: jax.ds(s, 3), jnp.int32(TOP), _window(TOP, 3)),
        "strided ds near the top": (lambda s: jax.ds(s, 4, 3), jnp.int32(TOP), _window(TOP, 4, 3)),
        "numpy uint64": (lambda _: np.array([2**64 - 1, 2**63], np.uint64), None,
                         [(2**64 - 1) % N, 2**63 % N]),
        "numpy int64": (lambda _: np.array([2**40 + 3, -(2**40)], np.int64), None,
                        [(2**40 + 3) % N, (-(2**40)) % N]),
        "python int": (lambda _: 2**40 + 3, None, (2**40 + 3) % N),
        "static ds": (lambda _: jax.ds(2**40 + 3, 3), None, _window(2**40 + 3, 3)),
    }


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("jitted", [False, True], ids=["eager", "jit"])
@pytest.mark.parametrize("case", list(_reads()))
def test_a_wrapped_read_takes_each_value_modulo_the_axis(backend, jitted, case):
    index_of, operand, positions = _reads()[case]
    x = put(X0)

    def get(i):
        return pp.at(x)[index_of(i)].get(mode="wrap", backend=backend)

    got = (jax.jit(get) if jitted else get)(operand)
    np.testing.assert_array_equal(np.asarray(got), X0[positions])


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_wrapped_window_near_the_top_of_int32_writes_every_slot(backend):
    # start + k overflowed int32 before: one update was lost, one slot left unwritten.
    new = jnp.array([1.0, 2.0, 3.0], jnp.float32)
    step = jax.jit(lambda x, s: pp.at(x)[jax.ds(s, 3)].set(new, mode="wrap", backend=backend),
                   donate_argnums=0)
    want = X0.copy()
    want[_window(TOP, 3)] = np.asarray(new)
    np.testing.assert_array_equal(read(step(put(X0), jnp.int32(TOP))), want)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_wrapped_uint32_index_on_an_inner_axis_and_as_a_block_start(backend):
    x = put(GRID)
    inner = pp.at(x)[1, jnp.array([2**32 - 1], jnp.uint32)].get(mode="wrap", backend=backend)
    np.testing.assert_array_equal(np.asarray(inner), GRID[1, [(2**32 - 1) % N]])
    row = pp.at(x)[jnp.uint32(2**32 - 1)].get(mode="wrap", backend=backend)
    np.testing.assert_array_equal(np.asarray(row), GRID[(2**32 - 1) % 4])


_X64_CHILD = textwrap.dedent(
    """
    import jax
    jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp, numpy as np
    import pallas_pinned as pp
    pinned = jax.sharding.make_single_device_sharding(jax.devices()[0], memory_kind="pinned_host")
    x0 = np.arange(5, dtype=np.float32) * 10
    x = jax.device_put(x0, pinned)
    top = 2**63 - 2
    cases = {
        "uint64": (jnp.array([2**64 - 1, 2**63], jnp.uint64), [(2**64 - 1) % 5, 2**63 % 5]),
        "int64": (jnp.array([-(2**63), 2**63 - 1], jnp.int64), [(-(2**63)) % 5, (2**63 - 1) % 5]),
    }
    for backend in ("xla", "interpret"):
        for name, (index, positions) in cases.items():
            got = jax.jit(lambda i: pp.at(x)[i].get(mode="wrap", backend=backend))(index)
            assert np.array_equal(np.asarray(got), x0[positions]), (backend, name, got)
        got = pp.at(x)[jax.ds(jnp.int64(top), 3)].get(mode="wrap", backend=backend)
        want = x0[[(top + k) % 5 for k in range(3)]]
        assert np.array_equal(np.asarray(got), want), (backend, "ds", got)
    print("ok")
    """
)


def test_with_x64_int64_and_uint64_indices_wrap_exactly():
    done = subprocess.run([sys.executable, "-c", _X64_CHILD], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().endswith("ok")


def _apply_in_order(a, positions, updates, method):
    """numpy: each update applied in index order (set: the last one wins)."""
    out = a.copy()
    for p, u in zip(positions, updates, strict=True):
        out[p] = {"set": lambda o, u: u, "add": np.add, "min": np.minimum, "max": np.maximum,
                  "multiply": np.multiply}[method](out[p], u)
    return out


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("method", ["set", "add", "min", "max", "multiply"])
@pytest.mark.parametrize("start", [0, 3, jnp.int32(5)], ids=["0", "3", "traced 5"])
def test_a_strided_window_past_its_cycle_comes_back_to_its_rows(backend, method, start):
    # jax.ds(start, 6, 5) on 4 rows: 0, 1, 2, 3, 0, 1 from 0. Those rows repeat: the
    # write's duplicates (they were taken as distinct, keeping one update per row).
    a = np.arange(1, N, dtype=np.float32)  # 4 rows
    updates = np.arange(2, 8, dtype=np.float32)
    positions = _window(int(start), 6, 5, dim=4)
    step = jax.jit(lambda x, s: getattr(pp.at(x)[jax.ds(s, 6, 5)], method)(
        jnp.asarray(updates), mode="wrap", backend=backend), donate_argnums=0)
    got = step(put(a), start)
    np.testing.assert_array_equal(read(got), _apply_in_order(a, positions, updates, method))


@pytest.mark.parametrize("spec", ["data", None], ids=["sharded", "replicated"])
def test_a_strided_window_past_its_cycle_on_a_mesh_keeps_the_last_write(spec):
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = jax.make_mesh((2,), ("data",))
    a = np.zeros(8, np.float32)
    x = jax.device_put(a, NamedSharding(mesh, P(spec), memory_kind="pinned_host"))
    updates = np.arange(1, 17, dtype=np.float32)
    got = pp.at(x)[jax.ds(4, 16, 9)].set(jnp.asarray(updates), mode="wrap")
    want = _apply_in_order(a, _window(4, 16, 9, dim=8), updates, "set")
    np.testing.assert_array_equal(read(got), want)


def test_a_wrapped_window_longer_than_its_axis_is_refused_naming_the_index_array():
    x = put(X0)
    with pytest.raises(ValueError, match=r"does not fit axis 0 of length 5; wrap more "
                       r"positions than the axis has with the index array"):
        pp.at(x)[jax.ds(3, N + 2)].set(1.0, mode="wrap")
    assert not x.is_deleted()
    np.testing.assert_array_equal(read(x), X0)
    # The fix the message names: later duplicates win, as with any index array.
    rows = (3 + jnp.arange(N + 2)) % N
    values = jnp.arange(N + 2, dtype=jnp.float32)
    expected = X0.copy()
    expected[np.asarray(rows)] = np.asarray(values)  # numpy assigns the last duplicate.
    np.testing.assert_array_equal(read(pp.at(x)[rows].set(values, mode="wrap")), expected)


# The other modes at the same ends: a strided jax.ds's positions start + k * stride, each
# clipped, dropped or filled on its own (the README), computed at full width. The sum
# overflowed the wide type near its top and the positions wrapped to row 0.
_FAR = {
    "int32 near the top": (jnp.int32(2**31 - 1), "traced"),
    "uint32 at the top": (jnp.uint32(2**32 - 1), "traced"),
    "python int past int64": (2**63 + 3, "static"),
    "python int below int64": (-(2**63) - 3, "static"),
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", list(_FAR))
def test_a_strided_window_far_outside_its_axis_takes_each_position_at_full_width(backend, case):
    start, how = _FAR[case]
    full = [int(start) + k * 2 for k in range(3)]
    updates = jnp.array([-1.0, -2.0, -3.0], jnp.float32)

    def calls(x, s):
        ref = pp.at(x)[jax.ds(s, 3, 2)]
        return (ref.set(updates, mode="clip", backend=backend),
                pp.at(x)[jax.ds(s, 3, 2)].get(mode="fill", fill_value=-7.0, backend=backend),
                pp.at(x)[jax.ds(s, 3, 2)].add(updates, mode="drop", backend=backend))

    if how == "traced":
        got = jax.jit(lambda x, s: calls(x, s))(put(X0), start)
    else:
        got = jax.jit(lambda x: calls(x, start))(put(X0))
    clipped = np.array([min(max(p, 0), N - 1) for p in full])
    want_set = X0.copy()
    want_set[clipped] = np.asarray(updates)  # All on one row: the last one wins.
    assert read(got[0]).tobytes() == want_set.tobytes()
    assert read(got[1]).tobytes() == np.full(3, -7.0, np.float32).tobytes()  # None in range.
    assert read(got[2]).tobytes() == X0.tobytes()  # Every position out of range: dropped.
