"""The local layer of the reads: ``x.at[index].get()`` on one buffer, into device memory.

The public op validates and parses the index, then calls :func:`read`: a jit
outside a trace (``x`` is not consumed), :func:`read_traced` inside one.
That asks ``_registry.choose`` for the implementation: a block is one
``dynamic_slice`` (``_block``); every other form reads rows of a 2-D view of
the buffer, by XLA or a kernel, under the rules of :func:`_rows_op`:

* ``jax.vmap`` over the indices folds the batch into one read; over a host
  buffer it is refused (there is one buffer);
* differentiation with respect to a device buffer works as jnp's gather
  does; with respect to a host buffer it is refused while tracing (the
  cotangent would be as large as the buffer).
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
from jax import lax

from pallas_pinned import (
    _block,
    _placement,
    _read_rows,
    _registry,
    _rows,
    _validation,
    tuning,
)
from pallas_pinned._index import IndexPlan
from pallas_pinned.reference import gather_rows_reference

__all__ = ["ReadCall", "read", "read_traced"]

_DEVICE = jax.memory.Space.Device


@dataclasses.dataclass(frozen=True)
class ReadCall:
    """Everything static about one read; hashable, so it keys jit's cache."""

    plan: IndexPlan
    mode: str | None
    fill: _validation.StaticScalar
    promised_sorted: bool  # as written; _registry.choose decides what it skips
    backend: str
    thresholds: tuning.Thresholds

    @classmethod
    def of(cls, plan, *, mode, fill, indices_are_sorted, backend):
        """The call's settings and the current thresholds."""
        return cls(
            plan=plan,
            mode=mode,
            fill=_validation.StaticScalar(fill),
            promised_sorted=bool(indices_are_sorted),
            backend=backend,
            thresholds=tuning.current(),
        )

    op = "get"  # What _registry.choose reads of a call.
    promised_distinct = False
    one_copy = True  # A block read is one copy in every mode (a fill applies on the device).

    @property
    def fill_mode(self) -> bool:
        return self.mode in _validation.FILL_MODES

    def fill_value(self, dtype):
        value = self.fill.value
        return _validation.default_fill(dtype) if value is None else value


def read(x, facts: _placement.Facts, operands, call: ReadCall):
    """Runs (or, inside a trace, stages) the read; the result is in device memory.
    ``facts`` are ``x``'s (``_placement.facts``), checked."""
    if not facts.concrete:
        return _read_jit(x, operands, call)
    # Traces must see where x really is (_placement.fix_memory_space).
    return _placement.wait_for_result(_read_jit(facts.buffer, operands, call))


@functools.partial(jax.jit, static_argnames=("call",))
def _read_jit(x, operands, call: ReadCall):
    return read_traced(x, operands, call)


def read_traced(x, operands, call: ReadCall):
    plan = call.plan
    out_shape = plan.result_shape
    if math.prod(out_shape) == 0:
        return _placement.read_nothing_of(x, jnp.zeros(out_shape, x.dtype))
    if x.size == 0:  # An indexed axis is empty: only fill modes get here (checked up front).
        fill = call.fill_value(x.dtype)
        return _placement.read_nothing_of(x, lax.full(out_shape, fill, x.dtype))
    on_copies = _placement.on_each_copy(functools.partial(_read_copy, call=call), x, operands)
    if on_copies is not None:
        return on_copies  # A replicated buffer on an Explicit mesh: see on_each_copy.
    return _read_copy(x, operands, call)


def _read_copy(x, operands, call: ReadCall):
    """:func:`read_traced` of one whole array (a device's copy, or the only one)."""
    plan = call.plan
    out_shape = plan.result_shape
    # Index arrays may live in host memory; the row arithmetic runs on the device.
    operands = jax.tree.map(_placement.to_device_memory, operands)
    # Sharded over a mixed mesh's Explicit axes, they are gathered: every entry counts.
    operands = jax.tree.map(functools.partial(_placement.replicated_like, x), operands)
    route = _registry.choose(call, x)
    if route.path == "block":
        out = _block_op(call)(x, operands)
        return jax.device_put(out, _DEVICE)
    rows = plan.rows(operands, call.mode, read=True)
    row_mode = "drop" if call.fill_mode else "clip"
    rows = _rows.normalize_rows(_placement.to_device_memory(rows), plan.num_rows, row_mode)
    x2d = x.reshape(plan.num_rows, plan.width)
    out2d = jax.device_put(_rows_op(route)(x2d, rows), _DEVICE)
    out2d = fill_out_of_range(out2d, rows, call, x.dtype)
    return jax.device_put(out2d.reshape(out_shape), _DEVICE)


def fill_out_of_range(out2d, rows, call: ReadCall, dtype):
    """In a fill mode, the fill value in the ``(n, d)`` rows read where ``rows`` (the
    normalized rows of ``call``'s plan) are out of range; else ``out2d`` as it is."""
    if not call.fill_mode:
        return out2d
    # lax.full_like converts as jnp's own fill does (e.g. 1000 wraps in int8).
    fill = lax.full_like(out2d, call.fill_value(dtype))
    return jnp.where(_rows.rows_in_range(rows, call.plan.num_rows)[:, None], out2d, fill)


