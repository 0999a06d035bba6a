"""Random index forms against jnp (hypothesis): the grammar's regression net.

Each example draws a buffer shape (now and then with a 0-length axis), an index of
ints, slices (any step), index arrays (now and then empty), ``jax.ds`` windows
(strides 1-3, static or traced starts), ``None`` and ``Ellipsis``, now and then an
entry that no grammar takes (a float, a zero step, a string, one index too many, a
second ``...``), a method and a mode; it runs jnp's ``x.at[index]`` under ``jit`` and
ours on the same values, under ``jit`` and eagerly, and compares them (exact values:
sums of duplicates do not depend on their order).

One example in four is a promise kept as written (README, "How it differs from jnp"):
ints, slices of positive step and one index array whose values are sorted
(``indices_are_sorted``) and/or distinct (``unique_indices``) as written, negative ones
among them, so that once they wrap the rows may be neither. Ours gets the promises, jnp
none: its result is what the promise must not change.

* Where jnp refuses, ours must refuse with an exception of the same kind
  (:func:`kind`: IndexError, TypeError, ValueError, ...), and ``x`` must stay
  alive; another kind, or ours accepting, is a disagreement. The listed
  exceptions are :data:`DOCUMENTED`, and a read of rows from a 0-length axis
  with ``mode="fill"``, which ours answers with fill values.
* Where jnp accepts, ours must accept and agree. A write whose selection is
  empty writes nothing, with updates of the selection's shape or of any other
  shape (jnp returns ``x`` for those); a read of an empty selection is an empty
  array of jnp's shape. No refusal of ours is excused.
"""

from __future__ import annotations

import dataclasses
import re
import warnings
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import event, given
from hypothesis import strategies as st

import pallas_pinned
from tests.helpers import examples
from tests.index_support import buffer_values, method_values, pinned

# A 0-length axis in about one shape of six (1 to 3 axes).
DIMS = (1, 2, 3, 5, 6) * 2 + (0,)
# An empty index array in about one index of six that has arrays.
ARRAY_DIMS = (1, 2, 3) * 2 + (0,)
PROMISES = {
    "sorted": {"indices_are_sorted": True},
    "unique": {"unique_indices": True},
    "both": {"indices_are_sorted": True, "unique_indices": True},
}
METHODS = ("get", "set", "add", "max")
MODES = (None, "clip", "fill")
# Entries no grammar takes, with the kind of jnp's refusal (ours must match it).
BAD = {
    "a float": 1.5,
    "a float array": np.array([1.0, 0.0]),
    "a zero step": slice(0, 3, 0),
    "a float slice bound": slice(0.5, 2),
    "a string": "0",
}
# jnp's refusal of any read of rows from a 0-length axis. With mode="fill" ours answers
# with fill values instead, NaN here (tests/test_gather.py, test_gather_from_an_empty_buffer_fills).
JNP_EMPTY_AXIS_READ = ("TypeError", r"Slice size at index \d+ in gather op is out of range")
# (jnp's kind, what jnp says, our kind, what we say): refusals of another kind that the
# library documents. A write through a static window longer than its axis: jnp's
# scatter fails its shape check with a TypeError; ours names the window (a ValueError,
# tests/test_errors.py "ds that does not fit").
DOCUMENTED = [
    ("TypeError", "Bounds of the window dimensions of updates must not exceed",
     "ValueError", r"jax\.ds\(start, \d+, \d+\) does not fit axis"),
    # A read of rows from a 0-length axis: jnp's gather fails its shape check in every
    # mode; ours names mode="fill" (tests/test_errors.py, test_gather_bad_buffers).
    (*JNP_EMPTY_AXIS_READ, "ValueError", r"has no rows to read with mode="),
]


def kind(err: BaseException) -> str:
    """The family of a refusal: the builtin class it belongs to (jax's own errors
    subclass these), else its own class's name."""
    for cls in (IndexError, TypeError, ValueError, OverflowError, NotImplementedError):
        if isinstance(err, cls):
            return cls.__name__
    return type(err).__name__


def same_refusal(theirs: BaseException, ours: BaseException) -> bool:
    if kind(theirs) == kind(ours):
        return True
    return any(kind(theirs) == k1 and re.search(m1, str(theirs))
               and kind(ours) == k2 and re.search(m2, str(ours))
               for k1, m1, k2, m2 in DOCUMENTED)


