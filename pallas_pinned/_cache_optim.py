"""The cached table's row optimizers, the two kinds of update a training step hands back
(:class:`Grads`, :class:`Deltas`), and the fixed-order sum of a batch's per-entry values.

An optimizer updates only the rows a batch touched (lazily, as FBGEMM's fused optimizers
do): ``update(rows, grads, state) -> (rows, state)`` over a batch's distinct rows, with
``grads`` each row's gradient summed over the batch's entries. Its per-row state lives in
companion tables beside the table (:class:`StateSpec` says their shape, dtype and initial
value), so it is cached, refreshed, flushed and checkpointed with the table's rows.

Arithmetic: rows and gradients are float32 for tables of floats up to 32 bits (the
table's dtype otherwise); the new rows are rounded to the table's dtype once. Each
optimizer applies optax's formula, in optax's order, with optax's defaults: a float32
table's touched rows get optax's bits on CPU (tests/test_cached_optim.py), and in general
are within one float32 rounding per step of them, as XLA may fuse a multiply and an add
into one FMA inside optax's program. Ours are fenced (:func:`fenced`), so that every
program of ours rounds alike.

This module imports no other cache module: the ops, the pipeline and the state build on it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax


class Grads(NamedTuple):
    """Per-entry gradients, ``(B, ...)`` aligned with the batch's ids: entry ``b`` is the
    gradient with respect to ``rows.per_entry()[b]`` (what ``jax.grad`` of a per-entry
    lookup gives). Summed per distinct row in a fixed order, then applied by the table's
    optimizer once per row."""

    grads: Any


class Deltas(NamedTuple):
    """Values added to the batch's distinct rows, ``(B, ...)`` in the order of
    ``rows.values``: one array for the table, or a tuple with one entry per table (the
    table, then each companion; None leaves one unchanged). No optimizer runs."""

    deltas: Any


@dataclasses.dataclass(frozen=True)
class StateSpec:
    """One per-row state table of an optimizer: ``(N, *shape)`` of ``dtype`` filled with
    ``init``; ``shape`` None is the table's row shape (element-wise state)."""

    shape: tuple[int, ...] | None = None
    dtype: Any = jnp.float32
    init: float = 0.0

    def full_shape(self, table_shape: tuple) -> tuple:
        return (table_shape[0], *(table_shape[1:] if self.shape is None else self.shape))


def compute_dtype(dtype) -> np.dtype:
    """float32 for floats of at most 32 bits; the dtype itself otherwise (ints add exactly)."""
    dtype = np.dtype(dtype)
    if jnp.issubdtype(dtype, jnp.floating) and dtype.itemsize < 4:
        return np.dtype(np.float32)
    return dtype


def _per_row(a: jax.Array, like: jax.Array) -> jax.Array:
    """``a`` (one value per row) with trailing axes to broadcast against ``like``."""
    return a.reshape(a.shape + (1,) * (like.ndim - a.ndim))


def row_mean(a: jax.Array) -> jax.Array:
    """The mean of each row of ``a``, summed pairwise in a fixed order of elementwise adds:
    XLA's reductions order their sums by the array's shape (on CPU a row's mean changed
    with the number of rows), and a row must get the same bits in any batch."""
    v = a.reshape(a.shape[0], -1)
    width = v.shape[1]
    size = 1 << max(width - 1, 0).bit_length()
    v = jnp.pad(v, ((0, 0), (0, size - width)))
    while v.shape[1] > 1:
        half = v.shape[1] // 2
        v = v[:, :half] + v[:, half:]
    return v[:, 0] / width


class RowOptimizer:
    """A row optimizer: its state tables and its update (see the module docstring)."""

    name = "custom"

    @property
    def state(self) -> tuple[StateSpec, ...]:
        return ()

    def update(self, rows, grads, state):
        raise NotImplementedError


@dataclasses.dataclass(frozen=True)
class SGD(RowOptimizer):
    """``optax.sgd(learning_rate)``: ``row - learning_rate * grad``."""

    learning_rate: float
    name = "sgd"

    def update(self, rows, grads, state):
        return rows + (-self.learning_rate) * grads, state


@dataclasses.dataclass(frozen=True)
class Adagrad(RowOptimizer):
    """``optax.adagrad``: an element-wise accumulator of squared gradients (its defaults)."""

    learning_rate: float
    initial_accumulator_value: float = 0.1
    eps: float = 1e-7
    name = "adagrad"

    @property
    def state(self):
        return (StateSpec(None, jnp.float32, self.initial_accumulator_value),)

    def update(self, rows, grads, state):
        (acc,) = state
        acc = grads * grads + acc
        scale = jnp.where(acc > 0, lax.rsqrt(acc + self.eps), 0.0)
        return rows + (-self.learning_rate) * (scale * grads), (acc,)


