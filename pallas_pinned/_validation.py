"""Checks of ``(x, indices, updates)`` and the settings, before anything runs.

Everything here looks only at types, shapes, dtypes, memory kinds and devices,
so it works the same on concrete arrays and on tracers inside ``jit`` and
raises before any computation is staged: bad input leaves ``x`` untouched.
Index *values* are normalized later, on the device (``_rows.normalize_rows``).
"""

from __future__ import annotations

import dataclasses
import math
import struct
import warnings
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from pallas_pinned import _index, _index_parse, _placement, _registry

# jnp's scatter modes ("fill" means "drop" for a write, as in jnp), and ours:
# "wrap" takes every index modulo its axis.
MODES = (None, "drop", "fill", "clip", "promise_in_bounds", "wrap")
BACKENDS = _registry.BACKENDS
# jnp's get modes (jax 0.11.2 and 0.12): None means "promise_in_bounds" there,
# which XLA implements by clamping; "drop" means "fill". Plus "wrap".
GATHER_MODES = (None, "fill", "drop", "clip", "promise_in_bounds", "wrap")
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


def check_mode_and_backend(mode: Any, backend: Any, modes: tuple = MODES) -> None:
    if mode not in modes:
        raise ValueError(f"unknown mode {mode!r}; expected one of {modes}")
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; expected one of {BACKENDS}")


def check_buffer(x: Any, facts: _placement.Facts) -> None:
    """The buffer itself; ``facts`` are ``x``'s (``_placement.facts``)."""
    if not (isinstance(x, jax.Array) or hasattr(x, "aval")):
        raise TypeError(
            f"x must be a jax.Array (the buffer), got {type(x).__name__}; "
            "place it with jax.device_put(x, sharding) first"
        )
    if facts.deleted:
        raise ValueError(_placement.DELETED)
    if jnp.dtype(x.dtype) not in SUPPORTED_DTYPES:
        names = ", ".join(str(d) for d in SUPPORTED_DTYPES)
        raise TypeError(f"unsupported dtype {x.dtype} for x; supported: {names}")


