"""Writes into the rows of a 2-D view of the buffer: set, add, min, max, mul; XLA or a kernel.

Every write reaches this module as ``x2d`` ``(num_rows, d)``, a flat list of
``rows`` and ``(n, d)`` updates (``_local_write`` made them from any index form).
:func:`write` runs one implementation of ``_registry``:

* ``"xla"``: the references (``reference.py``), with the row reads and writes
  of a host buffer done on the buffer itself (``_host_xla``);
* ``"xla_native"``: XLA's own ``x.at[rows].set`` / ``.add`` on the normalized
  rows (a set's duplicates dropped first), where the backend table measured
  it faster than the kernels;
* a kernel backend: the rows are normalized, and duplicates resolved on the
  device first (set: the last occurrence wins; add, min, max, mul: combined
  in a fixed order), so that every kernel entry owns a distinct row; then the
  family's launcher writes into the aliased buffer. Set and add keep a
  one-launch path for small batches (normalization and de-duplication or
  combining in the kernel); add has its own read-add-write kernel; min, max
  and mul read the rows with the gather kernel, combine on the device and
  write them with the set kernel.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax.numpy as jnp
from jax import lax

from pallas_pinned import _host_xla, _placement, _registry, _rows, tuning
from pallas_pinned.kernels.row_layout import offsets_fit
from pallas_pinned.reference import scatter_combine_rows_reference, scatter_rows_reference

__all__ = ["RowWrite", "updates_2d", "write"]


@dataclasses.dataclass(frozen=True)
class RowWrite:
    """Everything static about one row write; hashable, so it keys jit's cache."""

    op: str  # "set", "add", "min", "max" or "mul"
    mode: str | None  # jnp's modes, applied to the rows of the 2-D view
    # The rows are distinct, after the mode: the caller decides it once
    # (``_local_write.WriteCall.of``: a promise of unique indices says nothing
    # of the rows under "clip", the index form's own guarantee still does).
    unique: bool
    ascending: bool  # the normalized rows ascend
    thresholds: tuning.Thresholds


def write(x2d, rows, updates2d, cfg: RowWrite, implementation: str):
    """``x2d`` after the write, by ``implementation`` (``"xla"`` or a kernel backend)."""
    x2d = _placement.varying_as(x2d, rows, updates2d)
    if implementation == "xla":
        return _xla(x2d, rows, updates2d, cfg)
    if implementation == "xla_native":
        # Measured on CUDA only: elsewhere the reference keeps its own arithmetic.
        return lax.platform_dependent(
            x2d, rows, updates2d, cuda=functools.partial(_xla_native, cfg=cfg),
            default=functools.partial(_xla, cfg=cfg),
        )
    kernel = functools.partial(_kernel, cfg=cfg, backend=implementation)
    if implementation == "pallas" and not (
        offsets_fit(x2d.shape, x2d.dtype) and offsets_fit(updates2d.shape, x2d.dtype)
    ):
        return _xla(x2d, rows, updates2d, cfg)  # Pallas' 32-bit offsets would wrap.
    if implementation == "interpret":
        return kernel(x2d, rows, updates2d)  # Any platform.
    return lax.platform_dependent(
        x2d, rows, updates2d, cuda=kernel, default=functools.partial(_xla, cfg=cfg)
    )


def _normalized(x2d, rows, cfg: RowWrite):
    return _rows.normalize_rows(_placement.to_device_memory(rows), x2d.shape[0], cfg.mode)


def _xla(x2d, rows, updates2d, cfg: RowWrite):
    rows = _normalized(x2d, rows, cfg)
    if cfg.op == "set":
        return scatter_rows_reference(x2d, rows, updates2d, unique=cfg.unique)
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