@dataclasses.dataclass(frozen=True)
class RowwiseAdagrad(RowOptimizer):
    """FBGEMM's row-wise Adagrad: one accumulator per row, which adds the mean over the row
    of the squared gradient (:func:`row_mean`: a reference through ``jnp.mean`` agrees
    within a few float32 ulps); ``row - learning_rate / (sqrt(acc) + eps) * grad``."""

    learning_rate: float
    eps: float = 1e-8
    initial_accumulator_value: float = 0.0
    name = "rowwise_adagrad"

    @property
    def state(self):
        return (StateSpec((), jnp.float32, self.initial_accumulator_value),)

    def update(self, rows, grads, state):
        (acc,) = state
        acc = acc + row_mean(grads * grads)
        step = self.learning_rate / (jnp.sqrt(acc) + self.eps)
        return rows - _per_row(step, grads) * grads, (acc,)


@dataclasses.dataclass(frozen=True)
class Adam(RowOptimizer):
    """``optax.adam``, lazy: only touched rows update their moments, and each row counts its
    own steps (an int32 state column) for the bias correction; so a row's values are those
    of ``optax.adam`` run on the sequence of that row's own gradients."""

    learning_rate: float
    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-8
    eps_root: float = 0.0
    name = "adam"

    @property
    def state(self):
        return (StateSpec(None, jnp.float32, 0.0), StateSpec(None, jnp.float32, 0.0),
                StateSpec((), jnp.int32, 0))

    def update(self, rows, grads, state):
        mu, nu, count = state
        b1, b2 = self.b1, self.b2
        # optax's expressions, in its order: the same bits on a float32 table.
        mu = (1 - b1) * (grads**1) + b1 * mu
        nu = (1 - b2) * (grads**2) + b2 * nu
        count = jnp.where(count < np.iinfo(np.int32).max, count + 1, count)
        c = _per_row(count, grads)
        mu_hat = mu / (1 - b1**c).astype(mu.dtype)
        nu_hat = nu / (1 - b2**c).astype(nu.dtype)
        step = mu_hat / (jnp.sqrt(nu_hat + self.eps_root) + self.eps)
        return rows + (-self.learning_rate) * step, (mu, nu, count)


@dataclasses.dataclass(frozen=True)
class Custom(RowOptimizer):
    """A user's pure ``fn(rows, grads, state) -> (rows, state)`` with its state tables."""

    fn: Callable
    specs: tuple[StateSpec, ...] = ()
    name = "custom"

    @property
    def state(self):
        return self.specs

    def update(self, rows, grads, state):
        out = self.fn(rows, grads, state)
        if not (isinstance(out, tuple | list) and len(out) == 2):
            raise TypeError("a custom optimizer's fn(rows, grads, state) must return "
                            f"(rows, state), got {type(out).__name__}")
        new_rows, new_state = out
        if not isinstance(new_state, tuple | list) or len(new_state) != len(state):
            raise ValueError(f"a custom optimizer's fn must return its {len(state)} state "
                             "arrays as a tuple, in the order of its state specs")
        return new_rows, tuple(new_state)


def sgd(learning_rate: float) -> SGD:
    """Plain SGD, ``optax.sgd(learning_rate)``; no state."""
    return SGD(float(learning_rate))


def adagrad(learning_rate: float, initial_accumulator_value: float = 0.1,
            eps: float = 1e-7) -> Adagrad:
    """Element-wise Adagrad, ``optax.adagrad``'s arguments and defaults; one state table
    shaped like the table. Untouched rows see a zero gradient, so this is optax's whole
    update, not only the touched rows'."""
    return Adagrad(float(learning_rate), float(initial_accumulator_value), float(eps))


def rowwise_adagrad(learning_rate: float, eps: float = 1e-8,
                    initial_accumulator_value: float = 0.0) -> RowwiseAdagrad:
    """FBGEMM's row-wise Adagrad (its ``EXACT_ROWWISE_ADAGRAD``); one ``(N,)`` float32
    state table."""
    return RowwiseAdagrad(float(learning_rate), float(eps), float(initial_accumulator_value))


def adam(learning_rate: float, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8,
         eps_root: float = 0.0) -> Adam:
    """Lazy Adam, ``optax.adam``'s arguments and defaults on the rows a batch touches;
    state: the two moments (shaped like the table, float32) and each row's step count
    (``(N,)`` int32), which the bias correction uses."""
    return Adam(float(learning_rate), float(b1), float(b2), float(eps), float(eps_root))


