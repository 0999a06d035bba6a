"""docs/ARCHITECTURE.md's "where things go" recipes, followed: a toy op and a toy implementation.

The toy op is ``xor``: ``x.at[i]`` XOR ``updates``, integer and bool buffers only, every
update of a row applied (XOR is associative and commutative, so duplicates combine in any
order). It is registered at exactly the places the recipe "A new op" lists, through
``monkeypatch`` (undone after each test: the package itself does not change), then called
through the public path under ``jit`` on the CPU and compared with jnp applying the
updates one by one. The toy implementation is registered as "A new implementation" says:
first in an op's ``IMPLEMENTATIONS`` (``auto`` takes it), and as an explicit backend.

``_registry.choose`` runs while a call is traced, so its answer is part of the compiled
program: the implementation tests clear JAX's caches before and after, and every call
here is a fresh ``jax.jit`` of its own lambda.
"""

from __future__ import annotations

import dataclasses
import importlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import pallas_pinned as pp
from pallas_pinned import (
    _front,
    _local_write,
    _read_rows,
    _registry,
    _rows,
    _validation,
    _write_rows,
)
from tests.helpers import put, read
from tests.registry_support import picked as choices_made

# The package's name `at` is the function; its module holds the method class.
_at_module = importlib.import_module("pallas_pinned.at")


# --- the new op, as its public module would define it ---------------------------------


def scatter_xor_to_host(x, indices, updates, *, mode=None, unique_indices=False,
                        indices_are_sorted=False, backend="auto"):
    """``x.at[indices]`` XOR ``updates``: the recipe's public function, one call of the front."""
    return _front.write(
        "xor", x, indices, updates, mode=mode, unique_indices=unique_indices,
        indices_are_sorted=indices_are_sorted, backend=backend,
    )


def _xor_dtype_rule(real):
    """``_validation.check_op_dtype`` with the toy op's rule added (in the library: one
    more ``if`` in that function)."""

    def check_op_dtype(op, dtype):
        if op == "xor" and not (jnp.issubdtype(dtype, jnp.integer)
                                or jnp.dtype(dtype) == jnp.bool_):
            raise TypeError(f"scatter_xor_to_host takes an integer or bool buffer, not {dtype}")
        real(op, dtype)

    return check_op_dtype


def _register_xor(monkeypatch, *, leave_out: str | None = None) -> None:
    """Every step of the recipe "A new op", each under its name; ``leave_out`` skips one."""
    at_buffer = _at_module._IndexedBuffer
    steps = {
        # The names the refusals (vmap, grad, jvp) give the op.
        "OP_NAMES": lambda: monkeypatch.setitem(
            _local_write.OP_NAMES, "xor", "scatter_xor_to_host"),
        # What it accepts, checked once before anything runs (local and sharded alike).
        "check_op_dtype": lambda: monkeypatch.setattr(
            _validation, "check_op_dtype", _xor_dtype_rule(_validation.check_op_dtype)),
        # How duplicates combine and how the total meets the row: the block copy, the
        # reference (XLA) rows, a rank-0 buffer and the kernels' combine all read it.
        "COMBINERS": lambda: monkeypatch.setitem(_rows.COMBINERS, "xor", jnp.bitwise_xor),
        # What auto tries, in order.
        "IMPLEMENTATIONS": lambda: monkeypatch.setitem(
            _registry.IMPLEMENTATIONS, "xor", _registry.IMPLEMENTATIONS["min"]),
        # The device-side formula the gradient refusal names.
        "_DEVICE_COMBINES": lambda: monkeypatch.setitem(
            _local_write._DEVICE_COMBINES, "xor", "old ^ u"),
        # The public names: the function in the package, the method of at(x)[...].
        "public": lambda: (
            monkeypatch.setattr(pp, "scatter_xor_to_host", scatter_xor_to_host, raising=False),
            monkeypatch.setattr(pp, "__all__", [*pp.__all__, "scatter_xor_to_host"]),
            monkeypatch.setattr(at_buffer, "xor", lambda self, values, **kw: self._write(
                "xor", values, **kw), raising=False),
        ),
    }
    assert leave_out in (None, *steps), leave_out
    for name, step in steps.items():
        if name != leave_out:
            step()


