"""Python lists in an index or as updates, as arrays: numpy's reading of them, with
what it gets wrong for an index (an empty list is float64, ints beyond int64 beside
smaller ones are float64) set right, and what has no array form refused by name."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from pallas_pinned._rows import without_sub_byte

__all__ = ["list_as_array", "positions_array"]


def list_as_array(values: list | tuple, name: str, build=np.asarray):
    """A (nested) list as an array; None or a string in it, or a ragged nesting, refused
    by name (jnp.asarray's own messages do not say which argument they mean)."""
    for value in jax.tree.leaves(values, is_leaf=lambda v: v is None):
        if value is None or isinstance(value, str | bytes):
            raise TypeError(f"{name} holds {value!r}, which is not a number")
    try:
        return build(values)
    except (TypeError, ValueError) as err:
        # numpy says "inhomogeneous" of a ragged nesting; jnp.asarray, given jax arrays
        # in it, cannot concatenate them. Anything else is the builder's own word.
        if "inhomogeneous" not in str(err) and "Cannot concatenate" not in str(err):
            raise
        raise ValueError(
            f"{name} is a ragged list (its sublists differ in length), which has no array "
            f"shape; pass an array or a rectangular nesting ({err})"
        ) from None


def positions_array(values: list | tuple) -> np.ndarray:
    """A list of positions as a numpy array: an empty one (``[]``, ``[[]]``) of ints (numpy
    says float64), a list of traced values refused, jax scalars read by numpy one by one,
    sub-byte types widened first (numpy cannot build an array of jax int4 scalars, and
    stacking uint2 ones in jax aborts XLA's CPU compiler)."""
    values = jax.tree.map(_numpy_scalar, values)
    array = list_as_array(values, "indices")
    if array.size == 0 and array.dtype.kind == "f":
        return array.astype(np.int64)
    ints = _ints(values)
    if array.dtype.kind in "fO" and ints:
        # numpy makes float64 (or objects) of ints that no one of its integer types holds
        # together, such as 2**63 beside 1: not the floats a message would call them.
        if 0 <= min(ints) and max(ints) < 2**64:
            return list_as_array(values, "indices", build=lambda v: np.asarray(v, np.uint64))
        raise OverflowError(
            f"indices is a list of ints from {min(ints)} to {max(ints)}, which no one 64-bit "
            "integer type holds; pass the positions as an integer array: np.int64 below "
            "2**63, np.uint64 up to 2**64 - 1 (with a negative one written as the axis "
            "length plus it)"
        )
    return array


def _ints(values: Any) -> list[int]:
    """The list's values as Python ints if every one is an integer (no bool); else []."""
    leaves = jax.tree.leaves(values)
    if not all(isinstance(v, int) and not isinstance(v, bool)
               or np.ndim(v) == 0 and np.asarray(v).dtype.kind in "iu" for v in leaves):
        return []
    return [int(v) for v in leaves]


def _numpy_scalar(v: Any) -> Any:
    if isinstance(v, jax.core.Tracer):
        raise TypeError(
            "indices is a list holding traced values, which has no array form while "
            "tracing; pass one array instead: jnp.stack([...]) of the values (or "
            "jnp.array(...) of a nested list)"
        )
    # Read on the host even under a trace (a jax op would make it a tracer there).
    return without_sub_byte(np.asarray(v)) if isinstance(v, jax.Array) else v
