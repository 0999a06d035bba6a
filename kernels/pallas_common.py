"""What the Pallas (Triton backend) kernels share: tiling, tile addressing, the launch.

Every kernel works on a 2-D buffer ``x`` of ``(num_rows, d)`` and a flat list
of ``n`` row numbers. The grid is ``(cdiv(n, block_rows), cdiv(d, block_cols))``;
program ``(i, j)`` handles rows ``rows[i*block_rows ...]`` and columns
``j*block_cols ...``. Consecutive programs handle consecutive entries, so after
the caller sorts the rows the PCIe transactions go out in ascending address
order.

Every operand stays in its own memory space (``pl.ANY``: the kernels do their
own addressing), so a buffer in ``pinned_host`` memory is read and written
through its own pointer, over PCIe, and never copied.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from .row_layout import next_pow2, offsets_fit, skip_row

__all__ = [
    "RowGrid",
    "RowTiling",
    "Tile",
    "DISTINCT",
    "additive_identity",
    "choose_row_tiling",
    "dest_rows",
    "duplicates_possible",
    "for_chunks",
    "row_kernel_call",
    "matching_entries",
    "next_pow2",
    "normalized_indices",
    "offsets_fit",
    "one_launch_tiling",
    "output_type",
    "program_entries",
    "raw_entries",
    "skip_row",
    "sum_along",
    "tile_lanes",
    "when",
]

# A tile moves about this many bytes: enough independent stores per program
# to keep PCIe transactions in flight, small enough to keep registers in check.
# benchmarks/results/tune_scatter_h200.log: tile shape and warp count changed
# nothing beyond noise around this point.
_TILE_BYTES = 16 * 1024
# Widest column block, in bytes; wider rows are split across programs.
_MAX_COL_BLOCK_BYTES = 4096


# The one-launch paths (raw indices, duplicates found inside the kernel):
# entries compared per loop step of the duplicate search (up to 1 Ki batches
# need one step; each step waits for a load and a reduction), and entries per
# program. Short programs spread a small batch over many SMs (64 x 1 KiB rows in
# 4 programs of 16 rows took longer than XLA's scatter) and keep the
# block_rows x chunk comparison small.
_MAX_SEARCH_CHUNK = 1024
_MAX_FUSED_BLOCK_ROWS = 8


@dataclasses.dataclass(frozen=True)
class RowTiling:
    """Static launch settings of a row kernel (set, add and gather alike)."""

    block_rows: int
    block_cols: int
    num_warps: int


def choose_row_tiling(n: int, d: int, itemsize: int) -> RowTiling:
    """Power-of-two tile sizes for ``n`` rows of ``d`` elements of ``itemsize`` bytes.

    The column block covers a whole row up to 4 KiB, then rows fill the tile
    up to 16 KiB. Reads and writes of a row cost the same PCIe transactions,
    so one heuristic serves the set, gather and add kernels (the sorted-runs
    add tiles its own runs). Results never depend on it.
    """
    block_cols = min(next_pow2(d), max(1, _MAX_COL_BLOCK_BYTES // itemsize))
    rows_per_tile = max(1, _TILE_BYTES // (block_cols * itemsize))
    block_rows = min(next_pow2(max(n, 1)), next_pow2(rows_per_tile))
    num_warps = 8 if block_rows * block_cols * itemsize >= 8192 else 4
    return RowTiling(block_rows, block_cols, num_warps)


def one_launch_tiling(
    buffer_shape: tuple[int, int], indices: jax.Array, itemsize: int, tiling: RowTiling | None
) -> tuple[RowTiling, int]:
    """``(tiling, search_chunk)`` of a one-launch path over the raw ``(n,)`` ``indices``.

    Raises ValueError when the buffer's row count does not fit the indices'
    type (the kernel wraps negatives by adding it).
    """
    num_rows, row_width = buffer_shape
    if num_rows > jnp.iinfo(indices.dtype).max:
        raise ValueError(f"{num_rows} rows do not fit indices of type {indices.dtype}")
    (num_entries,) = indices.shape
    tiling = tiling or choose_row_tiling(num_entries, row_width, itemsize)
    tiling = dataclasses.replace(tiling, block_rows=min(tiling.block_rows, _MAX_FUSED_BLOCK_ROWS))
    return tiling, min(_MAX_SEARCH_CHUNK, next_pow2(num_entries))


@dataclasses.dataclass(frozen=True)
class RowGrid:
    """The static addressing a row kernel gets from :func:`launch_row_kernel` (as ``grid``).

    ``num_entries`` entries against a ``(num_rows, row_width)`` buffer, in
    tiles of ``block_rows`` entries by ``block_cols`` columns.
    """

    num_entries: int
    num_rows: int
    row_width: int
    block_rows: int
    block_cols: int


def program_entries(grid: RowGrid):
    """``(first, k, cols, k_ok)``: this program's entries ``k`` from ``first``, its columns.

    ``k_ok`` marks the entries that exist (not past the end of the batch).
    """
    first = pl.program_id(0) * grid.block_rows
    k = first + jnp.arange(grid.block_rows)
    cols = pl.program_id(1) * grid.block_cols + jnp.arange(grid.block_cols)
    return first, k, cols, k < grid.num_entries


def normalized_indices(raw, num_rows: int, mode: str | None):
    """``(rows, in_range)`` of raw indices, in a kernel: wrap negatives once, then apply ``mode``.

    The one-launch paths take the caller's indices as they are; this is the
    normalization the other paths do with XLA ops before the launch.
    """
    rows = jnp.where(raw < 0, raw + num_rows, raw)
    if mode == "clip":
        return jnp.clip(rows, 0, num_rows - 1), jnp.ones(rows.shape, bool)
    if mode == "promise_in_bounds":
        return rows, jnp.ones(rows.shape, bool)
    return rows, (rows >= 0) & (rows < num_rows)


def matching_entries(indices_ref, j, rows, *, num_entries: int, num_rows: int, mode):
    """``(block_rows, len(j))``: entry ``j`` of the batch writes the row ``rows[b]``.

    ``j`` is a chunk of entry numbers (those past the batch never match);
    raw indices are normalized with ``mode``, and entries out of range under
    a dropping mode match nothing. The one-launch paths find duplicates so.
    """
    j_ok = j < num_entries
    other_rows, in_range = normalized_indices(
        plgpu.load(indices_ref.at[j], mask=j_ok, other=0), num_rows, mode
    )
    return (rows[:, None] == other_rows[None, :]) & (j_ok & in_range)[None, :]


def for_chunks(start, stop, num_chunks: int, body, init):
    """``lax.fori_loop(start, stop, body, init)``; straight-line code for a one-chunk batch.

    ``num_chunks`` is the static count of chunks in the batch. With one, the
    only chunk is chunk 0 whatever ``start``/``stop`` the caller computed (the
    callers' ranges always hold it then). A tiny batch's time is its chain of
    dependent memory accesses: out of a loop, the chunk's index load is issued
    beside the program's other loads instead of after them.
    """
    if num_chunks == 1:
        return body(0, init)
    return lax.fori_loop(start, stop, body, init)


# What a one-launch kernel may assume of its raw indices' rows (its ``distinct``): None,
# they may repeat (it searches); "promised", distinct; "unless_negative", distinct unless
# some raw index is negative (distinct as written; -1 and n - 1 are one row): it checks.
DISTINCT = (None, "promised", "unless_negative")


def duplicates_possible(indices_ref, num_entries: int, chunk: int, distinct: str | None):
    """Whether the duplicate search must run: ``True``/``False`` known statically, or a
    traced scalar, for ``"unless_negative"``: whether some raw index is below zero (one
    pass over the indices, a chunk at a time)."""
    if distinct not in DISTINCT:
        raise ValueError(f"distinct must be one of {DISTINCT}, got {distinct!r}")
    if distinct is None:
        return True
    if distinct == "promised":
        return False
    num_chunks = pl.cdiv(num_entries, chunk)

    def lowest(c, low):
        j = c * chunk + jnp.arange(chunk)
        raw = plgpu.load(indices_ref.at[j], mask=j < num_entries, other=0)
        return jnp.minimum(low, jnp.min(raw))

    return for_chunks(0, num_chunks, num_chunks, lowest, jnp.zeros((), indices_ref.dtype)) < 0


def when(possible, search, skipped):
    """``search(skipped)`` if ``possible`` (a Python bool, or a traced scalar: then only
    the programs that need it run it), else ``skipped``."""
    if isinstance(possible, bool):
        return search(skipped) if possible else skipped
    return lax.cond(possible, search, lambda s: s, skipped)


def additive_identity(dtype):
    """``-0.0`` for floats (``v + -0.0`` is ``v`` for every ``v``, zeros of either sign
    included; ``+0.0`` would turn ``-0.0`` into ``+0.0``), ``0`` otherwise."""
    return jnp.array(-0.0 if jnp.issubdtype(dtype, jnp.floating) else 0, dtype)


def sum_along(a, axis: int, dtype, *, interpret: bool):
    """``jnp.sum(a, axis, dtype)`` that keeps the sign of a zero sum, as jnp's fold does.

    Triton's reduction combines the elements alone (a sum of ``-0.0`` is
    ``-0.0``). XLA's, which interpret mode runs, starts from ``+0.0``, and on
    the CPU even a ``-0.0`` start is lost in its partial sums past a few
    elements; there the halves are added elementwise instead, which IEEE
    defines for zeros of either sign.
    """
    if not (interpret and jnp.issubdtype(dtype, jnp.floating)):
        return jnp.sum(a, axis=axis, dtype=dtype)
    a = jnp.moveaxis(a.astype(dtype), axis, 0)
    while a.shape[0] > 1:
        half = a.shape[0] // 2
        a = jnp.concatenate([a[:half] + a[half:2 * half], a[2 * half:]])
    return a[0]


def raw_entries(indices_ref, grid: RowGrid, mode):
    """``(first, k, cols, rows, row_ok)`` of a one-launch program: its entries' normalized rows.

    ``row_ok`` marks the entries that exist and, under a dropping mode, are in range.
    """
    first, k, cols, k_ok = program_entries(grid)
    rows, in_range = normalized_indices(
        plgpu.load(indices_ref.at[k], mask=k_ok, other=0), grid.num_rows, mode
    )
    return first, k, cols, rows, k_ok & in_range


class Tile(NamedTuple):
    """One program's share of the work, as :func:`tile_lanes` loads it."""

    rows: Any  # (block_rows,) row numbers; -1 past the end of the batch
    order: Any  # (block_rows,) permutation entries, or the entry numbers
    cols: Any  # (block_cols,) column numbers
    entry_ok: Any  # (block_rows,) the entry exists (not past the batch)
    row_ok: Any  # entry_ok and, with check_bounds, the row is in the buffer
    mask: Any  # (block_rows, block_cols) row_ok crossed with real columns
    entry_mask: Any  # (block_rows, block_cols) entry_ok crossed with real columns
    first: Any  # this program's first entry number


