"""Where arrays live: memory spaces, platforms, and buffers whose type disagrees.

JAX records an array's memory in two places: its sharding's ``memory_kind``
(what the runtime allocated) and its type's ``memory_space`` (what a trace
sees). They can disagree: arrays made by ``jit(out_shardings=
make_single_device_sharding(..., memory_kind="pinned_host"))``, ``make_array_from_callback`` or
``make_array_from_single_device_arrays`` have a ``pinned_host`` sharding but a
type that says device memory (jax 0.11-0.12 derives the space from the
sharding only for ``NamedSharding``). A trace of such an array plans device
memory for a host buffer: XLA then refuses to compile on the GPU, and with a
donated buffer jax 0.12 aborts the process on CPU. So concrete arrays are
judged by their sharding, and :func:`fix_memory_space` re-describes the same
buffers with an equivalent ``NamedSharding``, which carries the right type.
Tracers carry only their type, which is all a trace can know.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

__all__ = [
    "DELETED",
    "Facts",
    "explicit_mesh",
    "facts",
    "fix_memory_space",
    "gathered",
    "is_concrete",
    "named_axes",
    "on_each_copy",
    "on_host",
    "place_like",
    "place_result",
    "platform_of",
    "read_nothing_of",
    "replicated_like",
    "same_mesh",
    "to_device_memory",
    "typed_mesh",
    "varying_as",
    "wait_for_result",
    "varying_axes",
]

_HOST = jax.memory.Space.Host


def is_concrete(a: Any) -> bool:
    return isinstance(a, jax.Array) and not isinstance(a, jax.core.Tracer)


DELETED = "x has been deleted (donated to an earlier call); use the array that call returned"


class Facts(NamedTuple):
    """What the ops ask about their buffer ``x``, read once per call by :func:`facts`: the
    checks and the run take these instead of asking about ``x`` again."""

    concrete: bool  # a jax.Array, not a tracer
    deleted: bool  # concrete and deleted (donated to an earlier call)
    in_host_memory: bool  # concrete, in host memory, pinned or not: what an eager write consumes
    sharded: bool  # the sharded layer's buffer (``_sharded.is_sharded_buffer``)
    sharding: Any  # the array's sharding when concrete, else its type's (None: no type)
    typed_mesh: Any  # the mesh of its type (:func:`typed_mesh`)
    signature: tuple | None  # what of a concrete x keys a kept plan (``_front``)
    buffer: Any  # x; concrete and alive, with a type that agrees with its memory
    platform: str  # where it is placed (:func:`platform_of`)
    varying: frozenset  # the shard_map axes its type varies along (:func:`varying_axes`)

    @property
    def explicit_mesh(self) -> Any:
        """The mesh of x's type when it has an ``Explicit`` axis; else None."""
        return _explicit(self.typed_mesh)


def facts(x: Any) -> Facts:
    """Everything the ops ask about the buffer ``x``, read once.

    Reading them raises nothing, whatever ``x`` is: judging them is ``_validation``'s.
    ``buffer`` is :func:`fix_memory_space`'s ``x`` where that applies (no copy)."""
    mesh = typed_mesh(x)
    if not is_concrete(x):
        sharding = getattr(jax.typeof(x), "sharding", None) if hasattr(x, "aval") else None
        return Facts(False, False, False, _traced_sharded(sharding), sharding, mesh, None, x,
                     platform_of(x), varying_axes(x))
    sharding, deleted = x.sharding, x.is_deleted()
    named = isinstance(sharding, jax.sharding.NamedSharding)
    sharded = (named and bool(named_axes(sharding.spec))) or (
        len(sharding.device_set) > 1 and not sharding.is_fully_replicated)
    return Facts(
        concrete=True, deleted=deleted,
        in_host_memory=sharding.memory_kind in ("pinned_host", "unpinned_host"),
        sharded=sharded, sharding=sharding, typed_mesh=mesh,
        signature=(x.shape, x.dtype, sharding, x.committed),
        buffer=x if deleted else _agreeing_type(x),
        platform=platform_of(x), varying=varying_axes(x),
    )


def _traced_sharded(sharding: Any) -> bool:
    """A traced buffer is the sharded layer's when its type names a mesh axis that is not
    ``Manual`` (inside ``shard_map`` the local shard's axes are)."""
    mesh = getattr(sharding, "mesh", None)
    if mesh is None:
        return False
    kinds = dict(zip(mesh.axis_names, mesh.axis_types, strict=True))
    manual = jax.sharding.AxisType.Manual
    return any(kinds.get(name) != manual for name in named_axes(sharding.spec))


def named_axes(spec) -> tuple[str, ...]:
    """The mesh axes a ``PartitionSpec`` names, in order."""
    names: list[str] = []
    for entry in spec:
        if entry is None or entry is jax.sharding.PartitionSpec.UNCONSTRAINED:
            continue
        names.extend((entry,) if isinstance(entry, str) else entry)
    return tuple(names)


