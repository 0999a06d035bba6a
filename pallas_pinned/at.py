"""``at(x)[indices].set/add/get``: jnp's ``.at`` spelling for the three host ops."""

from __future__ import annotations

from typing import Any

import jax

from pallas_pinned.gather import gather_from_host
from pallas_pinned.scatter import scatter_to_host
from pallas_pinned.scatter_add import scatter_add_to_host

__all__ = ["at"]


class _IndexedBuffer:
    """``at(x)[indices]``: waits for one of ``set``, ``add`` or ``get``."""

    __slots__ = ("_buffer", "_indices")

    def __init__(self, buffer: jax.Array, indices: Any):
        self._buffer = buffer
        self._indices = indices

    def set(self, values: Any, **kwargs: Any) -> jax.Array:
        """``scatter_to_host(x, indices, values, **kwargs)``: jnp's ``.set``."""
        return scatter_to_host(self._buffer, self._indices, values, **kwargs)

    def add(self, values: Any, **kwargs: Any) -> jax.Array:
        """``scatter_add_to_host(x, indices, values, **kwargs)``: jnp's ``.add``."""
        return scatter_add_to_host(self._buffer, self._indices, values, **kwargs)

    def get(self, **kwargs: Any) -> jax.Array:
        """``gather_from_host(x, indices, **kwargs)``: jnp's ``.get``, into device memory."""
        return gather_from_host(self._buffer, self._indices, **kwargs)

    def __getattr__(self, name: str):
        # jnp's .at also offers these; say so instead of a bare AttributeError.
        if name in ("mul", "multiply", "divide", "power", "min", "max", "apply"):
            raise NotImplementedError(
                f"pallas_pinned.at(x)[...].{name} is not provided; only set, add and get are. "
                f"Use jnp's x.at[...].{name} on a device-memory array"
            )
        raise AttributeError(name)

    def __repr__(self) -> str:
        return f"pallas_pinned.at({self._buffer.aval})[{self._indices!r}]"


class _AtHelper:
    """``at(x)``: index it with ``[indices]`` along axis 0."""

    __slots__ = ("_buffer",)

    def __init__(self, buffer: jax.Array):
        self._buffer = buffer

    def __getitem__(self, indices: Any) -> _IndexedBuffer:
        if isinstance(indices, tuple) and len(indices) == 1:
            indices = indices[0]  # x.at[(i,)] means x.at[i], as in jnp.
        return _IndexedBuffer(self._buffer, indices)

    def __repr__(self) -> str:
        return f"pallas_pinned.at({self._buffer.aval})"


def at(x: jax.Array) -> _AtHelper:
    """jnp's ``x.at[indices]`` for the host-buffer ops, indexing axis 0.

    ``at(x)[indices].set(values, **kw)`` is :func:`scatter_to_host`,
    ``.add(values, **kw)`` is :func:`scatter_add_to_host` and ``.get(**kw)``
    is :func:`gather_from_host`; the keywords are theirs (``mode``,
    ``unique_indices``, ``indices_are_sorted``, ``fill_value`` for ``get``,
    ``backend``). Index forms are those of the ops; a tuple of several indices
    (several axes) is refused when the op runs. ``set`` and ``add`` consume
    ``x`` outside ``jit``, like the ops.
    """
    return _AtHelper(x)
