"""``scatter_add_to_host``: ``x.at[indices].add(updates)`` along axis 0, in host memory.

Read top to bottom: the public function validates, then ``_add_traced``
chooses a path (a kernel for a host buffer on a CUDA GPU, XLA otherwise), and
``_kernel_add`` combines duplicate rows on the device and launches the kernel,
which reads, adds and writes each distinct row once.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from pallas_pinned import _backends, _host_xla, _placement, _rows, _sharded, _validation
from pallas_pinned._in_place import InPlaceConfig, in_place_op, transpose_to_updates
from pallas_pinned.kernels import pallas_common, scatter_add_pallas
from pallas_pinned.reference import gather_rows_reference, scatter_add_rows_reference

__all__ = ["scatter_add_to_host"]


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
    so the result is deterministic), then a kernel reads each distinct row
    once over PCIe, adds, and writes it back into the host buffer, which is
    never copied. Any other ``x`` gets the same arithmetic through XLA.

    Args:
      x: the buffer, at least 1-D; any supported dtype except bool (jnp's
        ``.add`` refuses bool too).
      indices: rows along axis 0, in the forms :func:`scatter_to_host` takes.
      updates: broadcast to ``indices.shape + x.shape[1:]`` and cast to
        ``x.dtype`` first, as for :func:`scatter_to_host`.
      mode: ``None``/``"drop"``/``"fill"`` (negatives wrap once, rows still out of range
        are skipped), ``"clip"``, or ``"promise_in_bounds"`` (no bounds check:
        an out-of-range index writes outside the buffer).
      unique_indices: promise that no row repeats (skips combining; ignored
        with ``"clip"``, which can make rows repeat).
      indices_are_sorted: promise that the normalized rows ascend (skips sorts).
      backend: ``"auto"``, ``"pallas"``, ``"triton"``, ``"interpret"`` or
        ``"xla"``, as for :func:`scatter_to_host`.

    Returns:
      The updated buffer, on ``x``'s device and memory kind. Sums are formed
      in float32 for float16/bfloat16 (rounded once per row, so they can
      differ from jnp's, which rounds after every addition) and in ``x.dtype``
      otherwise (integers wrap). The summation order within a row is fixed,
      so repeated calls give the same bits. Outside ``jit`` ``x`` is consumed,
      as if donated; inside ``jit`` the enclosing ``donate_argnums`` decides.

    Raises:
      TypeError, ValueError, NotImplementedError: for bad input, before
        anything runs; ``x`` is then left untouched. Under ``jax.grad`` with
        respect to ``x``: TypeError (with respect to ``updates`` it works).
        Under ``jax.vmap``: NotImplementedError naming the alternative.
    """
    if _sharded.is_sharded_buffer(x):
        return _sharded.scatter_add(
            x, indices, updates, mode=mode, unique_indices=unique_indices,
            indices_are_sorted=indices_are_sorted, backend=backend,
        )
    if getattr(x, "dtype", None) == jnp.bool_:
        # jnp's .add refuses bool as well; OR-accumulation would be .max.
        raise TypeError(
            f"scatter_add_to_host does not add into a bool buffer (x has dtype {x.dtype}), "
            "as jnp's .at[].add does not; use scatter_to_host with the OR computed on the "
            "device, or store the flags as uint8"
        )
    index = _validation.check_in_place_call(x, indices, updates, mode=mode, backend=backend)
    # The kernel also addresses the (n, d) update rows.
    updates_2d = (math.prod(index.shape), math.prod(x.shape[1:]))
    _validation.check_offsets(backend, "updates", updates_2d, x.dtype)
    cfg = InPlaceConfig.of_call(
        index, mode=mode, unique_indices=unique_indices,
        indices_are_sorted=indices_are_sorted, backend=backend,
    )
    return _add_op(x, index.rows, updates, cfg)


