"""One plan per call: which implementation runs, decided once; what the promises mean;
the eager rule; and how deep one call goes before its kernel.

jnp is the oracle for values: on the CPU, XLA's scatter applies duplicates in order
(the last set wins), which is the semantics every path of ours has.
"""

from __future__ import annotations

import collections
import inspect
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallas_pinned as pp
from pallas_pinned import _registry
from tests.helpers import put, read
from tests.registry_support import picked

ROWS = 7


def _fresh(rng, shape=(ROWS, 3)):
    return rng.standard_normal(shape).astype(np.float32)


# --- the promises under "wrap" -------------------------------------------------------


@pytest.mark.parametrize("backend", ["interpret", "xla", "auto"])
@pytest.mark.parametrize("jitted", [False, True])
def test_unique_promise_under_wrap_keeps_every_update_of_a_wrapped_row(rng, backend, jitted):
    # 0, n and 2n are distinct indices that name one row under "wrap": the promise says
    # nothing of the rows there, so all three updates land.
    x0, y = _fresh(rng), _fresh(rng, (3, 3))
    idx = jnp.array([0, ROWS, 2 * ROWS])

    def add(x, i, u):
        return pp.scatter_add_to_host(x, i, u, mode="wrap", unique_indices=True, backend=backend)

    out = (jax.jit(add) if jitted else add)(put(x0), idx, jnp.asarray(y))
    want = jnp.asarray(x0).at[np.asarray(idx) % ROWS].add(y)
    np.testing.assert_allclose(read(out), np.asarray(want), rtol=1e-6)


@pytest.mark.parametrize("backend", ["interpret", "xla", "auto"])
@pytest.mark.parametrize("jitted", [False, True])
def test_sorted_promise_under_wrap_still_lets_the_last_duplicate_win(rng, backend, jitted):
    # Ascending indices 1 < n-1 < n+1 wrap to rows 1, n-1, 1: not ascending, and row 1
    # repeats apart. The last write of row 1 must win.
    x0, y = _fresh(rng), _fresh(rng, (3, 3))
    idx = jnp.array([1, ROWS - 1, ROWS + 1])

    def write(x, i, u):
        return pp.scatter_to_host(x, i, u, mode="wrap", indices_are_sorted=True, backend=backend)

    out = (jax.jit(write) if jitted else write)(put(x0), idx, jnp.asarray(y))
    want = jnp.asarray(x0).at[np.asarray(idx) % ROWS].set(y)
    np.testing.assert_array_equal(read(out), np.asarray(want))


@pytest.mark.parametrize("backend", ["interpret", "xla"])
def test_sorted_promise_under_wrap_adds_each_wrapped_row_once(rng, backend):
    x0, y = _fresh(rng), _fresh(rng, (4, 3))
    idx = jnp.array([1, ROWS - 1, ROWS + 1, 2 * ROWS - 1])  # rows 1, n-1, 1, n-1
    out = pp.scatter_add_to_host(put(x0), idx, jnp.asarray(y), mode="wrap",
                                 indices_are_sorted=True, backend=backend)
    want = jnp.asarray(x0).at[np.asarray(idx) % ROWS].add(y)
    np.testing.assert_allclose(read(out), np.asarray(want), rtol=1e-6)


# --- the one function that chooses --------------------------------------------------


def _call(backend, *, num_entries=4, num_rows=8, width=1, op="set", kind="rows"):
    plan = types.SimpleNamespace(kind=kind, num_entries=num_entries, num_rows=num_rows,
                                 width=width)
    return types.SimpleNamespace(op=op, plan=plan, backend=backend, unique=False,
                                 one_copy=False)


