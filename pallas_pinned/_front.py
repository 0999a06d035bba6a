"""The public ops' one front: validate, then hand the call to the sharded or the local layer.

Every public op (``scatter*_to_host``, ``gather_from_host``, ``at``) is this
module's :func:`write` or :func:`read` with its docstring. Imports run one
way: public op → this front → sharded layer → local layer → shared helpers →
kernels; nothing below calls back up.
"""

from __future__ import annotations

from typing import Any

from pallas_pinned import _local_read, _local_write, _sharded, _validation

__all__ = ["read", "write"]


def write(
    op: str,
    x: Any,
    index: Any,
    updates: Any,
    *,
    mode: str | None,
    unique_indices: bool,
    indices_are_sorted: bool,
    backend: str,
):
    """``x.at[index].<op>(updates)`` for ``op`` in set, add, min, max, mul."""
    settings = dict(
        mode=mode, unique_indices=unique_indices, indices_are_sorted=indices_are_sorted,
        backend=backend,
    )
    if _sharded.is_sharded_buffer(x):
        return _sharded.write(op, x, index, updates, **settings)
    plan, operands = _validation.check_write(op, x, index, updates, mode=mode, backend=backend)
    call = _local_write.WriteCall.of(op, plan, **settings)
    return _local_write.write(x, operands, updates, call)


def read(
    x: Any,
    index: Any,
    *,
    mode: str | None,
    fill_value: Any,
    indices_are_sorted: bool,
    unique_indices: bool,
    backend: str,
):
    """``x.at[index].get(mode=mode, fill_value=fill_value)``, into device memory."""
    if _sharded.is_sharded_buffer(x):
        return _sharded.gather(
            x, index, mode=mode, fill_value=fill_value, indices_are_sorted=indices_are_sorted,
            unique_indices=unique_indices, backend=backend,
        )
    del unique_indices  # A read takes each row independently.
    plan, operands = _validation.check_read(x, index, mode=mode, backend=backend)
    fill = _validation.check_fill_value(fill_value)
    call = _local_read.ReadCall.of(
        plan, mode=mode, fill=fill, indices_are_sorted=indices_are_sorted, backend=backend
    )
    return _local_read.read(x, operands, call)