@pytest.fixture
def xor_op(monkeypatch):
    _register_xor(monkeypatch)


def _xor_oracle(x0, entries, updates):
    """jnp, one update at a time: ``x[where] ^= u`` for each entry in order."""
    out = jnp.asarray(x0)
    for where, u in zip(entries, updates, strict=True):
        out = out.at[where].set(out[where] ^ u)
    return np.asarray(out)


def _ints(rng, shape, dtype=np.int32):
    return rng.integers(0, np.iinfo(dtype).max, shape, dtype=dtype)


# Three index forms, one per plan kind: axis-0 indices (duplicates, a negative, one out of
# range dropped), a 3-D buffer's [layer, positions] ("rows"), and a block.
def _case(form, rng, rows=7):
    """``(x0, call(x, y, backend), y, entries, y_entries)``."""
    if form == "axis0":
        x0, idx = _ints(rng, (rows, 3)), np.array([1, 5, -2, 1, 0, 1, rows + 2], np.int32)
        y = _ints(rng, (7, 3))

        def call(x, y, backend):
            return pp.scatter_xor_to_host(x, jnp.asarray(idx), y, mode="drop", backend=backend)

        kept = [k for k, i in enumerate(idx) if -rows <= i < rows]
        return x0, call, y, [(int(idx[k]),) for k in kept], y[kept]
    if form == "layer_positions":
        x0, pos = _ints(rng, (4, 6, 5), np.uint16), np.array([1, 4, 1, -1], np.int32)
        y = _ints(rng, (4, 5), np.uint16)

        def call(x, y, backend):
            return pp.at(x)[2, jnp.asarray(pos)].xor(y, backend=backend)

        return x0, call, y, [(2, int(p)) for p in pos], y
    x0, y = _ints(rng, (7, 3)), _ints(rng, (3, 3))

    def call(x, y, backend):
        return pp.at(x)[1:4].xor(y, backend=backend)

    return x0, call, y, [(1,), (2,), (3,)], y


def _expected_pick(form, backend):
    """What ``_registry.choose`` picks on the CPU: ``backend="xla"`` copies a block whole
    and writes other forms by the reference; ``auto`` writes a host buffer's block as rows
    (only a set's strided block is one copy), by the reference off CUDA."""
    if backend == "interpret":
        return "interpret"
    return "block" if (form, backend) == ("block", "xla") else "xla"


@pytest.mark.parametrize("backend", ["xla", "interpret", "auto"])
@pytest.mark.parametrize("form", ["axis0", "layer_positions", "block"])
def test_the_toy_op_runs_through_the_public_path_under_jit(
        rng, monkeypatch, xor_op, form, backend):
    picked = choices_made(monkeypatch)
    x0, call, y, entries, y_entries = _case(form, rng)
    out = jax.jit(lambda x, y: call(x, y, backend))(put(x0), jnp.asarray(y))
    assert out.sharding.memory_kind == "pinned_host"
    np.testing.assert_array_equal(read(out), _xor_oracle(x0, entries, y_entries))
    assert set(picked) == {_expected_pick(form, backend)}, picked


@pytest.mark.parametrize("backend", ["xla", "interpret", "auto"])
def test_an_eager_toy_op_consumes_its_host_buffer_as_the_others_do(rng, xor_op, backend):
    x0, call, y, entries, y_entries = _case("axis0", rng)
    x = put(x0)
    out = call(x, jnp.asarray(y), backend)
    assert x.is_deleted()
    np.testing.assert_array_equal(read(out), _xor_oracle(x0, entries, y_entries))


