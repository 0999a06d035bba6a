"""The ops (the writes and the read) on one buffer sharded along axis 0 over a mesh, by global rows.

A buffer such as ``jax.device_put(x, NamedSharding(mesh, P("data"),
memory_kind="pinned_host"))`` holds rows ``[k*m, (k+1)*m)`` on the devices of
shard ``k`` (``m = rows / shards``; mesh axes not named in the spec hold
replicas, each updated alike). :func:`write` (set, add, min, max, mul) and
:func:`gather` take the public ops' arguments, with *global* indices, and
return what they return: the updated buffer with ``x``'s sharding and memory
kind, or for a gather the rows in device memory, **replicated** over the mesh.
Each device runs the existing single-device op on its own shard (inside
``jax.shard_map``, with local row numbers); the buffer is never gathered,
moved or copied. How indices travel and what that costs in device memory and
network bytes, against a sort-by-owner all-to-all: :mod:`._sharded_route`.

The public ops route here first (``_front``): ``if is_sharded_buffer(x): return
write(...)``. Every index form of the single-device ops is taken; the sharded
axis stays axis 0. Supported: a concrete array whose ``NamedSharding``
shards axis 0 only (over one or several mesh axes; axes of size 1 split
nothing, so a spec naming only those is one shard), rows divisible by the
shard count, and inside ``jit`` a traced buffer whose *type* carries that
sharding (a mesh with ``Explicit`` axes, ``jax.make_mesh``'s default in jax
0.12). Other layouts, uneven shards (which jax 0.12 itself refuses to build),
indices or updates outside the buffer's mesh or on another mesh are refused
with a ``ValueError`` before anything runs, ``x`` intact. Outside ``jit`` the
buffer is donated, as the single-device ops do.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from pallas_pinned import (
    _index_parse,
    _local_read,
    _local_write,
    _placement,
    _registry,
    _validation,
)
from pallas_pinned._sharded_route import (
    GatherConfig,
    Layout,
    WriteConfig,
    eager_write,
    gather_jit,
    gather_traced,
    write_differentiable,
)

__all__ = ["gather", "is_sharded_buffer", "scatter", "scatter_add", "write"]

_EXPLICIT = jax.sharding.AxisType.Explicit


def is_sharded_buffer(x: Any) -> bool:
    """Whether the public ops must hand ``x`` to this module.

    Concrete: ``x`` spans more than one device, or its ``NamedSharding`` names a
    mesh axis (even one of size 1: ``jax.make_mesh((1,), ("data",))`` on one
    GPU types the buffer ``f32[8@data]``, which the local ops cannot take).
    This module runs the layout it supports and refuses any other with the
    reason. A replicated buffer (``P()``) is as many whole copies: the local
    ops update each alike, eagerly as under jit. Traced: ``x``'s type names a
    mesh axis that is not ``Manual``. Traced buffers whose type says nothing
    (``Auto`` meshes) stay with the single-device ops; inside ``shard_map``
    the local shard's mesh axes are ``Manual``, so the local ops take it, as
    they must. (``_placement.facts`` reads it with the buffer's other facts.)
    """
    return _placement.facts(x).sharded


def _layout(x: Any, facts: _placement.Facts) -> Layout:
    """``check_buffer``'s checks for a sharded buffer, and how it is split; or raises."""
    _validation.check_buffer(x, facts)
    concrete = facts.concrete
    if x.ndim == 0:
        raise ValueError(f"x must have at least one axis to index, got shape {x.shape}")
    sharding = facts.sharding
    if not isinstance(sharding, NamedSharding):
        raise ValueError(
            f"x spans {len(sharding.device_set)} devices with a {type(sharding).__name__}; "
            "a sharded buffer needs NamedSharding(mesh, P(axis), memory_kind=...) that "
            "shards axis 0 only"
        )
    mesh, spec = sharding.mesh, tuple(sharding.spec)
    first = spec[0] if spec else None
    if not concrete and first is None and any(t != _EXPLICIT for t in mesh.axis_types):
        raise ValueError(
            f"x is traced on a mesh with axis types {mesh.axis_types}, so its type does not "
            "say how it is sharded; make the mesh with Explicit axes (jax.make_mesh's "
            "default) or call the op outside jit"
        )
    # Mesh axes of size 1 split nothing: named on other axes, or only on them, they
    # leave one shard along those axes (axis 0 unsplit: no axes, one shard).
    size_one = all(mesh.shape[a] == 1 for a in _placement.named_axes(spec))
    if (first is None and not size_one) or any(
            mesh.shape[a] > 1 for a in _placement.named_axes(spec[1:])):
        raise ValueError(
            f"x is sharded as {sharding.spec} over mesh {dict(mesh.shape)}; the ops take a "
            "buffer sharded along axis 0 only, e.g. P('data'), other axes replicated"
        )
    axes = _placement.named_axes(spec[:1])
    shards = math.prod(mesh.shape[a] for a in axes)
    if x.shape[0] % shards:
        raise ValueError(
            f"x has {x.shape[0]} rows, which {shards} shards (mesh axes {axes}) do not split "
            "evenly; pad the buffer to a multiple of the shard count"
        )
    return Layout(mesh, axes, shards, P(*spec))


def _place(name: str, a: Any, layout: Layout, traced: bool) -> Any:
    """``a`` replicated over the buffer's mesh when concrete, or a clear refusal.

    Inside a trace (``traced``) nothing moves here: the traced step gathers.
    """
    if isinstance(a, jax.core.Tracer):
        mesh = _placement.typed_mesh(a)
        if mesh is not None and mesh.axis_names and not _placement.same_mesh(mesh, layout.mesh):
            raise ValueError(
                f"{name} is traced on mesh {dict(mesh.shape)} but x on "
                f"{dict(layout.mesh.shape)}; use the buffer's mesh"
            )
        return a
    if traced or not hasattr(a, "shape"):
        return a  # Python scalars and closed-over constants: constants of the trace.
    if isinstance(a, jax.Array):
        devices = a.sharding.device_set
        if a.committed and not devices <= set(layout.mesh.devices.flat):
            raise ValueError(
                f"{name} is on {sorted(map(str, devices))}, outside x's mesh "
                f"{dict(layout.mesh.shape)}; put it on x's mesh first, e.g. "
                f"{_validation.moving(name, onto_mesh=True)}"
            )
        if len(devices) > 1:
            named = isinstance(a.sharding, NamedSharding)
            if not (named and _placement.same_mesh(a.sharding.mesh, layout.mesh)):
                raise ValueError(
                    f"{name} is sharded over another mesh than x ({a.sharding} against "
                    f"{dict(layout.mesh.shape)}); put it on x's mesh, e.g. "
                    f"{_validation.moving(name, onto_mesh=True)}"
                )
            return a  # On the mesh already: the traced step gathers it.
        if a.committed and devices != set(layout.mesh.devices.flat):
            # Committed to some of the mesh's devices: jnp refuses it too.
            raise ValueError(
                f"{name} is on {sorted(map(str, devices))} but x is on its mesh "
                f"{dict(layout.mesh.shape)}; put it on x's mesh first, e.g. "
                f"{_validation.moving(name, onto_mesh=True)}"
            )
    # numpy, or uncommitted on one device: a broadcast, which moves what an all-gather moves.
    return jax.device_put(a, NamedSharding(layout.mesh, P()))


def write(op, x, index, updates, *, mode=None, unique_indices=False,
          indices_are_sorted=False, backend="auto", facts=None):
    """A write (``op``: set, add, min, max, mul) on a buffer sharded along axis 0;
    ``facts`` are ``x``'s (``_placement.facts``), read here when not given."""
    facts = _placement.facts(x) if facts is None else facts
    # The single-device checks, against the global shape.
    _validation.check_mode_and_backend(mode, backend)
    layout = _layout(x, facts)
    plan, operands = _validation.check_write(op, x, index, updates, facts=facts, mode=mode,
                                             backend=backend, sharded=True)
    traced = not facts.concrete
    operands = tuple(_place(name, a, layout, traced)
                     for name, a in _validation.named_operands(index, operands))
    updates = _place("updates", updates, layout, traced)
    call = _local_write.WriteCall.of(
        op, plan, mode=mode, unique_indices=unique_indices,
        indices_are_sorted=indices_are_sorted, backend=backend,
    )
    cfg = WriteConfig(layout, call)
    if traced:
        return write_differentiable(x, operands, updates, cfg)
    if plan.num_entries == 0 or x.size == 0:
        return x  # Nothing to write: the buffer stays as it is, not consumed.
    donate = facts.in_host_memory and _local_write.may_donate(operands, updates)
    written = eager_write(x.sharding, donate)(x, operands, updates, cfg)
    return _placement.wait_for_result(written)


def scatter(x, index, updates, **settings):
    """``scatter_to_host`` on a buffer sharded along axis 0 (global indices)."""
    return write("set", x, index, updates, **settings)


def scatter_add(x, index, updates, **settings):
    """``scatter_add_to_host`` on a buffer sharded along axis 0 (global indices)."""
    return write("add", x, index, updates, **settings)


def gather(x, index, *, mode=None, fill_value=None, indices_are_sorted=False,
           unique_indices=False, backend="auto", facts=None):
    """``gather_from_host`` on a buffer sharded along axis 0; the result is replicated.
    ``facts`` are ``x``'s (``_placement.facts``), read here when not given."""

    del unique_indices  # A gather reads each row independently.
    facts = _placement.facts(x) if facts is None else facts
    _validation.check_mode_and_backend(mode, backend, modes=_validation.GATHER_MODES)
    layout = _layout(x, facts)
    fill = _validation.check_fill_value(fill_value)
    plan, operands = _index_parse.parse(index, x.shape, mode, read=True, min_lead=1)
    _validation.check_rows_to_read(x.shape, plan, mode)
    _registry.check_available(facts, backend)
    traced = not facts.concrete
    operands = tuple(_place(name, a, layout, traced)
                     for name, a in _validation.named_operands(index, operands))
    call = _local_read.ReadCall.of(
        plan, mode=mode, fill=fill, indices_are_sorted=indices_are_sorted, backend=backend
    )
    cfg = GatherConfig(layout, call)
    if traced:
        return gather_traced(x, operands, cfg)
    out_shape = plan.result_shape
    if math.prod(out_shape) == 0 or x.size == 0:
        # Nothing to read (or nothing there: fill mode, checked above); a jit
        # that reads nothing has no devices to run on, so the result is built here.
        # The fill converted as jnp's (and the one-device read's) is: 1000 wraps in int8.
        value = np.asarray(lax.full((), call.fill_value(x.dtype), x.dtype))
        out = np.full(out_shape, value if x.size == 0 else 0, jnp.dtype(x.dtype))
        return jax.device_put(out, NamedSharding(layout.mesh, P()))
    return _placement.wait_for_result(gather_jit(x, operands, cfg))