def _add_traced(x, rows, updates, cfg: InPlaceConfig):
    if math.prod(cfg.index_shape) == 0 or x.size == 0:
        return x
    rows = _rows.normalize_rows(_placement.to_device_memory(rows), x.shape[0], cfg.mode)
    updates2d = cfg.updates_2d(x, updates)
    x2d = x.reshape(x.shape[0], -1)
    kernel = functools.partial(_kernel_add, cfg=cfg)
    if cfg.backend == "xla":
        out = _xla_add(x2d, rows, updates2d, cfg)
    elif cfg.backend != "auto":
        out = kernel(x2d, rows, updates2d, backend=cfg.backend)
    else:
        # "auto": the kernel pays off only for host buffers of a CUDA GPU.
        kernel_backend = None
        if _placement.on_host(x2d):
            kernel_backend = _backends.auto_kernel_backend("add", x2d.dtype, rows.shape[0])
        fits = kernel_backend == "triton" or (
            pallas_common.offsets_fit(x2d.shape, x2d.dtype)
            and pallas_common.offsets_fit(updates2d.shape, x2d.dtype)
        )
        if kernel_backend is None or not fits:
            out = _xla_add(x2d, rows, updates2d, cfg)
        else:
            out = lax.platform_dependent(
                x2d,
                rows,
                updates2d,
                cuda=functools.partial(kernel, backend=kernel_backend),
                default=functools.partial(_xla_add, cfg=cfg),
            )
    return out.reshape(x.shape)


def _xla_add(x2d, rows, updates2d, cfg: InPlaceConfig):
    if not _placement.on_host(x2d):
        return scatter_add_rows_reference(x2d, rows, updates2d, unique=cfg.rows_distinct)
    # The reference's steps, with the row reads and writes done on the host
    # buffer itself and all the arithmetic on the device.
    values = updates2d.astype(_rows.add_accumulator_dtype(x2d.dtype))
    if not cfg.rows_distinct and rows.shape[0] > 1:
        rows, values = _rows.combine_duplicates(
            rows, values, x2d.shape[0], small_max=cfg.thresholds.small_combine_max
        )
    summed = (_host_xla.gather_rows(x2d, rows).astype(values.dtype) + values).astype(x2d.dtype)
    return _host_xla.set_distinct_rows(x2d, rows, summed)


def _kernel_add(x2d, rows, updates2d, cfg: InPlaceConfig, *, backend: str):
    num_rows, num_updates = x2d.shape[0], rows.shape[0]
    acc = _rows.add_accumulator_dtype(x2d.dtype)
    src = None
    check_bounds = cfg.mode != "promise_in_bounds"
    if not cfg.rows_distinct and num_updates > 1:
        # One distinct row per kernel entry, summed on the device first; the
        # skip markers it leaves behind must always be masked.
        rows, updates2d = _rows.combine_duplicates(
            rows,
            updates2d.astype(acc),
            num_rows,
            presorted=cfg.ascending,
            small_max=cfg.thresholds.small_combine_max,
        )
        check_bounds = True
    elif (
        cfg.thresholds.coalesce
        and not cfg.ascending
        and num_updates >= cfg.thresholds.sort_min_adds
    ):
        # Distinct rows: sort only for address locality.
        rows, src = lax.sort((rows, lax.iota(jnp.int32, num_updates)), num_keys=1)
    out = _launch(backend, x2d, rows, src, updates2d, acc_dtype=acc, check_bounds=check_bounds)
    return _placement.place_result(out, x2d)


def _launch(backend: str, x2d, rows, src, updates2d, *, acc_dtype, check_bounds: bool):
    if backend == "triton":
        # Imported here: jax-triton and triton are an optional extra.
        from pallas_pinned.kernels import scatter_add_triton

        return scatter_add_triton.scatter_add_rows_triton(
            x2d, rows, src, updates2d, acc_dtype=acc_dtype, check_bounds=check_bounds
        )
    return scatter_add_pallas.scatter_add_rows(
        x2d,
        rows,
        src,
        updates2d,
        acc_dtype=acc_dtype,
        check_bounds=check_bounds,
        interpret=backend == "interpret",
    )


# --- transformations: grad w.r.t. updates, clear refusals otherwise ----------


def _updates_vjp(cfg: InPlaceConfig, residuals, cotangent):
    """d out[rows[k]] / d updates[k] = 1 for every update that lands, duplicates included.

    Dropped updates get zero, clipped ones the cotangent of the row they were
    clipped to.
    """
    shape, rows, updates = residuals
    num_rows = shape[0]
    rows = _rows.normalize_rows(_placement.to_device_memory(rows), num_rows, cfg.mode)
    flat = _placement.to_device_memory(cotangent).reshape(num_rows, -1)
    picked = gather_rows_reference(flat, rows).reshape(cfg.index_shape + tuple(shape[1:]))
    return transpose_to_updates(picked, updates)


_add_op = in_place_op(
    _add_traced, _updates_vjp, op_name="scatter_add_to_host", batch_effect="all sets are added"
)
