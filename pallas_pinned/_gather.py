"""``gather_from_host``: the public op, its validation, dispatch and transformations."""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from pallas_pinned import _indexing
from pallas_pinned._scatter import _check_backend_available, _on_host, _to_device_memory
from pallas_pinned.kernels import gather_pallas, scatter_pallas
from pallas_pinned.reference import gather_rows_reference, rows_in_range

__all__ = ["gather_from_host"]

# jnp's get modes on jax 0.11.2. None means "promise_in_bounds" there, which
# XLA implements by clamping; "drop" means "fill".
GATHER_MODES = (None, "fill", "drop", "clip", "promise_in_bounds")
_FILL_MODES = ("fill", "drop")

# Below this many rows, sorting them costs more than the read locality it
# buys. Not yet measured for reads: this is the write crossover of
# scatter_to_host (16 Ki, H200). Read at call time, so tests may patch it.
SORT_MIN_GATHERS = 16384


@dataclasses.dataclass(frozen=True, eq=False)
class _StaticScalar:
    """A fill value as a jit cache key: equal by type and repr, so NaN == NaN."""

    value: Any

    def _key(self):
        return type(self.value), repr(self.value)

    def __eq__(self, other):
        return isinstance(other, _StaticScalar) and self._key() == other._key()

    def __hash__(self):
        return hash(self._key())


@dataclasses.dataclass(frozen=True)
class _GatherConfig:
    """Everything static about one call; hashable, so it keys jit's cache."""

    index_shape: tuple[int, ...]
    mode: str | None
    fill: _StaticScalar
    ascending: bool
    backend: str
    sort_min: int = SORT_MIN_GATHERS


def _default_fill(dtype) -> Any:
    # jnp's choice for mode="fill" without a fill_value: a value that stands out.
    dtype = jnp.dtype(dtype)
    if jnp.issubdtype(dtype, jnp.inexact):
        return np.nan
    if jnp.issubdtype(dtype, jnp.signedinteger):
        return int(jnp.iinfo(dtype).min)
    if jnp.issubdtype(dtype, jnp.unsignedinteger):
        return int(jnp.iinfo(dtype).max)
    return True  # bool


# --- the row gather: kernel or XLA, with custom vmap and jvp rules ----------


def _xla_gather(x2d, rows):
    if not _on_host(x2d):
        return gather_rows_reference(x2d, rows)
    # XLA ops need all operands in one memory space: move the small index to
    # the host for the gather alone (never the whole buffer to the device),
    # and do the masking on the device.
    valid = rows_in_range(rows, x2d.shape[0])
    host_rows = jax.device_put(jnp.where(valid, rows, 0), jax.memory.Space.Host)
    picked = jnp.take(x2d, host_rows, axis=0, mode="clip")
    picked = jax.device_put(picked, jax.memory.Space.Device)
    return jnp.where(valid[:, None], picked, jnp.zeros((), x2d.dtype))


def _kernel_gather(x2d, rows, *, ascending: bool, sort_min: int, interpret: bool):
    num_gathers = rows.shape[0]
    if ascending or num_gathers < sort_min:
        return gather_pallas.gather_rows(x2d, rows, interpret=interpret)
    # Read in ascending address order (coalesced PCIe reads) and let the
    # kernel store each row straight at its place in the caller's order.
    sorted_rows, order = lax.sort((rows, lax.iota(jnp.int32, num_gathers)), num_keys=1)
    return gather_pallas.gather_rows(x2d, sorted_rows, order, interpret=interpret)


def _kernel_offsets_fit(x2d, num_gathers: int) -> bool:
    # Pallas's 32-bit offsets wrap for 1-byte arrays of 2-4 GiB (see scatter_pallas).
    return scatter_pallas.offsets_fit(x2d.shape, x2d.dtype) and scatter_pallas.offsets_fit(
        (num_gathers, x2d.shape[1]), x2d.dtype
    )


