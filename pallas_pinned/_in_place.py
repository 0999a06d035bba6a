"""The wrapper shared by the ops that update a buffer in place: transformations and donation.

``scatter_to_host`` and ``scatter_add_to_host`` both write into ``x`` through
an aliased kernel, so both refuse ``jax.vmap`` (there is one buffer) and a
gradient with respect to ``x`` (its cotangent would be a second buffer of the
same size), and differentiate with respect to ``updates`` by a rule of their
own. Called outside ``jit`` they donate ``x`` to a jit whose result is placed
exactly where ``x`` is. This module builds that wrapper once for both.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable

import jax
import jax.numpy as jnp

from pallas_pinned import _placement, tuning


@dataclasses.dataclass(frozen=True)
class InPlaceConfig:
    """Everything static about one set or add call; hashable, so it keys jit's cache."""

    index_shape: tuple[int, ...]
    mode: str | None
    unique: bool
    ascending: bool
    backend: str
    thresholds: tuning.Thresholds

    @classmethod
    def of_call(cls, index, *, mode, unique_indices, indices_are_sorted, backend):
        """The call's settings, its index form's own guarantees and the current thresholds."""
        return cls(
            index_shape=index.shape,
            mode=mode,
            unique=bool(unique_indices) or index.unique,
            ascending=bool(indices_are_sorted) or index.ascending,
            backend=backend,
            thresholds=tuning.current(),
        )

    def updates_2d(self, x, updates):
        """``updates`` as the ``(n, d)`` rows the kernels read: x's dtype, device memory.

        Broadcast and cast as jnp does; for updates already of that shape and
        dtype every step is a no-op, so nothing is launched.
        """
        updates = jnp.asarray(_placement.to_device_memory(updates)).astype(x.dtype)
        updates = jnp.broadcast_to(updates, self.index_shape + tuple(x.shape[1:]))
        return updates.reshape(math.prod(self.index_shape), math.prod(x.shape[1:]))

    @property
    def rows_distinct(self) -> bool:
        # Clipping can map distinct out-of-range indices onto the same edge
        # row: "unique" promises distinct indices, not distinct rows.
        return self.unique and self.mode != "clip"


def _vmap_message(op_name: str, batch_effect: str) -> str:
    return (
        f"{op_name} does not support jax.vmap: it updates one buffer in place. Fold a batch "
        f"of index/update sets into one call, {op_name}(x, indices.reshape(-1), "
        f"updates.reshape((-1,) + x.shape[1:])) ({batch_effect}), or loop over buffers with "
        "lax.fori_loop / lax.scan"
    )


def _buffer_grad_message(op_name: str) -> str:
    return (
        f"{op_name} is not differentiable with respect to the buffer x: its cotangent would be "
        "a second buffer of x's full size. Differentiate with respect to updates only, and wrap "
        "the buffer in jax.lax.stop_gradient(x) if it is derived from differentiated values"
    )


def in_place_op(
    traced: Callable, updates_vjp: Callable, *, op_name: str, batch_effect: str
) -> Callable:
    """Wraps ``traced(x, rows, updates, cfg)`` with the rules above.

    ``updates_vjp(cfg, (x_shape, rows, updates), cotangent)`` returns the
    cotangent of ``updates``. The returned ``apply(x, rows, updates, cfg)``
    takes a static (hashable) ``cfg`` with an ``index_shape``: inside a trace
    it stages the op; outside, it runs it in place and consumes ``x`` (as if
    donated), or returns ``x`` untouched when there is nothing to write.
    Outside a trace, a buffer whose type disagrees with its sharding is first
    re-described (``_placement.fix_memory_space``, no copy), and the result
    is placed with ``x``'s own sharding, so the donated buffer and the result
    agree on their memory kind (jax 0.12 aborts the process when they do not).
    """
    vmap_message = _vmap_message(op_name, batch_effect)
    grad_message = _buffer_grad_message(op_name)

    @functools.cache
    def without_vmap(cfg):
        @jax.custom_batching.custom_vmap
        def call(x, rows, updates):
            return traced(x, rows, updates, cfg)

        @call.def_vmap
        def _reject(axis_size, in_batched, *args):
            raise NotImplementedError(vmap_message)

        return call

    @functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
    def op(x, rows, updates, cfg):
        return without_vmap(cfg)(x, rows, updates)

    def fwd(x, rows, updates, cfg):
        # symbolic_zeros: each argument says whether it is being differentiated.
        if x.perturbed:
            raise TypeError(grad_message)
        out = without_vmap(cfg)(x.value, rows.value, updates.value)
        return out, (x.value.shape, rows.value, updates.value)

    def bwd(cfg, residuals, cotangent):
        return None, None, updates_vjp(cfg, residuals, cotangent)

    op.defvjp(fwd, bwd, symbolic_zeros=True)

    @functools.cache
    def donating(sharding):
        return jax.jit(op, static_argnums=(3,), donate_argnums=(0,), out_shardings=sharding)

    def apply(x, rows, updates, cfg):
        if not isinstance(updates, jax.Array | jax.core.Tracer):
            updates = jnp.asarray(updates)  # custom_vjp wants arrays, not Python scalars.
        if isinstance(x, jax.core.Tracer):
            return op(x, rows, updates, cfg)
        if math.prod(cfg.index_shape) == 0 or x.size == 0:
            return x  # Nothing to write; the buffer stays as it is.
        x = _placement.fix_memory_space(x)
        return donating(x.sharding)(x, rows, updates, cfg)

    return apply


def transpose_to_updates(picked: jax.Array, updates: jax.Array) -> jax.Array:
    """Cotangent of ``updates`` from the per-row cotangent ``picked``.

    The forward cast ``updates`` to the buffer's dtype and broadcast it to
    ``picked.shape``; this applies the transpose of both (sums over broadcast
    axes, casts back).
    """
    _, to_updates = jax.vjp(
        lambda u: jnp.broadcast_to(u.astype(picked.dtype), picked.shape), updates
    )
    (cotangent,) = to_updates(picked)
    return cotangent