def _xla_native(x2d, rows, updates2d, cfg: RowWrite):
    """XLA's own formulation of a set or an add, ``x2d.at[rows].set/add(updates2d)``: what
    ``auto`` runs where the table measured it faster (for a host buffer, a GPU scatter
    kernel of XLA's that stores into the buffer over PCIe, without our ordering work).

    The rows are normalized here, at full width, so XLA only ever sees rows in range or
    skip markers (its host path truncated 64-bit indices on the H200). XLA applies
    duplicate indices in no fixed order (on the H200 its host path kept other than the
    last), so for a set every row written again later is dropped first: the last
    occurrence wins, as on every path. An add sums duplicates in XLA's order, in the
    buffer's dtype: ``auto`` takes it only where that is also our accumulator's
    (float32, not bfloat16), so only the rounding order of duplicates may differ.
    """
    if cfg.op not in ("set", "add"):
        raise AssertionError(f"XLA's own path serves set and add only, not {cfg.op}")
    num_rows = x2d.shape[0]
    rows = _normalized(x2d, rows, cfg)
    if cfg.op == "add":
        return x2d.at[rows].add(updates2d, mode="drop", wrap_negative_indices=False)
    if not cfg.unique and rows.shape[0] > 1:
        # The threshold measured with this path on the H200 (2026-12-03) is add's.
        rows, src = _rows.drop_superseded(
            rows, num_rows, small_max=cfg.thresholds.small_combine_max
        )
        if src is not None:
            updates2d = updates2d[src]
    return x2d.at[rows].set(updates2d, mode="drop", wrap_negative_indices=False)


def _combined(x2d, rows, updates2d, cfg: RowWrite, *, presorted: bool = False):
    """One entry per distinct row, its updates combined in a fixed order (skip markers else)."""
    totals = updates2d.astype(_rows.add_accumulator_dtype(x2d.dtype, cfg.op))
    if cfg.unique or rows.shape[0] <= 1:
        return rows, totals
    return _rows.combine_duplicates(
        rows,
        totals,
        x2d.shape[0],
        presorted=presorted,
        small_max=cfg.thresholds.small_combine_max,
        op=cfg.op,
    )


def _kernel(x2d, rows, updates2d, *, cfg: RowWrite, backend: str):
    # The one-launch kernels take raw rows and wrap negatives in the indices' own type,
    # past normalize_rows: refuse rows that type cannot number here, for every path.
    _rows.check_rows_addressable(x2d.shape[0])
    launch = _registry.kernels(backend)
    if cfg.op == "set":
        return _placement.place_result(_kernel_set(launch, x2d, rows, updates2d, cfg), x2d)
    if cfg.op == "add":
        return _placement.place_result(_kernel_add(launch, x2d, rows, updates2d, cfg), x2d)
    # min, max, mul: read the distinct rows, combine on the device, write them back.
    rows, totals = _combined(x2d, _normalized(x2d, rows, cfg), updates2d, cfg)
    current = launch.get(x2d, rows, None).astype(totals.dtype)
    merged = _rows.COMBINERS[cfg.op](current, totals).astype(x2d.dtype)
    return _placement.place_result(launch.set(x2d, rows, None, merged, check_bounds=True), x2d)


def _kernel_set(launch, x2d, rows, updates2d, cfg: RowWrite):
    num_rows, num_updates = x2d.shape[0], updates2d.shape[0]
    limits = cfg.thresholds
    if (
        launch.set_fused is not None and num_updates <= limits.fused_max_updates
    ):
        # Small batches: one launch that normalizes and de-duplicates by itself.
        # widen is a no-op for int32 (int64 with x64) indices.
        raw = _rows.widen(_placement.to_device_memory(rows))
        return launch.set_fused(
            x2d, raw, updates2d, mode=cfg.mode, drop_superseded=not cfg.unique
        )
    rows = _normalized(x2d, rows, cfg)
    # Duplicates must be resolved before the kernel runs (its programs write
    # in parallel); sorting also turns scattered PCIe writes into ascending ones.
    sort_for_locality = (
        limits.coalesce and not cfg.ascending and num_updates >= limits.sort_min_updates
    )
    dedupe = not cfg.unique or sort_for_locality
    src = None
    if dedupe:
        rows, src = _rows.drop_superseded(
            rows, num_rows, small_max=limits.small_dedupe_max, presorted=cfg.ascending
        )
    # De-duplication marks superseded rows past the end: those must always be
    # masked, even when the caller promised in-bounds indices.
    check_bounds = dedupe or cfg.mode != "promise_in_bounds"
    return launch.set(x2d, rows, src, updates2d, check_bounds=check_bounds)


