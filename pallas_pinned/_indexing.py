"""Validation and normalization of ``(x, indices, updates)`` before anything runs.

Everything here looks only at shapes, dtypes, memory kinds and devices, so it
works the same on concrete arrays and on tracers inside ``jit``, and raises
before any computation is staged. Index *values* are normalized on the device
by :func:`normalize_rows`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

MODES = (None, "drop", "clip", "promise_in_bounds")
BACKENDS = ("auto", "xla", "pallas", "triton", "interpret")

# Element types the kernels store. Narrower and exotic types (int4, float8,
# complex) are left out until a kernel test covers them.
SUPPORTED_DTYPES = tuple(
    jnp.dtype(t)
    for t in (
        jnp.bool_,
        jnp.int8,
        jnp.uint8,
        jnp.int16,
        jnp.uint16,
        jnp.int32,
        jnp.uint32,
        jnp.int64,
        jnp.uint64,
        jnp.float16,
        jnp.bfloat16,
        jnp.float32,
        jnp.float64,
    )
)

SUPPORTED_INDEX_FORMS = (
    "a Python int, an integer array of any shape (numpy or jax), "
    "a list of ints, or a static slice along axis 0"
)


@dataclasses.dataclass(frozen=True)
class RowIndex:
    """An index along axis 0, reduced to a flat integer array plus its shape.

    ``rows`` is a numpy array for static forms (int, slice, list) and a jax
    array (or tracer) otherwise; ``shape`` is the shape the index has in
    ``x.at[indices]``, which is the leading part of the update shape.
    """

    rows: Any
    shape: tuple[int, ...]
    unique: bool = False
    ascending: bool = False


def _is_integer_dtype(dtype) -> bool:
    return jnp.issubdtype(dtype, jnp.integer)


def parse_index(indices: Any, num_rows: int) -> RowIndex:
    """Turns the user's ``indices`` into a :class:`RowIndex`, or raises."""
    if isinstance(indices, (bool, np.bool_)):
        raise TypeError(f"indices must be integers, got the bool {indices!r}")
    if isinstance(indices, (int, np.integer)):
        info = np.iinfo(index_dtype())
        rows = np.asarray([min(max(int(indices), info.min), info.max)], index_dtype())
        return RowIndex(rows, (), unique=True, ascending=True)
    if isinstance(indices, slice):
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
    if isinstance(indices, list):
        # An empty list has no dtype of its own; numpy would say float64.
        indices = np.asarray(indices) if indices else np.zeros((0,), np.int64)
    if isinstance(indices, (np.ndarray, jax.Array)) or hasattr(indices, "aval"):
        dtype = indices.dtype
        if not _is_integer_dtype(dtype):
            raise TypeError(
                f"indices must have an integer dtype, got {dtype} (shape {indices.shape}); "
                "cast with .astype(jnp.int32)"
            )
        if isinstance(indices, np.ndarray):
            # Narrow here, saturating, before jax would truncate int64 values.
            indices = _to_wide_numpy(indices, index_dtype())
        return RowIndex(indices, tuple(indices.shape))
    raise NotImplementedError(
        f"unsupported index {type(indices).__name__} {indices!r}: supported forms are "
        f"{SUPPORTED_INDEX_FORMS}. Tuples (several axes), None, Ellipsis and boolean masks "
        "are not supported"
    )


def check_mode_and_backend(mode: Any, backend: Any) -> None:
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; expected one of {MODES}")
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; expected one of {BACKENDS}")


def check_buffer(x: Any) -> None:
    if not (isinstance(x, jax.Array) or hasattr(x, "aval")):
        raise TypeError(
            f"x must be a jax.Array (the buffer to update), got {type(x).__name__}; "
            "place it with jax.device_put(x, sharding) first"
        )
    if x.ndim == 0:
        raise ValueError(f"x must have at least one axis to index, got shape {x.shape}")
    if jnp.dtype(x.dtype) not in SUPPORTED_DTYPES:
        names = ", ".join(str(d) for d in SUPPORTED_DTYPES)
        raise TypeError(f"unsupported dtype {x.dtype} for x; supported: {names}")


def check_updates(updates: Any, target_shape: tuple[int, ...]) -> None:
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


def _devices_of(a: Any):
    if isinstance(a, jax.Array) and not isinstance(a, jax.core.Tracer):
        return a.sharding.device_set
    return None


def check_same_device(x: Any, indices: Any, updates: Any) -> None:
    """Concrete inputs must live on the buffer's device (any memory kind)."""
    x_devices = _devices_of(x)
    if x_devices is None:
        return
    for name, other in (("indices", indices), ("updates", updates)):
        devices = _devices_of(other)
        if devices is not None and devices != x_devices:
            raise ValueError(
                f"{name} is on {sorted(map(str, devices))} but x is on "
                f"{sorted(map(str, x_devices))}; move it with jax.device_put first"
            )


def index_dtype():
    """The widest integer type jax computes with right now (x64 or not)."""
    return jnp.dtype(jnp.int64 if jax.config.jax_enable_x64 else jnp.int32)


def skip_row(num_rows: int, dtype) -> int:
    """Marker for rows that must not be written: one past the end if it fits."""
    return num_rows if num_rows <= jnp.iinfo(dtype).max else -1


def _to_wide_numpy(rows: np.ndarray, wide) -> np.ndarray:
    # Saturating cast: values the wide type cannot hold are out of range for
    # any buffer jax can index, and saturation keeps them out of range.
    info, have = np.iinfo(wide), np.iinfo(rows.dtype)
    if have.max > info.max:
        rows = np.minimum(rows, np.asarray(info.max).astype(rows.dtype))
    if have.min < info.min:
        rows = np.maximum(rows, info.min)
    return rows.astype(wide)


def _to_wide(rows, wide):
    dtype = jnp.dtype(rows.dtype)
    info = jnp.iinfo(wide)
    if jnp.iinfo(dtype).max > info.max:
        # Unsigned of the same width: saturate before the cast so that huge
        # values stay out of range instead of wrapping to small rows.
        rows = jnp.where(rows > info.max, jnp.asarray(info.max, dtype), rows)
    return rows.astype(wide)


def normalize_rows(rows, num_rows: int, mode: str | None):
    """Wraps negatives once, then drops (marks) or clips out-of-range rows.

    Returns a flat array of the widest index type. In ``"drop"`` mode rows
    still out of range become :func:`skip_row`; with ``"promise_in_bounds"``
    they are left as they are and the caller promised there are none.
    """
    wide = index_dtype()
    if isinstance(rows, np.ndarray):
        rows = jnp.asarray(_to_wide_numpy(rows.reshape(-1), wide))
    else:
        rows = _to_wide(jnp.ravel(rows), wide)
    n = jnp.asarray(num_rows, wide) if num_rows <= jnp.iinfo(wide).max else None
    if n is not None:
        rows = jnp.where(rows < 0, rows + n, rows)
    if mode == "clip":
        return jnp.clip(rows, 0, num_rows - 1)
    if mode == "promise_in_bounds":
        return rows
    in_range = rows >= 0
    if n is not None:
        in_range &= rows < n
    return jnp.where(in_range, rows, skip_row(num_rows, wide))
