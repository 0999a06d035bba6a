"""The public ops' one front: validate, then hand the call to the sharded or the local layer.

Every public op (``scatter*_to_host``, ``gather_from_host``, ``at``) is this
module's :func:`write` or :func:`read` with its docstring. Imports run one
way: public op → this front → sharded layer → local layer → shared helpers →
kernels; nothing below calls back up.
"""

from __future__ import annotations

import reprlib
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from pallas_pinned import (
    _index_lists,
    _local_read,
    _local_write,
    _placement,
    _rows,
    _sharded,
    _validation,
)

__all__ = ["read", "write"]

# Eager calls repeat one signature many times (a replay buffer's inserts, a decode
# loop's cache writes), and every check before a call looks only at the arguments'
# types, shapes, dtypes and shardings and at the settings (``_validation``). So the
# index plan of a signature that passed once is kept, and a call of that signature
# only checks what can change from call to call: a deleted buffer, and a buffer
# passed again as its own index or updates (and whether an explicit kernel backend
# can run). The checks cost more than the rest of a small eager call
# (docs/PERFORMANCE.md, "One call"). Only calls whose
# index is one concrete array and whose updates already have the buffer's dtype
# (no cast to warn about) are kept.
_PLANS: dict = {}
_MAX_PLANS = 256


def _signature(*parts: Any, x: _placement.Facts, arrays: tuple) -> tuple | None:
    """The key of a call whose buffer (``x``: its facts) and every array are concrete
    (``None``: not one to keep)."""
    if x.signature is None or not all(_placement.is_concrete(a) for a in arrays):
        return None
    # Committed or not: an uncommitted array may sit on another device than x.
    key = (*parts, x.signature, *((a.shape, a.dtype, a.sharding, a.committed) for a in arrays))
    try:
        hash(key)
    except TypeError:  # A setting of an unhashable type: checked in full every call.
        return None
    return key


def _kept(key: tuple | None) -> Any:
    """The value kept for ``key``; None if none is."""
    return None if key is None else _PLANS.get(key)


def _keep(key: tuple | None, value: Any, operands: tuple, index: Any) -> None:
    """Keeps a checked ``value`` for ``key`` when its only operand is ``index`` itself."""
    if key is None or len(operands) != 1 or operands[0] is not index:
        return
    if len(_PLANS) >= _MAX_PLANS:
        try:
            _PLANS.pop(next(iter(_PLANS)), None)  # The oldest signature goes first.
        except (RuntimeError, StopIteration):  # Another thread got there first.
            pass
    _PLANS[key] = value


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
    """``x.at[index].<op>(updates)`` for ``op`` in set, add, sub, min, max, mul."""
    settings = dict(
        mode=mode, unique_indices=unique_indices, indices_are_sorted=indices_are_sorted,
        backend=backend,
    )
    _check_static_flags(unique_indices=unique_indices, indices_are_sorted=indices_are_sorted)
    _validation.check_arguments_alive(indices=index, updates=updates)
    updates = _as_updates(updates, getattr(x, "dtype", None))
    if op == "sub":
        op, updates = "add", _negated(x, updates)
    # x's facts are read once, here; the rest of the path takes them (and each module
    # below sees x at most once: tests/test_one_pass.py).
    facts = _placement.facts(x)
    with _local_write.naming_the_jvp_fix(op):
        if facts.sharded:
            return _sharded.write(op, x, index, updates, facts=facts, **settings)
        shape = x.shape if facts.concrete else None  # None: x is traced (or not an array).
        index, lifted = _positions_as_values(index, updates, shape)
        key = None
        if isinstance(updates, jax.Array) and updates.dtype == getattr(x, "dtype", None):
            key = _signature("write", op, *settings.items(), x=facts, arrays=(index, updates))
        plan = _kept(key)
        if plan is None:
            plan, operands = _validation.check_write(
                op, x, index, updates, facts=facts, mode=mode, backend=backend)
            _keep(key, plan, operands, index)
        else:
            operands = (index,)
            _validation.check_kept(x, facts, backend, ("indices", index), ("updates", updates))
        plan = plan.with_starts_in_range(lifted)
        call = _local_write.WriteCall.of(op, plan, **settings)
        return _local_write.write(x, facts, operands, updates, call)


