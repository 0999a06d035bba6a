"""``scatter_add_to_host``: the public op, its validation, dispatch and transformations."""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from pallas_pinned import _indexing
from pallas_pinned._gather import _dispatch_gather, _xla_gather
from pallas_pinned._in_place import in_place_op, transpose_to_updates
from pallas_pinned._scatter import (
    _check_backend_available,
    _on_host,
    _rows_and_updates,
    _to_device_memory,
)
from pallas_pinned.kernels import scatter_add_pallas, scatter_pallas
from pallas_pinned.reference import (
    add_accumulator_dtype,
    combine_duplicates,
    scatter_add_rows_reference,
)

__all__ = ["scatter_add_to_host"]

# Below this many updates with unique indices, sorting them costs more than
# the address locality it buys. Not yet measured for read-add-write: this is
# the write crossover of scatter_to_host (16 Ki, H200). Duplicates are always
# sorted (that is how they are combined). Read at call time; tests patch it.
SORT_MIN_ADDS = 16384


@dataclasses.dataclass(frozen=True)
class _AddConfig:
    """Everything static about one call; hashable, so it keys jit's cache.

    ``index_shape`` and ``mode`` have the meaning they have in scatter_to_host's
    config (``_rows_and_updates`` reads them).
    """

    index_shape: tuple[int, ...]
    mode: str | None
    unique: bool
    ascending: bool
    backend: str
    sort_min: int = SORT_MIN_ADDS

    @property
    def rows_distinct(self) -> bool:
        # Clipping can map distinct out-of-range indices onto the same edge
        # row, and two read-add-writes of one row would lose an addition.
        return self.unique and self.mode != "clip"


# --- the two paths -----------------------------------------------------------


def _xla_add(x2d, rows, updates2d, cfg: _AddConfig):
    if not _on_host(x2d):
        return scatter_add_rows_reference(x2d, rows, updates2d, unique=cfg.rows_distinct)
    # The same steps as the reference, with the row reads and writes done on
    # the host buffer itself (XLA wants one memory space per op) and all the
    # arithmetic on the device.
    values = updates2d.astype(add_accumulator_dtype(x2d.dtype))
    if not cfg.rows_distinct and rows.shape[0] > 1:
        rows, values = combine_duplicates(rows, values, x2d.shape[0])
    summed = (_xla_gather(x2d, rows).astype(values.dtype) + values).astype(x2d.dtype)
    host = jax.memory.Space.Host
    return x2d.at[jax.device_put(rows, host)].set(
        jax.device_put(summed, host),
        mode="drop",
        unique_indices=True,
        wrap_negative_indices=False,  # Skip markers are dropped, never wrapped.
    )


def _kernel_add(x2d, rows, updates2d, cfg: _AddConfig, *, interpret: bool):
    num_rows, num_updates = x2d.shape[0], rows.shape[0]
    acc = add_accumulator_dtype(x2d.dtype)
    src = None
    check_bounds = cfg.mode != "promise_in_bounds"
    if not cfg.rows_distinct and num_updates > 1:
        # One distinct row per kernel entry, summed on the device first; the
        # skip markers it leaves behind must always be masked.
        rows, updates2d = combine_duplicates(
            rows, updates2d.astype(acc), num_rows, presorted=cfg.ascending
        )
        check_bounds = True
    elif not cfg.ascending and num_updates >= cfg.sort_min:
        # Distinct rows: sort only for address locality.
        rows, src = lax.sort((rows, lax.iota(jnp.int32, num_updates)), num_keys=1)
    out = scatter_add_pallas.scatter_add_rows(
        x2d, rows, src, updates2d, acc_dtype=acc, check_bounds=check_bounds, interpret=interpret
    )
    if _on_host(x2d):
        # pallas_call declares its outputs in device memory; the result is the
        # aliased host buffer, so say where it lives and XLA keeps it there.
        out = jax.device_put(out, jax.memory.Space.Host)
    return out


def _kernel_offsets_fit(x2d, updates_shape) -> bool:
    return scatter_pallas.offsets_fit(x2d.shape, x2d.dtype) and scatter_pallas.offsets_fit(
        updates_shape, x2d.dtype
    )


def _add_traced(x, rows, updates, cfg: _AddConfig):
    if math.prod(cfg.index_shape) == 0 or x.size == 0:
        return x
    rows, updates2d = _rows_and_updates(x, rows, updates, cfg)
    x2d = x.reshape(x.shape[0], -1)
    kernel = functools.partial(_kernel_add, cfg=cfg)
    if cfg.backend == "xla":
        out = _xla_add(x2d, rows, updates2d, cfg)
    elif cfg.backend in ("pallas", "interpret"):
        out = kernel(x2d, rows, updates2d, interpret=cfg.backend == "interpret")
    elif not _on_host(x2d) or not _kernel_offsets_fit(x2d, updates2d.shape):
        # "auto" on device memory: XLA's own home turf.
        out = _xla_add(x2d, rows, updates2d, cfg)
    else:
        out = lax.platform_dependent(
            x2d,
            rows,
            updates2d,
            cuda=functools.partial(kernel, interpret=False),
            default=functools.partial(_xla_add, cfg=cfg),
        )
    return out.reshape(x.shape)