@dataclasses.dataclass
class Case:
    shape: tuple
    entries: list  # (kind, value) per item of the index, in order
    method: str
    mode: str | None
    seed: int
    promises: dict = dataclasses.field(default_factory=dict)  # kept as written, ours only

    def index(self, traced):
        """The index, with the traced ds starts and arrays taken from ``traced``."""
        items, k = [], 0
        for what, value in self.entries:
            if what == "ds":
                start, size, stride, is_traced = value
                items.append(jax.ds(traced[k] if is_traced else start, size, stride))
                k += is_traced
            elif what == "array":
                items.append(traced[k])
                k += 1
            else:
                items.append(value)
        return tuple(items)

    def operands(self):
        out = []
        for what, value in self.entries:
            if what == "ds" and value[3]:
                out.append(jnp.int32(value[0]))
            elif what == "array":
                out.append(jnp.asarray(value))
        return out

    def __str__(self):
        shown = [(w, v.tolist() if isinstance(v, np.ndarray) else v) for w, v in self.entries]
        promised = "".join(f" {k}" for k in sorted(self.promises))
        return f"{self.method} x{self.shape}[{shown}] mode={self.mode}{promised}"


@st.composite
def _entry(draw, dim, arrays_shape):
    what = draw(st.sampled_from(["int", "slice", "slice", "array", "array", "ds", "ds"]))
    if what == "int":
        return "int", draw(st.integers(-dim - 2, dim + 1))
    if what == "slice":
        return "slice", draw(_slice(dim, [None, 1, 2, -1, -2]))
    if what == "array":
        shape = arrays_shape[draw(st.integers(0, len(arrays_shape))):]
        flat = draw(st.lists(st.integers(-dim - 1, dim), min_size=int(np.prod(shape)),
                             max_size=int(np.prod(shape))))
        return "array", np.array(flat, np.int32).reshape(shape)
    stride = draw(st.sampled_from([1, 1, 2, 3]))
    size = draw(st.integers(0, (dim - 1) // stride + 1))
    return "ds", (draw(st.integers(-dim - 2, dim + 1)), size, stride, draw(st.booleans()))


def _slice(dim, steps):
    bound = st.none() | st.integers(-dim - 2, dim + 2)
    return st.builds(slice, bound, bound, st.sampled_from(steps))


@st.composite
def promised_case(draw, shape) -> Case:
    """Ints, slices of positive step and one index array, sorted and/or distinct as written.

    The array's values are in ``[-dim - 1, dim]``: negative ones, which may wrap onto a
    row that another names (distinct as written, not after) or below one before them
    (sorted as written, not after), and one past either end. The promise holds for the
    index tuples in the array's order: the ints are the same in each, slices are windows.
    """
    promise = draw(st.sampled_from(sorted(PROMISES)))
    axis = draw(st.integers(0, len(shape) - 1))
    count = draw(st.integers(axis + 1, len(shape)))
    entries = []
    for k, dim in enumerate(shape[:count]):
        if k == axis:
            values = range(-dim - 1, dim + 1)
            size = draw(st.integers(0, 8 if promise == "sorted" else min(8, len(values))))
            flat = (draw(st.lists(st.sampled_from(values), min_size=size, max_size=size))
                    if promise == "sorted" else draw(st.permutations(values))[:size])
            entries.append(("array", np.array(sorted(flat) if promise != "unique" else flat,
                                              np.int32)))
        elif draw(st.booleans()):
            entries.append(("int", draw(st.integers(-dim - 1, dim))))
        else:
            entries.append(("slice", draw(_slice(dim, [None, 1, 2]))))
    return Case(shape, entries, draw(st.sampled_from(METHODS)), draw(st.sampled_from(MODES)),
                draw(st.integers(0, 2**32 - 1)), PROMISES[promise])


@st.composite
def cases(draw) -> Case:
    shape = tuple(draw(st.lists(st.sampled_from(DIMS), min_size=1, max_size=3)))
    if draw(st.integers(0, 3)) == 0:
        return draw(promised_case(shape))
    arrays_shape = tuple(draw(st.lists(st.sampled_from(ARRAY_DIMS), min_size=1, max_size=2)))
    count = draw(st.integers(1, len(shape)))
    entries = [draw(_entry(d, arrays_shape)) for d in shape[:count]]
    extra = draw(st.sampled_from([None] * 6 + ["None", "Ellipsis", "bad", "too many", "two ..."]))
    if extra == "too many":
        entries = [draw(_entry(d, arrays_shape)) for d in shape] + [("int", 0)]
    elif extra == "two ...":
        entries[draw(st.integers(0, len(entries))):0] = [("ellipsis", ...)]
        entries.append(("ellipsis", ...))
    elif extra == "bad":  # In place of an entry: one fault per index, as jnp reports one.
        entries[draw(st.integers(0, len(entries) - 1))] = ("bad", BAD[draw(st.sampled_from(
            sorted(BAD)))])
    elif extra is not None:
        item = {"None": ("none", None), "Ellipsis": ("ellipsis", ...)}[extra]
        entries.insert(draw(st.integers(0, len(entries))), item)
    return Case(shape, entries, draw(st.sampled_from(METHODS)), draw(st.sampled_from(MODES)),
                draw(st.integers(0, 2**32 - 1)))


def _call(ref, method, mode, values, **kw):
    if method == "get":
        return ref.get(mode=mode, **kw)
    return getattr(ref, method)(values, mode="drop" if mode == "fill" else mode, **kw)


def _theirs(case):
    return jax.jit(lambda x, ops, values: _call(x.at[case.index(ops)], case.method, case.mode,
                                                values))


def _ours(case, backend, jitted):
    def run(x, ops, values):
        return _call(pallas_pinned.at(x)[case.index(ops)], case.method, case.mode, values,
                     backend=backend, **case.promises)

    return jax.jit(run) if jitted else run


def _jnp(case, a, ops, values) -> tuple[Any, BaseException | None]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return np.asarray(_theirs(case)(jnp.asarray(a), ops, values)), None
        except Exception as err:  # noqa: BLE001 - jnp's refusal: ours must match it
            return None, err


def check(case: Case, backend: str) -> list[str]:
    """The disagreements of ours, under jit and eagerly, with jnp on ``case`` (an empty
    list when none); jnp's answer serves both."""
    rng = np.random.default_rng(case.seed)
    a = buffer_values(rng, case.shape)
    ops = case.operands()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            shape = jax.eval_shape(lambda x, ops: x.at[case.index(ops)].get(), a, ops).shape
    except Exception:  # noqa: BLE001 - jnp refuses the index: values of no matter
        shape = ()
    selection = jnp.asarray(method_values(rng, case.method, shape, a, np.float32))
    # jnp sizes a static window past the end as a slice in get and as a window in a
    # write: a scalar update fits both. jnp's answer is its result for the first
    # updates it takes, or its refusal of the last.
    for values in [selection] + ([jnp.float32(-1.75)] if case.method != "get" else []):
        expected, refused = _jnp(case, a, ops, values)
        if refused is None:
            break
    event("jnp refuses" if refused is not None else
          "empty selection" if 0 in shape else "jnp accepts")
    event("promised" if case.promises else "no promise")
    event("a 0-length axis" if 0 in case.shape else "no 0-length axis")
    wrong = [w for jitted in (True, False)
             for w in _compare(case, backend, jitted, a, ops, values, expected, refused)]
    if case.method != "get" and 0 in shape and refused is None:
        # Nothing selected: jnp writes nothing whatever the updates' shape; so must ours.
        odd = jnp.asarray(method_values(rng, case.method, (3, 1), a, np.float32))
        expected, refused = _jnp(case, a, ops, odd)
        wrong += [w for jitted in (True, False)
                  for w in _compare(case, backend, jitted, a, ops, odd, expected, refused)]
    return wrong


def _fills_where_jnp_refuses(case, refused, got) -> bool:
    """A read of rows from a 0-length axis with mode="fill": fill values, where jnp refuses."""
    jnp_kind, jnp_says = JNP_EMPTY_AXIS_READ
    return (case.method == "get" and case.mode == "fill" and 0 in case.shape
            and kind(refused) == jnp_kind and re.search(jnp_says, str(refused)) is not None
            and bool(np.isnan(got).all()))


def _compare(case, backend, jitted, a, ops, values, expected, refused) -> list[str]:
    what = f"{case} updates {values.shape} backend={backend} {'jit' if jitted else 'eager'}"
    x = pinned(a)
    try:
        got = np.asarray(_ours(case, backend, jitted)(x, ops, values))
    except Exception as err:  # noqa: BLE001
        if refused is None:
            return [f"{what}: jnp accepts, ours refuses ({type(err).__name__}: {err})"]
        if not same_refusal(refused, err):
            return [f"{what}: jnp refuses with {type(refused).__name__} ({refused}), "
                    f"ours with {type(err).__name__} ({err})"]
        if x.is_deleted():
            return [f"{what}: a refused call consumed x"]
        return []
    if refused is not None and not _fills_where_jnp_refuses(case, refused, got):
        return [f"{what}: jnp refuses ({type(refused).__name__}: {refused}), ours accepts"]
    if refused is not None:
        return []
    if got.shape != expected.shape or not np.array_equal(got, expected, equal_nan=True):
        return [f"{what}: got {got.tolist()}, jnp {expected.tolist()}"]
    return []


@pytest.mark.parametrize("backend", ["xla", "interpret"])
@examples(75)
@given(case=cases())
def test_random_index_forms_follow_jnp(case, backend):
    # Each example runs ours under jit and eagerly against one answer of jnp's.
    wrong = check(case, backend)
    assert not wrong, "\n".join(wrong)
