"""Writes into the rows of a 2-D view of the buffer: set, add, min, max, mul; XLA or a kernel.

Every row write reaches this module as ``x2d`` ``(num_rows, d)``, a flat list of
``rows`` and ``(n, d)`` updates (``_local_write`` made them from any index form),
through one implementation of ``_registry``:

* :func:`write_reference`: the plain-jnp references (``reference.py``), with the row
  reads and writes of a host buffer done on the buffer itself (``_host_xla``);
* :func:`write_xla_native`: XLA's own ``x.at[rows].set`` / ``.add`` on the normalized
  rows (a set's duplicates dropped first);
* :func:`write_kernel`: a kernel family. Duplicates are resolved on the device
  first (set: the last occurrence wins; add, min, max, mul: combined in a fixed
  order), so that every kernel entry owns a distinct row, except on the one-launch
  paths, which do both themselves. Add's paths: one launch for small batches; the
  sorted-runs kernel over a stable order for rows that may repeat, and for distinct
  rows it sorts for locality; the plain add kernel for other distinct rows. min,
  max and mul read the rows with the gather kernel, combine on the device and
  write them with the set kernel.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax.numpy as jnp
from jax import lax

from pallas_pinned import _host_xla, _placement, _rows, tuning
from pallas_pinned._families import kernels
from pallas_pinned.reference import scatter_combine_rows_reference, scatter_rows_reference

__all__ = ["RowWrite", "updates_2d", "write_kernel", "write_reference", "write_xla_native"]


@dataclasses.dataclass(frozen=True)
class RowWrite:
    """Everything static about one row write; hashable, so it keys jit's cache."""

    op: str  # "set", "add", "min", "max" or "mul"
    mode: str | None  # jnp's modes, applied to the rows of the 2-D view
    # The rows are distinct, after the mode (``_local_write.WriteCall.of`` decides).
    unique: bool
    ascending: bool  # the normalized rows ascend
    thresholds: tuning.Thresholds


def _normalized(x2d, rows, cfg: RowWrite):
    return _rows.normalize_rows(_placement.to_device_memory(rows), x2d.shape[0], cfg.mode)


def write_reference(x2d, rows, updates2d, cfg: RowWrite):
    """The references' write. On the CPU a set is XLA's own scatter, which applies
    duplicates in order (the last wins), as ours do: nothing to add to it."""
    rows = _normalized(x2d, rows, cfg)
    if cfg.op == "set":
        return lax.platform_dependent(
            x2d, rows, updates2d, cpu=_scatter_in_order,
            default=functools.partial(scatter_rows_reference, unique=cfg.unique),
        )
    if not _placement.on_host(x2d):
        return scatter_combine_rows_reference(
            x2d, rows, updates2d, op=cfg.op, unique=cfg.unique
        )
    # The reference's steps, with the row reads and writes done on the host
    # buffer itself and all the arithmetic on the device.
    rows, totals = _combined(x2d, rows, updates2d, cfg)
    current = _host_xla.gather_rows(x2d, rows).astype(totals.dtype)
    merged = _rows.COMBINERS[cfg.op](current, totals).astype(x2d.dtype)
    return _host_xla.set_distinct_rows(x2d, rows, merged)


def _scatter_in_order(x2d, rows, updates2d):
    # The write's derivatives are its own rules (_local_write.with_write_rules); a forward
    # mode that reaches in here (jax.hessian's) gets its refusal there, not a tangent of
    # XLA's scatter, whose rule for repeated indices mixes memory spaces.
    x2d, updates2d = lax.stop_gradient((x2d, updates2d))
    return x2d.at[rows].set(updates2d, mode="drop", wrap_negative_indices=False)


def write_xla_native(x2d, rows, updates2d, cfg: RowWrite):
    """XLA's own set or add on CUDA; the reference elsewhere (where it was not measured)."""
    return lax.platform_dependent(
        x2d, rows, updates2d, cuda=functools.partial(_xla_native, cfg=cfg),
        default=functools.partial(write_reference, cfg=cfg),
    )


def _xla_native(x2d, rows, updates2d, cfg: RowWrite):
    """``x2d.at[rows].set/add(updates2d)``: for a host buffer, a GPU scatter kernel of
    XLA's that stores into the buffer over PCIe, without our ordering work.

    The rows are normalized here, at full width, so XLA only ever sees rows in range
    or skip markers (XLA's host path can truncate 64-bit indices). XLA applies
    duplicate indices in no fixed order, so for a set every row written again later
    is dropped first: the last occurrence wins, as on every path. An add sums
    duplicates in XLA's order, in the buffer's dtype: ``auto`` takes it only where that
    is also our accumulator's (float32), so only the rounding order of duplicates may
    differ.
    """
    rows = _normalized(x2d, rows, cfg)
    if cfg.op == "add":
        return x2d.at[rows].add(updates2d, mode="drop", wrap_negative_indices=False)
    if not cfg.unique and rows.shape[0] > 1:
        rows, src = _rows.dedupe_last_wins(rows, x2d.shape[0])
        updates2d = updates2d[src]
    return x2d.at[rows].set(updates2d, mode="drop", wrap_negative_indices=False)


def _combined(x2d, rows, updates2d, cfg: RowWrite, *, presorted: bool = False):
    """One entry per distinct row, its updates combined in a fixed order (skip markers else)."""
    totals = updates2d.astype(_rows.add_accumulator_dtype(x2d.dtype, cfg.op))
    if cfg.unique or rows.shape[0] <= 1:
        return rows, totals
    return _rows.combine_duplicates(
        rows, totals, x2d.shape[0], presorted=presorted, op=cfg.op
    )