def tile_lanes(rows_ref, order_ref, grid: RowGrid, *, check_bounds: bool) -> Tile:
    """Loads this program's rows and permutation entries and builds its masks."""
    first, k, cols, k_ok = program_entries(grid)
    rows = plgpu.load(rows_ref.at[k], mask=k_ok, other=-1)
    order = k if order_ref is None else plgpu.load(order_ref.at[k], mask=k_ok, other=0)
    row_ok = k_ok
    if check_bounds:
        row_ok = row_ok & (rows >= 0)
        if grid.num_rows <= jnp.iinfo(rows.dtype).max:
            row_ok = row_ok & (rows < grid.num_rows)
    cols_ok = (cols < grid.row_width)[None, :]
    return Tile(rows, order, cols, k_ok, row_ok, row_ok[:, None] & cols_ok,
                k_ok[:, None] & cols_ok, first)


def dest_rows(rows, row_ok, num_rows: int):
    """The rows a masked store into the buffer addresses: ``rows`` where ``row_ok``.

    Masked-off lanes point past the end (:func:`skip_row`), never at a real
    element: interpret mode emulates a masked store with a scatter that
    writes back the old value, which would race a real write to the same
    element.
    """
    return jnp.where(row_ok, rows, skip_row(num_rows, rows.dtype))