def check_arguments_alive(**arguments: Any) -> None:
    """An index or updates array that was deleted (donated to an earlier call): refused
    before anything runs, where JAX would fail inside the op's own jit."""
    for name, value in arguments.items():
        for leaf in jax.tree.leaves(value):
            if _placement.is_concrete(leaf) and leaf.is_deleted():
                raise ValueError(
                    f"{name} holds an array that has been deleted (donated to an earlier "
                    "call, or deleted); pass a live array, such as the one that call returned"
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
    # A write that selects nothing takes updates of any shape, as jnp's scatter does.
    if result != tuple(target_shape) and math.prod(target_shape) != 0:
        raise ValueError(
            f"updates of shape {shape} cannot be broadcast to {tuple(target_shape)} "
            "(the shape the index writes: x.at[index].get()'s, but with each jax.ds window at "
            "its full size, as jnp's scatter takes it)"
        )
    warn_if_lossy(updates, x_dtype)


def warn_if_lossy(updates: Any, x_dtype) -> None:
    """jnp's warning where casting the updates to the buffer's type can lose information.

    jnp's rule: a cast is safe when promoting the updates with the buffer's type gives
    the buffer's type (Python scalars are weakly typed).
    """
    if jnp.result_type(updates, x_dtype) != jnp.dtype(x_dtype):
        warnings.warn(
            f"updates of dtype {jnp.result_type(updates)} are cast to the buffer's dtype "
            f"{jnp.dtype(x_dtype)}, which can lose information (jnp's .at[] warns the same "
            "way); they are cast before add, subtract, multiply, min or max combine them, "
            "where jnp combines in the promoted type; cast them yourself to silence this",
            FutureWarning,
            stacklevel=4,
        )


def named_operands(index: Any, operands: tuple) -> list[tuple[str, Any]]:
    """An index's dynamic operands with the names messages give them: ``indices`` for the
    index itself, ``index array k`` for a part of it (a tuple's array, a window's start)."""
    return [("indices" if operand is index else f"index array {k}", operand)
            for k, operand in enumerate(operands)]


def moving(name: str, *, onto_mesh: bool) -> str:
    """The call that puts input ``name`` on x's devices, in x's words: replicated over
    x's mesh, or on x's one device. ``<index array 0>`` stands for a part of the index."""
    code = name if name.isidentifier() else f"<{name}>"
    target = ("NamedSharding(x.sharding.mesh, P())" if onto_mesh
              else "x.sharding.with_memory_kind('device')")
    return f"jax.device_put({code}, {target})"


def _moving(name: str, x: Any) -> str:
    return moving(name, onto_mesh=isinstance(x.sharding, jax.sharding.NamedSharding))


def check_same_device(x: Any, facts: _placement.Facts, *others: tuple[str, Any]) -> None:
    """Committed concrete inputs must live on the buffer's device (any memory kind).

    An uncommitted one (``jnp.array(...)`` on the default device) moves with the
    call, as jit moves it: on a buffer of another device, eagerly as under jit.
    """
    concrete = facts.concrete
    if not concrete or len(x.sharding.device_set) == 1:  # Closed over by a jit, say.
        _check_traced_on_one_device(facts.typed_mesh, others)
    for name, other in others if concrete else ():
        if not (_placement.is_concrete(other) and other.committed):
            continue
        if other.sharding.device_set != x.sharding.device_set:
            raise ValueError(
                f"{name} is on {sorted(map(str, other.sharding.device_set))} but x is on "
                f"{sorted(map(str, x.sharding.device_set))}; move it to x's devices first, "
                f"e.g. {_moving(name, x)}"
            )
        theirs, ours = other.sharding, x.sharding
        if (len(theirs.device_set) > 1 and isinstance(theirs, jax.sharding.NamedSharding)
                and isinstance(ours, jax.sharding.NamedSharding)
                and not _placement.same_mesh(theirs.mesh, ours.mesh)):
            raise ValueError(
                f"{name} is sharded over another mesh than x ({theirs} against "
                f"{dict(ours.mesh.shape)}); put it on x's mesh, e.g. "
                f"{moving(name, onto_mesh=True)}"
            )
    _check_one_typed_mesh(facts, others)


def _check_traced_on_one_device(mesh: Any, others: tuple[tuple[str, Any], ...]) -> None:
    """Traced on one device (no mesh in its type, ``mesh``), x takes no input typed as
    sharded over a mesh: the kernels would fail deep inside Pallas, and jnp refuses it too."""
    if getattr(mesh, "axis_names", None):
        return
    for name, other in others:
        if not isinstance(other, jax.core.Tracer):
            continue
        sharding = getattr(jax.typeof(other), "sharding", None)
        if any(axes is not None for axes in getattr(sharding, "spec", ())):
            raise ValueError(
                f"{name} is sharded over the mesh {dict(sharding.mesh.shape)} "
                f"({sharding.spec}) but x is on one device; pass them on the same devices: "
                f"{name} on x's device ({moving(name, onto_mesh=False)}, outside the jit) "
                "or x on that mesh"
            )


def _check_one_typed_mesh(facts: _placement.Facts, others: tuple[tuple[str, Any], ...]) -> None:
    """x typed on a mesh of ``Auto`` axes only takes no input typed on a mesh with
    ``Explicit`` axes, concrete or traced: the kernels failed inside JAX ("Mesh for
    all inputs should be equal") or Pallas ("sharded ref ... can only be indexed by
    slices"), and jnp refuses it too. Where x's mesh has ``Explicit`` axes the ops run
    on each copy and gather such inputs first (``_placement.on_each_copy``); where it
    has ``Manual`` ones (a ``shard_map`` body) JAX's own message names the fix."""
    ours = facts.typed_mesh
    auto = jax.sharding.AxisType.Auto
    if ours is None or not ours.axis_names or any(t != auto for t in ours.axis_types):
        return
    for name, other in others:
        theirs = _placement.typed_mesh(other)
        if theirs is None or jax.sharding.AxisType.Explicit not in theirs.axis_types:
            continue
        where = "" if facts.concrete else ", outside the jit"
        raise ValueError(
            f"{name} is typed on the mesh {dict(theirs.shape)} with axis types "
            f"{_type_names(theirs)} but x on {dict(ours.shape)} with "
            f"{_type_names(ours)}; a call takes one mesh: put {name} on x's mesh "
            f"({moving(name, onto_mesh=True)}{where}) or x on that mesh"
        )


def _type_names(mesh: Any) -> str:
    return "(" + ", ".join(t.name for t in mesh.axis_types) + ")"


def check_not_aliased(x: Any, facts: _placement.Facts, *others: tuple[str, Any]) -> None:
    """The buffer is consumed (donated); it cannot also be read as another argument."""
    for name, other in others:
        same = other is x
        # Empty arrays may all share one (null) pointer: they hold nothing to alias.
        concrete = facts.concrete and _placement.is_concrete(other)
        if not same and concrete and x.size > 0 and other.size > 0:
            same = not _buffer_pointers(other).isdisjoint(_buffer_pointers(x))
        if same:
            raise ValueError(
                f"{name} is the buffer x itself; x is updated in place (donated), so it cannot "
                f"also be read as {name}. Pass a copy: jnp.array({name}, copy=True), or put "
                "it on the device with jax.device_put"
            )


def _buffer_pointers(a: Any) -> set[int]:
    """The device buffers behind ``a``: one, or one per addressable shard (a sharded or
    replicated array has no single pointer); none for a deleted array."""
    try:
        return {a.unsafe_buffer_pointer()}
    except (RuntimeError, ValueError):  # Deleted, or not one buffer.
        pass
    try:
        return {shard.data.unsafe_buffer_pointer() for shard in a.addressable_shards}
    except (RuntimeError, ValueError):
        return set()


def check_write(
    op: str, x: Any, index: Any, updates: Any, *, facts: _placement.Facts, mode: Any,
    backend: Any, sharded: bool = False,
) -> tuple[_index.IndexPlan, tuple]:
    """Every check of a write, in the order users fix them; returns the parsed index.
    ``facts`` are ``x``'s (``_placement.facts``): nothing here asks about ``x`` again.

    ``sharded``: ``x`` is sharded along axis 0 (the sharded layer places the index and
    updates on its mesh itself, so they may live anywhere; axis 0 must be indexed)."""
    check_mode_and_backend(mode, backend)
    check_buffer(x, facts)
    check_op_dtype(op, x.dtype)
    plan, operands = _index_parse.parse(index, x.shape, mode, min_lead=int(sharded))
    check_updates(updates, plan.result_shape, x.dtype)
    if not sharded:
        check_same_device(x, facts, ("indices", index), ("updates", updates))
    check_not_aliased(x, facts, ("indices", index), ("updates", updates))
    for name, operand in named_operands(index, operands):
        if not sharded:
            check_same_device(x, facts, (name, operand))
        check_not_aliased(x, facts, (name, operand))
    _registry.check_available(facts, backend, updates, *operands)
    return plan, operands


def check_read(
    x: Any, index: Any, *, facts: _placement.Facts, mode: Any, backend: Any,
) -> tuple[_index.IndexPlan, tuple]:
    """Every check of a read; returns the parsed index. ``facts`` as for check_write."""
    check_mode_and_backend(mode, backend, modes=GATHER_MODES)
    check_buffer(x, facts)
    plan, operands = _index_parse.parse(index, x.shape, mode, read=True)
    check_rows_to_read(x.shape, plan, mode)
    check_same_device(x, facts, ("indices", index))
    for name, operand in named_operands(index, operands):
        check_same_device(x, facts, (name, operand))
    _registry.check_available(facts, backend, *operands)
    return plan, operands


def check_kept(x: Any, facts: _placement.Facts, backend: Any, *others: tuple[str, Any]) -> None:
    """What a call whose signature passed the full checks before (``_front``'s kept
    plans) still checks, in check_write's order: what can change from call to call. A
    deleted buffer; ``others`` (a write's indices and updates) that are the buffer
    itself; whether an explicit kernel backend can run now (the registry's answer now,
    not when kept)."""
    if facts.deleted:
        raise ValueError(_placement.DELETED)
    check_not_aliased(x, facts, *others)
    _registry.check_available(facts, backend)


def check_op_dtype(op: str, dtype) -> None:
    """add and mul refuse a bool buffer (OR is ``.max``). jnp refuses bool updates there,
    and combines numeric ones in their promoted type before casting back to bool."""
    if op in ("add", "mul") and jnp.dtype(dtype) == jnp.bool_:
        raise TypeError(
            f"{'scatter_add_to_host' if op == 'add' else 'scatter_mul_to_host'} does not "
            f"{op} into a bool buffer (x has dtype {dtype}); use .max (OR) or .min (AND), "
            "or store the flags as uint8"
        )


def check_rows_to_read(shape: tuple[int, ...], plan: _index.IndexPlan, mode: Any) -> None:
    """An indexed axis of length 0 has nothing to clamp to: only the filling modes read it."""
    empty_axis = any(shape[item.axis] == 0 for item in plan.items if item.axis >= 0)
    if empty_axis and plan.num_entries > 0 and mode not in FILL_MODES:
        raise ValueError(
            f"x of shape {shape} has no rows to read with mode={mode!r}; "
            "use mode='fill' to get fill values for rows that do not exist"
        )


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


def scalar_key(value: Any) -> tuple:
    """A static Python scalar as a cache key: a float by its bits (a NaN equals a NaN of
    the same bits, -0.0 is not 0.0), anything else by type and value (numpy's bytes would
    make -1 and 2**64 - 1 one key)."""
    bits = struct.pack("<d", value) if isinstance(value, float) else value
    return type(value), bits


@dataclasses.dataclass(frozen=True, eq=False)
class StaticScalar:
    """A fill value as a jit cache key: equal by type and bits, so NaN == NaN, and a NaN
    of another sign or payload (or -0.0 and 0.0) is another key."""

    value: Any

    def _key(self):
        return scalar_key(self.value)

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
