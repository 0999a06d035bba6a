"""Pallas kernels that add rows into a buffer in place: ``x[rows[k]] += updates[src[k]]``.

Same operands and launch as :mod:`.scatter_pallas` (the buffer ``x`` is aliased
to the only output, so a ``pinned_host`` buffer is read and written over PCIe
and never copied), except that each program reads the destination rows, adds
the update rows in an accumulator type and writes the sums back, rounded once.

Programs run in parallel, and two read-add-write sequences on the same row
would lose one of the additions (and atomics would add in no fixed order), so
exactly one program writes each row:

* :func:`scatter_add_rows`: the caller makes the valid rows distinct
  (duplicates combined on the device first);
* :func:`scatter_add_rows_fused` (small batches, raw indices): the first
  entry of a row finds the others with an ``n x n`` search and sums them;
* :func:`scatter_add_sorted_runs` (rows in a stable ascending order): the
  first entry of each run of equal rows sums the run.

``updates`` may be of ``x.dtype`` or of the accumulator type.

With ``atomic_write`` (float32 buffers summed in float32) the owner adds its
total with one atomic add instead of reading the row and storing the sum, with
the same bits: :mod:`.owner_write`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from .owner_write import atomic_write_allowed, check_atomic, read_row, write_total
from .pallas_common import (
    RowGrid,
    RowTiling,
    additive_identity,
    choose_row_tiling,
    dest_rows,
    duplicates_possible,
    for_chunks,
    matching_entries,
    next_pow2,
    one_launch_tiling,
    raw_entries,
    row_kernel_call,
    sum_along,
    tile_lanes,
    when,
)

__all__ = [
    "atomic_write_allowed",
    "scatter_add_rows",
    "scatter_add_rows_fused",
    "scatter_add_rows_fused_kernel",
    "scatter_add_rows_kernel",
    "scatter_add_sorted_runs",
    "scatter_add_sorted_runs_kernel",
]


def _owner_write(x, acc_dtype, atomic_write, interpret) -> dict:
    """The launch's settings of the owner write (:mod:`.owner_write`)."""
    return {"atomic": check_atomic(x, acc_dtype, atomic_write, interpret)}


def scatter_add_rows_kernel(
    rows_ref, src_ref, updates_ref, x_in_ref, x_out_ref, *, grid: RowGrid, check_bounds: bool,
    acc_dtype, atomic: str | None = None,
):
    """Adds one ``block_rows x block_cols`` tile of update rows into ``x``."""
    # Aliased to x_out_ref: the same buffer. Reading through the output ref
    # is what interpret mode also supports (it seeds the output with x).
    del x_in_ref
    tile = tile_lanes(rows_ref, src_ref, grid, check_bounds=check_bounds)
    dest = dest_rows(tile.rows, tile.row_ok, grid.num_rows)
    source = updates_ref.at[tile.order[:, None], tile.cols[None, :]]
    addend = plgpu.load(source, mask=tile.mask, other=0)
    current = read_row(x_out_ref, dest, tile.cols, tile.mask, atomic=atomic)
    write_total(x_out_ref, dest, tile.cols, tile.mask, addend.astype(acc_dtype), current,
                 atomic=atomic)


def scatter_add_rows(
    x: jax.Array, rows: jax.Array, src: jax.Array | None, updates: jax.Array, *,
    acc_dtype=None, check_bounds: bool = True, tiling: RowTiling | None = None,
    atomic_write: bool = False, interpret: bool = False,
) -> jax.Array:
    """Builds and calls the kernel; sums in ``acc_dtype`` (default ``x.dtype``).

    ``atomic_write``: see the module's doc. Traced inside a ``jit``: the result aliases ``x``.
    """
    (num_updates,) = rows.shape
    acc_dtype = jnp.dtype(x.dtype if acc_dtype is None else acc_dtype)
    itemsize = max(x.dtype.itemsize, updates.dtype.itemsize)
    tiling = tiling or choose_row_tiling(num_updates, x.shape[1], itemsize)
    body, arrays, params = row_kernel_call(
        scatter_add_rows_kernel, (rows, src, updates, x), tiling=tiling, in_place=True,
        check_bounds=check_bounds,
        acc_dtype=acc_dtype, **_owner_write(x, acc_dtype, atomic_write, interpret),
    )
    call = pl.pallas_call(body, name="pallas_pinned_scatter_add_rows", interpret=interpret,
                          **params)
    return call(*arrays)


