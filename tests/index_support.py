"""What the index-grammar tests share: placement, data, jnp as the oracle, the checks.

Every grammar test runs ``pallas_pinned.at(x)[index].<method>`` on a buffer in
``pinned_host`` memory and the same ``x.at[index].<method>`` of jnp on a
device-memory copy, and compares result shapes, dtypes and values. ``"wrap"``
is not a jnp mode: its oracle is jnp after taking every index modulo its axis
(ints, index arrays, and each ``jax.ds(s, k)`` as the array ``(s + arange(k)) % n``).
"""

from __future__ import annotations

import dataclasses
import math
import zlib
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import pallas_pinned

CPU = jax.devices("cpu")[0]
PINNED = jax.sharding.make_single_device_sharding(CPU, memory_kind="pinned_host")
DEVICE = jax.sharding.make_single_device_sharding(CPU, memory_kind="device")
WRITES = ("set", "add", "min", "max", "multiply", "mul")


def pinned(a) -> jax.Array:
    """A fresh buffer in pinned_host memory (writes outside jit consume it)."""
    return jax.device_put(np.asarray(a), PINNED)


def on_device(a) -> jax.Array:
    return jax.device_put(np.asarray(a), DEVICE)


def buffer_values(rng, shape, dtype=np.float32) -> np.ndarray:
    """Distinct positive integers (exact in float32): every position tells itself apart."""
    n = math.prod(shape)
    return (rng.permutation(n) + 1).reshape(shape).astype(dtype)


def update_values(rng, shape, dtype=np.float32) -> np.ndarray:
    """Negative small integers: never equal to a buffer value, sums and products exact."""
    return (-rng.integers(1, 9, size=shape)).astype(dtype)


def method_values(rng, method: str, shape, buffer: np.ndarray, dtype) -> np.ndarray:
    """The values a write of ``method`` takes: for min and max integers among the buffer's
    own (1 to its size), so that either side wins somewhere (negative ones never win a max,
    and always a min); for the rest, and an empty buffer, :func:`update_values`."""
    if method in ("min", "max") and buffer.size:
        return rng.integers(1, buffer.size + 1, size=shape).astype(dtype)
    return update_values(rng, shape, dtype)


# --- index arrays as operands of jit -------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Slot:
    k: int


def _is_array(it) -> bool:
    return isinstance(it, (np.ndarray, np.integer, jax.Array))


def _is_ds(it) -> bool:
    return type(it).__name__ == "Slice" and hasattr(it, "size")


def split(index) -> tuple[Any, list]:
    """The index with its arrays (numpy scalars and ``jax.ds`` starts included) taken out,
    and those arrays.

    Under jit the arrays are passed as arguments (traced); lists, ints, slices,
    ``None``, ``...`` stay static as written, and so does a ``jax.ds`` whose
    start is a Python int.
    """
    arrays = []

    def take(it):
        if _is_array(it):
            arrays.append(np.asarray(it))
            return _Slot(len(arrays) - 1)
        if _is_ds(it) and _is_array(it.start):
            arrays.append(np.asarray(it.start))
            return _DsSlot(len(arrays) - 1, it.size, it.stride)
        return it

    if isinstance(index, tuple):
        return tuple(take(it) for it in index), arrays
    return take(index), arrays


@dataclasses.dataclass(frozen=True)
class _DsSlot:
    k: int
    size: int
    stride: int


def join(template, arrays):
    def put_back(it):
        if isinstance(it, _DsSlot):
            return jax.ds(arrays[it.k], it.size, it.stride)
        return arrays[it.k] if isinstance(it, _Slot) else it

    if isinstance(template, tuple):
        return tuple(put_back(it) for it in template)
    return put_back(template)


# --- the oracle ----------------------------------------------------------------


