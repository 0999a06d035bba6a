"""Checks of ``(x, indices, updates)`` and the settings, before anything runs.

Everything here looks only at types, shapes, dtypes, memory kinds and devices,
so it works the same on concrete arrays and on tracers inside ``jit`` and
raises before any computation is staged: bad input leaves ``x`` untouched.
Index *values* are normalized later, on the device (``_rows.normalize_rows``).
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from pallas_pinned import _placement
from pallas_pinned._rows import index_dtype, to_wide_numpy
from pallas_pinned.kernels.pallas_common import offsets_fit

# jnp's scatter modes; "fill" means "drop" for a write, as in jnp.
MODES = (None, "drop", "fill", "clip", "promise_in_bounds")
BACKENDS = ("auto", "xla", "pallas", "triton", "interpret")
KERNEL_BACKENDS = ("pallas", "triton", "interpret")
# jnp's get modes (jax 0.11.2 and 0.12): None means "promise_in_bounds" there,
# which XLA implements by clamping; "drop" means "fill".
GATHER_MODES = (None, "fill", "drop", "clip", "promise_in_bounds")
FILL_MODES = ("fill", "drop")

# Element types the kernels store. Narrower and exotic types (int4, float8,
# complex) are left out until a kernel test covers them.
SUPPORTED_DTYPES = tuple(
    jnp.dtype(t)
    for t in (
        jnp.bool_, jnp.int8, jnp.uint8, jnp.int16, jnp.uint16, jnp.int32, jnp.uint32,
        jnp.int64, jnp.uint64, jnp.float16, jnp.bfloat16, jnp.float32, jnp.float64,
    )
)

SUPPORTED_INDEX_FORMS = (
    "a Python int, an integer array of any shape (numpy or jax), "
    "a list of ints, or a static slice along axis 0"
)

_MASK_ADVICE = (
    "boolean masks are not supported: a mask selects a data-dependent number of rows. "
    "Turn it into row numbers of a fixed count, padded with an out-of-range row that "
    "mode='drop' skips: rows = jnp.nonzero(mask, size=MAX_ROWS, fill_value=x.shape[0])[0], "
    "then call with (rows, updates, mode='drop')"
)


@dataclasses.dataclass(frozen=True)
class RowIndex:
    """An index along axis 0, reduced to a flat integer array plus its shape.

    ``rows`` is a numpy array for static forms (int, slice, list) and a jax
    array (or tracer) otherwise; ``shape`` is the shape the index has in
    ``x.at[indices]``, the leading part of the update shape. ``unique`` and
    ``ascending`` are what the static form itself guarantees.
    """

    rows: Any
    shape: tuple[int, ...]
    unique: bool = False
    ascending: bool = False


def _index_type_error(what: str) -> TypeError:
    return TypeError(f"indices must be integers, got {what}; supported: {SUPPORTED_INDEX_FORMS}")


def _parse_slice(indices: slice, num_rows: int) -> RowIndex:
    for part in (indices.start, indices.stop, indices.step):
        if part is not None and not isinstance(part, (int, np.integer)):
            raise NotImplementedError(
                f"only static slices are supported, got {indices!r}; pass an integer "
                "array such as jnp.arange(start, stop) for dynamic bounds"
            )
    if indices.step == 0:
        raise ValueError(f"slice step cannot be zero, got {indices!r}")
    picked = range(num_rows)[indices]  # No O(num_rows) array for a short slice.
    rows = np.arange(picked.start, picked.stop, picked.step, dtype=index_dtype())
    return RowIndex(rows, rows.shape, unique=True, ascending=(indices.step or 1) > 0)


def _list_to_array(indices: list) -> np.ndarray:
    if not indices:
        return np.zeros((0,), np.int64)  # An empty list has no dtype; numpy says float64.
    try:
        return np.asarray(indices)
    except ValueError as err:  # numpy refuses ragged nesting.
        raise ValueError(
            "indices is a ragged list (its sublists differ in length), which has no array "
            f"shape; pass a flat list or a rectangular nesting of ints ({err})"
        ) from None


def parse_index(indices: Any, num_rows: int) -> RowIndex:
    """Turns the user's ``indices`` into a :class:`RowIndex`, or raises."""
    if isinstance(indices, (bool, np.bool_)):
        raise TypeError(f"indices must be integers, got the bool {indices!r}; {_MASK_ADVICE}")
    if isinstance(indices, (float, complex, np.floating, np.complexfloating)):
        raise _index_type_error(f"the {type(indices).__name__} {indices!r}")
    if isinstance(indices, (int, np.integer)):
        info = np.iinfo(index_dtype())
        rows = np.asarray([min(max(int(indices), info.min), info.max)], index_dtype())
        return RowIndex(rows, (), unique=True, ascending=True)
    if isinstance(indices, slice):
        return _parse_slice(indices, num_rows)
    if isinstance(indices, list):
        indices = _list_to_array(indices)
    if isinstance(indices, (np.ndarray, jax.Array)) or hasattr(indices, "aval"):
        dtype = jnp.dtype(indices.dtype)
        if dtype == jnp.bool_:
            raise TypeError(f"indices has dtype bool (shape {indices.shape}); {_MASK_ADVICE}")
        if not jnp.issubdtype(dtype, jnp.integer):
            raise _index_type_error(f"an array of dtype {dtype} (shape {indices.shape})")
        if isinstance(indices, np.ndarray):
            # Narrow here, saturating, before jax would truncate int64 values.
            indices = to_wide_numpy(indices, index_dtype())
        return RowIndex(indices, tuple(indices.shape))
    raise NotImplementedError(
        f"unsupported index {type(indices).__name__} {indices!r}: supported forms are "
        f"{SUPPORTED_INDEX_FORMS}. Tuples (several axes), None and Ellipsis are not supported"
    )


