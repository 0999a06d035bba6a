"""The traced steps of the sharded ops: route the indices, run the local op per shard.

Every device receives the whole index list (and the updates) in their
original order: an all-gather, or nothing when they are replicated already.
It keeps the entries it owns, ``row - k*m`` on shard ``k`` of ``m`` rows;
the others become the out-of-range local row ``m``, which the local op's
``"drop"`` mode skips. Because each device sees the global order, "the last
occurrence wins" and the fixed summation order of ``scatter_add`` carry over
from the local ops unchanged: the results agree bit for bit with the
single-device op on the same data. Modes are applied against the *global*
row count before routing (negatives wrap once; ``"clip"`` clamps into
``[0, rows)``; ``"drop"`` marks the rest; ``"promise_in_bounds"`` checks
nothing and a row outside every shard is skipped). A gather reads each row on
its owner; the devices combine the rows with a ``psum`` of their bit patterns
(each row comes from exactly one shard, so the integer sum is exact, NaN
payloads and ``-0.0`` included); the result is replicated in device memory.

Cost per call, for ``n`` index entries of ``b`` bytes (4; 8 with x64), rows
of ``w`` bytes and ``D`` shards (per replica group when other mesh axes hold
replicas). Implemented, all-gather routing:

- route a write: every device receives ``(D-1)/D * n*(b+w)`` bytes (a ring
  all-gather of inputs sharded over the devices; a broadcast from one device
  moves the same total; ``b`` per index array where several index several
  axes) and holds ``n*(b+w)``;
- the local op then masks and sorts all ``n`` entries on every device
  (``O(n log n)`` work, ``~n*(b+4)`` bytes of keys), but each device writes
  only the rows it owns over PCIe (``~n/D*w`` for spread-out rows);
- route a gather: the indices as above (``(D-1)/D * n*b``), then a ``psum``
  of the ``(n, w)`` contributions: a ring all-reduce sends and receives
  ``2(D-1)/D * n*w`` per device, which holds ``2*n*w`` (contribution and
  replicated result).

Not implemented, sort-by-owner all-to-all: each device sorts its ``n/D``
entries by owner, exchanges ``D`` counts, and sends each entry to its owner
only, ``~(D-1)/D * n/D * (b+4+w)`` per device for spread-out rows (``+4``: the
global position, needed for last-wins and for a fixed add order, as a second
sort key on the receiver); a gather sends indices to the owners and rows back,
``(D-1)/D * n/D * (b+w)``, result sharded like the indices (``n/D*w`` per
device). About ``D`` times fewer bytes, but XLA's all-to-all has static
shapes: each receive buffer needs a capacity, and rows that all land on one
shard need capacity ``n``, i.e. the all-gather's memory; a smaller capacity
needs an overflow path. The all-gather needs no bound, no second key and no
count exchange. ``tests/sharded_child.py`` (run by ``tests/test_sharded.py``)
checks the collectives' sizes in the compiled HLO against the list above;
nothing about speed is measured on CPU, where it means nothing (the "devices"
share one memory, collectives are memcpys).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from pallas_pinned import (
    _index_parse,
    _local_read,
    _local_write,
    _placement,
    _registry,
    _rows,
    _validation,
    _write_rows,
)
from pallas_pinned._index import IndexPlan

_EXPLICIT = jax.sharding.AxisType.Explicit


@dataclasses.dataclass(frozen=True)
class Layout:
    """How axis 0 is split: the mesh, the mesh axes that split it, the shard count."""

    mesh: Any  # Mesh when concrete, AbstractMesh when traced.
    axes: tuple[str, ...]
    shards: int
    spec: P  # The buffer's own; axes past the first name only mesh axes of size 1.


@dataclasses.dataclass(frozen=True)
class WriteConfig:
    """A write on a sharded buffer: how it is split, and the call as the local layer has it."""

    layout: Layout
    call: _local_write.WriteCall  # Its plan indexes the global buffer.


@dataclasses.dataclass(frozen=True)
class GatherConfig:
    layout: Layout
    call: _local_read.ReadCall


def replicated(a, layout: Layout):
    """``a`` on every device of the mesh: the all-gather (or nothing, if already so)."""
    a = _placement.to_device_memory(jnp.asarray(a))
    target = NamedSharding(layout.mesh, P())
    kinds = set(layout.mesh.axis_types)
    if _EXPLICIT in kinds:
        # Explicit types change only through reshard, on a mesh that mixes in Auto
        # axes too: a sharding constraint there leaves an index typed sharded.
        a = jax.reshard(a, target)
        if kinds == {_EXPLICIT}:
            return a
        # reshard leaves the Auto axes to the partitioner: an array sharded over one
        # came back so (a read's fill, from its index), where a constraint pins it.
    return lax.with_sharding_constraint(a, target)


def _gathered(operands, layout: Layout):
    """The arrays among ``operands`` on every device (numpy and Python values are
    constants already)."""
    return jax.tree.map(
        lambda a: replicated(a, layout) if isinstance(a, jax.Array | jax.core.Tracer) else a,
        operands,
    )


def _local_rows(rows, layout: Layout, shard_rows: int):
    """This shard's local row numbers, ``shard_rows`` (dropped) for every other row."""
    if not layout.axes:  # Axis 0 is not split: every row is this device's.
        return rows, jnp.zeros((), rows.dtype)
    first = lax.axis_index(layout.axes).astype(rows.dtype) * shard_rows
    local = rows - first  # No overflow: rows >= int_min + num_rows after the wrap.
    owned = (local >= 0) & (local < shard_rows)
    return jnp.where(owned, local, shard_rows), first