def wrapped(index, shape):
    """``index`` for the ``"wrap"`` oracle, and the rolls it needs.

    Ints and index arrays are taken modulo their axis. A window ``jax.ds(s, k)``
    becomes ``jax.ds(0, k)`` of the buffer rolled by ``-s`` on its axis: the
    positions ``(s + arange(k)) % n``, where a window stands (a ds is a slice to
    numpy's placement rules, not an index array).
    """
    items = list(index) if isinstance(index, tuple) else [index]
    consuming = sum(1 for it in items if it is not None and it is not Ellipsis)
    out, rolls, axis = [], [], 0
    for it in items:
        if it is None:
            out.append(it)
            continue
        if it is Ellipsis:
            out.append(it)
            axis += len(shape) - consuming
            continue
        n = shape[axis]
        if _is_ds(it):
            rolls.append((axis, jnp.asarray(it.start)))
            out.append(jax.ds(0, it.size))
        elif isinstance(it, (int, np.integer)) and not isinstance(it, bool):
            out.append(int(it) % n)
        elif isinstance(it, list) or _is_array(it):
            out.append(jnp.asarray(it) % n)
        else:
            out.append(it)
        axis += 1
    return (tuple(out) if isinstance(index, tuple) else out[0]), rolls


def jnp_call(a, index, method: str, values=None, *, mode=None, fill_value=None):
    """jnp's ``a.at[index].<method>`` on a device-memory array (``"wrap"`` as defined above)."""
    a = jnp.asarray(a)
    if mode == "wrap":
        index, rolls = wrapped(index, a.shape)
        for axis, start in rolls:
            a = jnp.roll(a, -start, axis=axis)
        result = jnp_call(a, index, method, values, fill_value=fill_value)
        if method != "get":
            for axis, start in rolls:
                result = jnp.roll(result, start, axis=axis)
        return result
    ref = a.at[index]
    if method == "get":
        return ref.get(mode=mode, fill_value=fill_value)
    return getattr(ref, method)(values, mode=mode)


def pp_call(x, index, method: str, values=None, **kwargs):
    """``pallas_pinned.at(x)[index].<method>``."""
    ref = pallas_pinned.at(x)[index]
    if method == "get":
        return ref.get(**kwargs)
    return getattr(ref, method)(values, **kwargs)


def assert_matches(actual, expected, what: str) -> None:
    """Same shape, dtype and values (NaN equal to NaN), with the case in the message."""
    actual, expected = np.asarray(actual), np.asarray(expected)
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != jnp's {expected.shape}"
    assert actual.dtype == expected.dtype, f"{what}: dtype {actual.dtype} != jnp's {expected.dtype}"
    np.testing.assert_array_equal(actual, expected, err_msg=what)


def expected_memory(method: str) -> str:
    return "device" if method == "get" else "pinned_host"


def describe(index) -> str:
    """A short, readable form of an index for ids and messages."""
    if isinstance(index, tuple):
        return "(" + ",".join(describe(it) for it in index) + ")"
    if isinstance(index, slice):
        parts = ["" if p is None else str(p) for p in (index.start, index.stop, index.step)]
        return ":".join(parts).rstrip(":") or ":"
    if index is Ellipsis:
        return "..."
    if isinstance(index, np.ndarray):
        return "a" + str(index.tolist()).replace(" ", "")
    if _is_ds(index):
        traced = "traced " if _is_array(index.start) else ""
        return f"ds({traced}{index.start},{index.size})"
    return str(index).replace(" ", "")


# XLA's CPU optimizations cost more compile time than these tiny programs ever run.
FAST_COMPILE = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}


def compile_fast(f, *args):
    """``jax.jit(f)`` compiled for ``args`` with few optimizations (the tests compile a lot)."""
    return jax.jit(f).lower(*args).compile(FAST_COMPILE)


def run_jit(f, *args):
    return compile_fast(f, *args)(*args)


def case_rng(*key) -> np.random.Generator:
    """A random stream per case, the same in every run (crc32 of the case's description)."""
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


def write_shape(a, index, mode) -> tuple:
    """The shape of the values a write takes: the whole selection, even where jnp's get
    would clamp a static ``jax.ds`` window like a slice (its filling read does not)."""
    mode = "fill" if mode in (None, "clip", "promise_in_bounds") else mode
    template, arrays = split(index)
    return jax.eval_shape(
        lambda a, arrays: jnp_call(a, join(template, arrays), "get", mode=mode), a, arrays
    ).shape


def check_eager(rng, shape, index, methods, *, backend="xla", mode=None, dtype=np.float32):
    """Each method outside jit, on a fresh pinned copy, against jnp."""
    a = buffer_values(rng, shape, dtype)
    values = {m: method_values(rng, m, write_shape(a, index, mode), a, dtype)
              for m in methods if m != "get"}
    template, arrays = split(index)  # jnp takes a jax.ds with an array start only traced
    expected = run_jit(lambda a, v, arrays: {
        m: jnp_call(a, join(template, arrays), m, v.get(m), mode=mode) for m in methods
    }, a, values, arrays)
    for method in methods:
        what = f"{method} x{shape}[{describe(index)}] mode={mode} backend={backend} eager"
        got = pp_call(pinned(a), index, method, values.get(method), mode=mode, backend=backend)
        assert_matches(got, expected[method], what)
        assert got.sharding.memory_kind == expected_memory(method), what