def _positions_as_values(index: Any, updates: Any, shape: tuple | None,
                         ) -> tuple[Any, frozenset]:
    """An eager call's index with its Python- and numpy-int positions as 0-d int32 arrays,
    and the buffer axes of those it lifted. ``shape``: a concrete buffer's (None: traced).

    A static position is part of the compiled program, so an eager loop over
    positions (``at(cache)[t].set(v)`` for each ``t``) would compile once per
    value (about 40 ms each on a 2-core CPU, against jnp's 0.3 ms per call). For
    an index of ints, unit-step static slices, ``None`` and ``...`` only, an int
    in ``[0, axis length)`` selects the same elements, static or not, in every
    mode and op (jnp's semantics differ only out of range, and beside a strided
    ``jax.ds``, which this leaves static): one program then serves every value.
    Inside a trace (``x`` or ``updates`` a tracer) nothing changes: a user's jit
    compiles its static positions once anyway. Under a transfer guard neither: the
    value would be a host-to-device transfer the static int never made. Each lifted
    value was seen in range, so its axis needs no run-time check: the caller marks
    the plan (``IndexPlan.with_starts_in_range``), and the call takes the path the
    static int takes (a strided block's set stays one copy).
    """
    items = index if isinstance(index, tuple) else (index,)
    if (shape is None or isinstance(updates, jax.core.Tracer)
            or not any(_is_int(it) for it in items) or _transfers_guarded()):
        return index, frozenset()
    if not all(_is_int(it) or it is None or it is Ellipsis or _unit_static_slice(it)
               for it in items) or sum(it is Ellipsis for it in items) > 1:
        return index, frozenset()
    consuming = sum(it is not None and it is not Ellipsis for it in items)
    if consuming > len(shape):
        return index, frozenset()  # The parser names the fault.
    lifted, axes, axis = [], set(), 0
    for it in items:
        if it is Ellipsis:
            axis = len(shape) - (consuming - axis)
        elif it is not None:
            if _is_int(it) and 0 <= int(it) < min(shape[axis], 2**31 - 1):
                it = jnp.asarray(int(it), jnp.int32)
                axes.add(axis)
            axis += 1
        lifted.append(it)
    return (tuple(lifted) if isinstance(index, tuple) else lifted[0]), frozenset(axes)


def _transfers_guarded() -> bool:
    return any(level not in (None, "allow") for level in (
        jax.config.jax_transfer_guard, jax.config.jax_transfer_guard_host_to_device))


def _is_int(it: Any) -> bool:
    """A Python or numpy int (not a bool, which jnp reads as a mask)."""
    return type(it) is int or isinstance(it, np.integer)


def _unit_static_slice(it: Any) -> bool:
    return isinstance(it, slice) and all(
        b is None or type(b) is int for b in (it.start, it.stop)
    ) and it.step in (None, 1)


def _check_static_flags(**flags: Any) -> None:
    """The promises are static settings (a write's plan depends on them), so a trace
    must know them."""
    for name, value in flags.items():
        if isinstance(value, jax.core.Tracer):
            raise TypeError(
                f"{name} must be a Python bool known while tracing (a static setting), "
                f"got a traced value {value!r}; pass it as a static argument of your jit"
            )
        if isinstance(value, str | bytes):
            # A promise: a truthy "False" would promise what may not hold. What jnp takes
            # (bools, 0 and 1, None) is taken as its truth value, as jnp takes it.
            raise TypeError(f"{name} must be True or False, got the string {value!r}")
        try:
            scalar = np.ndim(value) == 0
        except ValueError:  # a ragged nesting
            scalar = False
        if not scalar:
            # One promise covers the whole call; numpy's "truth value of an array" would not
            # say which argument it means.
            raise TypeError(f"{name} must be True or False, got {reprlib.repr(value)}")


