"""``at(x)[index].get/set/add/subtract/min/max/multiply``: jnp's ``.at`` for the host ops."""

from __future__ import annotations

from typing import Any

import jax

from pallas_pinned import _front

__all__ = ["at"]

# jnp's .at offers these too; they are not provided here (an AttributeError
# that names the alternative keeps hasattr() and getattr(..., default) working).
_NOT_PROVIDED = ("divide", "power", "apply")


class _IndexedBuffer:
    """``at(x)[index]``: waits for one of its methods."""

    __slots__ = ("_buffer", "_index")

    def __init__(self, buffer: jax.Array, index: Any):
        self._buffer = buffer
        self._index = index

    def _write(self, op: str, values: Any, **kwargs: Any) -> jax.Array:
        settings = dict(mode=None, unique_indices=False, indices_are_sorted=False,
                        backend="auto")
        unknown = sorted(set(kwargs) - set(settings))
        if unknown:
            # Named for the user's call, not this private method's.
            method = {"sub": "subtract", "mul": "multiply"}.get(op, op)
            raise TypeError(
                f"at(x)[...].{method}() got an unexpected keyword argument {unknown[0]!r}; "
                f"it takes {', '.join(settings)}"
            )
        return _front.write(op, self._buffer, self._index, values, **{**settings, **kwargs})

    def get(self, *, mode=None, fill_value=None, indices_are_sorted=False,
            unique_indices=False, backend="auto") -> jax.Array:
        """:func:`gather_from_host`: jnp's ``.get``, into device memory."""
        return _front.read(
            self._buffer, self._index, mode=mode, fill_value=fill_value,
            indices_are_sorted=indices_are_sorted, unique_indices=unique_indices,
            backend=backend,
        )

    def set(self, values: Any, **kwargs: Any) -> jax.Array:
        """:func:`scatter_to_host`: jnp's ``.set``; the last duplicate wins."""
        return self._write("set", values, **kwargs)

    def add(self, values: Any, **kwargs: Any) -> jax.Array:
        """:func:`scatter_add_to_host`: jnp's ``.add``."""
        return self._write("add", values, **kwargs)

    def subtract(self, values: Any, **kwargs: Any) -> jax.Array:
        """jnp's ``.subtract``: ``.add`` of the updates cast to ``x``'s type (as add casts
        them) and negated there: jnp's values where that cast is lossless (a NaN result
        can differ in sign from jnp's on the CPU; refusals name scatter_add_to_host)."""
        return self._write("sub", values, **kwargs)

    def min(self, values: Any, **kwargs: Any) -> jax.Array:
        """:func:`scatter_min_to_host`: jnp's ``.min``."""
        return self._write("min", values, **kwargs)

    def max(self, values: Any, **kwargs: Any) -> jax.Array:
        """:func:`scatter_max_to_host`: jnp's ``.max``."""
        return self._write("max", values, **kwargs)

    def multiply(self, values: Any, **kwargs: Any) -> jax.Array:
        """:func:`scatter_mul_to_host`: jnp's ``.multiply``."""
        return self._write("mul", values, **kwargs)

    mul = multiply

    def __getattr__(self, name: str):
        if name in _NOT_PROVIDED:
            raise AttributeError(
                f"pallas_pinned.at(x)[...].{name} is not provided (get, set, add, subtract, "
                f"min, max, multiply/mul are). Read the rows with .get(), compute on the "
                f"device, and write them back with .set(), or use jnp's x.at[...].{name} on "
                "a device array"
            )
        raise AttributeError(name)

    def __repr__(self) -> str:
        return f"pallas_pinned.at({self._buffer.aval})[{self._index!r}]"


class _AtHelper:
    """``at(x)``: index it with ``[index]``."""

    __slots__ = ("_buffer",)

    def __init__(self, buffer: jax.Array):
        self._buffer = buffer

    def __getitem__(self, index: Any) -> _IndexedBuffer:
        return _IndexedBuffer(self._buffer, index)

    def __repr__(self) -> str:
        return f"pallas_pinned.at({self._buffer.aval})"


def at(x: jax.Array) -> _AtHelper:
    """jnp's ``x.at[index]`` for a buffer in host memory (or any buffer).

    ``at(x)[index].get(**kw)`` is :func:`gather_from_host`; ``.set``,
    ``.add``, ``.min``, ``.max``, ``.multiply`` (also ``.mul``) take
    ``(values, **kw)`` and are :func:`scatter_to_host`,
    :func:`scatter_add_to_host`, :func:`scatter_min_to_host`,
    :func:`scatter_max_to_host` and :func:`scatter_mul_to_host`;
    ``.subtract`` is ``.add`` of the negated values. The
    keywords are theirs (``mode``, ``unique_indices``,
    ``indices_are_sorted``, ``backend``; ``fill_value`` for ``get``). Every
    index form jnp takes works, boolean masks aside, plus ``mode="wrap"``.
    The writes consume ``x`` outside ``jit``, like the ops.
    """
    return _AtHelper(x)
