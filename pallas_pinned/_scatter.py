"""``scatter_to_host``: the public op, its validation and its dispatch."""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from pallas_pinned import _indexing
from pallas_pinned._in_place import in_place_op, transpose_to_updates
from pallas_pinned.kernels import scatter_pallas
from pallas_pinned.reference import (
    dedupe_last_wins,
    drop_superseded_small,
    scatter_rows_reference,
)

__all__ = ["scatter_to_host"]

# Below this many updates with unique indices, sorting them costs more than
# the address locality it buys. Measured on the H200 (benchmarks/results/
# tune_scatter_h200.log, 2026-12-02): unsorted vs sorted random unique rows
# tie near 16 Ki updates for 4- and 512-byte rows; at 64 Ki sorting is 1.7x
# (512 B) to 1.8x (4 B) faster, at 1 Mi 2.4x to 8.3x; below 4 Ki the sort's
# ~30-70 us of fixed cost loses. Results never depend on this choice.
SORT_MIN_UPDATES = 16384
# Up to this many updates, duplicates are resolved by an n x n comparison
# fused with the index normalization instead of a sort: one launch fewer.
SMALL_DEDUPE_MAX = 64


@dataclasses.dataclass(frozen=True)
class _Config:
    """Everything static about one call; hashable, so it keys jit's cache."""

    index_shape: tuple[int, ...]
    mode: str | None
    unique: bool
    ascending: bool
    backend: str
    coalesce: bool = True


def _memory_space(a: Any):
    return getattr(jax.typeof(a), "memory_space", None)


def _on_host(a: Any) -> bool:
    return _memory_space(a) == jax.memory.Space.Host


def _to_device_memory(a: Any) -> Any:
    # Indices and updates may arrive in pinned_host memory (as in the issue's
    # example); the kernel reads them from device memory.
    if isinstance(a, jax.Array | jax.core.Tracer) and _on_host(a):
        return jax.device_put(a, jax.memory.Space.Device)
    return a


def _rows_and_updates(x, rows, updates, cfg: _Config):
    """Normalized flat rows and ``(n, d)`` updates of x's dtype, in device memory."""
    rows, updates = _to_device_memory(rows), _to_device_memory(updates)
    num_rows = x.shape[0]
    width = math.prod(x.shape[1:])
    rows = _indexing.normalize_rows(rows, num_rows, cfg.mode)
    updates = jnp.asarray(updates).astype(x.dtype)
    updates = jnp.broadcast_to(updates, cfg.index_shape + x.shape[1:])
    return rows, updates.reshape(rows.shape[0], width)


def _xla_path(x, rows, updates, cfg: _Config):
    rows, updates = _rows_and_updates(x, rows, updates, cfg)
    x2d = x.reshape(x.shape[0], -1)
    out = scatter_rows_reference(x2d, rows, updates, unique=cfg.unique)
    return out.reshape(x.shape)


def _needs_dedupe(cfg: _Config, num_updates: int) -> bool:
    """Whether rows go through :func:`dedupe_last_wins` (sort unless ascending).

    Duplicates must be resolved before the kernel runs (its programs write in
    parallel); sorting also turns scattered PCIe writes into ascending ones.
    """
    if not cfg.unique:
        return True
    return not cfg.ascending and cfg.coalesce and num_updates >= SORT_MIN_UPDATES


def _launch_pallas(x2d, rows, src, updates, *, check_bounds: bool, interpret: bool = False):
    return scatter_pallas.scatter_rows(
        x2d, rows, src, updates, check_bounds=check_bounds, interpret=interpret
    )


def _launch_triton(x2d, rows, src, updates, *, check_bounds: bool):
    # Imported here: jax-triton and triton are an optional extra.
    from pallas_pinned.kernels import scatter_triton

    return scatter_triton.scatter_rows_triton(x2d, rows, src, updates, check_bounds=check_bounds)


_LAUNCHERS = {
    "pallas": _launch_pallas,
    "interpret": functools.partial(_launch_pallas, interpret=True),
    "triton": _launch_triton,
}


def _kernel_path(x, rows, updates, cfg: _Config, *, kernel: str):
    x_on_host = _on_host(x)
    rows, updates = _rows_and_updates(x, rows, updates, cfg)
    num_rows = x.shape[0]
    dedupe = _needs_dedupe(cfg, rows.shape[0])
    src = None
    if dedupe and not cfg.ascending and rows.shape[0] <= SMALL_DEDUPE_MAX:
        rows = drop_superseded_small(rows, num_rows)
    elif dedupe:
        rows, src = dedupe_last_wins(rows, num_rows, presorted=cfg.ascending)
    x2d = x.reshape(num_rows, -1)
    out = _LAUNCHERS[kernel](
        x2d,
        rows,
        src,
        updates,
        # De-duplication marks superseded rows past the end: those must always
        # be masked, even when the caller promised in-bounds indices.
        check_bounds=dedupe or cfg.mode != "promise_in_bounds",
    )
    if x_on_host:
        # pallas_call declares its outputs in device memory; the result is the
        # aliased host buffer, so say where it lives and XLA keeps it there.
        out = jax.device_put(out, jax.memory.Space.Host)
    return out.reshape(x.shape)