def write_kernel(x2d, rows, updates2d, cfg: RowWrite, *, family: str, interpret: bool):
    """The kernel family's write on CUDA (on every platform under Pallas's
    interpreter); the reference elsewhere."""
    # The one-launch kernels take raw rows and wrap negatives in the indices' own type,
    # past normalize_rows: refuse rows that type cannot number here, for every path.
    _rows.check_rows_addressable(x2d.shape[0])
    launch = kernels(family, interpret=interpret)
    kernel = functools.partial(_KERNEL_WRITES[cfg.op], cfg=cfg, launch=launch)
    if interpret:
        return kernel(x2d, rows, updates2d)
    return lax.platform_dependent(
        x2d, rows, updates2d, cuda=kernel, default=functools.partial(write_reference, cfg=cfg)
    )


def _kernel_set(x2d, rows, updates2d, *, cfg: RowWrite, launch):
    limits = cfg.thresholds
    if launch.set_fused is not None and updates2d.shape[0] <= limits.fused_max_updates:
        # Small batches: one launch that normalizes and de-duplicates by itself.
        # widen is a no-op for int32 (int64 with x64) indices.
        raw = _rows.widen(_placement.to_device_memory(rows))
        out = launch.set_fused(x2d, raw, updates2d, mode=cfg.mode,
                               drop_superseded=not cfg.unique)
        return _placement.place_result(out, x2d)
    rows = _normalized(x2d, rows, cfg)
    # Duplicates must be resolved before the kernel runs (its programs write
    # in parallel); sorting also turns scattered PCIe writes into ascending ones.
    sort_for_locality = not cfg.ascending and updates2d.shape[0] >= limits.sort_from
    dedupe = not cfg.unique or sort_for_locality
    src = None
    if dedupe:
        rows, src = _rows.dedupe_last_wins(rows, x2d.shape[0], presorted=cfg.ascending)
    # De-duplication marks superseded rows past the end: those must always be
    # masked, even when the caller promised in-bounds indices.
    check_bounds = dedupe or cfg.mode != "promise_in_bounds"
    out = launch.set(x2d, rows, src, updates2d, check_bounds=check_bounds)
    return _placement.place_result(out, x2d)


def _kernel_add(x2d, rows, updates2d, *, cfg: RowWrite, launch):
    limits = cfg.thresholds
    acc = _rows.add_accumulator_dtype(x2d.dtype)
    num_updates = updates2d.shape[0]
    atomic = {}
    if launch.atomic_write_allowed(x2d.dtype, acc) and num_updates >= limits.atomic_add_from:
        atomic = {"atomic_write": True}
    # Hot rows make the one launch's duplicate sums long: rows that may repeat take it
    # for fewer updates.
    fused_max = limits.fused_max_adds if cfg.unique else limits.fused_max_unpromised_adds
    if launch.add_fused is not None and num_updates <= fused_max:
        # Small batches: one launch that normalizes and combines duplicates by itself.
        raw = _rows.widen(_placement.to_device_memory(rows))
        out = launch.add_fused(x2d, raw, updates2d, mode=cfg.mode,
                               combine_duplicates=not cfg.unique, acc_dtype=acc, **atomic)
        return _placement.place_result(out, x2d)
    rows = _normalized(x2d, rows, cfg)
    src = None
    check_bounds = cfg.mode != "promise_in_bounds"
    repeats = not cfg.unique and num_updates > 1
    sort_for_locality = not cfg.ascending and num_updates >= limits.sort_from
    if launch.add_sorted is not None and (repeats or sort_for_locality):
        # A stable order makes each row's entries one run; the kernel sums each run in
        # entry order and masks the skip markers itself.
        if not cfg.ascending:
            if launch.order is not None and num_updates <= limits.order_kernel_max:
                rows, src = launch.order(rows)  # One launch instead of XLA's sort.
            else:
                rows, src = _rows.stable_order(rows)
        out = launch.add_sorted(x2d, rows, src, updates2d, acc_dtype=acc, **atomic)
        return _placement.place_result(out, x2d)
    if repeats:
        # A family without the runs kernel: one distinct row per entry, summed on the
        # device first; the skip markers it leaves behind must always be masked.
        rows, updates2d = _combined(x2d, rows, updates2d, cfg, presorted=cfg.ascending)
        check_bounds = True
    out = launch.add(x2d, rows, src, updates2d, acc_dtype=acc, check_bounds=check_bounds,
                     **atomic)
    return _placement.place_result(out, x2d)


def _kernel_combine(x2d, rows, updates2d, *, cfg: RowWrite, launch):
    """min, max, mul: read the distinct rows, combine on the device, write them back."""
    rows, totals = _combined(x2d, _normalized(x2d, rows, cfg), updates2d, cfg)
    current = launch.get(x2d, rows, None).astype(totals.dtype)
    merged = _rows.COMBINERS[cfg.op](current, totals).astype(x2d.dtype)
    return _placement.place_result(launch.set(x2d, rows, None, merged, check_bounds=True), x2d)


_KERNEL_WRITES = {
    "set": _kernel_set,
    "add": _kernel_add,
    "min": _kernel_combine,
    "max": _kernel_combine,
    "mul": _kernel_combine,
}


def updates_2d(x_dtype, updates, result_shape: tuple[int, ...], width: int):
    """``updates`` as the ``(n, width)`` rows the kernels read: x's dtype, device memory.

    Broadcast to the indexed result's shape and cast as jnp does; for updates
    already of that shape and dtype every step is a no-op, so nothing is launched.
    """
    updates = _rows.cast_updates(_placement.to_device_memory(updates), x_dtype)
    updates = jnp.broadcast_to(updates, result_shape)
    num_entries = math.prod(result_shape) // width if width else 0
    return updates.reshape(num_entries, width)