def _dispatch_gather(x2d, rows, *, backend: str, ascending: bool, sort_min: int):
    """``(n, d)`` rows of ``x2d`` for normalized ``rows``; zeros where out of range."""
    kernel = functools.partial(_kernel_gather, ascending=ascending, sort_min=sort_min)
    if backend == "xla":
        return _xla_gather(x2d, rows)
    if backend in ("pallas", "interpret"):
        return kernel(x2d, rows, interpret=backend == "interpret")
    # "auto": the kernel pays off only for host buffers of a CUDA GPU.
    if not _on_host(x2d) or not _kernel_offsets_fit(x2d, rows.shape[0]):
        return _xla_gather(x2d, rows)
    return lax.platform_dependent(
        x2d, rows, cuda=functools.partial(kernel, interpret=False), default=_xla_gather
    )


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
def _gather_rows_op(backend: str, ascending: bool, sort_min: int):
    """The row gather for one static setting, with its vmap and jvp rules."""
    impl = functools.partial(
        _dispatch_gather, backend=backend, ascending=ascending, sort_min=sort_min
    )

    @jax.custom_batching.custom_vmap
    def batched_safe(x2d, rows):
        return impl(x2d, rows)

    @batched_safe.def_vmap
    def _vmap_rule(axis_size, in_batched, x2d, rows):
        x_batched, rows_batched = in_batched
        if x_batched:
            if _on_host(x2d):
                raise NotImplementedError(_HOST_VMAP_MESSAGE.format(shape=x2d.shape))
            # A batch of device buffers: XLA's own batched gather.
            in_axes = (0, 0 if rows_batched else None)
            return jax.vmap(_xla_gather, in_axes=in_axes)(x2d, rows), True
        # Only the indices are batched: one gather over all of them.
        flat = differentiable(x2d, rows.reshape(-1))
        return flat.reshape(axis_size, rows.shape[1], x2d.shape[1]), True

    @jax.custom_jvp
    def differentiable(x2d, rows):
        return batched_safe(x2d, rows)

    @differentiable.defjvp
    def _jvp_rule(primals, tangents):
        x2d, rows = primals
        if _on_host(x2d):
            # TypeError, as scatter_to_host refuses a gradient for its buffer.
            raise TypeError(_HOST_GRAD_MESSAGE.format(shape=x2d.shape, dtype=x2d.dtype))
        x_dot, _ = tangents
        # Linear in x_dot, so JAX transposes it into a scatter-add for grad.
        return differentiable(x2d, rows), gather_rows_reference(x_dot, rows)

    return differentiable


# --- the traced op -----------------------------------------------------------


def _fill_like(out, cfg: _GatherConfig):
    value = cfg.fill.value
    if value is None:
        value = _default_fill(out.dtype)
    # lax.full_like converts as jnp's own fill does (e.g. 1000 wraps in int8).
    return lax.full_like(out, value)


def _gather_traced(x, rows, cfg: _GatherConfig):
    num_rows, row_shape = x.shape[0], tuple(x.shape[1:])
    width = math.prod(row_shape)
    num_gathers = math.prod(cfg.index_shape)
    out_shape = cfg.index_shape + row_shape
    fill_mode = cfg.mode in _FILL_MODES
    if num_gathers == 0 or width == 0:
        return jax.device_put(jnp.zeros(out_shape, x.dtype), jax.memory.Space.Device)
    rows = _to_device_memory(rows)
    rows = _indexing.normalize_rows(rows, num_rows, "drop" if fill_mode else "clip")
    if num_rows == 0:  # Only reachable in fill mode (checked up front).
        out2d = jnp.zeros((num_gathers, width), x.dtype)
    else:
        op = _gather_rows_op(cfg.backend, cfg.ascending, cfg.sort_min)
        out2d = op(x.reshape(num_rows, width), rows)
        out2d = jax.device_put(out2d, jax.memory.Space.Device)
    if fill_mode:
        valid = rows_in_range(rows, num_rows)
        out2d = jnp.where(valid[:, None], out2d, _fill_like(out2d, cfg))
    return jax.device_put(out2d.reshape(out_shape), jax.memory.Space.Device)