# --- the writes: set, add, min, max, mul ---------------------------------------


@functools.cache
def eager_write(sharding, donate: bool):
    """The eager write: x donated (unless ``donate`` is False), the result placed where x is."""
    return jax.jit(write_differentiable, static_argnums=(3,), donate_argnums=(0,) if donate else (),
                   out_shardings=sharding)


def write_differentiable(x, operands, updates, cfg: WriteConfig):
    """:func:`write_traced` with the local writes' gradient rules (see :func:`_with_rules`)."""
    return _with_rules(cfg)(x, operands, updates)


@functools.lru_cache(maxsize=256)  # One per static index value: bounded, as _front's plans.
def _with_rules(cfg: WriteConfig):
    """The write with the local write's rules: vmap refused, the gradient with respect
    to the updates for set and add, the others refused alike."""
    return _local_write.with_write_rules(
        cfg.call.op, functools.partial(write_traced, cfg=cfg),
        functools.partial(_updates_cotangent, cfg),
    )


def _updates_cotangent(cfg: WriteConfig, operands, updates, cotangent):
    """Each update's cotangent: its row's, read on the row's owner (set: if it won)."""
    plan = cfg.call.plan
    given = updates
    operands, updates = _gathered((operands, updates), cfg.layout)
    rows = replicated(_global_rows(plan, operands, cfg.call.mode, read=False), cfg.layout)
    picked = _read_on_owners(
        cfg, _placement.to_device_memory(cotangent), rows,
        lambda flat, local: jnp.take(flat, local, axis=0, mode="fill", fill_value=0),
    )
    if cfg.call.op == "set":
        picked = jnp.where(_local_write.winners(rows, plan.num_rows)[:, None], picked, 0)
    cotangent = _local_write.transpose_to_updates(picked.reshape(plan.result_shape), updates)
    # Typed as the updates were: sharded over the mesh, the cotangent is too.
    sharding = getattr(jax.typeof(given), "sharding", None)
    if getattr(sharding, "mesh", None) is None or sharding.mesh.empty:
        return cotangent
    return jax.sharding.reshard(cotangent, sharding)


def _global_rows(plan: IndexPlan, operands, mode, *, read: bool):
    """Normalized rows of the buffer's 2-D view against the *global* shape (marks else)."""
    rows = plan.rows(operands, mode, read=read)
    if plan.kind == "axis0" and mode != "wrap":
        # Global modes first: wrap negatives once, then clip or mark against all rows.
        row_mode = ("drop" if mode in (None, "promise_in_bounds") else mode) if not read else (
            "drop" if mode in _validation.FILL_MODES else "clip"
        )
    else:
        row_mode = "drop"
    return _rows.normalize_rows(_placement.to_device_memory(rows), plan.num_rows, row_mode)


def write_traced(x, operands, updates, cfg: WriteConfig):
    plan = cfg.call.plan
    if plan.num_entries == 0 or x.size == 0:
        return x
    # Every device computes every entry's row: index arrays and updates sharded
    # over the mesh (a data-parallel batch) are gathered first, as the rows would be.
    operands, updates = _gathered((operands, updates), cfg.layout)
    rows = _global_rows(plan, operands, cfg.call.mode, read=False)
    updates = _write_rows.updates_2d(x.dtype, updates, plan.result_shape, plan.width)
    # The promises are the global index's (as written): what they say of its rows is
    # decided here, where its type is known; each shard gets rows in range or marked.
    unique, ascending, _ = _registry.promises(
        cfg.call, operands[0].dtype if plan.kind == "axis0" else None)
    cfg = dataclasses.replace(cfg, call=dataclasses.replace(
        cfg.call, promised_distinct=unique, promised_sorted=ascending))
    spec = cfg.layout.spec
    # check_vma=False: the local ops stage kernels (pallas_call, also traced on
    # CPU under platform_dependent) whose outputs carry no varying-axes type.
    return jax.shard_map(
        functools.partial(_write_shard, cfg),
        mesh=cfg.layout.mesh,
        in_specs=(spec, P(), P()),
        out_specs=spec,
        check_vma=False,
    )(x, replicated(rows, cfg.layout), replicated(updates, cfg.layout))


