"""Random index forms against jnp, on fixed seeds: the grammar's regression net.

Each case draws a buffer shape, an index of ints, slices (any step), index
arrays, ``jax.ds`` windows (strides 1-3, static or traced starts), ``None``
and ``Ellipsis``, a method and a mode; it runs jnp's ``x.at[index]`` and ours
under ``jit`` on the same values and compares them (exact values: sums of
duplicates do not depend on their order). Where jnp refuses, ours must refuse
too, and ``x`` must stay alive. A CPU fuzz of this kind (16 k cases) found
the strided-window, static-window and empty-axis bugs that the grammar's
other tests had missed.
"""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallas_pinned
from tests.index_support import pinned

CASES_PER_SEED = 30
SEEDS = range(8)
METHODS = ("get", "set", "add", "max")
MODES = (None, "clip", "fill")


def _shape(rng):
    return tuple(int(d) for d in rng.choice([1, 2, 3, 5, 6], size=int(rng.integers(1, 4))))


def _entry(rng, dim, arrays_shape):
    """One index entry for an axis of length ``dim``: (kind, static value, traced value)."""
    kind = rng.choice(["int", "slice", "array", "ds"], p=[0.2, 0.25, 0.3, 0.25])
    if kind == "int":
        return "int", int(rng.integers(-dim - 2, dim + 2))
    if kind == "slice":
        bound = lambda: None if rng.random() < 0.3 else int(rng.integers(-dim - 2, dim + 3))  # noqa: E731
        return "slice", slice(bound(), bound(), rng.choice([None, 1, 2, -1, -2]))
    if kind == "array":
        shape = arrays_shape[int(rng.integers(0, len(arrays_shape) + 1)):]
        return "array", rng.integers(-dim - 1, dim + 1, size=shape).astype(np.int32)
    stride = int(rng.choice([1, 1, 2, 3]))
    size = int(rng.integers(0, (dim - 1) // stride + 2))
    return "ds", (int(rng.integers(-dim - 2, dim + 2)), size, stride, bool(rng.random() < 0.6))


def _case(rng):
    shape = _shape(rng)
    arrays_shape = tuple(int(d) for d in rng.choice([1, 2, 3], size=int(rng.integers(1, 3))))
    entries = [_entry(rng, d, arrays_shape) for d in shape[: int(rng.integers(1, len(shape) + 1))]]
    extras = []
    if rng.random() < 0.2:
        extras.append((int(rng.integers(0, len(entries) + 1)), None))
    elif rng.random() < 0.2:
        extras.append((int(rng.integers(0, len(entries) + 1)), Ellipsis))
    return shape, entries, extras, rng.choice(METHODS), rng.choice(MODES)


def _index(entries, extras, traced):
    """The index, with the traced ds starts and arrays taken from ``traced``."""
    items, k = [], 0
    for kind, value in entries:
        if kind == "ds":
            start, size, stride, is_traced = value
            items.append(jax.ds(traced[k] if is_traced else start, size, stride))
            k += is_traced
        elif kind == "array":
            items.append(traced[k])
            k += 1
        else:
            items.append(value)
    for position, extra in extras:
        items.insert(position, extra)
    return tuple(items)


def _traced_operands(entries):
    out = []
    for kind, value in entries:
        if kind == "ds" and value[3]:
            out.append(jnp.int32(value[0]))
        elif kind == "array":
            out.append(jnp.asarray(value))
    return out


def _run(at, x, index, method, mode, values):
    ref = at(x)[index]
    if method == "get":
        return ref.get(mode=mode)
    return getattr(ref, method)(values, mode="drop" if mode == "fill" else mode)


@pytest.mark.parametrize("backend", ["xla", "interpret"])
@pytest.mark.parametrize("seed", SEEDS)
def test_random_index_forms_follow_jnp(seed, backend):
    rng = np.random.default_rng(1000 + seed)
    wrong = []
    for case in range(CASES_PER_SEED):
        shape, entries, extras, method, mode = _case(rng)
        a = (rng.integers(-40, 40, size=shape) / 4).astype(np.float32)
        operands = _traced_operands(entries)
        what = f"seed {seed} case {case}: {method} x{shape}[{entries} {extras}] mode={mode}"

        def theirs(x, ops, values, entries=entries, extras=extras, method=method, mode=mode):
            return _run(lambda x: x.at, x, _index(entries, extras, ops), method, mode, values)

        def ours(x, ops, values, entries=entries, extras=extras, method=method, mode=mode):
            ref = pallas_pinned.at(x)[_index(entries, extras, ops)]
            if method == "get":
                return ref.get(mode=mode, backend=backend)
            return getattr(ref, method)(values, mode="drop" if mode == "fill" else mode,
                                        backend=backend)

        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                out_shape = jax.eval_shape(
                    lambda x, ops, e=entries, x2=extras: x.at[_index(e, x2, ops)].get(),
                    a, operands,
                ).shape
                values = jnp.asarray((rng.integers(-40, 40, size=out_shape) / 4)
                                     .astype(np.float32))
                try:
                    expected = np.asarray(jax.jit(theirs)(jnp.asarray(a), operands, values))
                except Exception:  # noqa: BLE001
                    if method == "get":
                        raise
                    # jnp sizes a static window past the end as a slice in get and as a
                    # window in a write: a scalar update fits both.
                    values = jnp.float32(-1.75)
                    expected = np.asarray(jax.jit(theirs)(jnp.asarray(a), operands, values))
        except Exception:  # noqa: BLE001 - jnp refuses: ours must refuse too
            x = pinned(a)
            try:
                jax.jit(ours)(x, operands, jnp.zeros((), jnp.float32))
            except Exception:  # noqa: BLE001
                assert not x.is_deleted(), what
                continue
            wrong.append(f"{what}: jnp refuses, ours accepts")
            continue
        try:
            got = np.asarray(jax.jit(ours)(pinned(a), operands, values))
        except Exception as err:  # noqa: BLE001
            if method != "get" and 0 in out_shape:
                continue  # Stricter than jnp: updates must fit even an empty selection.
            wrong.append(f"{what}: jnp accepts, ours refuses ({err})")
            continue
        if got.shape != expected.shape or not np.array_equal(got, expected, equal_nan=True):
            wrong.append(f"{what}: got {got.tolist()}, jnp {expected.tolist()}")
    assert not wrong, f"{len(wrong)} disagreements with jnp:\n" + "\n".join(wrong[:10])
