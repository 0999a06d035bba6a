"""Tiling and static checks of the raw Triton kernels' launches; no triton needed.

What :func:`triton_common.plan_rows` checks before it builds a launch, kept
apart from triton so that it imports without the extra: the tiling
(:class:`TritonTiling`, the heuristic :func:`choose_tiling`, the grid and
:func:`check_tiling` against Triton's and CUDA's limits) and the operands
(:func:`check_entries`, :func:`check_updates`). :mod:`triton_common`
re-exports all of it.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from .row_layout import next_pow2

__all__ = [
    "EVICTION_POLICIES", "LOAD_CACHE_MODIFIERS", "STORE_CACHE_MODIFIERS", "TritonTiling",
    "check_entries", "check_tiling", "check_updates", "choose_tiling", "grid",
    "tiling_for_tile_bytes",
]

# Cache modifiers Triton 3.6 accepts on loads and on stores, and eviction
# policies (both); "" is the compiler's default. Which one helps PCIe traffic
# to pinned memory is an open measurement, so they are settings of the tiling.
LOAD_CACHE_MODIFIERS = ("", ".ca", ".cg", ".cv")
STORE_CACHE_MODIFIERS = ("", ".wb", ".cg", ".cs", ".wt")
EVICTION_POLICIES = ("", "evict_first", "evict_last")

# CUDA grid limits: blockIdx.x up to 2**31 - 1, blockIdx.y up to 65535.
MAX_ROW_PROGRAMS = 2**31 - 1
MAX_COL_PROGRAMS = 65535
# Triton refuses tensors of more elements than this.
MAX_TILE_ELEMS = 1 << 20
INDEX_DTYPES = (jnp.dtype(jnp.int32), jnp.dtype(jnp.int64))


def check_entries(x, rows, partner, *, partner_name: str) -> None:
    """``x`` is 2-D, ``rows`` 1-D int32/int64, ``partner`` None or int32 like ``rows``."""
    if x.ndim != 2:
        raise ValueError(f"x must be 2-D (num_rows, d), got shape {x.shape}")
    if rows.ndim != 1 or jnp.dtype(rows.dtype) not in INDEX_DTYPES:
        raise TypeError(f"rows must be 1-D int32 or int64, got {rows.dtype}{rows.shape}")
    if partner is not None and (partner.shape != rows.shape or partner.dtype != jnp.int32):
        raise TypeError(
            f"{partner_name} must be None or int32 of rows' shape {rows.shape}, "
            f"got {partner.dtype}{partner.shape}"
        )


def check_updates(x, rows, src, updates, *, dtypes) -> None:
    """``updates`` is ``(m, d)`` of one of ``dtypes``, with a row for each entry without ``src``."""
    dtypes = tuple(dict.fromkeys(jnp.dtype(t) for t in dtypes))
    shape_ok = updates.ndim == 2 and updates.shape[1] == x.shape[1]
    if not shape_ok or jnp.dtype(updates.dtype) not in dtypes:
        kinds = " or ".join(str(t) for t in dtypes)
        raise ValueError(
            f"updates must be (m, {x.shape[1]}) {kinds} like x's rows, "
            f"got {updates.dtype}{updates.shape}"
        )
    if src is None and updates.shape[0] < rows.shape[0]:
        raise ValueError(
            f"without src, updates needs at least {rows.shape[0]} rows, got {updates.shape[0]}"
        )


@dataclasses.dataclass(frozen=True)
class TritonTiling:
    """Static launch settings of a Triton row kernel.

    ``block_rows`` and ``block_cols`` are powers of two. ``cache_modifier`` or
    ``eviction_policy`` (at most one: PTX has one instruction form with a
    cache operator, another with eviction priorities) go to the accesses of
    the buffer ``x``; each op says which ones.
    """

    block_rows: int
    block_cols: int
    num_warps: int
    cache_modifier: str = ""
    eviction_policy: str = ""


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def tiling_for_tile_bytes(
    n: int, d: int, itemsize: int, *, tile_bytes: int, max_col_block_bytes: int
) -> TritonTiling:
    """Power-of-two tile of about ``tile_bytes`` for ``n`` entries of ``d`` elements.

    The column block covers a row up to ``max_col_block_bytes`` (wider rows
    take several programs; over 65535 of them, wider blocks), then entries
    fill the tile. One warp per 2 KiB of tile (8 x 16-byte accesses per
    thread at most), 1 to 8: tiny tiles do not pay for idle warps.
    """
    d = max(d, 1)
    block_cols = min(next_pow2(d), max(1, max_col_block_bytes // itemsize))
    block_cols = max(block_cols, next_pow2(_cdiv(d, MAX_COL_PROGRAMS)))
    rows_per_tile = max(1, tile_bytes // (block_cols * itemsize))
    block_rows = min(next_pow2(max(n, 1)), next_pow2(rows_per_tile))
    num_warps = min(8, next_pow2(max(1, block_rows * block_cols * itemsize // 2048)))
    return TritonTiling(block_rows, block_cols, num_warps)


def choose_tiling(n: int, d: int, itemsize: int) -> TritonTiling:
    """Tile sizes for ``n`` entries of ``d`` elements, for every op.

    ``itemsize`` is the widest type the registers hold (for the add, the
    accumulator's when wider). About 16 KiB of host accesses per program
    keeps enough PCIe traffic in flight to cover its round-trip latency; a
    column block covers a row up to 4 KiB. Results never depend on the
    tiling; only speed does. Sizes: those of the Pallas kernels, a choice:
    the tiling sweep (benchmarks/results/tune_scatter_h200.log) found tile
    shape and warp count changing nothing beyond noise there.
    """
    return tiling_for_tile_bytes(n, d, itemsize, tile_bytes=16 * 1024, max_col_block_bytes=4096)


def grid(n: int, d: int, tiling: TritonTiling) -> tuple[int, int]:
    return _cdiv(n, tiling.block_rows), _cdiv(d, tiling.block_cols)


def check_tiling(
    tiling: TritonTiling, n: int, d: int, *, cache_modifiers: tuple[str, ...]
) -> None:
    """Raises ValueError for a tiling that Triton, ptxas or CUDA would refuse.

    ``cache_modifiers`` are those the op's accesses of ``x`` accept
    (:data:`LOAD_CACHE_MODIFIERS` or :data:`STORE_CACHE_MODIFIERS`).
    """
    for field in ("block_rows", "block_cols"):
        value = getattr(tiling, field)
        if not isinstance(value, int) or value < 1 or value & (value - 1):
            raise ValueError(f"{field} must be a positive power of two, got {value!r}")
    if tiling.num_warps not in (1, 2, 4, 8, 16, 32):
        raise ValueError(f"num_warps must be a power of two in [1, 32], got {tiling.num_warps!r}")
    if tiling.block_rows * tiling.block_cols > MAX_TILE_ELEMS:
        raise ValueError(
            f"tile {tiling.block_rows}x{tiling.block_cols} has more than {MAX_TILE_ELEMS} "
            "elements, Triton's limit"
        )
    if tiling.cache_modifier not in cache_modifiers:
        raise ValueError(
            f"unknown cache_modifier {tiling.cache_modifier!r}; expected one of {cache_modifiers}"
        )
    if tiling.eviction_policy not in EVICTION_POLICIES:
        raise ValueError(
            f"unknown eviction_policy {tiling.eviction_policy!r}; "
            f"expected one of {EVICTION_POLICIES}"
        )
    if tiling.cache_modifier and tiling.eviction_policy:
        raise ValueError(
            f"cache_modifier {tiling.cache_modifier!r} and eviction_policy "
            f"{tiling.eviction_policy!r} cannot be combined; set at most one"
        )
    row_programs, col_programs = grid(n, d, tiling)
    if row_programs > MAX_ROW_PROGRAMS or col_programs > MAX_COL_PROGRAMS:
        raise ValueError(
            f"grid {(row_programs, col_programs)} for {n} rows of {d} elements exceeds CUDA's "
            f"limits {(MAX_ROW_PROGRAMS, MAX_COL_PROGRAMS)}; use larger blocks"
        )