def test_the_sharded_layer_serves_the_toy_op_unchanged(rng, xor_op):
    mesh = jax.make_mesh((2,), ("data",), devices=jax.devices("cpu")[:2])
    x0, idx = _ints(rng, (8, 3)), np.array([1, 5, -2, 1, 7, 4], np.int32)  # both shards
    y = _ints(rng, (6, 3))
    x = jax.device_put(x0, NamedSharding(mesh, P("data"), memory_kind="pinned_host"))
    out = jax.jit(lambda x, i, y: pp.scatter_xor_to_host(x, i, y))(x, idx, y)
    assert out.sharding.is_equivalent_to(x.sharding, x.ndim)
    np.testing.assert_array_equal(read(out), _xor_oracle(x0, [(int(i),) for i in idx], y))


def test_the_toy_ops_dtype_rule_refuses_a_float_buffer_before_anything_runs(rng, xor_op):
    x = put(rng.standard_normal((7, 3)).astype(np.float32))
    with pytest.raises(TypeError, match="integer or bool buffer"):
        pp.scatter_xor_to_host(x, jnp.array([1]), jnp.ones((1, 3)))
    assert not x.is_deleted()


def test_the_toy_ops_transformation_rules_name_it(rng, xor_op):
    x = put(_ints(rng, (7, 3)))
    i = jnp.array([1, 2])
    with pytest.raises(NotImplementedError, match="scatter_xor_to_host does not support jax.vmap"):
        jax.vmap(lambda u: pp.scatter_xor_to_host(x, i, u))(jnp.ones((2, 2, 3), jnp.int32))
    with pytest.warns(FutureWarning), pytest.raises(TypeError, match=r"new = old \^ u"):
        jax.grad(lambda u: pp.scatter_xor_to_host(x, i, u).astype(jnp.float32).sum())(
            jnp.ones((2, 3), jnp.float32))
    assert not x.is_deleted()


# Each step of the recipe, left out, and a call that then fails: the list is not longer
# than it must be. (The public names need no demonstration.) The registries are read while
# a call is traced, and what is built from them is kept per call (``_local_write``'s rules
# and JAX's traces, keyed by the frozen WriteCall): each step's call has a shape of its
# own, so that no earlier test's kept program answers it.
_WITHOUT = {
    "OP_NAMES": ("xla", "axis0"),
    "COMBINERS": ("xla", "axis0"),
    "IMPLEMENTATIONS": ("auto", "axis0"),
    "_DEVICE_COMBINES": ("grad", None),
    "check_op_dtype": ("float", None),
}


@pytest.mark.parametrize("step", list(_WITHOUT))
def test_every_step_of_the_new_op_recipe_is_needed(rng, monkeypatch, step):
    _register_xor(monkeypatch, leave_out=step)
    how, form = _WITHOUT[step]
    rows = 20 + list(_WITHOUT).index(step)
    if how == "grad":
        x = put(_ints(rng, (rows, 3)))
        with pytest.warns(FutureWarning), pytest.raises(KeyError, match="xor"):
            jax.grad(lambda u: pp.scatter_xor_to_host(x, jnp.array([1]), u)
                     .astype(jnp.float32).sum())(jnp.ones((1, 3), jnp.float32))
    elif how == "float":
        # Without the rule the buffer passes validation and jnp refuses it while tracing,
        # in its own words, not the op's.
        x = put(rng.standard_normal((rows, 3)).astype(np.float32))
        with pytest.raises(TypeError) as refused:
            pp.scatter_xor_to_host(x, jnp.array([1]), jnp.ones((1, 3), jnp.float32))
        assert "scatter_xor_to_host" not in str(refused.value)
    else:
        x0, call, y, _, _ = _case(form, rng, rows)
        with pytest.raises(KeyError, match="xor"):
            jax.jit(lambda x, y: call(x, y, how))(put(x0), jnp.asarray(y))


