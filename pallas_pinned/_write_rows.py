"""Writes into the rows of a 2-D view of the buffer: set, add, min, max, mul; XLA or a kernel.

Every row write reaches this module as ``x2d`` ``(num_rows, d)``, a flat list of
``rows`` and ``(n, d)`` updates (``_local_write`` made them from any index form), and
the :class:`~pallas_pinned._registry.Plan` that ``_registry.choose`` made for the call.
:func:`write` runs the plan's path (:data:`PATHS`); a path does what the plan says and
decides nothing itself:

* ``reference``: the plain-jnp references (``reference.py``), with the row reads and
  writes of a host buffer done on the buffer itself (``_host_xla``);
* the kernel paths. Duplicates are resolved on the device first (set: the last
  occurrence wins; add, min, max, mul: combined in a fixed order), so that every kernel
  entry owns a distinct row, except on the one-launch paths, which do both themselves.
  min, max and mul read the rows with the gather kernel, combine on the device and
  write them with the set kernel.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax.numpy as jnp
from jax import lax

from pallas_pinned import _host_xla, _placement, _rows
from pallas_pinned._families import kernels
from pallas_pinned.reference import scatter_combine_rows_reference, scatter_rows_reference

__all__ = ["PATHS", "RowWrite", "updates_2d", "write"]


@dataclasses.dataclass(frozen=True)
class RowWrite:
    """Everything static about one row write: the op, the rows' mode and the plan."""

    op: str  # "set", "add", "min", "max" or "mul"
    mode: str | None  # jnp's modes, applied to the rows of the 2-D view
    plan: object  # _registry.Plan


def write(x2d, rows, updates2d, cfg: RowWrite):
    """``cfg.plan``'s path, or its branches per platform (``Plan.platforms``)."""
    def run(path):
        return functools.partial(PATHS[path], cfg=cfg)

    if not cfg.plan.platforms:
        return run(cfg.plan.path)(x2d, rows, updates2d)
    branches = {platform: run(path) for platform, path in cfg.plan.platforms}
    return lax.platform_dependent(x2d, rows, updates2d, **branches)


def _normalized(x2d, rows, cfg: RowWrite):
    return _rows.normalize_rows(_placement.to_device_memory(rows), x2d.shape[0], cfg.mode)


def _launch(cfg: RowWrite):
    return kernels(cfg.plan.impl.family, interpret=cfg.plan.impl.interpret)


def _reference(x2d, rows, updates2d, *, cfg: RowWrite):
    """The references' write."""
    rows = _normalized(x2d, rows, cfg)
    if cfg.op == "set":
        return scatter_rows_reference(x2d, rows, updates2d, unique=cfg.plan.unique)
    if not _placement.on_host(x2d):
        return scatter_combine_rows_reference(
            x2d, rows, updates2d, op=cfg.op, unique=cfg.plan.unique
        )
    # The reference's steps, with the row reads and writes done on the host
    # buffer itself and all the arithmetic on the device.
    rows, totals = _combined(x2d, rows, updates2d, cfg)
    current = _host_xla.gather_rows(x2d, rows).astype(totals.dtype)
    merged = _rows.COMBINERS[cfg.op](current, totals).astype(x2d.dtype)
    return _host_xla.set_distinct_rows(x2d, rows, merged)


def _reference_in_order(x2d, rows, updates2d, *, cfg: RowWrite):
    """The reference's set on the CPU: XLA's own scatter applies duplicates in order (the
    last wins), as ours do: nothing to add to it."""
    rows = _normalized(x2d, rows, cfg)
    # The write's derivatives are its own rules (_local_write.with_write_rules); a forward
    # mode that reaches in here (jax.hessian's) gets its refusal there, not a tangent of
    # XLA's scatter, whose rule for repeated indices mixes memory spaces.
    x2d, updates2d = lax.stop_gradient((x2d, updates2d))
    return x2d.at[rows].set(updates2d, mode="drop", wrap_negative_indices=False)


def _combined(x2d, rows, updates2d, cfg: RowWrite, *, presorted: bool = False):
    """One entry per distinct row, its updates combined in a fixed order (skip markers else)."""
    totals = updates2d.astype(_rows.add_accumulator_dtype(x2d.dtype, cfg.op))
    if cfg.plan.unique or rows.shape[0] <= 1:
        return rows, totals
    return _rows.combine_duplicates(
        rows, totals, x2d.shape[0], presorted=presorted, op=cfg.op
    )


