"""What the raw Triton kernels (launched through jax-triton) share.

The Triton backend sits beside the Pallas one with the same contracts:
:mod:`scatter_triton`, :mod:`gather_triton` and :mod:`scatter_add_triton`
each hold an op's plan and public function, and the first two a
``@triton.jit`` kernel (the add is the scatter kernel with ``ADD``).
Upstream deprecated Pallas's Triton backend and Mosaic GPU has no host memory
space; a plain Triton kernel called with ``triton_call`` keeps the ops alive
and gives direct control of the host accesses (vector width, cache modifier,
eviction policy). This module holds the rest, written once:

* the import guard: without triton, importing a Triton kernel module raises
  an ImportError naming the extra; without jax-triton they import (kernels
  compile ahead of time) and launching raises it; where jax-triton cannot
  launch, launching raises NotImplementedError (:func:`check_can_launch`);
* :class:`TritonTiling`, its checks, :func:`choose_tiling` and the grid;
  :func:`tile_entries`, :func:`tile_mask`;
* :func:`plan_rows`, which turns an op's shapes and dtypes into a
  :class:`TritonLaunch`, everything static about one launch, which
  :func:`launch` hands to ``triton_call`` and :func:`compile_for_target`
  compiles ahead of time (so the PTX the tests read is the launched kernel's).

Every kernel sees a ``(num_rows, d)`` buffer ``x`` and a batch of ``n``
entries, entry ``k`` pairing buffer row ``rows[k]`` with row ``partner[k]``
of the other side (the update row for scatter and add, the output row for
gather). The grid is ``(cdiv(n, block_rows), cdiv(d, block_cols))``: axis 0 is
CUDA's ``x`` axis (up to 2**31 - 1 programs, so any batch fits), the column
axis CUDA's ``y`` axis, limited to 65535 programs, which the tiling
heuristics respect by widening the column block for absurdly wide rows.

Two jax-triton conventions, one kernel for both: a kernel's pointers are its
operands' and then one for the result, which for an in-place op is the
buffer ``x`` itself. jax-triton 0.3 passes ``x`` twice (as the aliased
operand, which the kernel ignores, and as the output: the same memory); 0.4
passes it once, as a ``jax.new_ref`` in the result's slot, and the operand
slot gets a placeholder (:func:`launch`). In both the result comes back
declared in device memory; callers ``device_put`` it to the host space.

Install with ``pip install "pallas-pinned[triton]"`` (jax-triton 0.3.1 and
triton 3.6). Combinations and where they were tested:

* jax-triton 0.3.1 + triton 3.6.0, jax 0.11.2: launched on an H200 (the GPU
  tests).
* jax-triton 0.3.1 + triton 3.6.0, jax 0.12.0.1 on CPU (CI): installs; it
  refuses to import without CUDA, so kernels compile ahead of time for sm_90
  (both signatures), and the launch lowers to StableHLO for CUDA with a
  stand-in for jaxlib's CUDA Triton plugin, jax-triton compiling the very
  PTX :func:`compile_for_target` gives. Not launched on a GPU with jax 0.12.
* jax-triton 0.4.1 + triton 3.9.0 (0.4 needs triton >= 3.7), jax 0.12.0.1
  on CPU (by hand; the same tests): installs and imports, the 0.4 launch
  lowers the same way. It cannot launch with jax 0.12: 0.4.1's dead-code
  rule takes the old arguments, so ``jit`` fails to lower it (unless with
  ``keep_unused=True``), and :func:`check_can_launch` refuses it
  (:data:`JAX_TRITON_UNUSABLE`).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import tempfile
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp

INSTALL_HINT = 'pip install "pallas-pinned[triton]"'
# The jax-triton release series whose triton_call conventions launch() speaks.
JAX_TRITON_SERIES = ((0, 3), (0, 4))


def _not_installed(err: ImportError) -> ImportError:
    return ImportError(
        "the Triton backend of pallas_pinned needs triton and jax-triton, which are "
        f"optional: {INSTALL_HINT} ({str(err).splitlines()[0]})"
    )


try:
    import triton
    import triton.language as tl
    from triton.backends.compiler import GPUTarget
except ImportError as err:
    raise _not_installed(err) from err


def _series(module) -> tuple[int, int]:
    return tuple(module.__version_info__[:2])


def _why_04_cannot_launch(module) -> str | None:
    """Why an importable jax-triton 0.4 still cannot launch here; None if it can."""
    lib = getattr(getattr(module, "triton_lib", None), "triton_kernel_call_lib", None)
    if not hasattr(lib, "TritonKernelCall"):
        # 0.4 imports on any jaxlib; only jaxlib's CUDA plugin has the launcher.
        return "jax-triton requires JAX to be installed with GPU support (jaxlib's CUDA plugin)"
    try:  # 0.4.1's dead-code rule takes (used_outs, eqn); jax 0.12 passes three arguments.
        from jax._src.interpreters import partial_eval as pe

        theirs = pe.dce_rules[module.triton_lib.triton_kernel_call_p]
        wanted = len(inspect.signature(pe._default_dce_rule).parameters)
        if len(inspect.signature(theirs).parameters) != wanted:
            return (
                f"jax-triton {module.__version__}'s dead-code rule does not fit jax "
                f"{jax.__version__}'s (jit would fail to lower its triton_call)"
            )
    except (AttributeError, KeyError, TypeError, ValueError, ImportError):
        pass  # Internals moved: nothing known to be wrong.
    return None


# Why kernels cannot be launched here; None when they can. Only launching
# needs jax-triton: compile_for_target needs triton alone (PTX tests on CPU).
JAX_TRITON_UNUSABLE: str | None = None
_JAX_TRITON_MISSING: ImportError | None = None
# The installed jax-triton's series, launchable or not (compile_for_target's default).
INSTALLED_SERIES: tuple[int, int] | None = None
try:
    import jax_triton
except ImportError as err:
    jax_triton = None
    missing = err.name if isinstance(err, ModuleNotFoundError) else None
    if missing is not None and missing.partition(".")[0] not in ("jax", "jaxlib"):
        # jax-triton itself, or one of its own dependencies, is not installed.
        _JAX_TRITON_MISSING = _not_installed(err)
        JAX_TRITON_UNUSABLE = str(_JAX_TRITON_MISSING)
    else:
        # Installed, but refuses this jaxlib (0.3.1 raises ImportError on a
        # jaxlib without GPU support).
        JAX_TRITON_UNUSABLE = " ".join(str(err).split())
else:
    INSTALLED_SERIES = _series(jax_triton)
    if INSTALLED_SERIES not in JAX_TRITON_SERIES:
        # Another convention for aliased buffers; launching through it would
        # fail inside the lowering with an unrelated-looking error.
        JAX_TRITON_UNUSABLE = (
            f"jax-triton {jax_triton.__version__} is installed, but this backend is written "
            f"for jax-triton 0.3.x or 0.4.x: {INSTALL_HINT}"
        )
        INSTALLED_SERIES = None
    elif INSTALLED_SERIES == (0, 4):
        JAX_TRITON_UNUSABLE = _why_04_cannot_launch(jax_triton)
    if JAX_TRITON_UNUSABLE is not None:
        jax_triton = None

__all__ = [  # The kernel modules' shared parts; the ops import those modules, not this one.
    "EVICTION_POLICIES", "INSTALLED_SERIES", "INSTALL_HINT", "JAX_TRITON_SERIES",
    "JAX_TRITON_UNUSABLE", "LOAD_CACHE_MODIFIERS", "STORE_CACHE_MODIFIERS", "TRITON_TYPES",
    "TritonLaunch", "TritonTiling", "check_can_launch", "check_element_dtype", "check_entries",
    "check_installed", "check_tiling", "check_updates", "choose_tiling", "compile_for_target",
    "element_type", "grid", "launch", "plan_rows", "tile_entries", "tile_mask",
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
# Triton's name of each element type, as jax-triton 0.3.1 spells it when it
# types the kernel's pointer arguments (bool is i1: one byte per element).
TRITON_TYPES = {
    jnp.dtype(t): name
    for t, name in (
        (jnp.bool_, "i1"), (jnp.int8, "i8"), (jnp.uint8, "u8"), (jnp.int16, "i16"),
        (jnp.uint16, "u16"), (jnp.int32, "i32"), (jnp.uint32, "u32"), (jnp.int64, "i64"),
        (jnp.uint64, "u64"), (jnp.float16, "fp16"), (jnp.bfloat16, "bf16"),
        (jnp.float32, "fp32"), (jnp.float64, "fp64"),
    )
}


def element_type(dtype) -> tl.dtype:
    """Triton's element type for a dtype of :data:`TRITON_TYPES` (for in-kernel casts)."""
    dtype = jnp.dtype(dtype)
    return tl.int1 if dtype == jnp.bool_ else getattr(tl, dtype.name)