# --- transformations: grad w.r.t. updates, clear refusals otherwise ----------


def _updates_vjp(cfg: _AddConfig, residuals, cotangent):
    shape, rows, updates = residuals
    num_rows = shape[0]
    # d out[rows[k]] / d updates[k] = 1 for every update that lands (all of
    # them add, duplicates included); dropped ones get zero, clipped ones the
    # cotangent of the row they were clipped to.
    rows = _indexing.normalize_rows(_to_device_memory(rows), num_rows, cfg.mode)
    flat = cotangent.reshape(num_rows, -1)
    picked = _dispatch_gather(
        flat, rows, backend=cfg.backend, ascending=cfg.ascending, sort_min=cfg.sort_min
    )
    picked = jax.device_put(picked, jax.memory.Space.Device)
    picked = picked.reshape(cfg.index_shape + tuple(shape[1:]))
    return transpose_to_updates(picked, updates)


_add_op = in_place_op(
    _add_traced, _updates_vjp, op_name="scatter_add_to_host", batch_effect="all sets are added"
)


# --- validation and the public op --------------------------------------------


def _check_addable(x) -> None:
    if jnp.dtype(x.dtype) == jnp.bool_:
        # jnp's .add refuses bool as well; OR-accumulation would be .max.
        raise TypeError(
            f"scatter_add_to_host does not add into a bool buffer (x has dtype {x.dtype}), "
            "as jnp's .at[].add does not; use scatter_to_host with the OR computed on the "
            "device, or store the flags as uint8"
        )


def _check_update_offsets(x, index_shape, backend: str) -> None:
    # The kernel also addresses the (n, d) update rows with 32-bit offsets.
    shape = (math.prod(index_shape), math.prod(x.shape[1:]))
    if backend == "pallas" and not scatter_pallas.offsets_fit(shape, x.dtype):
        raise NotImplementedError(
            f"backend='pallas' cannot address {math.prod(shape)} {x.dtype} update elements: "
            "Pallas uses 32-bit signed offsets for 1-byte arrays of 2-4 GiB; use "
            "backend='auto' (falls back to XLA) or split the updates into smaller calls"
        )


def scatter_add_to_host(
    x: jax.Array,
    indices: Any,
    updates: Any,
    *,
    mode: str | None = None,
    unique_indices: bool = False,
    indices_are_sorted: bool = False,
    backend: str = "auto",
) -> jax.Array:
    """Returns ``x.at[indices].add(updates, mode=mode)`` along axis 0.

    Built for ``x`` in ``pinned_host`` memory of a GPU: updates of the same row
    are summed on the device first (a stable sort and a segmented prefix sum,
    so the result is deterministic), then a Pallas kernel reads each distinct
    row once over PCIe, adds, and writes it back into the host buffer, which
    is never copied. Any other ``x`` gets the same arithmetic through XLA.

    Args:
      x: the buffer, at least 1-D; any supported dtype except bool (jnp's
        ``.add`` refuses bool too).
      indices: rows along axis 0, in the forms :func:`scatter_to_host` takes.
      updates: broadcast to ``indices.shape + x.shape[1:]`` and cast to
        ``x.dtype`` first, as for :func:`scatter_to_host`.
      mode: ``None``/``"drop"`` (negatives wrap once, rows still out of range
        are skipped), ``"clip"``, or ``"promise_in_bounds"`` (no bounds check:
        an out-of-range index writes outside the buffer).
      unique_indices: promise that no row repeats (skips combining; ignored
        with ``"clip"``, which can make rows repeat).
      indices_are_sorted: promise that the normalized rows ascend (skips sorts).
      backend: ``"auto"``, ``"pallas"``, ``"interpret"`` or ``"xla"``, as for
        :func:`scatter_to_host`.

    Returns:
      The updated buffer, with ``x``'s device, sharding and memory kind. Sums
      are formed in float32 for float16/bfloat16 (rounded once per row, so
      they can differ from jnp's, which rounds after every addition) and in
      ``x.dtype`` otherwise (integers wrap). The summation order within a row
      is fixed, so repeated calls give the same bits. Outside ``jit`` ``x`` is
      consumed, as if donated; inside ``jit`` the enclosing
      ``donate_argnums`` decides.

    Raises:
      TypeError, ValueError, NotImplementedError: for bad input, before
        anything runs; ``x`` is then left untouched. Under ``jax.grad`` with
        respect to ``x``: TypeError (with respect to ``updates`` it works).
        Under ``jax.vmap``: NotImplementedError naming the alternative.
    """
    _indexing.check_mode_and_backend(mode, backend)
    _indexing.check_buffer(x)
    _check_addable(x)
    index = _indexing.parse_index(indices, x.shape[0])
    _indexing.check_updates(updates, index.shape + tuple(x.shape[1:]))
    _indexing.check_same_device(x, indices, updates)
    _check_backend_available(x, backend)
    _check_update_offsets(x, index.shape, backend)
    cfg = _AddConfig(
        index_shape=index.shape,
        mode=mode,
        unique=bool(unique_indices) or index.unique,
        ascending=bool(indices_are_sorted) or index.ascending,
        backend=backend,
        sort_min=SORT_MIN_ADDS,
    )
    return _add_op(x, index.rows, updates, cfg)
