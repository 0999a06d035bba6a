"""``scatter_to_host``: ``x.at[indices].set(updates)`` along axis 0, straight into host memory.

Read top to bottom: the public function validates, then ``_scatter_traced``
chooses a path (a kernel for a host buffer on a CUDA GPU, XLA otherwise), and
``_kernel_path`` prepares the rows and launches the kernel.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from pallas_pinned import _backends, _placement, _rows, _sharded, _validation
from pallas_pinned._in_place import InPlaceConfig, in_place_op, transpose_to_updates
from pallas_pinned.kernels import pallas_common, scatter_pallas
from pallas_pinned.reference import scatter_rows_reference

__all__ = ["scatter_to_host"]


def scatter_to_host(
    x: jax.Array,
    indices: Any,
    updates: Any,
    *,
    mode: str | None = None,
    unique_indices: bool = False,
    indices_are_sorted: bool = False,
    backend: str = "auto",
) -> jax.Array:
    """Returns ``x.at[indices].set(updates, mode=mode)`` along axis 0.

    Built for ``x`` in ``pinned_host`` memory of a GPU: a kernel takes indices
    and updates from device memory and stores the rows straight into the host
    buffer over PCIe, without copying the buffer. Any other ``x`` (device
    memory, CPU-only JAX) gets the same semantics through XLA.

    Args:
      x: the buffer, at least 1-D, of a supported dtype, on one device.
      indices: rows along axis 0: a Python int, an integer array of any shape
        (numpy or jax, any memory kind, same device as ``x``), a list of ints,
        or a static slice. Values are compared at full width: an int64 index
        past the buffer is out of range, never truncated onto a real row.
      updates: broadcast to ``indices.shape + x.shape[1:]`` (for a slice, its
        length) and cast to ``x.dtype`` as jnp does (with its FutureWarning
        for lossy casts).
      mode: ``None``, ``"drop"`` or ``"fill"`` (negative indices wrap once as in numpy,
        rows still out of range are skipped), ``"clip"``, or
        ``"promise_in_bounds"`` (no bounds check at all: an out-of-range index
        writes outside the buffer; use only when you know).
      unique_indices: promise that no row repeats (skips de-duplication).
      indices_are_sorted: promise that the normalized rows ascend (skips the sort).
      backend: ``"auto"`` (the kernel for host buffers on CUDA, XLA otherwise),
        ``"pallas"`` (the Pallas kernel, CUDA only), ``"triton"`` (the raw
        Triton kernel through jax-triton, CUDA only, needs the ``triton``
        extra), ``"interpret"`` (the Pallas kernel in interpret mode, any
        platform) or ``"xla"``.

    Returns:
      The updated buffer, on ``x``'s device and memory kind. Duplicate rows:
      the last occurrence in ``indices`` (row-major) wins. Outside ``jit`` the
      update happens in place and ``x`` is consumed, as if donated; inside
      ``jit`` the enclosing ``donate_argnums`` decides (without donation XLA
      copies the buffer first).

    Raises:
      TypeError, ValueError, NotImplementedError: for bad input, before
        anything runs; ``x`` is then left untouched.
    """
    if _sharded.is_sharded_buffer(x):
        return _sharded.scatter(
            x, indices, updates, mode=mode, unique_indices=unique_indices,
            indices_are_sorted=indices_are_sorted, backend=backend,
        )
    index = _validation.check_in_place_call(x, indices, updates, mode=mode, backend=backend)
    cfg = InPlaceConfig.of_call(
        index, mode=mode, unique_indices=unique_indices,
        indices_are_sorted=indices_are_sorted, backend=backend,
    )
    return _scatter_op(x, index.rows, updates, cfg)


def _scatter_traced(x, rows, updates, cfg: InPlaceConfig):
    if math.prod(cfg.index_shape) == 0 or x.size == 0:
        return x
    if cfg.backend == "xla":
        return _xla_path(x, rows, updates, cfg)
    if cfg.backend != "auto":
        return _kernel_path(x, rows, updates, cfg, backend=cfg.backend)
    # "auto": the kernel pays off only for host buffers of a CUDA GPU; device
    # memory is XLA's own scatter's home turf.
    kernel_backend = None
    if _placement.on_host(x):
        kernel_backend = _backends.auto_kernel_backend("set", x.dtype, math.prod(cfg.index_shape))
    fits = kernel_backend == "triton" or pallas_common.offsets_fit(x.shape, x.dtype)
    if kernel_backend is None or not fits:
        return _xla_path(x, rows, updates, cfg)
    return lax.platform_dependent(
        x,
        rows,
        updates,
        cuda=functools.partial(_kernel_path, cfg=cfg, backend=kernel_backend),
        default=functools.partial(_xla_path, cfg=cfg),
    )


def _rows_and_updates(x, rows, updates, cfg: InPlaceConfig):
    """Normalized flat rows and ``(n, d)`` updates of x's dtype, in device memory."""
    rows = _rows.normalize_rows(_placement.to_device_memory(rows), x.shape[0], cfg.mode)
    return rows, cfg.updates_2d(x, updates)