_HOST_GRAD_MESSAGE = (
    "gather_from_host cannot be differentiated with respect to a buffer in pinned_host "
    "memory (x of shape {shape}, dtype {dtype}): its gradient would be a dense array as "
    "large as the whole host buffer. Wrap x in jax.lax.stop_gradient if only other "
    "inputs matter, or gather from a device-memory array to get that gradient. If x "
    "comes from scatter_*_to_host(x0, i, u) and you differentiate with respect to u, "
    "read x0 before the write and apply u on the device: for unique rows, "
    "gather_from_host(x0, i) + u is what the updated rows read back as"
)

_HOST_VMAP_MESSAGE = (
    "jax.vmap over the buffer x of gather_from_host is not supported for x in pinned_host "
    "memory (batched x of shape {shape}); vmap over the indices only (the batch is "
    "folded into one gather), or loop over the buffers"
)


def _guarded(read_fn, tangent_fn, fold=None):
    """``read_fn(x, dyn)`` with the vmap and jvp rules of the module docstring.

    ``tangent_fn(x_dot, dyn)`` is the same read in plain jnp, linear in
    ``x_dot`` (JAX transposes it for grad). ``fold(read, axis_size, x, dyn,
    dyn_batched)``, when given, reads a batch of index operands (the batched ones
    along axis 0); else JAX batches ``read_fn``.
    """

    @jax.custom_batching.custom_vmap
    def batched_safe(x, dyn):
        return read_fn(x, dyn)

    @batched_safe.def_vmap
    def _vmap_rule(axis_size, in_batched, x, dyn):
        x_batched, dyn_batched = in_batched
        if x_batched and _placement.on_host(x):
            raise NotImplementedError(_HOST_VMAP_MESSAGE.format(shape=x.shape))
        if x_batched or fold is None:
            axes = (0 if x_batched else None, jax.tree.map(lambda b: 0 if b else None,
                                                           dyn_batched))
            return jax.vmap(read_fn, in_axes=axes)(x, dyn), True
        return fold(differentiable, axis_size, x, dyn, dyn_batched), True

    @jax.custom_jvp
    def differentiable(x, dyn):
        return batched_safe(x, dyn)

    @differentiable.defjvp
    def _jvp_rule(primals, tangents):
        x, dyn = primals
        if _placement.on_host(x):
            # TypeError, as the writes refuse a gradient for their buffer.
            raise TypeError(_HOST_GRAD_MESSAGE.format(shape=x.shape, dtype=x.dtype))
        x_dot, _ = tangents
        # Linear in x_dot, so JAX transposes it into a scatter-add for grad.
        return differentiable(x, dyn), tangent_fn(x_dot, dyn)

    return differentiable


def _fold_rows(read, axis_size, x2d, rows, rows_batched):
    # Only the indices are batched: one read over all of them.
    shape = (axis_size, rows.shape[1], x2d.shape[1])
    if rows.size == 0:  # An empty batch: no kernel gets zero rows to read.
        return _placement.read_nothing_of(x2d, jnp.zeros(shape, x2d.dtype))
    return read(x2d, rows.reshape(-1)).reshape(shape)


@functools.cache
def _rows_op(route: _registry.Plan):
    """The row read for one plan, with its rules (the tangent reads like jnp)."""
    return _guarded(functools.partial(_read_rows.read, plan=route), gather_rows_reference,
                    _fold_rows)


@functools.lru_cache(maxsize=256)  # One per static index value: bounded, as _front's plans.
def _block_op(call: ReadCall):
    def read_fn(x, operands, fill=None):
        fill = call.fill_value(x.dtype) if fill is None else fill
        return _block.read(x, call.plan, operands, mode=call.mode, fill=fill)

    # The tangent fills with zeros: a filled entry does not depend on x.
    return _guarded(read_fn, functools.partial(read_fn, fill=0),
                    functools.partial(_fold_blocks, read_fn))


def _fold_blocks(read_fn, read, axis_size, x, operands, batched):
    """A batch of block reads: JAX's batching of ``read_fn`` on a device buffer; on a
    host one, one copy per entry (``read``, with the rules, in a loop).

    Batched, a block's ``dynamic_slice`` becomes a gather, which XLA refuses on
    host memory ("memory_space of all inputs passed to gather must be the same").
    """
    if not _placement.on_host(x):
        axes = jax.tree.map(lambda b: 0 if b else None, batched)
        return jax.vmap(read_fn, in_axes=(None, axes))(x, operands)
    leaves, tree = jax.tree.flatten(operands)
    flags = jax.tree.leaves(batched)

    def one(batch_leaves):
        it = iter(batch_leaves)
        return read(x, tree.unflatten([next(it) if b else leaf
                                       for leaf, b in zip(leaves, flags, strict=True)]))

    return lax.map(one, [leaf for leaf, b in zip(leaves, flags, strict=True) if b])