@dataclasses.dataclass
class Case:
    """One (shape, index, mode) of a batch: its data, and what jnp and the op gave."""

    shape: tuple
    index: Any
    mode: str | None = None
    dtype: Any = np.float32
    a: Any = None
    values: dict = dataclasses.field(default_factory=dict)
    expected: dict = dataclasses.field(default_factory=dict)
    got: dict | BaseException | None = None

    @property
    def name(self) -> str:
        return f"x{self.shape}[{describe(self.index)}] mode={self.mode}"


def _prepare(case: Case, methods) -> Case:
    rng = case_rng(case.shape, describe(case.index), case.mode, np.dtype(case.dtype).name)
    case.a = buffer_values(rng, case.shape, case.dtype)
    shape = write_shape(case.a, case.index, case.mode)
    case.values = {m: method_values(rng, m, shape, case.a, case.dtype)
                   for m in methods if m != "get"}
    return case


def _pp_traced(cases, methods, backend):
    """One jitted function running every case's methods; index arrays traced."""
    templates = [split(c.index) for c in cases]
    errors = {}

    def run(xs, arrays, values):
        outs = []
        for k, c in enumerate(cases):
            try:
                idx = join(templates[k][0], arrays[k])
                outs.append({m: pp_call(xs[k], idx, m, values[k].get(m), mode=c.mode,
                                        backend=backend) for m in methods})
            except Exception as err:  # Reported by that case's test, not the batch.
                errors[k] = err
                outs.append(None)
        return outs

    xs = [pinned(c.a) for c in cases]
    arrays = [[on_device(i) for i in t[1]] for t in templates]
    outs = run_jit(run, xs, arrays, [c.values for c in cases])
    return [errors.get(k, out) for k, out in enumerate(outs)]


def run_batch(cases: list[Case], methods, *, backend="xla") -> dict[str, Case]:
    """Every case under jit, in one compile for the op and one for jnp.

    Should the batch fail to compile or run as a whole, each case runs alone
    so that the failure lands on its own test.
    """
    cases = [_prepare(c, methods) for c in cases]
    templates = [split(c.index) for c in cases]
    expected = run_jit(lambda arrays, values, indices: [
        {m: jnp_call(a, join(t[0], i), m, v.get(m), mode=c.mode) for m in methods}
        for c, a, v, t, i in zip(cases, arrays, values, templates, indices, strict=True)
    ], [c.a for c in cases], [c.values for c in cases], [t[1] for t in templates])
    try:
        got = _pp_traced(cases, methods, backend)
    except Exception:
        got = []
        for c in cases:
            try:
                got.append(_pp_traced([c], methods, backend)[0])
            except Exception as err:
                got.append(err)
    for c, e, g in zip(cases, expected, got, strict=True):
        c.expected, c.got = e, g
    return {c.name: c for c in cases}


def case_ids(pairs) -> list[str]:
    """pytest ids for a table of (shape, index) pairs."""
    return [f"{shape}-{describe(index)}" for shape, index in pairs]


class Batches:
    """A module's batches, each run on first use: one per (table, modes, backend).

    A test asks for its own case; the first test of a table pays for the
    table's two compiles.
    """

    def __init__(self, methods):
        self.methods = methods
        self._done = {}

    def case(self, table, shape, index, mode=None, *, modes=(None,), backend="xla") -> Case:
        key = (id(table), tuple(modes), backend)
        if key not in self._done:
            cases = [Case(s, i, m) for s, i in table for m in modes]
            self._done[key] = run_batch(cases, self.methods, backend=backend)
        return self._done[key][Case(shape, index, mode).name]


def check_case(case: Case, methods, *, backend="xla") -> None:
    if isinstance(case.got, BaseException):
        raise case.got
    for method in methods:
        what = f"{method} {case.name} backend={backend} jit"
        assert_matches(case.got[method], case.expected[method], what)
        assert case.got[method].sharding.memory_kind == expected_memory(method), what