def _raw(rows):
    """The caller's rows for a one-launch kernel, which wraps negatives in their own type.
    ``widen`` is a no-op for int32 (int64 with x64) indices."""
    return _rows.widen(_placement.to_device_memory(rows))


def _distinct(plan) -> str | None:
    """What a one-launch kernel may assume of its raw indices' rows (its ``distinct``)."""
    return "promised" if plan.unique else "unless_negative" if plan.unless_negative else None


def _set_one_launch(x2d, rows, updates2d, *, cfg: RowWrite):
    """Small batches: one launch that normalizes and de-duplicates by itself."""
    out = _launch(cfg).set_fused(x2d, _raw(rows), updates2d, mode=cfg.mode,
                                 distinct=_distinct(cfg.plan))
    return _placement.place_result(out, x2d)


def _set_rows(x2d, rows, updates2d, *, cfg: RowWrite):
    """Normalized rows; duplicates (and the locality sort) resolved by a sort first."""
    plan = cfg.plan
    rows = _normalized(x2d, rows, cfg)
    src = None
    if plan.dedupe:
        rows, src = _rows.dedupe_last_wins(rows, x2d.shape[0], presorted=plan.ascending)
    out = _launch(cfg).set(x2d, rows, src, updates2d, check_bounds=plan.check_bounds)
    return _placement.place_result(out, x2d)


def _add_one_launch(x2d, rows, updates2d, *, cfg: RowWrite):
    """Small batches: one launch that normalizes and combines duplicates by itself."""
    plan = cfg.plan
    out = _launch(cfg).add_fused(
        x2d, _raw(rows), updates2d, mode=cfg.mode, distinct=_distinct(plan),
        acc_dtype=_rows.add_accumulator_dtype(x2d.dtype), atomic_write=plan.atomic,
    )
    return _placement.place_result(out, x2d)


def _add_runs(x2d, rows, updates2d, *, cfg: RowWrite):
    """A stable order makes each row's entries one run; the kernel sums each run in entry
    order and masks the skip markers itself."""
    plan, launch = cfg.plan, _launch(cfg)
    rows = _normalized(x2d, rows, cfg)
    orders = {None: lambda r: (r, None), "kernel": launch.order, "sort": _rows.stable_order}
    rows, src = orders[plan.order](rows)
    out = launch.add_sorted(x2d, rows, src, updates2d,
                            acc_dtype=_rows.add_accumulator_dtype(x2d.dtype),
                            atomic_write=plan.atomic)
    return _placement.place_result(out, x2d)


def _add_rows(x2d, rows, updates2d, *, cfg: RowWrite):
    """Distinct rows, one kernel entry each; rows that may repeat are summed on the device
    first (``dedupe``)."""
    plan = cfg.plan
    rows = _normalized(x2d, rows, cfg)
    if plan.dedupe:
        rows, updates2d = _combined(x2d, rows, updates2d, cfg, presorted=plan.ascending)
    out = _launch(cfg).add(x2d, rows, None, updates2d,
                           acc_dtype=_rows.add_accumulator_dtype(x2d.dtype),
                           check_bounds=plan.check_bounds, atomic_write=plan.atomic)
    return _placement.place_result(out, x2d)


def _combine(x2d, rows, updates2d, *, cfg: RowWrite):
    """min, max, mul: read the distinct rows, combine on the device, write them back."""
    launch = _launch(cfg)
    rows, totals = _combined(x2d, _normalized(x2d, rows, cfg), updates2d, cfg)
    current = launch.get(x2d, rows, None).astype(totals.dtype)
    merged = _rows.COMBINERS[cfg.op](current, totals).astype(x2d.dtype)
    return _placement.place_result(launch.set(x2d, rows, None, merged, check_bounds=True), x2d)


PATHS = {
    "reference": _reference,
    "reference_in_order": _reference_in_order,
    "set_one_launch": _set_one_launch,
    "set_rows": _set_rows,
    "add_one_launch": _add_one_launch,
    "add_runs": _add_runs,
    "add_rows": _add_rows,
    "combine": _combine,
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
