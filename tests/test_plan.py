"""One plan per call: which implementation runs, decided once; what the promises mean;
the eager rule; and how deep one call goes before its kernel.

jnp is the oracle for values: on the CPU, XLA's scatter applies duplicates in order
(the last set wins), which is the semantics every path of ours has.
"""

from __future__ import annotations

import ast
import collections
import dataclasses
import inspect
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallas_pinned as pp
from pallas_pinned import _registry, tuning
from tests.helpers import put, read
from tests.registry_support import call_of, picked

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
    return call_of(op, num_entries, kind=kind, backend=backend, num_rows=num_rows,
                   width=width)


def test_an_explicit_pallas_backend_refuses_rows_its_offsets_cannot_address():
    # A set of 2**30 + 8 two-byte rows of one-byte updates into a small buffer: the kernel
    # would address the update rows with wrapped 32-bit offsets. Refused, never run on XLA.
    x = jax.ShapeDtypeStruct((64, 2), jnp.uint8)
    with pytest.raises(NotImplementedError, match="32-bit offsets cannot address the rows"):
        _registry.choose(_call("pallas", num_entries=2**30 + 8, num_rows=64, width=2), x)
    with pytest.raises(NotImplementedError, match="32-bit offsets cannot address x"):
        _registry.choose(_call("pallas", num_rows=2**30 + 8, width=2), x)


@pytest.mark.parametrize("backend", ["auto", "xla", "pallas", "triton", "interpret"])
def test_every_backend_refuses_more_entries_than_int32_numbers_naming_the_split(backend):
    x = jax.ShapeDtypeStruct((2**33, 1), jnp.float32)
    with pytest.raises(ValueError, match=r"2\*\*31 - 1 at most\); split the call"):
        _registry.choose(_call(backend, num_entries=2**31, num_rows=2**33), x)
    try:  # One entry fewer is not refused for its count (a kernel may refuse the rows).
        _registry.choose(_call(backend, num_entries=2**31 - 1, num_rows=2**33), x)
    except (NotImplementedError, OverflowError) as refused:
        assert "split the call" not in str(refused)


@pytest.mark.parametrize("backend", ["interpret", "xla", "auto"])
def test_2_31_entries_are_refused_before_anything_is_traced_into_a_kernel(backend):
    x = jax.ShapeDtypeStruct((2**31 + 1,), jnp.uint8, sharding=_pinned_sharding())
    i = jax.ShapeDtypeStruct((2**31,), jnp.int32)
    u = jax.ShapeDtypeStruct((2**31,), jnp.uint8)
    f = jax.jit(lambda x, i, u: pp.scatter_to_host(x, i, u, backend=backend))
    with pytest.raises(ValueError, match="split the call"):
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


# What a dispatch reads: the backend, the kernel family, the platform, the thresholds.
_DECIDING = {
    "backend", "backends", "family", "interpret", "platform", "platform_of", "thresholds",
    "limits", "impl", "implementation", "KERNEL_BACKENDS", "_host_on_cuda", "on_cuda",
    *(f.name for f in dataclasses.fields(tuning.Thresholds)),
}
# The modules that decide (and what only checks or names them), and the tools.
_DECIDERS = {"_registry.py", "_availability.py", "tuning.py", "testing.py", "__main__.py"}
# The plan's executors: their platform_dependent takes its branches from the plan.
_EXECUTORS = {("_write_rows.py", "write"), ("_read_rows.py", "read")}


def _dispatches(path: pathlib.Path) -> list[str]:
    """Branches of ``path`` on a deciding name, and its ``lax.platform_dependent`` calls
    outside the plan's executors."""
    tree = ast.parse(path.read_text())
    found = []

    def names(node):
        return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)} | {
            n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute)}

    def visit(node, function):
        tests = []
        refusal = (isinstance(node, ast.If) and not node.orelse
                   and all(isinstance(statement, ast.Raise) for statement in node.body))
        if refusal:
            pass  # A check that refuses decides nothing about what runs.
        elif isinstance(node, ast.If | ast.IfExp | ast.While):
            tests = [node.test]
        elif isinstance(node, ast.comprehension):
            tests = node.ifs
        elif isinstance(node, ast.Match):
            tests = [node.subject]
        for test in tests:
            hit = names(test) & _DECIDING
            if hit:
                found.append(f"{path.name}:{test.lineno}: branch on {sorted(hit)}")
        if (isinstance(node, ast.Call) and getattr(node.func, "attr", None)
                == "platform_dependent" and (path.name, function) not in _EXECUTORS):
            found.append(f"{path.name}:{node.lineno}: platform_dependent in {function}")
        for child in ast.iter_child_nodes(node):
            name = child.name if isinstance(child, ast.FunctionDef) else function
            visit(child, name)

    visit(tree, None)
    return found


def test_the_plan_is_the_only_decision():
    # No module but the deciders branches on the backend, the family, the platform or a
    # threshold, and platform_dependent runs only where the plan names its branches.
    root = pathlib.Path(pp.__file__).parent
    found = [hit for path in sorted(root.glob("*.py")) if path.name not in _DECIDERS
             for hit in _dispatches(path)]
    assert not found, found


def test_the_dispatch_reader_sees_every_form_of_branch(tmp_path):
    path = tmp_path / "probe.py"
    path.write_text(
        "def f(call, x, backend):\n"
        "    if backend == 'pallas':\n        pass\n"
        "    if backend == 'xla':\n        raise ValueError\n"
        "    y = 1 if call.thresholds.sort_from > 3 else 2\n"
        "    z = [a for a in x if a.platform == 'gpu']\n"
        "    while limits.atomic_add_from:\n        break\n"
        "    return lax.platform_dependent(x, cuda=f, default=f)\n"
    )
    assert len(_dispatches(path)) == 5, _dispatches(path)


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