def _scatter_traced(x, rows, updates, cfg: _Config):
    if math.prod(cfg.index_shape) == 0 or x.size == 0:
        return x
    if cfg.backend == "xla":
        return _xla_path(x, rows, updates, cfg)
    if cfg.backend in _LAUNCHERS:
        return _kernel_path(x, rows, updates, cfg, kernel=cfg.backend)
    # "auto": the kernel pays off only for host buffers of a CUDA GPU; device
    # memory is XLA's own scatter's home turf.
    if not _on_host(x) or not scatter_pallas.offsets_fit(x.shape, x.dtype):
        return _xla_path(x, rows, updates, cfg)
    return lax.platform_dependent(
        x,
        rows,
        updates,
        cuda=functools.partial(_kernel_path, cfg=cfg, kernel="pallas"),
        default=functools.partial(_xla_path, cfg=cfg),
    )


def _winning_rows(rows, cfg: _Config, num_rows: int):
    """Normalized rows, and which positions' updates survive in the result."""
    rows = _indexing.normalize_rows(_to_device_memory(rows), num_rows, cfg.mode)
    kept_sorted, src = dedupe_last_wins(rows, num_rows)
    in_buffer = (kept_sorted >= 0) & (kept_sorted < num_rows)
    survives = jnp.zeros(rows.shape, bool).at[src].set(in_buffer, unique_indices=True)
    return jnp.clip(rows, 0, num_rows - 1), survives


def _updates_vjp(cfg: _Config, residuals, cotangent):
    shape, rows, updates = residuals
    num_rows = shape[0]
    safe_rows, survives = _winning_rows(rows, cfg, num_rows)
    flat = _to_device_memory(cotangent).reshape(num_rows, -1)
    picked = jnp.where(survives[:, None], flat[safe_rows], 0)
    picked = picked.reshape(cfg.index_shape + tuple(shape[1:]))
    return transpose_to_updates(picked, updates)


_scatter_op = in_place_op(
    _scatter_traced, _updates_vjp, op_name="scatter_to_host", batch_effect="later sets win"
)


def _check_backend_available(x, backend: str) -> None:
    if backend not in ("pallas", "triton"):
        return
    if backend == "triton":
        # Raises ImportError naming the extra when jax-triton is missing.
        from pallas_pinned.kernels import scatter_triton  # noqa: F401
    elif not scatter_pallas.offsets_fit(x.shape, x.dtype):
        raise NotImplementedError(
            f"backend='pallas' cannot address a {x.dtype} buffer of {x.size} elements: Pallas "
            "uses 32-bit signed offsets for 1-byte buffers of 2-4 GiB; use backend='auto' "
            "(falls back to XLA) or a buffer of a wider dtype"
        )
    platform = (
        next(iter(x.sharding.device_set)).platform
        if isinstance(x, jax.Array) and not isinstance(x, jax.core.Tracer)
        else jax.default_backend()
    )
    if platform != "gpu":
        raise NotImplementedError(
            f"backend={backend!r} compiles a Triton kernel and needs a CUDA GPU, but x is on "
            f"{platform!r}; use backend='interpret' to run the Pallas kernel on CPU, or 'auto'"
        )


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

    Built for ``x`` in ``pinned_host`` memory of a GPU: a Pallas kernel takes
    indices and updates from device memory and stores the rows straight into
    the host buffer over PCIe, without copying the buffer. Any other ``x``
    (device memory, CPU-only JAX) gets the same semantics through XLA.

    Args:
      x: the buffer, at least 1-D, of a supported dtype.
      indices: rows along axis 0: a Python int, an integer array of any shape
        (numpy or jax, any memory kind, same device as ``x``), a list of ints,
        or a static slice.
      updates: broadcast to ``indices.shape + x.shape[1:]`` (for a slice, its
        length) and cast to ``x.dtype`` as jnp does.
      mode: ``None`` or ``"drop"`` (negative indices wrap once as in numpy,
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
      The updated buffer, with ``x``'s device, sharding and memory kind.
      Duplicate rows: the last occurrence in ``indices`` (row-major) wins.
      Outside ``jit`` the update happens in place and ``x`` is consumed, as if
      donated; inside ``jit`` the enclosing ``donate_argnums`` decides (without
      donation XLA copies the buffer first).

    Raises:
      TypeError, ValueError, NotImplementedError: for bad input, before
        anything runs; ``x`` is then left untouched.
    """
    _indexing.check_mode_and_backend(mode, backend)
    _indexing.check_buffer(x)
    index = _indexing.parse_index(indices, x.shape[0])
    _indexing.check_updates(updates, index.shape + tuple(x.shape[1:]))
    _indexing.check_same_device(x, indices, updates)
    _check_backend_available(x, backend)
    cfg = _Config(
        index_shape=index.shape,
        mode=mode,
        unique=bool(unique_indices) or index.unique,
        ascending=bool(indices_are_sorted) or index.ascending,
        backend=backend,
    )
    return _scatter_op(x, index.rows, updates, cfg)