def _negated(x: Any, updates: Any) -> Any:
    """``.subtract``'s updates for ``add``: cast to ``x``'s type as add casts them (with
    jnp's warning where that can lose information), then negated there, where ``x - y``
    and ``x + (-y)`` agree (negation is exact, and integers wrap alike). What is not
    numeric goes on unchanged, for add's own refusal, and so does ``x`` itself."""
    dtype = getattr(x, "dtype", None)
    if dtype is not None and jnp.dtype(dtype) == jnp.bool_:
        raise TypeError(
            f"subtract from a bool buffer (x has dtype {dtype}) is not provided: jnp refuses "
            "bool updates there, and subtracts numeric ones in their promoted type before "
            "casting back to bool. For x AND NOT y use .min(~y); for jnp's numeric result "
            "store the flags as uint8"
        )
    if dtype is None or updates is x:
        return updates
    try:
        updates = jnp.asarray(_placement.to_device_memory(updates))
    except (TypeError, ValueError):  # jnp says ValueError for None: add names it "updates"
        return updates
    if not (jnp.issubdtype(updates.dtype, jnp.number) or updates.dtype == jnp.bool_):
        return updates
    _validation.warn_if_lossy(updates, dtype)
    return -_rows.cast_updates(updates, dtype)


def _as_updates(updates: Any, x_dtype) -> Any:
    """Updates as jnp's ``.at[]`` takes them: a list becomes an array, and a Python int
    too large for the default int type (2**32 - 1 into uint32) one of ``x``'s type."""
    if isinstance(updates, list | tuple):
        return _index_lists.list_as_array(updates, "updates", build=jnp.asarray)
    if (
        type(updates) is int and x_dtype is not None and jnp.issubdtype(x_dtype, jnp.integer)
        and not _fits(updates, jnp.int_) and _fits(updates, x_dtype)
    ):
        return np.asarray(updates, dtype=x_dtype)
    return updates


def _fits(value: int, dtype) -> bool:
    info = jnp.iinfo(jax.dtypes.canonicalize_dtype(dtype))
    return info.min <= value <= info.max


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
    _check_static_flags(unique_indices=unique_indices, indices_are_sorted=indices_are_sorted)
    _validation.check_arguments_alive(indices=index)
    facts = _placement.facts(x)  # Read once, as for a write.
    if facts.sharded:
        return _sharded.gather(
            x, index, mode=mode, fill_value=fill_value, indices_are_sorted=indices_are_sorted,
            unique_indices=unique_indices, backend=backend, facts=facts,
        )
    del unique_indices  # A read takes each row independently.
    index, lifted = _positions_as_values(index, None, x.shape if facts.concrete else None)
    key = None
    if isinstance(fill_value, int | float | None):
        # By its bits: as dict keys, -0.0 equals 0.0 and a NaN equals nothing.
        fill = _validation.scalar_key(fill_value)
        key = _signature("read", mode, backend, *fill, x=facts, arrays=(index,))
    kept = _kept(key)
    if kept is None:
        plan, operands = _validation.check_read(x, index, facts=facts, mode=mode,
                                                backend=backend)
        fill = _validation.check_fill_value(fill_value)
        _keep(key, (plan, fill), operands, index)
    else:
        (plan, fill), operands = kept, (index,)
        _validation.check_kept(x, facts, backend)
    plan = plan.with_starts_in_range(lifted)
    call = _local_read.ReadCall.of(
        plan, mode=mode, fill=fill, indices_are_sorted=indices_are_sorted, backend=backend
    )
    return _local_read.read(x, facts, operands, call)