# --- one launch for small batches: normalization and combining inside ---
#
# The unfused path first combined duplicates with about a dozen XLA ops before its launch (a
# stable order, a segmented scan; now a stable sort, then the sorted-runs kernel above), which
# took 23.2 us per step at 64 x 1 KiB against 13.5 with the combining skipped
# (docs/PERFORMANCE.md, "Thresholds"). Here each entry's program normalizes its own raw index, and
# the FIRST occurrence of a row owns it: it searches the earlier entries for its row (if one is
# found, the entry is skipped), then sums the later entries of its row into its own, chunk by
# chunk in entry order, and does the one read-add-write (or atomic add). Distinct rows cost one
# search of the indices; the update rows of duplicates are loaded only for chunks that hold some.

# Elements of the (block_rows, sum_chunk, block_cols) tensor one step of the
# duplicate sum holds: 32 KiB of float32 per program.
_SUM_ELEMENTS = 8192


def _any(mask):
    # Pallas' Triton lowering has no reduce_or.
    return jnp.max(mask.astype(jnp.int32)) > 0


def scatter_add_rows_fused_kernel(
    indices_ref, updates_ref, x_in_ref, x_out_ref, *, grid: RowGrid, search_chunk: int,
    sum_chunk: int, mode: str | None, distinct: str | None, acc_dtype, atomic: str | None = None,
    interpret_sums: bool = False,
):
    """Adds one tile of raw-indexed updates; each row's first entry adds all of that row's.

    Absent entries add ``-0.0``, the identity that keeps a row's ``-0.0``.
    """
    del x_in_ref  # Aliased to x_out_ref: the same buffer.
    num_entries, num_rows = grid.num_entries, grid.num_rows
    first, k, cols, rows, row_ok = raw_entries(indices_ref, grid, mode)
    cols_ok = (cols < grid.row_width)[None, :]
    # Both loads go out before the duplicate search, not after it: a small
    # batch's time is its chain of dependent accesses, and the row's read is a
    # PCIe round trip. The update load is masked by the batch's end only; the
    # row is read for every entry in range, also for one that turns out not to
    # own its row (only owners write, so a read that is not used is harmless).
    total = plgpu.load(
        updates_ref.at[k[:, None], cols[None, :]],
        mask=(k < num_entries)[:, None] & cols_ok, other=0,
    ).astype(acc_dtype)
    current = read_row(x_out_ref, dest_rows(rows, row_ok, num_rows), cols,
                        row_ok[:, None] & cols_ok, atomic=atomic)
    num_chunks = pl.cdiv(num_entries, search_chunk)

    def combine(state):
        _, total = state

        def others(j):
            found = matching_entries(
                indices_ref, j, rows, num_entries=num_entries, num_rows=num_rows, mode=mode
            )
            return found & (j[None, :] != k[:, None])

        def search_chunk_of(c, earlier):
            j = c * search_chunk + jnp.arange(search_chunk)
            hit = others(j) & (j[None, :] < k[:, None])
            return jnp.maximum(earlier, jnp.max(hit.astype(jnp.int32), axis=1))

        # Only earlier entries can own this row: stop after this program's chunk.
        earlier = for_chunks(
            0, jnp.minimum(first // search_chunk + 1, num_chunks), num_chunks,
            search_chunk_of, jnp.zeros((grid.block_rows,), jnp.int32),
        )
        owner = row_ok & (earlier == 0)

        def later_of(j):
            return others(j) & (j[None, :] > k[:, None]) & owner[:, None]

        def add_sub_chunk(start, total):
            j = start + jnp.arange(sum_chunk)
            hit = later_of(j)

            def accumulate(total):
                mask = (j < num_entries)[:, None] & cols_ok
                addend = plgpu.load(
                    updates_ref.at[j[:, None], cols[None, :]], mask=mask, other=0
                ).astype(acc_dtype)
                picked = jnp.where(hit[:, :, None], addend[None, :, :],
                                   additive_identity(acc_dtype))
                return total + sum_along(picked, 1, acc_dtype, interpret=interpret_sums)

            return lax.cond(_any(hit), accumulate, lambda t: t, total)

        def add_chunk(c, total):
            start = c * search_chunk
            hit = later_of(start + jnp.arange(search_chunk))
            steps = search_chunk // sum_chunk

            def accumulate(total):
                return lax.fori_loop(
                    0, steps, lambda s, t: add_sub_chunk(start + s * sum_chunk, t), total
                )

            return lax.cond(_any(hit), accumulate, lambda t: t, total)

        # Only later entries are summed in: start at this program's own chunk.
        total = for_chunks(first // search_chunk, num_chunks, num_chunks, add_chunk, total)
        return earlier, total

    # The entries that an earlier one of the same row owns (1), and the owners' totals.
    possible = duplicates_possible(indices_ref, num_entries, search_chunk, distinct)
    earlier, total = when(possible, combine, (jnp.zeros((grid.block_rows,), jnp.int32), total))
    row_ok = row_ok & (earlier == 0)
    # Addressed anew with the owners only: the store's masked lanes must point
    # past the end, not at a row another program writes (dest_rows says why).
    write_total(x_out_ref, dest_rows(rows, row_ok, num_rows), cols, row_ok[:, None] & cols_ok,
                 total, current, atomic=atomic)


def scatter_add_rows_fused(
    x: jax.Array,
    indices: jax.Array,
    updates: jax.Array,
    *,
    mode: str | None,
    distinct: str | None = None,
    acc_dtype=None,
    tiling: RowTiling | None = None,
    atomic_write: bool = False,
    interpret: bool = False,
) -> jax.Array:
    """``x.at[indices].add(updates, mode=mode)`` in one launch, duplicates summed in entry order.

    ``indices`` are the caller's raw ``(n,)`` int32/int64 indices (negative
    ones wrap once; ``num_rows`` must fit their type); ``updates`` ``(n, d)``.
    Sums are formed in ``acc_dtype`` (default ``x.dtype``) and rounded once.
    ``distinct`` (:data:`~.pallas_common.DISTINCT`): what the caller promises of the
    rows; duplicates are searched for and summed where they may repeat. The search
    grows as ``n**2``: small batches only. ``atomic_write``: see the
    module's doc. Traced inside a ``jit``: the result aliases ``x``.
    """
    acc_dtype = jnp.dtype(x.dtype if acc_dtype is None else acc_dtype)
    itemsize = max(x.dtype.itemsize, acc_dtype.itemsize)
    tiling, search_chunk = one_launch_tiling(x.shape, indices, itemsize, tiling)
    per_entry = tiling.block_rows * tiling.block_cols
    sum_chunk = min(search_chunk, max(1, _SUM_ELEMENTS // per_entry))
    body, arrays, params = row_kernel_call(
        scatter_add_rows_fused_kernel, (indices, updates, x), tiling=tiling, in_place=True,
        search_chunk=search_chunk, sum_chunk=sum_chunk, mode=mode, distinct=distinct,
        acc_dtype=acc_dtype, interpret_sums=interpret,
        **_owner_write(x, acc_dtype, atomic_write, interpret),
    )
    call = pl.pallas_call(body, name="pallas_pinned_scatter_add_rows_fused", interpret=interpret,
                          **params)
    return call(*arrays)


# --- larger batches: one launch over sorted runs ---
#
# Above the one-launch limit XLA normalizes the rows and puts them in a stable
# order (the order kernel, or XLA's stable sort), so the entries of a
# row form one run, in entry order. The run's first entry owns the row: its
# program sums the run chunk by chunk and does the one read-add-write (or atomic
# add). Runs are contiguous, so only a program's last run can go on past its block, and its
# owner follows it until it ends. This replaces the segmented scan's log2(n)
# passes over the updates, which took most of the sparse client's add (72.4 of
# its 85.2 us at 4096 Zipf ids; docs/PERFORMANCE.md, "Thresholds").

# Entries per program at most. A program compares its entries pairwise (a
# block_rows**2 x block_cols tensor, kept within _SUM_ELEMENTS), so narrow rows
# get more entries per program and wide rows fewer.
_MAX_RUN_BLOCK_ROWS = 64


def _run_tiling(num_entries: int, row_width: int, itemsize: int) -> RowTiling:
    block_cols = choose_row_tiling(num_entries, row_width, itemsize).block_cols
    block_rows = 1
    while (block_rows * 2 <= min(_MAX_RUN_BLOCK_ROWS, next_pow2(num_entries))
           and (block_rows * 2) ** 2 * block_cols <= _SUM_ELEMENTS):
        block_rows *= 2
    num_warps = 8 if block_rows * block_cols * itemsize >= 8192 else 4
    return RowTiling(block_rows, block_cols, num_warps)


def scatter_add_sorted_runs_kernel(
    rows_ref, perm_ref, updates_ref, x_in_ref, x_out_ref, *, grid: RowGrid, sum_chunk: int,
    run_chunk: int, acc_dtype, atomic: str | None = None, interpret_sums: bool = False,
):
    """Adds the runs that start in one tile of sorted rows; each run's first entry owns its row.

    Sums start from ``-0.0``, the identity that keeps a row's ``-0.0``.
    """
    del x_in_ref  # Aliased to x_out_ref: the same buffer.
    num_entries, num_rows = grid.num_entries, grid.num_rows
    # Bounds checked: the skip markers of the order lie outside the buffer.
    tile = tile_lanes(rows_ref, None, grid, check_bounds=True)
    first, k, rows, cols = tile.first, tile.order, tile.rows, tile.cols
    cols_ok = (cols < grid.row_width)[None, :]
    zero = additive_identity(acc_dtype)

    def rows_at(j, ok):
        return plgpu.load(rows_ref.at[j], mask=ok, other=-1)

    def updates_at(j, ok):
        src = j if perm_ref is None else plgpu.load(perm_ref.at[j], mask=ok, other=0)
        return plgpu.load(
            updates_ref.at[src[:, None], cols[None, :]], mask=ok[:, None] & cols_ok, other=0
        ).astype(acc_dtype)

    before = jnp.where(k > 0, rows_at(jnp.maximum(k - 1, 0), tile.entry_ok & (k > 0)), -1)
    owner = tile.row_ok & (rows != before)
    # The owners' rows are read now, before the runs are summed: the PCIe round
    # trip then overlaps the summing instead of following it.
    mask = owner[:, None] & cols_ok
    dest = dest_rows(rows, owner, num_rows)
    current = read_row(x_out_ref, dest, cols, mask, atomic=atomic)

    # This block's own entries: each owner sums the entries of its run here.
    total = jnp.full((grid.block_rows, grid.block_cols), zero)
    for start in range(0, grid.block_rows, sum_chunk):
        j = first + start + jnp.arange(sum_chunk)
        j_ok = j < num_entries
        hit = (
            owner[:, None] & (rows_at(j, j_ok)[None, :] == rows[:, None])
            & (j[None, :] >= k[:, None]) & j_ok[None, :]
        )
        picked = jnp.where(hit[:, :, None], updates_at(j, j_ok)[None, :, :], zero)
        total = total + sum_along(picked, 1, acc_dtype, interpret=interpret_sums)

    # The last run of the block, if it starts here, may go on past it.
    last_row = jnp.max(jnp.where(tile.entry_ok, rows, -1))
    tail_owner = owner & (rows == last_row)
    after = first + grid.block_rows + jnp.arange(1)
    continues = jnp.max(rows_at(after, after < num_entries)) == last_row

    def follow(carry):
        start, extra, _ = carry
        j = start + jnp.arange(run_chunk)
        hit = (j < num_entries) & (rows_at(j, j < num_entries) == last_row)
        extra = extra + sum_along(
            jnp.where(hit[:, None], updates_at(j, hit), zero), 0, acc_dtype,
            interpret=interpret_sums,
        )
        # A run is contiguous: it can go on only if it filled this chunk.
        return start + run_chunk, extra, jnp.min(hit.astype(jnp.int32))

    going_on = jnp.where(continues, jnp.max(tail_owner.astype(jnp.int32)), 0)
    _, extra, _ = lax.while_loop(
        lambda carry: carry[2] > 0, follow,
        (first + grid.block_rows, jnp.full((grid.block_cols,), zero), going_on),
    )
    total = total + jnp.where(tail_owner[:, None], extra[None, :], zero)
    write_total(x_out_ref, dest, cols, mask, total, current, atomic=atomic)


def scatter_add_sorted_runs(
    x: jax.Array, rows: jax.Array, perm: jax.Array | None, updates: jax.Array, *,
    acc_dtype=None, tiling: RowTiling | None = None, atomic_write: bool = False,
    interpret: bool = False,
) -> jax.Array:
    """``x[rows[k]] += updates[perm[k]]`` for rows that ascend, duplicates summed in one launch.

    ``rows`` are normalized and ascending (equal rows adjacent, in entry
    order); entries outside ``[0, num_rows)`` (the skip markers) are left out.
    ``perm`` maps each entry to its update row (None: the identity). Each
    run's sum is formed in ``acc_dtype`` (default ``x.dtype``) in entry order,
    chunk by chunk, and added to the buffer's row once: the same input gives
    the same bits. ``atomic_write``: see the module's doc. Traced inside a
    ``jit``: the result aliases ``x``.
    """
    (num_entries,) = rows.shape
    acc_dtype = jnp.dtype(x.dtype if acc_dtype is None else acc_dtype)
    itemsize = max(x.dtype.itemsize, acc_dtype.itemsize)
    tiling = tiling or _run_tiling(num_entries, x.shape[1], itemsize)
    sum_chunk = min(tiling.block_rows,
                    max(1, _SUM_ELEMENTS // (tiling.block_rows * tiling.block_cols)))
    run_chunk = min(next_pow2(num_entries), max(1, _SUM_ELEMENTS // tiling.block_cols))
    body, arrays, params = row_kernel_call(
        scatter_add_sorted_runs_kernel, (rows, perm, updates, x), tiling=tiling, in_place=True,
        sum_chunk=sum_chunk,
        run_chunk=run_chunk, acc_dtype=acc_dtype, interpret_sums=interpret,
        **_owner_write(x, acc_dtype, atomic_write, interpret),
    )
    call = pl.pallas_call(body, name="pallas_pinned_scatter_add_sorted_runs", interpret=interpret,
                          **params)
    return call(*arrays)