def output_type(shape, dtype, operands) -> jax.ShapeDtypeStruct:
    """The kernel's output type. Inside ``jax.shard_map`` with ``check_vma`` (its default),
    Pallas wants it said along which mesh axes the output varies: along every one an
    operand varies along, as the kernel mixes them all. Elsewhere the set is empty."""
    varying = frozenset().union(*(jax.typeof(a).manual_axis_type.varying for a in operands))
    return jax.ShapeDtypeStruct(
        shape, dtype, manual_axis_type=jax.sharding.ManualAxisType(varying=varying)
    )


def row_kernel_call(kernel, operands, *, tiling, in_place: bool, **settings):
    """``(body, arrays, params)`` for ``pl.pallas_call(body, name=..., interpret=...,
    **params)(*arrays)``: ``kernel(*operand_refs, out_ref, grid=..., **settings)`` over the
    row grid. Each kernel module's builder makes that call itself, under its own name.

    ``operands`` start with the ``(n,)`` row numbers and end with the
    ``(num_rows, d)`` buffer; ``None`` stands for an absent permutation:
    ``pallas_call`` takes arrays only, so the ``None`` is bound inside the
    kernel instead. The kernel gets its addressing as ``grid`` (a
    :class:`RowGrid`) plus its own ``settings``. With ``in_place`` the buffer
    is aliased to the only output, so the kernel updates it in place; else
    the output is a fresh ``(n, d)`` array of the buffer's dtype.
    """
    (num_entries,) = operands[0].shape
    num_rows, row_width = buffer_shape = operands[-1].shape
    grid = RowGrid(num_entries, num_rows, row_width, tiling.block_rows, tiling.block_cols)
    present = [k for k, a in enumerate(operands) if a is not None]

    def body(*refs):
        bound = dict(zip(present, refs[:-1], strict=True))
        refs_in = (bound.get(k) for k in range(len(operands)))
        # The kernels mix program ids (int32) with aranges (int64 under x64) as jnp's
        # standard promotion allows; a user's jax_numpy_dtype_promotion="strict" must not
        # reach inside them (with x64 on it refused every kernel).
        with jax.numpy_dtype_promotion("standard"):
            return kernel(*refs_in, refs[-1], grid=grid, **settings)

    arrays = [operands[k] for k in present]
    out_shape = buffer_shape if in_place else (num_entries, row_width)
    any_spec = pl.BlockSpec(memory_space=pl.ANY)
    params = dict(
        out_shape=output_type(out_shape, arrays[-1].dtype, arrays),
        grid=(pl.cdiv(num_entries, tiling.block_rows), pl.cdiv(row_width, tiling.block_cols)),
        in_specs=[any_spec] * len(arrays),
        out_specs=any_spec,
        input_output_aliases={len(arrays) - 1: 0} if in_place else {},
        compiler_params=plgpu.CompilerParams(num_warps=tiling.num_warps, num_stages=1),
    )
    return body, arrays, params