# distinct_adds_by_runs serves rows of at least this many bytes: the rows it was measured on.
_RUNS_MIN_ROW_BYTES = 256


def _stable_order(launch, rows, thresholds):
    if launch.order is not None and rows.shape[0] <= thresholds.order_kernel_max:
        return launch.order(rows)  # One launch instead of about five (tuning says).
    return _rows.stable_order(rows, small_max=thresholds.runs_rank_max)


def _kernel_add(launch, x2d, rows, updates2d, cfg: RowWrite):
    acc = _rows.add_accumulator_dtype(x2d.dtype)
    atomic = {}
    if launch.atomic_write_allowed(x2d.dtype, acc) and (
        updates2d.shape[0] >= cfg.thresholds.atomic_add_from
    ):
        atomic = {"atomic_write": True, "relaxed_atomics": cfg.thresholds.relaxed_atomics}
    fused_max = cfg.thresholds.fused_max_adds
    if not cfg.unique:  # Hot rows make the one launch's duplicate sums long (tuning says).
        fused_max = min(fused_max, cfg.thresholds.fused_max_unpromised_adds)
    if launch.add_fused is not None and updates2d.shape[0] <= fused_max:
        # Small batches: one launch that normalizes and combines duplicates by itself.
        raw = _rows.widen(_placement.to_device_memory(rows))
        return launch.add_fused(
            x2d, raw, updates2d, mode=cfg.mode, combine_duplicates=not cfg.unique,
            acc_dtype=acc, **atomic,
        )
    rows = _normalized(x2d, rows, cfg)
    src = None
    check_bounds = cfg.mode != "promise_in_bounds"
    if not cfg.unique and rows.shape[0] > 1:
        if launch.add_sorted is not None and cfg.thresholds.add_runs_in_kernel:
            # A stable order makes each row's entries one run; the kernel sums
            # each run in entry order and masks the skip markers itself.
            if not cfg.ascending:
                rows, src = _stable_order(launch, rows, cfg.thresholds)
            return launch.add_sorted(x2d, rows, src, updates2d, acc_dtype=acc, **atomic)
        # One distinct row per kernel entry, summed on the device first; the
        # skip markers it leaves behind must always be masked.
        rows, updates2d = _combined(x2d, rows, updates2d, cfg, presorted=cfg.ascending)
        check_bounds = True
    elif (
        cfg.thresholds.coalesce
        and not cfg.ascending
        and rows.shape[0] >= cfg.thresholds.sort_min_adds
    ):
        # Distinct rows: sort only for address locality.
        rows, src = lax.sort((rows, lax.iota(jnp.int32, rows.shape[0])), num_keys=1)
        if (not atomic and launch.add_sorted is not None
                and x2d.shape[1] * x2d.dtype.itemsize >= _RUNS_MIN_ROW_BYTES
                and cfg.thresholds.distinct_adds_by_runs):
            # Sorted distinct rows are runs of one entry each; where the owners read their
            # rows, the runs kernel was measured faster (tuning says where).
            return launch.add_sorted(x2d, rows, src, updates2d, acc_dtype=acc, **atomic)
    return launch.add(
        x2d, rows, src, updates2d, acc_dtype=acc, check_bounds=check_bounds, **atomic
    )


def updates_2d(x_dtype, updates, result_shape: tuple[int, ...], width: int):
    """``updates`` as the ``(n, width)`` rows the kernels read: x's dtype, device memory.

    Broadcast to the indexed result's shape and cast as jnp does; for updates
    already of that shape and dtype every step is a no-op, so nothing is launched.
    """
    updates = _rows.cast_updates(_placement.to_device_memory(updates), x_dtype)
    updates = jnp.broadcast_to(updates, result_shape)
    num_entries = math.prod(result_shape) // width if width else 0
    return updates.reshape(num_entries, width)
