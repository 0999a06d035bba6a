"""``gather_from_host``: ``x.at[indices].get()`` along axis 0, read straight from host memory.

Read top to bottom: the public function validates, ``_gather_traced``
normalizes the rows and applies the fill, and ``_gather_rows_op`` chooses a
path (a kernel for a host buffer on a CUDA GPU, XLA otherwise) under the
op's own vmap and jvp rules.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from pallas_pinned import _backends, _host_xla, _placement, _rows, _sharded, _validation, tuning
from pallas_pinned.kernels import gather_pallas, pallas_common
from pallas_pinned.reference import gather_rows_reference

__all__ = ["gather_from_host"]



@dataclasses.dataclass(frozen=True)
class _Config:
    """Everything static about one call; hashable, so it keys jit's cache."""

    index_shape: tuple[int, ...]
    mode: str | None
    fill: _validation.StaticScalar
    ascending: bool
    backend: str
    thresholds: tuning.Thresholds


def gather_from_host(
    x: jax.Array,
    indices: Any,
    *,
    mode: str | None = None,
    fill_value: Any = None,
    indices_are_sorted: bool = False,
    unique_indices: bool = False,
    backend: str = "auto",
) -> jax.Array:
    """Returns ``x.at[indices].get(mode=mode, fill_value=fill_value)`` along axis 0.

    Built for ``x`` in ``pinned_host`` memory of a GPU: a kernel reads the
    rows over PCIe straight from the host buffer into a device array, without
    copying the buffer. Large unsorted batches are read in ascending address
    order (the kernel stores each row back at its place in the caller's
    order). Any other ``x`` gets the same semantics through XLA.

    Args:
      x: the buffer, at least 1-D, of a supported dtype, on one device.
      indices: rows along axis 0, in the forms :func:`scatter_to_host` takes
        (int, integer array of any shape, list of ints, static slice).
      mode: as jnp's ``get`` (jax 0.11.2 and 0.12): ``None`` (jnp's default,
        ``"promise_in_bounds"``) and ``"promise_in_bounds"`` give what XLA
        gives, i.e. negative indices wrap once and the rest are clamped into
        range, exactly like ``"clip"`` (the kernel never reads outside the
        buffer); ``"fill"`` and ``"drop"`` wrap negatives once and return
        ``fill_value`` for rows still out of range.
      fill_value: static scalar for ``"fill"``/``"drop"``, converted to
        ``x.dtype`` as jnp does. Default: NaN for floats, the minimum of
        signed and the maximum of unsigned integers, True for bool.
        Ignored in the other modes, as in jnp.
      indices_are_sorted: promise that the normalized rows ascend (skips the
        sort that coalesces reads). Only speed depends on it.
      unique_indices: accepted for parity with jnp; a gather does not need it.
      backend: ``"auto"`` (the kernel for host buffers on CUDA, XLA
        otherwise), ``"pallas"``, ``"triton"`` (CUDA only), ``"interpret"`` or
        ``"xla"``.

    Returns:
      ``indices.shape + x.shape[1:]`` of ``x.dtype``, in device memory of
      ``x``'s device, even when ``x`` is on the host. ``x`` is not consumed.

    Raises:
      TypeError, ValueError, NotImplementedError: for bad input, before
        anything runs. TypeError under ``jax.grad``/``jax.jvp`` with respect
        to a host ``x`` (a device ``x`` differentiates like jnp's gather);
        NotImplementedError under ``jax.vmap`` over a host ``x`` (vmap over
        the indices is folded into one call).
    """
    if _sharded.is_sharded_buffer(x):
        return _sharded.gather(
            x, indices, mode=mode, fill_value=fill_value, indices_are_sorted=indices_are_sorted,
            unique_indices=unique_indices, backend=backend,
        )
    del unique_indices  # A gather reads each row independently.
    _validation.check_mode_and_backend(mode, backend, modes=_validation.GATHER_MODES)
    _validation.check_buffer(x)
    fill = _validation.check_fill_value(fill_value)
    index = _validation.parse_index(indices, x.shape[0])
    num_gathers = math.prod(index.shape)
    if x.shape[0] == 0 and num_gathers > 0 and mode not in _validation.FILL_MODES:
        raise ValueError(
            f"x of shape {x.shape} has no rows to read with mode={mode!r}; "
            "use mode='fill' to get fill values for rows that do not exist"
        )
    _validation.check_same_device(x, ("indices", indices))
    _validation.check_backend_available(x, backend)
    _validation.check_offsets(backend, "a buffer", x.shape, x.dtype)
    result_2d = (num_gathers, math.prod(x.shape[1:]))
    _validation.check_offsets(backend, "a result", result_2d, x.dtype)
    cfg = _Config(
        index_shape=index.shape,
        mode=mode,
        fill=_validation.StaticScalar(fill),
        ascending=bool(indices_are_sorted) or index.ascending,
        backend=backend,
        thresholds=tuning.current(),
    )
    if _placement.is_concrete(x):
        x = _placement.fix_memory_space(x)  # Traces must see where x really is.
    return _gather_jit(x, index.rows, cfg)


@functools.partial(jax.jit, static_argnames=("cfg",))
def _gather_jit(x, rows, cfg: _Config):
    return _gather_traced(x, rows, cfg)