def _write_shard(cfg: WriteConfig, x_local, rows, updates):
    view_rows = cfg.call.plan.num_rows // cfg.layout.shards
    local, first = _local_rows(rows, cfg.layout, view_rows)
    if cfg.call.promised_sorted:
        # Ascending global rows: this shard's run is contiguous and the rows of
        # lower shards precede it. Rotating those behind it (all dropped) keeps
        # the local rows ascending, so the promise still holds locally.
        below = jnp.sum(rows < first)
        local, updates = jnp.roll(local, -below), jnp.roll(updates, -below, axis=0)
    x2d = x_local.reshape(view_rows, cfg.call.plan.width)
    # Local rows are in [0, view_rows]: unsigned, they keep the promises (_registry.promises).
    local = local.astype(jnp.uint32 if view_rows < 2**32 - 1 else jnp.uint64)
    plan, operands = _index_parse.parse(local, x2d.shape, "drop")
    # "drop" locally whatever the global mode: rows of other shards are marked.
    call = dataclasses.replace(cfg.call, plan=plan, mode="drop")
    return _local_write.write_traced(x2d, operands, updates, call).reshape(x_local.shape)


# --- the read ------------------------------------------------------------------


@functools.partial(jax.jit, static_argnames=("cfg",))
def gather_jit(x, rows, cfg: GatherConfig):
    return gather_traced(x, rows, cfg)


def _bits_dtype(dtype):
    """The unsigned type of ``dtype``'s width: a sum of one nonzero pattern is exact."""
    return jnp.dtype(f"uint{max(8, jnp.dtype(dtype).itemsize * 8)}")


def gather_traced(x, operands, cfg: GatherConfig):
    plan = cfg.call.plan
    out_shape = plan.result_shape
    if math.prod(out_shape) == 0 or x.size == 0:
        # An empty axis is only allowed in fill mode (checked up front).
        out = jnp.full(out_shape, cfg.call.fill_value(x.dtype) if x.size == 0 else 0, x.dtype)
        return replicated(_placement.read_nothing_of(x, out), cfg.layout)
    operands = _gathered(operands, cfg.layout)  # As for the writes.
    rows = replicated(_global_rows(plan, operands, cfg.call.mode, read=True), cfg.layout)
    out = _read_on_owners(cfg, x, rows, functools.partial(_read_shard, cfg))
    out = _local_read.fill_out_of_range(out, rows, cfg.call, x.dtype)
    return replicated(out.reshape(out_shape), cfg.layout)


def _read_shard(cfg: GatherConfig, x2d, local):
    plan, operands = _index_parse.parse(local, x2d.shape, "fill")
    # "fill" with 0: rows of other shards are not read and give all-zero bits.
    call = dataclasses.replace(
        cfg.call, plan=plan, mode="fill", fill=_validation.StaticScalar(0)
    )
    return _local_read.read_traced(x2d, operands, call).reshape(local.shape[0], -1)


def _read_on_owners(cfg, source, rows, read_local):
    """The rows ``rows`` (global, replicated) of ``source`` (sharded as the buffer),
    each read on its owner by ``read_local(flat_shard, local_rows)``, which gives zeros
    for rows of other shards; replicated.

    The shards' reads are combined by bit pattern: each row comes from one shard,
    so the integer sum is exact, NaN payloads and ``-0.0`` included.
    """
    layout, plan = cfg.layout, cfg.call.plan
    view_rows = plan.num_rows // layout.shards
    bits_type = _bits_dtype(source.dtype)

    def shard(source_local, rows):
        local, _ = _local_rows(rows, layout, view_rows)
        got = read_local(source_local.reshape(view_rows, plan.width), local)
        if got.dtype == jnp.bool_:
            bits = got.astype(bits_type)
        else:
            bits = lax.bitcast_convert_type(got, bits_type)
        return lax.psum(bits, layout.axes) if layout.axes else bits

    # check_vma=False, as for the writes; the psum makes the result replicated.
    bits = jax.shard_map(shard, mesh=layout.mesh, in_specs=(layout.spec, P()), out_specs=P(),
                         check_vma=False)(source, rows)
    if source.dtype == jnp.bool_:
        return bits.astype(bool)
    return lax.bitcast_convert_type(bits, source.dtype)