def wait_for_inputs(*args: Any) -> None:
    """Waits until the concrete arrays among ``args`` are computed; raises the error of one
    whose computation failed. An eager write donates ``x`` as it is dispatched, and a run that
    fails on an input has consumed ``x`` by then (jnp's copying ``x.at`` keeps it): waiting
    first raises that error while ``x`` is still the caller's. The cost: the write is
    dispatched once its inputs exist instead of being queued behind them."""
    try:
        jax.block_until_ready([a for a in jax.tree.leaves(args) if is_concrete(a)])
    except Exception as error:
        error.add_note("pallas_pinned: an index or updates array of this write failed to "
                       "compute; nothing was written and x was not consumed")
        raise


def wait_for_result(result: Any) -> Any:
    """An eager call returns once its computation has completed.

    JAX frees a pinned_host array that Python drops while a computation still reads or
    writes it, and the next pinned_host array can get that memory at once: waiting
    here, while the call still holds its arguments, keeps every one of them alive
    until the computation is done (under jit, the caller's own program does).
    """
    return jax.block_until_ready(result)


def on_host(a: Any) -> bool:
    """Whether ``a`` lives in pinned host memory (by its sharding when concrete)."""
    if is_concrete(a):
        return a.sharding.memory_kind == "pinned_host"
    return getattr(jax.typeof(a), "memory_space", None) == _HOST


def to_device_memory(a: Any) -> Any:
    """``a`` in device memory: the kernels read indices and updates from there."""
    if isinstance(a, jax.Array | jax.core.Tracer) and on_host(a):
        return jax.device_put(a, jax.memory.Space.Device)
    return a


def same_mesh(a, b) -> bool:
    """Same axes; and the same devices in the same order when both are concrete."""
    concrete = isinstance(a, jax.sharding.Mesh) and isinstance(b, jax.sharding.Mesh)
    same_axes = a.axis_names == b.axis_names and a.axis_sizes == b.axis_sizes
    return same_axes and (not concrete or bool((a.devices == b.devices).all()))


def read_nothing_of(x: Any, out: Any) -> Any:
    """``out`` (built without reading ``x``), made to depend on ``x`` to no effect.

    A jit whose result does not read its buffer drops it, and with it the
    buffer's devices: a read of no rows (or from an empty axis) would come
    back on one device where its other reads are on ``x``'s mesh, or fail to
    build a result typed on it. ``lax.select``, which ``jnp.where`` would skip
    for an empty result, keeps every bit of ``out``.
    """
    nothing = to_device_memory(lax.slice_in_dim(x, 0, 0, axis=0))
    return lax.select(jnp.any(nothing != nothing), jnp.zeros_like(out), out)


def typed_mesh(a: Any) -> Any:
    """The (abstract) mesh of ``a``'s type; None for what has no JAX type or no mesh."""
    if not isinstance(a, jax.Array | jax.core.Tracer):
        return None
    return getattr(getattr(jax.typeof(a), "sharding", None), "mesh", None)


def explicit_mesh(x: Any):
    """The mesh ``x``'s type carries when it has an ``Explicit`` axis; else None."""
    return _explicit(typed_mesh(x))


def _explicit(mesh: Any):
    explicit = jax.sharding.AxisType.Explicit
    if mesh is not None and not mesh.empty and any(t == explicit for t in mesh.axis_types):
        return mesh
    return None


def place_like(a: Any, x: Any) -> Any:
    """``a`` (a new part of ``x``) placed as ``x`` is, for an update slice into it.

    Its memory space; and when ``x``'s type carries a mesh with ``Explicit``
    axes (a replicated buffer on ``jax.make_mesh``'s mesh, or one that mixes
    axis types), replicated over that mesh: an update slice wants its operands
    sharded alike.
    """
    mesh = explicit_mesh(x)
    if mesh is not None:
        replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
        a = jax.sharding.reshard(a, replicated)
    return jax.device_put(a, _HOST) if on_host(x) else a


def replicated_like(x: Any, a: Any) -> Any:
    """``a`` (an index array or the updates), gathered (:func:`gathered`) when ``x``'s
    type carries a mesh with ``Explicit`` axes; else as it is."""
    return a if explicit_mesh(x) is None else gathered(a)


def gathered(a: Any) -> Any:
    """``a`` replicated over its mesh when its type shards it (a data-parallel batch of
    indices); anything else as it is.

    The ops compare and sort whole index lists: every device needs every entry.
    """
    if not isinstance(a, jax.Array | jax.core.Tracer):
        return a
    sharding = getattr(jax.typeof(a), "sharding", None)
    mesh = getattr(sharding, "mesh", None)
    if mesh is None or mesh.empty or all(entry is None for entry in sharding.spec):
        return a
    return jax.sharding.reshard(to_device_memory(a), jax.sharding.NamedSharding(
        mesh, jax.sharding.PartitionSpec()))