def check_mode_and_backend(mode: Any, backend: Any, modes: tuple = MODES) -> None:
    if mode not in modes:
        raise ValueError(f"unknown mode {mode!r}; expected one of {modes}")
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; expected one of {BACKENDS}")


def check_buffer(x: Any) -> None:
    if not (isinstance(x, jax.Array) or hasattr(x, "aval")):
        raise TypeError(
            f"x must be a jax.Array (the buffer), got {type(x).__name__}; "
            "place it with jax.device_put(x, sharding) first"
        )
    if _placement.is_concrete(x) and x.is_deleted():
        raise ValueError(
            "x has been deleted (donated to an earlier call); use the array that call returned"
        )
    if x.ndim == 0:
        raise ValueError(f"x must have at least one axis to index, got shape {x.shape}")
    if jnp.dtype(x.dtype) not in SUPPORTED_DTYPES:
        names = ", ".join(str(d) for d in SUPPORTED_DTYPES)
        raise TypeError(f"unsupported dtype {x.dtype} for x; supported: {names}")
    if _placement.is_concrete(x) and len(x.sharding.device_set) != 1:
        raise NotImplementedError(
            f"x is sharded over {len(x.sharding.device_set)} devices; the ops take a buffer "
            "on one device"
        )


def check_updates(updates: Any, target_shape: tuple[int, ...], x_dtype) -> None:
    """Shape and dtype of ``updates``; warns on a lossy cast as jnp's scatter does."""
    shape = np.shape(updates)
    dtype = getattr(updates, "dtype", None) or np.asarray(updates).dtype
    if not (jnp.issubdtype(dtype, jnp.number) or jnp.issubdtype(dtype, jnp.bool_)):
        raise TypeError(f"updates must be numeric or bool, got dtype {dtype}")
    try:
        result = np.broadcast_shapes(shape, target_shape)
    except ValueError:
        result = None
    if result != tuple(target_shape):
        raise ValueError(
            f"updates of shape {shape} cannot be broadcast to {tuple(target_shape)} "
            "(indices.shape + x.shape[1:])"
        )
    # jnp's rule: a cast is safe when promoting the updates with the buffer's
    # type gives the buffer's type (Python scalars are weakly typed).
    if jnp.result_type(updates, x_dtype) != jnp.dtype(x_dtype):
        warnings.warn(
            f"updates of dtype {jnp.result_type(updates)} are cast to the buffer's dtype "
            f"{jnp.dtype(x_dtype)}, which can lose information (jnp's .at[].set warns the "
            "same way); cast them yourself to silence this",
            FutureWarning,
            stacklevel=3,
        )