def _gather_traced(x, rows, cfg: _Config):
    num_rows, row_shape = x.shape[0], tuple(x.shape[1:])
    width = math.prod(row_shape)
    num_gathers = math.prod(cfg.index_shape)
    out_shape = cfg.index_shape + row_shape
    fill_mode = cfg.mode in _validation.FILL_MODES
    device = jax.memory.Space.Device
    if num_gathers == 0 or width == 0:
        return jax.device_put(jnp.zeros(out_shape, x.dtype), device)
    rows = _placement.to_device_memory(rows)
    rows = _rows.normalize_rows(rows, num_rows, "drop" if fill_mode else "clip")
    if num_rows == 0:  # Only reachable in fill mode (checked up front).
        out2d = jnp.zeros((num_gathers, width), x.dtype)
    else:
        op = _gather_rows_op(cfg.backend, cfg.ascending, cfg.thresholds)
        out2d = jax.device_put(op(x.reshape(num_rows, width), rows), device)
    if fill_mode:
        value = cfg.fill.value
        # lax.full_like converts as jnp's own fill does (e.g. 1000 wraps in int8).
        fill = lax.full_like(out2d, _validation.default_fill(x.dtype) if value is None else value)
        out2d = jnp.where(_rows.rows_in_range(rows, num_rows)[:, None], out2d, fill)
    return jax.device_put(out2d.reshape(out_shape), device)


# --- the row read: kernel or XLA, with custom vmap and jvp rules -------------


def _dispatch(x2d, rows, *, backend: str, ascending: bool, thresholds: tuning.Thresholds):
    """``(n, d)`` rows of ``x2d`` for normalized ``rows``; zeros where out of range."""
    kernel = functools.partial(_kernel_gather, ascending=ascending, thresholds=thresholds)
    if backend == "xla":
        return _host_xla.gather_rows(x2d, rows)
    if backend != "auto":
        return kernel(x2d, rows, backend=backend)
    # "auto": the kernel pays off only for host buffers of a CUDA GPU.
    kernel_backend = None
    if _placement.on_host(x2d):
        kernel_backend = _backends.auto_kernel_backend("gather", x2d.dtype, rows.shape[0])
    fits = kernel_backend == "triton" or (
        pallas_common.offsets_fit(x2d.shape, x2d.dtype)
        and pallas_common.offsets_fit((rows.shape[0], x2d.shape[1]), x2d.dtype)
    )
    if kernel_backend is None or not fits:
        return _host_xla.gather_rows(x2d, rows)
    return lax.platform_dependent(
        x2d,
        rows,
        cuda=functools.partial(kernel, backend=kernel_backend),
        default=_host_xla.gather_rows,
    )


def _kernel_gather(x2d, rows, *, backend: str, ascending: bool, thresholds: tuning.Thresholds):
    num_gathers = rows.shape[0]
    dest = None
    if thresholds.coalesce and not ascending and num_gathers >= thresholds.sort_min_gathers:
        # Read in ascending address order (coalesced PCIe reads) and let the
        # kernel store each row straight at its place in the caller's order.
        rows, dest = lax.sort((rows, lax.iota(jnp.int32, num_gathers)), num_keys=1)
    if backend == "triton":
        # Imported here: jax-triton and triton are an optional extra.
        from pallas_pinned.kernels import gather_triton

        return gather_triton.gather_rows_triton(x2d, rows, dest)
    return gather_pallas.gather_rows(x2d, rows, dest, interpret=backend == "interpret")


_HOST_GRAD_MESSAGE = (
    "gather_from_host cannot be differentiated with respect to a buffer in pinned_host "
    "memory (x of shape {shape}, dtype {dtype}): its gradient would be a dense array as "
    "large as the whole host buffer. Wrap x in jax.lax.stop_gradient if only other "
    "inputs matter, or gather from a device-memory array to get that gradient"
)

_HOST_VMAP_MESSAGE = (
    "jax.vmap over the buffer x of gather_from_host is not supported for x in pinned_host "
    "memory (batched x of shape {shape}); vmap over the indices only (the batch is "
    "folded into one gather), or loop over the buffers"
)


@functools.cache
def _gather_rows_op(backend: str, ascending: bool, thresholds: tuning.Thresholds):
    """The row read for one static setting, with its vmap and jvp rules."""
    impl = functools.partial(
        _dispatch, backend=backend, ascending=ascending, thresholds=thresholds
    )

    @jax.custom_batching.custom_vmap
    def batched_safe(x2d, rows):
        return impl(x2d, rows)

    @batched_safe.def_vmap
    def _vmap_rule(axis_size, in_batched, x2d, rows):
        x_batched, rows_batched = in_batched
        if x_batched:
            if _placement.on_host(x2d):
                raise NotImplementedError(_HOST_VMAP_MESSAGE.format(shape=x2d.shape))
            # A batch of device buffers: XLA's own batched gather.
            in_axes = (0, 0 if rows_batched else None)
            return jax.vmap(_host_xla.gather_rows, in_axes=in_axes)(x2d, rows), True
        # Only the indices are batched: one gather over all of them.
        flat = differentiable(x2d, rows.reshape(-1))
        return flat.reshape(axis_size, rows.shape[1], x2d.shape[1]), True

    @jax.custom_jvp
    def differentiable(x2d, rows):
        return batched_safe(x2d, rows)

    @differentiable.defjvp
    def _jvp_rule(primals, tangents):
        x2d, rows = primals
        if _placement.on_host(x2d):
            # TypeError, as scatter_to_host refuses a gradient for its buffer.
            raise TypeError(_HOST_GRAD_MESSAGE.format(shape=x2d.shape, dtype=x2d.dtype))
        x_dot, _ = tangents
        # Linear in x_dot, so JAX transposes it into a scatter-add for grad.
        return differentiable(x2d, rows), gather_rows_reference(x_dot, rows)

    return differentiable