@functools.partial(jax.jit, static_argnames=("cfg",))
def _gather_jit(x, rows, cfg: _GatherConfig):
    return _gather_traced(x, rows, cfg)


# --- validation and the public op --------------------------------------------


def _check_gather_mode(mode: Any) -> None:
    if mode not in GATHER_MODES:
        raise ValueError(
            f"unknown mode {mode!r} for gather_from_host; expected one of {GATHER_MODES}"
        )


def _check_fill_value(fill_value: Any) -> Any:
    """Returns the fill value as a static Python scalar, or raises."""
    if fill_value is None:
        return None
    if isinstance(fill_value, jax.core.Tracer):
        raise TypeError(
            f"fill_value must be a static scalar (a Python or numpy number), got the traced "
            f"value {fill_value}; pass a constant, or apply jnp.where to the result"
        )
    if np.ndim(fill_value) != 0:
        raise ValueError(f"fill_value must be a scalar, got shape {np.shape(fill_value)}")
    dtype = np.asarray(fill_value).dtype
    if not (
        jnp.issubdtype(dtype, jnp.bool_)
        or jnp.issubdtype(dtype, jnp.integer)
        or jnp.issubdtype(dtype, jnp.floating)
    ):
        raise TypeError(
            f"fill_value must be a bool, integer or real number, got {fill_value!r} "
            f"of dtype {dtype}"
        )
    return fill_value.item() if hasattr(fill_value, "item") else fill_value


def _check_rows_to_read(x, num_gathers: int, mode: str | None) -> None:
    if x.shape[0] == 0 and num_gathers > 0 and mode not in _FILL_MODES:
        raise ValueError(
            f"x of shape {x.shape} has no rows to read with mode={mode!r}; "
            "use mode='fill' to get fill values for rows that do not exist"
        )


def _check_output_offsets(x, num_gathers: int, backend: str) -> None:
    out_shape = (num_gathers, math.prod(x.shape[1:]))
    if backend == "pallas" and not scatter_pallas.offsets_fit(out_shape, x.dtype):
        raise NotImplementedError(
            f"backend='pallas' cannot address a {x.dtype} result of {math.prod(out_shape)} "
            "elements: Pallas uses 32-bit signed offsets for 1-byte arrays of 2-4 GiB; use "
            "backend='auto' (falls back to XLA) or gather fewer rows per call"
        )


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

    Built for ``x`` in ``pinned_host`` memory of a GPU: a Pallas kernel reads
    the rows over PCIe straight from the host buffer into a device array,
    without copying the buffer. Large unsorted batches are read in ascending
    address order (the kernel stores each row back at its place in the
    caller's order). Any other ``x`` gets the same semantics through XLA.

    Args:
      x: the buffer, at least 1-D, of a supported dtype.
      indices: rows along axis 0, in the forms :func:`scatter_to_host` takes
        (int, integer array of any shape, list of ints, static slice).
      mode: as jnp's ``get`` on jax 0.11.2: ``None`` (jnp's default,
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
        otherwise), ``"pallas"`` (CUDA only), ``"interpret"`` or ``"xla"``.

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
    del unique_indices  # A gather reads each row independently.
    _check_gather_mode(mode)
    _indexing.check_mode_and_backend(None, backend)
    _indexing.check_buffer(x)
    fill = _check_fill_value(fill_value)
    index = _indexing.parse_index(indices, x.shape[0])
    _check_rows_to_read(x, math.prod(index.shape), mode)
    _indexing.check_same_device(x, indices, None)
    _check_backend_available(x, backend)
    _check_output_offsets(x, math.prod(index.shape), backend)
    cfg = _GatherConfig(
        index_shape=index.shape,
        mode=mode,
        fill=_StaticScalar(fill),
        ascending=bool(indices_are_sorted) or index.ascending,
        backend=backend,
        sort_min=SORT_MIN_GATHERS,
    )
    return _gather_jit(x, index.rows, cfg)