def check_element_dtype(dtype, what: str) -> None:
    if jnp.dtype(dtype) not in TRITON_TYPES:
        raise TypeError(
            f"the Triton kernels do not handle {what} of dtype {dtype}; supported: "
            + ", ".join(str(t) for t in TRITON_TYPES)
        )


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


def _next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


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
    block_cols = min(_next_pow2(d), max(1, max_col_block_bytes // itemsize))
    block_cols = max(block_cols, _next_pow2(_cdiv(d, MAX_COL_PROGRAMS)))
    rows_per_tile = max(1, tile_bytes // (block_cols * itemsize))
    block_rows = min(_next_pow2(max(n, 1)), _next_pow2(rows_per_tile))
    num_warps = min(8, _next_pow2(max(1, block_rows * block_cols * itemsize // 2048)))
    return TritonTiling(block_rows, block_cols, num_warps)


def choose_tiling(n: int, d: int, itemsize: int) -> TritonTiling:
    """Tile sizes for ``n`` entries of ``d`` elements, for every op.

    ``itemsize`` is the widest type the registers hold (for the add, the
    accumulator's when wider). About 16 KiB of host accesses per program
    keeps enough PCIe traffic in flight to cover its round-trip latency; a
    column block covers a row up to 4 KiB. Results never depend on the
    tiling; only speed does. Sizes: those of the Pallas kernels, a choice:
    the H200 tiling sweep found tile shape and warp count changing nothing
    beyond noise there, and the loop benchmark measured the scatter and the
    add within 5 % of Pallas for 64 Ki-row batches
    (benchmarks/results/loop_h200.json); the gather's speed against Pallas's
    has not been measured yet.
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


@triton.jit
def tile_entries(
    rows_ptr,
    partner_ptr,
    NUM_ENTRIES: tl.constexpr,
    NUM_ROWS: tl.constexpr,
    ROW_WIDTH: tl.constexpr,
    BLOCK_ROWS: tl.constexpr,
    BLOCK_COLS: tl.constexpr,
    HAS_PARTNER: tl.constexpr,
    CHECK_BOUNDS: tl.constexpr,
):
    """This program's entries: ``(entry_ok, rows, partner, row_ok, cols)``.

    ``entry_ok`` marks entries that exist, ``row_ok`` those that also (with
    ``CHECK_BOUNDS``) point inside the buffer; ``partner`` is
    ``partner_ptr[k]``, or ``k`` itself without ``HAS_PARTNER`` (the slot then
    holds a placeholder). Entries and rows are int64 from the start: batch
    sizes and element offsets (row times width) may pass 2**31.
    """
    k = tl.program_id(0).to(tl.int64) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    entry_ok = k < NUM_ENTRIES
    rows = tl.load(rows_ptr + k, mask=entry_ok, other=-1).to(tl.int64)
    if HAS_PARTNER:
        partner = tl.load(partner_ptr + k, mask=entry_ok, other=0).to(tl.int64)
    else:
        partner = k
    row_ok = entry_ok
    if CHECK_BOUNDS:
        row_ok = row_ok & (rows >= 0) & (rows < NUM_ROWS)
    cols = tl.program_id(1) * BLOCK_COLS + tl.arange(0, BLOCK_COLS)
    # Each program's columns start on a block boundary and run contiguously:
    # with the row stride's own alignment this lets accesses be 16-byte vectors.
    cols = tl.max_contiguous(tl.multiple_of(cols, BLOCK_COLS), BLOCK_COLS)
    return entry_ok, rows, partner, row_ok, cols


@triton.jit
def tile_mask(lane_ok, cols, ROW_WIDTH: tl.constexpr, BLOCK_COLS: tl.constexpr):
    """``lane_ok`` (per entry) crossed with the columns inside the row."""
    mask = tl.broadcast_to(lane_ok[:, None], (lane_ok.shape[0], BLOCK_COLS))
    if ROW_WIDTH % BLOCK_COLS != 0:  # Only the last column block has a tail.
        mask = mask & (cols < ROW_WIDTH)[None, :]
    return mask


@dataclasses.dataclass(frozen=True)
class TritonLaunch:
    """Everything static about one kernel launch.

    ``operand_dtypes`` are the array operands' dtypes in the kernel's order;
    the kernel's last pointer is the result: a fresh ``out_shape`` array, or,
    for an in-place op, the buffer operand ``aliased_operand`` (see
    :func:`launch` for how each jax-triton passes it). ``constexprs`` are the
    kernel's compile-time settings.
    """

    kernel: Any
    name: str
    operand_dtypes: tuple[jnp.dtype, ...]
    out_shape: tuple[int, ...]
    out_dtype: jnp.dtype
    aliased_operand: int | None
    tiling: TritonTiling
    grid: tuple[int, int]
    constexprs: Mapping[str, Any]


def plan_rows(
    kernel,
    op: str,
    x_shape: tuple[int, int],
    dtype,
    num_entries: int,
    *,
    rows_dtype,
    has_partner: bool,
    data_dtypes: tuple,
    in_place: bool,
    cache_modifiers: tuple[str, ...],
    tiling: TritonTiling | None,
    itemsize: int | None = None,
    **constexprs,
) -> TritonLaunch:
    """The launch of one row kernel, from shapes and dtypes alone.

    The kernel's operands are ``rows``, the partner (``src``/``dest``,
    int32, or ``rows`` again unread without one) and ``data_dtypes`` (the
    last is ``x``'s, aliased when ``in_place``); a fresh result is
    ``(num_entries, d)`` of ``dtype``. Every kernel takes ``NUM_ENTRIES``,
    ``NUM_ROWS``, ``ROW_WIDTH``, ``BLOCK_ROWS``, ``BLOCK_COLS``,
    ``HAS_PARTNER``, ``CACHE_MODIFIER`` and ``EVICTION_POLICY``, plus its own
    ``constexprs``. ``itemsize`` (default ``dtype``'s) sizes the default tiling.
    """
    num_rows, row_width = x_shape
    dtype = jnp.dtype(dtype)
    check_element_dtype(dtype, "x")
    if tiling is None:
        tiling = choose_tiling(num_entries, row_width, itemsize or dtype.itemsize)
    check_tiling(tiling, num_entries, row_width, cache_modifiers=cache_modifiers)
    rows_dtype = jnp.dtype(rows_dtype)
    # triton_call takes only arrays; without a partner, rows fills its slot unread.
    partner_dtype = jnp.dtype(jnp.int32) if has_partner else rows_dtype
    operand_dtypes = (rows_dtype, partner_dtype, *(jnp.dtype(t) for t in data_dtypes))
    return TritonLaunch(
        kernel=kernel,
        name=f"pallas_pinned_{op}_triton",
        operand_dtypes=operand_dtypes,
        out_shape=(num_rows if in_place else num_entries, row_width),
        out_dtype=dtype,
        aliased_operand=len(operand_dtypes) - 1 if in_place else None,
        tiling=tiling,
        # No buffer rows: every entry is out of range, nothing to launch.
        grid=grid(num_entries if num_rows else 0, row_width, tiling),
        constexprs=dict(
            NUM_ENTRIES=num_entries,
            NUM_ROWS=num_rows,
            ROW_WIDTH=row_width,
            BLOCK_ROWS=tiling.block_rows,
            BLOCK_COLS=tiling.block_cols,
            HAS_PARTNER=has_partner,
            CACHE_MODIFIER=tiling.cache_modifier,
            EVICTION_POLICY=tiling.eviction_policy,
            **constexprs,
        ),
    )


def check_installed() -> None:
    """Raises ImportError naming the extra when jax-triton is not installed.

    Op layers call it before any platform check: a missing extra comes first.
    """
    if _JAX_TRITON_MISSING is not None:
        raise ImportError(str(_JAX_TRITON_MISSING)) from _JAX_TRITON_MISSING


def check_can_launch() -> None:
    """ImportError without jax-triton; NotImplementedError where it cannot launch.

    (A jaxlib without CUDA, a jax-triton release other than 0.3 or 0.4, or a
    jax that jax-triton does not fit.)
    """
    check_installed()
    if jax_triton is None:
        raise NotImplementedError(
            f"jax-triton cannot launch kernels in this installation (it needs a jaxlib with "
            f"CUDA support and jax-triton 0.3 or 0.4): {JAX_TRITON_UNUSABLE}"
        )


def _pointer_dtypes(plan: TritonLaunch, series: tuple[int, int]) -> tuple[jnp.dtype, ...]:
    """The kernel's pointer types as jax-triton ``series`` passes them (see :func:`launch`)."""
    dtypes = list(plan.operand_dtypes)
    if series >= (0, 4) and plan.aliased_operand is not None:
        dtypes[plan.aliased_operand] = dtypes[0]  # The placeholder: the first operand again.
    return (*dtypes, plan.out_dtype)


def launch(plan: TritonLaunch, *operands: jax.Array | None) -> jax.Array:
    """Calls ``plan``'s kernel on ``operands`` through ``jax_triton.triton_call``.

    Meant to be traced inside a CUDA ``jit``. A ``None`` operand (no
    partner) is filled with the first operand, which the kernel then does not
    read. Every operand keeps its own memory space, and the kernel gets its
    raw pointer: an aliased operand in ``pinned_host`` memory is written over
    PCIe in place (donate it, or XLA copies it first). jax-triton 0.3 gets
    the aliased buffer as an operand and, through ``input_output_aliases``,
    as the output; 0.4 gets it once, as a ``jax.new_ref`` in the output's
    slot, with the first operand as a placeholder in its operand slot, and
    the result is the Ref's value after the call. Either way (as with
    ``pallas_call``) the result is declared in device memory; for an
    aliased host buffer the caller ``device_put``s it to
    ``jax.memory.Space.Host``, which XLA then keeps in place. An empty grid
    or buffer launches nothing (CUDA refuses empty grids): the aliased
    buffer comes back as it was, a fresh output as zeros.
    """
    check_can_launch()
    operands = tuple(operands[0] if a is None else a for a in operands)
    dtypes = tuple(jnp.dtype(a.dtype) for a in operands)
    if dtypes != plan.operand_dtypes:
        # The plan is what compile_for_target compiles; launching other types
        # would run a kernel the PTX tests never saw.
        raise TypeError(f"{plan.name}: operands {dtypes} are not {plan.operand_dtypes}")
    aliased = plan.aliased_operand
    if 0 in plan.grid:
        if aliased is not None:
            return operands[aliased]
        return jnp.zeros(plan.out_shape, plan.out_dtype)
    settings = dict(
        kernel=plan.kernel,
        grid=plan.grid,
        name=plan.name,
        num_warps=plan.tiling.num_warps,
        num_stages=1,  # No loop to pipeline.
        **plan.constexprs,
    )
    out = jax.ShapeDtypeStruct(plan.out_shape, plan.out_dtype)
    if INSTALLED_SERIES == (0, 3):
        aliases = None if aliased is None else {aliased: 0}
        return jax_triton.triton_call(
            *operands, out_shape=out, input_output_aliases=aliases, **settings
        )
    if aliased is None:
        return jax_triton.triton_call(*operands, out_type=out, **settings)
    buffer = jax.new_ref(operands[aliased])
    placed = operands[:aliased] + (operands[0],) + operands[aliased + 1 :]
    jax_triton.triton_call(*placed, buffer, out_type=(), **settings)
    return buffer[...]


def compile_for_target(
    plan: TritonLaunch, *, capability: int = 90, series: tuple[int, int] | None = None
):
    """Compiles ``plan``'s kernel ahead of time for an NVIDIA target; no GPU needed.

    Same signature, 16-byte pointer alignment and compile-time settings as
    :func:`launch` hands jax-triton ``series`` (default: the installed one's,
    else 0.3), so what compiles here compiles there. Returns Triton's
    compiled kernel (``asm["ttir"]``, ``["ptx"]``, ``["cubin"]``), for tests
    and for reading the accesses it emits; compiled once per distinct plan.
    """
    series = series or INSTALLED_SERIES or JAX_TRITON_SERIES[0]
    if series not in JAX_TRITON_SERIES:
        raise ValueError(f"series must be one of {JAX_TRITON_SERIES}, got {series}")
    pointer_dtypes = _pointer_dtypes(plan, series)
    names = plan.kernel.arg_names
    settings = names[len(pointer_dtypes) :]
    if set(settings) != set(plan.constexprs):
        raise ValueError(
            f"{plan.name}: the kernel's parameters {names} do not match {len(pointer_dtypes)} "
            f"pointers and the settings {sorted(plan.constexprs)}"
        )
    return _compile(
        plan.kernel, pointer_dtypes, tuple(sorted(plan.constexprs.items())),
        plan.tiling.num_warps, capability,
    )


@functools.lru_cache(maxsize=256)
def _compile(kernel, pointer_dtypes, constexprs, num_warps: int, capability: int):
    pointers = zip(kernel.arg_names, pointer_dtypes, strict=False)  # Then the settings.
    signature = {name: "*" + TRITON_TYPES[t] for name, t in pointers}
    signature.update({name: "constexpr" for name, _ in constexprs})
    # jax-triton promises Triton every array is 16-byte aligned.
    attrs = {(i,): [["tt.divisibility", 16]] for i in range(len(pointer_dtypes))}
    source = triton.compiler.ASTSource(
        fn=kernel, signature=signature, constexprs=dict(constexprs), attrs=attrs
    )
    # jax-triton blanks TRITON_CACHE_DIR on import, which stops triton.compile;
    # a throw-away cache keeps the user's cache out of it as well.
    with tempfile.TemporaryDirectory() as cache_dir, triton.knobs.cache.scope():
        triton.knobs.cache.dir = cache_dir
        return triton.compile(
            source,
            target=GPUTarget("cuda", capability, 32),
            # jax-triton 0.3.1 asks for FP fusion; 0.4 takes triton's default,
            # fusion on up to triton 3.9 (the kernels have no multiply-add anyway).
            options={"num_warps": num_warps, "num_stages": 1, "enable_fp_fusion": True},
        )