def check_same_device(x: Any, *others: tuple[str, Any]) -> None:
    """Concrete inputs must live on the buffer's device (any memory kind)."""
    if not _placement.is_concrete(x):
        return
    for name, other in others:
        if _placement.is_concrete(other) and other.sharding.device_set != x.sharding.device_set:
            raise ValueError(
                f"{name} is on {sorted(map(str, other.sharding.device_set))} but x is on "
                f"{sorted(map(str, x.sharding.device_set))}; move it with jax.device_put first"
            )


def check_not_aliased(x: Any, *others: tuple[str, Any]) -> None:
    """The buffer is consumed (donated); it cannot also be read as another argument."""
    for name, other in others:
        same = other is x
        # Empty arrays may all share one (null) pointer: they hold nothing to alias.
        concrete = _placement.is_concrete(x) and _placement.is_concrete(other)
        if not same and concrete and x.size > 0 and other.size > 0:
            try:
                same = other.unsafe_buffer_pointer() == x.unsafe_buffer_pointer()
            except (RuntimeError, ValueError):  # Deleted, or not one buffer.
                same = False
        if same:
            raise ValueError(
                f"{name} is the buffer x itself; x is updated in place (donated), so it cannot "
                f"also be read as {name}. Pass a copy: jnp.array({name}, copy=True), or put "
                "it on the device with jax.device_put"
            )


def check_backend_available(x: Any, backend: str) -> None:
    """Explicit kernel backends must be able to run where ``x`` is."""
    if backend == "triton":
        # ImportError naming the extra when triton or jax-triton is missing:
        # a missing extra is reported before the platform.
        from pallas_pinned.kernels import triton_common

        triton_common.check_installed()
    if backend in ("pallas", "triton") and _placement.platform_of(x) != "gpu":
        raise NotImplementedError(
            f"backend={backend!r} compiles a Triton kernel and needs a CUDA GPU, but x is on "
            f"{_placement.platform_of(x)!r}; use backend='interpret' to run the Pallas kernel "
            "on CPU, or 'auto'"
        )


def check_offsets(backend: str, what: str, shape: tuple[int, ...], dtype) -> None:
    """An explicit ``"pallas"`` backend refuses arrays its 32-bit offsets would wrap."""
    if backend == "pallas" and not offsets_fit(shape, dtype):
        raise NotImplementedError(
            f"backend='pallas' cannot address {what} of {math.prod(shape)} {jnp.dtype(dtype)} "
            "elements: Pallas uses 32-bit signed offsets for 1-byte arrays of 2-4 GiB; use "
            "backend='auto' (falls back to XLA), backend='triton', or split the call"
        )


def check_in_place_call(x: Any, indices: Any, updates: Any, *, mode: Any, backend: Any) -> RowIndex:
    """Every check of a set or add call, in the order users fix them; returns the index."""
    check_mode_and_backend(mode, backend)
    check_buffer(x)
    index = parse_index(indices, x.shape[0])
    check_updates(updates, index.shape + tuple(x.shape[1:]), x.dtype)
    check_same_device(x, ("indices", indices), ("updates", updates))
    check_not_aliased(x, ("indices", indices), ("updates", updates))
    check_backend_available(x, backend)
    check_offsets(backend, "a buffer", x.shape, x.dtype)
    return index


def default_fill(dtype) -> Any:
    """jnp's fill for ``mode="fill"`` without a ``fill_value``: a value that stands out."""
    dtype = jnp.dtype(dtype)
    if jnp.issubdtype(dtype, jnp.inexact):
        return np.nan
    if jnp.issubdtype(dtype, jnp.signedinteger):
        return int(jnp.iinfo(dtype).min)
    if jnp.issubdtype(dtype, jnp.unsignedinteger):
        return int(jnp.iinfo(dtype).max)
    return True  # bool


@dataclasses.dataclass(frozen=True, eq=False)
class StaticScalar:
    """A fill value as a jit cache key: equal by type and repr, so NaN == NaN."""

    value: Any

    def _key(self):
        return type(self.value), repr(self.value)

    def __eq__(self, other):
        return isinstance(other, StaticScalar) and self._key() == other._key()

    def __hash__(self):
        return hash(self._key())


def check_fill_value(fill_value: Any) -> Any:
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