def on_each_copy(fn, x: Any, *args: Any) -> Any | None:
    """``fn(x, *args)`` run on every copy of ``x``, replicated over the ``Explicit``
    axes of its mesh; None where ``x``'s type carries no such axis.

    The local ops take whole arrays; typed on a mesh with ``Explicit`` axes,
    every operation inside them would follow sharding-in-types rules (a
    ``pallas_call`` wants its mesh axes ``Manual``; an update slice its operands
    sharded alike: Pallas's interpreter failed there on a mesh mixing in ``Auto``
    axes). Inside a ``shard_map`` manual over the ``Explicit`` axes, each copy is
    whole along them and the ops run as on one device; ``Auto`` axes stay XLA's
    (a trace does not see whether they shard ``x``). Arguments sharded over the
    mesh are gathered first; other values are constants of ``fn``.
    """
    mesh = explicit_mesh(x)
    if mesh is None:
        return None
    explicit = jax.sharding.AxisType.Explicit
    manual = {a for a, t in zip(mesh.axis_names, mesh.axis_types, strict=True) if t == explicit}
    leaves, tree = jax.tree.flatten(args)
    arrays = [isinstance(a, jax.Array | jax.core.Tracer) for a in leaves]

    def body(x_copy, *array_leaves):
        it = iter(array_leaves)
        return fn(x_copy, *tree.unflatten([next(it) if is_array else leaf
                                           for leaf, is_array in zip(leaves, arrays, strict=True)]))

    passed = [gathered(a) for a, is_array in zip(leaves, arrays, strict=True) if is_array]
    spec = jax.sharding.PartitionSpec()
    # check_vma=False: the ops stage kernels whose outputs carry no varying-axes type.
    return jax.shard_map(body, mesh=mesh, in_specs=spec, out_specs=spec, axis_names=manual,
                         check_vma=False)(x, *passed)


def varying_as(x: Any, *others: Any) -> Any:
    """``x`` typed as varying over every mesh axis ``others`` vary over, inside a
    ``shard_map`` that checks varying axes (``check_vma=True``).

    A write of updates that differ from device to device gives each device its own
    buffer, as jnp's does. The kernels' output takes ``x``'s type and XLA's path the
    union of its operands': without this the two branches of ``auto`` differed in
    type ("switch branches must have equal output types"). No data moves.
    """
    have = varying_axes(x)
    wanted = frozenset().union(*map(varying_axes, others)) - have
    return jax.lax.pcast(x, tuple(sorted(wanted)), to="varying") if wanted else x


def varying_axes(a: Any) -> frozenset:
    """The mesh axes ``a``'s type varies along (empty outside a checking ``shard_map``)."""
    if not isinstance(a, jax.Array | jax.core.Tracer):
        return frozenset()
    manual = getattr(jax.typeof(a), "manual_axis_type", None)
    return frozenset(getattr(manual, "varying", None) or ())


def place_result(out: jax.Array, x: jax.Array) -> jax.Array:
    """Declares a kernel's aliased result in ``x``'s memory space.

    ``pallas_call`` and ``triton_call`` declare their outputs in device
    memory; the result is the aliased host buffer, so saying where it lives
    keeps XLA from moving it.
    """
    return jax.device_put(out, _HOST) if on_host(x) else out


def platform_of(x: Any) -> str:
    """The platform ``x`` is placed on, or, inside a trace, the default one."""
    if is_concrete(x):
        return next(iter(x.sharding.device_set)).platform
    return jax.default_backend()


def fix_memory_space(x: jax.Array) -> jax.Array:
    """Returns ``x`` with a type whose memory space agrees with its sharding.

    For a single-device ``pinned_host`` array whose type says device memory
    (see the module docstring), the same buffer is wrapped again under an
    equivalent one-device ``NamedSharding``: no copy, no data movement, and
    ``x`` stays valid. Any other array is returned as it is. Call it on
    buffers from checkpoint restores or ``jit(out_shardings=...)`` before
    passing them into your own ``jax.jit``; the ops call it themselves when
    called outside ``jit``, so their results come back with the agreeing type
    (an equivalent sharding: same device, same memory kind).
    """
    if isinstance(x, jax.core.Tracer):
        raise TypeError(
            "fix_memory_space takes a concrete jax.Array, not a traced value: call it "
            "outside jax.jit, on the buffer you are about to pass in"
        )
    if not isinstance(x, jax.Array):
        raise TypeError(
            f"fix_memory_space takes a jax.Array, got {type(x).__name__}; place it in "
            "pinned host memory first with jax.device_put"
        )
    if x.is_deleted():
        raise ValueError(DELETED)
    return _agreeing_type(x)


def _agreeing_type(x: jax.Array) -> jax.Array:
    """:func:`fix_memory_space` of a live concrete array."""
    kind = x.sharding.memory_kind
    if kind != "pinned_host" or jax.typeof(x).memory_space == _HOST:
        return x
    devices = list(x.sharding.device_set)
    if len(devices) != 1:
        return x  # Multi-device shardings that are not named: left as they are.
    mesh = jax.sharding.Mesh(np.asarray(devices), ("_one_device",))
    named = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(), memory_kind=kind)
    # Wraps the existing per-device buffer: no copy (tests compare pointers).
    return jax.make_array_from_single_device_arrays(
        x.shape, named, [shard.data for shard in x.addressable_shards]
    )