def custom_optimizer(fn: Callable, state: tuple | list = ()) -> Custom:
    """A user's optimizer: ``fn(rows, grads, state) -> (rows, state)``, pure, over a batch's
    distinct rows (``(B, ...)``, in the compute dtype), their summed gradients and a tuple
    of its state rows; ``state``: one :class:`StateSpec` per state table."""
    if not callable(fn):
        raise TypeError(f"custom_optimizer: fn must be callable, got {type(fn).__name__}")
    state = tuple(state)
    if not all(isinstance(s, StateSpec) for s in state):
        raise TypeError("custom_optimizer: state must be a tuple of cached_table.StateSpec, "
                        "e.g. (StateSpec(shape=(), init=0.0),) for one value per row")
    return Custom(fn, state)


def check_optimizer(optimizer: Any) -> None:
    if optimizer is not None and not isinstance(optimizer, RowOptimizer):
        raise TypeError("optimizer must be made by cached_table.sgd, adagrad, "
                        "rowwise_adagrad, adam or custom_optimizer, got "
                        f"{type(optimizer).__name__}")


def fenced(fn: Callable, *args):
    """``fn(*args)`` with its inputs and result materialized (``optimization_barrier``): XLA
    fuses a multiply and an add into one FMA, or not, by what surrounds them; fenced, an
    update's arithmetic is the same in every program (any cache size, prefetch or not)."""
    return lax.optimization_barrier(fn(*lax.optimization_barrier(args)))


def plus(rows: jax.Array, deltas: jax.Array) -> jax.Array:
    """``rows + deltas`` in the compute dtype, rounded once to the rows' dtype."""
    def add(rows, deltas):
        dtype = compute_dtype(rows.dtype)
        return (rows.astype(dtype) + deltas.astype(dtype)).astype(rows.dtype)

    return fenced(add, rows, deltas)


def apply_optimizer(optimizer: RowOptimizer, values: tuple, grads: jax.Array) -> tuple:
    """The new rows and state rows (as stored: each table's dtype) of a batch's distinct
    rows ``values`` (the table's, then its state's) with summed ``grads``."""
    k = len(optimizer.state)
    return fenced(lambda v, g: _apply(optimizer, v, g), tuple(values[:1 + k]), grads)


def _apply(optimizer: RowOptimizer, values: tuple, grads: jax.Array) -> tuple:
    rows, state = values[0], values[1:]
    dtype = compute_dtype(rows.dtype)
    new_rows, new_state = optimizer.update(rows.astype(dtype), grads.astype(dtype), state)
    if new_rows.shape != rows.shape:
        raise ValueError(f"the optimizer returned rows of shape {new_rows.shape}, the rows "
                         f"are {rows.shape}")
    for s, t in zip(new_state, state, strict=True):
        if s.shape != t.shape:
            raise ValueError(f"the optimizer returned a state of shape {s.shape} for one "
                             f"of {t.shape}")
    return (new_rows.astype(rows.dtype), *(s.astype(t.dtype) for s, t in
                                          zip(new_state, state, strict=True)))


def sum_runs(values: jax.Array, order: jax.Array, start: jax.Array, run: jax.Array,
             dtype) -> jax.Array:
    """Per-entry ``values`` summed over each run of equal keys, in a fixed order.

    ``order``: a stable sort of the entries by key; ``start``: where a run begins in that
    order; ``run``: each sorted position's run number. The sum of run ``r`` lands in row
    ``r`` of the result (zeros past the last run). A run is summed as a pairwise tree over
    its entries in entry order, positioned from the run's own start: the same bits wherever
    the run sits in the batch and whatever else the batch holds (no scatter-add, whose
    order XLA does not promise).
    """
    v = lax.optimization_barrier(values).astype(dtype)[order]  # as :func:`fenced`
    b = v.shape[0]
    pos = jnp.arange(b, dtype=jnp.int32)
    offset = pos - lax.cummax(jnp.where(start, pos, 0))
    # The first position of the next run, for each position.
    starts_after = jnp.concatenate([jnp.where(start[1:], pos[1:], b), jnp.full((1,), b,
                                                                               jnp.int32)])
    end = lax.cummin(starts_after, reverse=True)
    width = 1
    while width < b:
        shifted = jnp.concatenate([v[width:], jnp.zeros((width, *v.shape[1:]), v.dtype)])
        take = (offset % (2 * width) == 0) & (pos + width < end)
        v = jnp.where(_per_row(take, v), v + shifted, v)
        width *= 2
    return jnp.zeros_like(v).at[jnp.where(start, run, b)].set(v, mode="drop",
                                                              unique_indices=True)