# --- a new implementation -------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Toy(_registry.Implementation):
    """Serves calls of at most ``max_entries`` entries, by the reference's code."""

    max_entries: int = 4

    def unsupported(self, call, x, auto):
        if call.plan.num_entries > self.max_entries:
            return f"the toy serves at most {self.max_entries} entries"
        return None


_TOY_RAN: list[str] = []


def _toy_write(x2d, rows, updates2d, *, cfg):
    _TOY_RAN.append(cfg.op)
    return _write_rows.PATHS["reference"](x2d, rows, updates2d, cfg=cfg)


def _toy_read(x2d, rows, *, plan):
    _TOY_RAN.append("get")
    return _read_rows.PATHS["reference"](x2d, rows, plan=plan)


TOY = _Toy("toy", "toy")


@pytest.fixture
def toy(monkeypatch):
    """TOY first in set's and get's IMPLEMENTATIONS, and the explicit backend "toy"."""
    jax.clear_caches()  # Programs traced before would not ask choose again.
    _TOY_RAN.clear()
    for op in ("set", "get"):
        monkeypatch.setitem(_registry.IMPLEMENTATIONS, op, (TOY, *_registry.IMPLEMENTATIONS[op]))
    monkeypatch.setitem(_registry._EXPLICIT, "toy", (TOY,))
    monkeypatch.setitem(_write_rows.PATHS, "toy", _toy_write)
    monkeypatch.setitem(_read_rows.PATHS, "toy", _toy_read)
    monkeypatch.setattr(_validation, "BACKENDS", (*_validation.BACKENDS, "toy"))
    yield _TOY_RAN
    jax.clear_caches()  # Nor may later tests run a program that chose it.


def test_auto_takes_the_first_implementation_that_can_serve(rng, monkeypatch, toy):
    picked = choices_made(monkeypatch)
    x0 = rng.standard_normal((11, 3)).astype(np.float32)
    write = jax.jit(lambda x, i, y: pp.scatter_to_host(x, i, y))
    for idx in ([1, 4, 1], [1, 4, 1, 2, 3]):  # 3 entries: the toy; 5: it objects
        y = rng.standard_normal((len(idx), 3)).astype(np.float32)
        out = write(put(x0), jnp.array(idx), jnp.asarray(y))
        want = jnp.asarray(x0).at[np.array(idx)].set(y)
        np.testing.assert_array_equal(read(out), np.asarray(want))
    assert picked == ["toy", "xla"] and toy == ["set"]
    got = jax.jit(lambda x, i: pp.gather_from_host(x, i))(put(x0), jnp.array([3, 0]))
    np.testing.assert_array_equal(read(got), x0[[3, 0]])
    assert picked[-1] == "toy" and toy == ["set", "get"]


def test_an_explicit_backend_is_honoured_or_refused_never_replaced(rng, monkeypatch, toy):
    picked = choices_made(monkeypatch)
    x0 = rng.standard_normal((11, 3)).astype(np.float32)
    y = jnp.ones((3, 3))
    out = pp.scatter_to_host(put(x0), jnp.array([1, 4, 1]), y, backend="toy")
    want = jnp.asarray(x0).at[np.array([1, 4])].set(1.0)
    np.testing.assert_array_equal(read(out), np.asarray(want))
    assert picked == ["toy"] and toy == ["set"]
    x = put(x0)
    with pytest.raises(NotImplementedError, match="toy: the toy serves at most 4 entries"):
        pp.scatter_to_host(x, jnp.arange(5), jnp.ones((5, 3)), backend="toy")
    assert not x.is_deleted() and toy == ["set"]  # refused before anything ran
    with pytest.raises(NotImplementedError, match="toy: the toy serves at most 4 entries"):
        jax.jit(lambda x: pp.scatter_to_host(x, jnp.arange(5), jnp.ones((5, 3)),
                                             backend="toy"))(x)
    with pytest.raises(ValueError, match="unknown backend 'toy2'"):
        pp.scatter_to_host(x, jnp.arange(2), jnp.ones((2, 3)), backend="toy2")