def test_an_explicit_pallas_backend_refuses_rows_its_offsets_cannot_address():
    # A set of 2**30 + 8 two-byte rows of one-byte updates into a small buffer: the kernel
    # would address the update rows with wrapped 32-bit offsets. Refused, never run on XLA.
    x = jax.ShapeDtypeStruct((64, 2), jnp.uint8)
    with pytest.raises(NotImplementedError, match="32-bit offsets cannot address the rows"):
        _registry.choose(_call("pallas", num_entries=2**30 + 8, num_rows=64, width=2), x)
    with pytest.raises(NotImplementedError, match="32-bit offsets cannot address x"):
        _registry.choose(_call("pallas", num_rows=2**30 + 8, width=2), x)


@pytest.mark.parametrize("backend", ["pallas", "triton", "interpret"])
def test_an_explicit_kernel_backend_refuses_more_entries_than_int32_numbers(backend):
    x = jax.ShapeDtypeStruct((2**33, 1), jnp.float32)
    with pytest.raises(NotImplementedError, match="int32 entry numbers"):
        _registry.choose(_call(backend, num_entries=2**31, num_rows=2**33), x)
    assert _registry.choose(_call(backend, num_entries=2**31 - 1, num_rows=2**33),
                            x).name == backend


def test_interpret_refuses_2_31_entries_before_anything_is_traced_into_a_kernel(rng):
    x = jax.ShapeDtypeStruct((2**31 + 1,), jnp.uint8, sharding=_pinned_sharding())
    i = jax.ShapeDtypeStruct((2**31,), jnp.int32)
    u = jax.ShapeDtypeStruct((2**31,), jnp.uint8)
    f = jax.jit(lambda x, i, u: pp.scatter_to_host(x, i, u, backend="interpret"))
    with pytest.raises(NotImplementedError, match="int32 entry numbers"):
        f.trace(x, i, u)


def _pinned_sharding():
    cpu = jax.devices("cpu")[0]
    return jax.sharding.make_single_device_sharding(cpu, memory_kind="pinned_host")


@pytest.mark.parametrize("backend", ["interpret", "xla"])
def test_an_explicit_backend_is_what_runs(rng, monkeypatch, backend):
    ran = picked(monkeypatch)
    x0 = _fresh(rng)
    out = pp.scatter_to_host(put(x0), jnp.array([3, 1, 3]), jnp.ones((3, 3)), backend=backend)
    assert ran == [backend]
    want = jnp.asarray(x0).at[np.array([3, 1])].set(1.0)
    np.testing.assert_array_equal(read(out), np.asarray(want))


def test_auto_on_the_cpu_runs_xla_and_a_strided_block_set_is_one_copy(rng, monkeypatch):
    ran = picked(monkeypatch)
    pp.scatter_to_host(put(_fresh(rng)), jnp.array([3, 1]), jnp.ones((2, 3)))
    kv = put(rng.standard_normal((2, 5, 4)).astype(np.float32))
    pp.at(kv)[:, jnp.asarray(2)].set(jnp.ones((2, 4)), mode="clip")
    assert ran == ["xla", "block"]


def test_every_backend_decision_goes_through_choose():
    import pathlib
    import re

    root = pathlib.Path(pp.__file__).parent
    pattern = re.compile(r"\b(impl|implementation|backend)\s*==\s*[\"']")
    found = [
        f"{path.name}:{n}: {line.strip()}"
        for path in [*root.glob("*.py"), *(root.parent / "kernels").glob("*.py")]
        if path.name != "_registry.py"
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if pattern.search(line)
    ]
    assert not found, found


# --- the eager rule -----------------------------------------------------------------


def test_an_eager_write_consumes_a_host_buffer_and_never_a_device_one(rng):
    host, device = put(_fresh(rng)), put(_fresh(rng), "device")
    new_host = pp.scatter_to_host(host, jnp.array([1]), jnp.ones((1, 3)))
    new_device = pp.scatter_to_host(device, jnp.array([1]), jnp.ones((1, 3)))
    assert host.is_deleted()
    assert not device.is_deleted()  # As jnp's .at never consumes its array.
    assert read(new_host)[1].tolist() == read(new_device)[1].tolist() == [1.0] * 3