def _xla_path(x, rows, updates, cfg: InPlaceConfig):
    rows, updates = _rows_and_updates(x, rows, updates, cfg)
    out = scatter_rows_reference(x.reshape(x.shape[0], -1), rows, updates, unique=cfg.unique)
    return out.reshape(x.shape)


def _kernel_path(x, rows, updates, cfg: InPlaceConfig, *, backend: str):
    num_rows, num_updates = x.shape[0], math.prod(cfg.index_shape)
    limits = cfg.thresholds
    if backend != "triton" and num_updates <= limits.fused_max_updates:
        return _fused_kernel_path(x, rows, updates, cfg, backend=backend)
    rows, updates = _rows_and_updates(x, rows, updates, cfg)
    # Duplicates must be resolved before the kernel runs (its programs write
    # in parallel); sorting also turns scattered PCIe writes into ascending ones.
    sort_for_locality = (
        limits.coalesce and not cfg.ascending and num_updates >= limits.sort_min_updates
    )
    dedupe = not cfg.unique or sort_for_locality
    src = None
    if dedupe and not cfg.ascending and num_updates <= limits.small_dedupe_max:
        rows = _rows.drop_superseded_small(rows, num_rows)
    elif dedupe:
        rows, src = _rows.dedupe_last_wins(rows, num_rows, presorted=cfg.ascending)
    # De-duplication marks superseded rows past the end: those must always be
    # masked, even when the caller promised in-bounds indices.
    check_bounds = dedupe or cfg.mode != "promise_in_bounds"
    out = _launch(backend, x.reshape(num_rows, -1), rows, src, updates, check_bounds=check_bounds)
    return _placement.place_result(out, x).reshape(x.shape)


def _fused_kernel_path(x, rows, updates, cfg: InPlaceConfig, *, backend: str):
    """Small batches: one launch that normalizes and de-duplicates by itself."""
    # widen is a no-op for int32 (int64 with x64) indices.
    rows = _rows.widen(_placement.to_device_memory(rows))
    out = scatter_pallas.scatter_rows_fused(
        x.reshape(x.shape[0], -1),
        rows,
        cfg.updates_2d(x, updates),
        mode=cfg.mode,
        drop_superseded=not cfg.unique,
        interpret=backend == "interpret",
    )
    return _placement.place_result(out, x).reshape(x.shape)


def _launch(backend: str, x2d, rows, src, updates, *, check_bounds: bool):
    if backend == "triton":
        # Imported here: jax-triton and triton are an optional extra.
        from pallas_pinned.kernels import scatter_triton

        return scatter_triton.scatter_rows_triton(
            x2d, rows, src, updates, check_bounds=check_bounds
        )
    return scatter_pallas.scatter_rows(
        x2d, rows, src, updates, check_bounds=check_bounds, interpret=backend == "interpret"
    )


# --- transformations: grad w.r.t. updates, clear refusals otherwise ----------


def _updates_vjp(cfg: InPlaceConfig, residuals, cotangent):
    """Each update receives the cotangent of the row it won, zero if it lost or dropped."""
    shape, rows, updates = residuals
    num_rows = shape[0]
    rows = _rows.normalize_rows(_placement.to_device_memory(rows), num_rows, cfg.mode)
    kept_sorted, src = _rows.dedupe_last_wins(rows, num_rows)
    survives = jnp.zeros(rows.shape, bool).at[src].set(
        _rows.rows_in_range(kept_sorted, num_rows), unique_indices=True
    )
    flat = _placement.to_device_memory(cotangent).reshape(num_rows, -1)
    picked = jnp.where(survives[:, None], flat[jnp.clip(rows, 0, num_rows - 1)], 0)
    picked = picked.reshape(cfg.index_shape + tuple(shape[1:]))
    return transpose_to_updates(picked, updates)


_scatter_op = in_place_op(
    _scatter_traced, _updates_vjp, op_name="scatter_to_host", batch_effect="later sets win"
)