def test_an_eager_write_returns_once_its_result_is_computed(rng, monkeypatch):
    from pallas_pinned import _placement

    waited = []
    real = _placement.wait_for_result
    monkeypatch.setattr(_placement, "wait_for_result",
                        lambda result: waited.append(real(result)) or waited[-1])
    out = pp.scatter_add_to_host(put(_fresh(rng)), jnp.array([1, 1]), jnp.ones((2, 3)))
    got = pp.gather_from_host(out, jnp.array([1]))
    assert [w is out for w in waited] == [True, False] and waited[1] is got


# --- how deep one call goes ----------------------------------------------------------


def _frames_at_pallas_call(monkeypatch, run) -> list[tuple[str, str]]:
    from jax.experimental import pallas as pl

    seen, real = [], pl.pallas_call

    def spy(*args, **kwargs):
        seen.append([(f.frame.f_globals.get("__name__", ""), f.function)
                     for f in inspect.stack()
                     if f.frame.f_globals.get("__name__", "").startswith("pallas_pinned")])
        return real(*args, **kwargs)

    monkeypatch.setattr(pl, "pallas_call", spy)
    run()
    assert seen, "no pallas_call was made"
    return seen[0]


@pytest.mark.parametrize("form", ["at_3d", "scatter_to_host"])
def test_one_jitted_call_reaches_its_kernel_in_at_most_9_frames_of_5_modules(
        rng, monkeypatch, form):
    if form == "at_3d":
        x = put(rng.standard_normal((4, 16, 8)).astype(np.float32))

        def run():
            jax.jit(lambda x, p, y: pp.at(x)[2, p].set(y, backend="interpret"))(
                x, jnp.array([1, 3]), jnp.ones((2, 8)))
    else:
        x = put(rng.standard_normal((64, 8)).astype(np.float32))

        def run():
            jax.jit(lambda x, i, y: pp.scatter_to_host(x, i, y, backend="interpret"))(
                x, jnp.array([1, 3]), jnp.ones((2, 8)))

    frames = _frames_at_pallas_call(monkeypatch, run)
    modules = collections.Counter(module for module, _ in frames)
    assert len(frames) <= 9 and len(modules) <= 5, frames


def test_validation_and_parsing_run_once_per_call(rng, monkeypatch):
    from pallas_pinned import _index_parse, _validation

    counts = collections.Counter()
    for module, name in ((_index_parse, "parse"), (_validation, "check_write")):
        real = getattr(module, name)

        def counted(*args, _real=real, _name=name, **kwargs):
            counts[_name] += 1
            return _real(*args, **kwargs)

        monkeypatch.setattr(module, name, counted)
    x = put(rng.standard_normal((4, 16, 8)).astype(np.float32))
    jax.jit(lambda x, p, y: pp.at(x)[2, p].set(y))(x, jnp.array([1, 3]), jnp.ones((2, 8)))
    assert counts == {"parse": 1, "check_write": 1}


@pytest.mark.gpu
@pytest.mark.parametrize("entries, width, match", [
    (2**30 + 8, 2, "32-bit offsets cannot address the rows"),  # 2 GiB + 16 B of update rows
    (2**31, 1, "int32 entry numbers"),
])
def test_an_explicit_pallas_set_is_refused_not_run_on_xla(entries, width, match):
    # Traced only: the refusal comes while tracing, before anything is allocated or runs.
    gpu = jax.devices("gpu")[0]
    pinned = jax.sharding.make_single_device_sharding(gpu, memory_kind="pinned_host")
    x = jax.ShapeDtypeStruct((64, width), jnp.uint8, sharding=pinned)
    i = jax.ShapeDtypeStruct((entries,), jnp.int32)
    u = jax.ShapeDtypeStruct((entries, width), jnp.uint8)
    f = jax.jit(lambda x, i, u: pp.scatter_to_host(x, i, u, backend="pallas"))
    with pytest.raises(NotImplementedError, match=match):
        f.trace(x, i, u)
