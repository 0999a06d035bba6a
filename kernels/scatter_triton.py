"""Raw Triton kernel, launched through jax-triton, that writes rows into a buffer in place.

A second backend beside :mod:`scatter_pallas`, with exactly the same contract
(see :func:`scatter_rows_triton`). Upstream deprecated Pallas's Triton backend
and Mosaic GPU has no host memory space; a plain ``@triton.jit`` kernel called
with ``jax_triton.triton_call`` keeps the op alive and gives direct control of
the stores: vector width, cache modifier and eviction policy.

The buffer ``x`` is an operand of the custom call aliased to its only output
(``input_output_aliases``), so the kernel receives the buffer's own pointer:
when ``x`` lives in ``pinned_host`` memory every store is a PCIe write straight
into host memory and the buffer is never copied.

Data layout seen by the kernel (all prepared on the device by the caller):

* ``rows``  ``(n,)`` int32 or int64: destination row of each update, in the
  order the kernel should write them. Rows outside ``[0, num_rows)`` are
  skipped unless ``check_bounds=False``.
* ``src``   ``(n,)`` int32, optional: which row of ``updates`` goes to
  ``rows[k]``; ``None`` means ``k`` itself.
* ``updates`` ``(m, d)``: update rows in device memory.
* ``x``     ``(num_rows, d)``: the buffer, any memory space.

The grid is ``(cdiv(n, block_rows), cdiv(d, block_cols))``; program ``(i, j)``
writes the ``block_rows x block_cols`` tile of update rows ``i*block_rows...``
and columns ``j*block_cols...``. Axis 0 is CUDA's ``x`` axis (up to 2**31 - 1
programs, so any count of updates fits); the column axis is CUDA's ``y`` axis,
limited to 65535 programs, which the tiling heuristic respects by widening
the column block for absurdly wide rows.

Install with ``pip install "pallas-pinned[triton]"`` (jax-triton 0.3.1 with
triton 3.6.0; jax-triton 0.4 needs triton >= 3.7).
"""

from __future__ import annotations

import dataclasses
import tempfile

import jax
import jax.numpy as jnp

try:
    import triton
    import triton.language as tl
    from triton.backends.compiler import GPUTarget
except ImportError as err:
    raise ImportError(
        "pallas_pinned.kernels.scatter_triton needs triton and jax-triton, which are "
        f'optional: pip install "pallas-pinned[triton]" ({err})'
    ) from err

try:
    import jax_triton
except ModuleNotFoundError as err:  # Not installed, or a dependency of it missing.
    raise ImportError(
        "pallas_pinned.kernels.scatter_triton needs triton and jax-triton, which are "
        f'optional: pip install "pallas-pinned[triton]" ({err})'
    ) from err
except ImportError as err:
    # Installed, but refuses a jaxlib without GPU support. The kernel still
    # compiles ahead of time (compile_for_target); only launching needs it.
    jax_triton = None
    _JAX_TRITON_UNUSABLE = str(err).splitlines()[0]

__all__ = [
    "CACHE_MODIFIERS",
    "EVICTION_POLICIES",
    "TRITON_TYPES",
    "TritonTiling",
    "choose_triton_tiling",
    "compile_for_target",
    "scatter_rows_triton",
    "scatter_rows_triton_kernel",
]

# Store cache modifiers and eviction policies Triton 3.6 accepts; "" is the
# compiler's default. Which one helps PCIe writes to pinned memory is an open
# measurement, so they are settings of the tiling.
CACHE_MODIFIERS = ("", ".wb", ".cg", ".cs", ".wt")
EVICTION_POLICIES = ("", "evict_first", "evict_last")

# A tile moves about this many bytes: enough independent stores per program
# to keep PCIe writes in flight, small enough to keep registers in check.
_TILE_BYTES = 16 * 1024
# Widest column block, in bytes, unless the grid limit forces wider.
_MAX_COL_BLOCK_BYTES = 4096
# CUDA grid limits: blockIdx.x up to 2**31 - 1, blockIdx.y up to 65535.
_MAX_ROW_PROGRAMS = 2**31 - 1
_MAX_COL_PROGRAMS = 65535
# Triton refuses tensors of more elements than this.
_MAX_TILE_ELEMS = 1 << 20
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
_INDEX_DTYPES = (jnp.dtype(jnp.int32), jnp.dtype(jnp.int64))
_NAME = "pallas_pinned_scatter_rows_triton"


@dataclasses.dataclass(frozen=True)
class TritonTiling:
    """Static launch settings of the Triton scatter kernel.

    ``block_rows`` and ``block_cols`` are powers of two; ``cache_modifier``
    or ``eviction_policy`` (at most one: PTX cannot combine them) goes to the
    host stores (see :data:`CACHE_MODIFIERS`, :data:`EVICTION_POLICIES`).
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


def choose_triton_tiling(n: int, d: int, itemsize: int) -> TritonTiling:
    """Picks power-of-two tile sizes for ``n`` update rows of ``d`` elements.

    The column block covers a whole row up to 4 KiB (wider rows take several
    programs along grid axis 1), then rows fill the tile up to 16 KiB. Results
    never depend on the tiling; only speed does. Placeholder sizes until
    measured on the H200.
    """
    d = max(d, 1)
    block_cols = min(_next_pow2(d), max(1, _MAX_COL_BLOCK_BYTES // itemsize))
    # Rows wider than 65535 column blocks need wider blocks to fit the grid.
    block_cols = max(block_cols, _next_pow2(_cdiv(d, _MAX_COL_PROGRAMS)))
    rows_per_tile = max(1, _TILE_BYTES // (block_cols * itemsize))
    block_rows = min(_next_pow2(max(n, 1)), _next_pow2(rows_per_tile))
    # One warp per 2 KiB of tile (8 x 16-byte stores per thread at most),
    # between 1 and 8: tiny tiles do not pay for idle warps.
    tile_bytes = block_rows * block_cols * itemsize
    num_warps = min(8, _next_pow2(max(1, tile_bytes // 2048)))
    return TritonTiling(block_rows, block_cols, num_warps)


@triton.jit
def scatter_rows_triton_kernel(
    rows_ptr,
    src_ptr,
    updates_ptr,
    x_in_ptr,
    x_out_ptr,
    NUM_UPDATES: tl.constexpr,
    NUM_ROWS: tl.constexpr,
    ROW_WIDTH: tl.constexpr,
    BLOCK_ROWS: tl.constexpr,
    BLOCK_COLS: tl.constexpr,
    HAS_SRC: tl.constexpr,
    CHECK_BOUNDS: tl.constexpr,
    AS_BYTES: tl.constexpr,
    CACHE_MODIFIER: tl.constexpr,
    EVICTION_POLICY: tl.constexpr,
):
    """Writes one ``BLOCK_ROWS x BLOCK_COLS`` tile: ``x[rows[k]] = updates[src[k]]``.

    ``x_in_ptr`` is the same buffer as ``x_out_ptr`` (aliased) and unused.
    Without ``HAS_SRC`` the ``src_ptr`` slot holds a placeholder and is
    ignored. ``AS_BYTES`` (bool buffers, which jax-triton types ``*i1``)
    copies raw bytes: through an ``i1`` pointer Triton loads a byte, compares
    it with zero and widens it back before every store (twice the PTX).
    """
    # 64-bit from the start: update counts and element offsets may pass 2**31.
    k = tl.program_id(0).to(tl.int64) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    k_ok = k < NUM_UPDATES
    rows = tl.load(rows_ptr + k, mask=k_ok).to(tl.int64)
    if HAS_SRC:
        src = tl.load(src_ptr + k, mask=k_ok).to(tl.int64)
    else:
        src = k
    row_ok = k_ok
    if CHECK_BOUNDS:
        row_ok = row_ok & (rows >= 0) & (rows < NUM_ROWS)
    cols = tl.program_id(1) * BLOCK_COLS + tl.arange(0, BLOCK_COLS)
    # Each program's columns start on a block boundary and run contiguously:
    # with the row stride's own alignment this lets stores be 16-byte vectors.
    cols = tl.max_contiguous(tl.multiple_of(cols, BLOCK_COLS), BLOCK_COLS)
    mask = tl.broadcast_to(row_ok[:, None], (BLOCK_ROWS, BLOCK_COLS))
    if ROW_WIDTH % BLOCK_COLS != 0:
        mask = mask & (cols < ROW_WIDTH)[None, :]
    # Row index times stride in int64 (both operands already are), always.
    dst_offsets = rows[:, None] * ROW_WIDTH + cols[None, :]
    src_offsets = src[:, None] * ROW_WIDTH + cols[None, :]
    if AS_BYTES:
        updates_ptr = updates_ptr.to(tl.pointer_type(tl.uint8), bitcast=True)
        x_out_ptr = x_out_ptr.to(tl.pointer_type(tl.uint8), bitcast=True)
    # Masked lanes neither load nor store, so their values never matter.
    values = tl.load(updates_ptr + src_offsets, mask=mask)
    tl.store(
        x_out_ptr + dst_offsets,
        values,
        mask=mask,
        cache_modifier=CACHE_MODIFIER,
        eviction_policy=EVICTION_POLICY,
    )


def _check_tiling(tiling: TritonTiling, n: int, d: int) -> None:
    for field in ("block_rows", "block_cols"):
        value = getattr(tiling, field)
        if not isinstance(value, int) or value < 1 or value & (value - 1):
            raise ValueError(f"{field} must be a positive power of two, got {value!r}")
    if tiling.num_warps not in (1, 2, 4, 8, 16, 32):
        raise ValueError(f"num_warps must be a power of two in [1, 32], got {tiling.num_warps!r}")
    if tiling.block_rows * tiling.block_cols > _MAX_TILE_ELEMS:
        raise ValueError(
            f"tile {tiling.block_rows}x{tiling.block_cols} has more than {_MAX_TILE_ELEMS} "
            "elements, Triton's limit"
        )
    if tiling.cache_modifier not in CACHE_MODIFIERS:
        raise ValueError(
            f"unknown cache_modifier {tiling.cache_modifier!r}; expected one of {CACHE_MODIFIERS}"
        )
    if tiling.eviction_policy not in EVICTION_POLICIES:
        raise ValueError(
            f"unknown eviction_policy {tiling.eviction_policy!r}; "
            f"expected one of {EVICTION_POLICIES}"
        )
    if tiling.cache_modifier and tiling.eviction_policy:
        # PTX has one store form with a cache operator and another with an
        # eviction priority; ptxas rejects both on one instruction.
        raise ValueError(
            f"cache_modifier {tiling.cache_modifier!r} and eviction_policy "
            f"{tiling.eviction_policy!r} cannot be combined; set at most one"
        )
    row_programs, col_programs = _grid(n, d, tiling)
    if row_programs > _MAX_ROW_PROGRAMS or col_programs > _MAX_COL_PROGRAMS:
        raise ValueError(
            f"grid {(row_programs, col_programs)} for {n} rows of {d} elements exceeds CUDA's "
            f"limits {(_MAX_ROW_PROGRAMS, _MAX_COL_PROGRAMS)}; use larger blocks"
        )


def _check_operands(x, rows, src, updates) -> None:
    if x.ndim != 2:
        raise ValueError(f"x must be 2-D (num_rows, d), got shape {x.shape}")
    if rows.ndim != 1 or jnp.dtype(rows.dtype) not in _INDEX_DTYPES:
        raise TypeError(f"rows must be 1-D int32 or int64, got {rows.dtype}{rows.shape}")
    if src is not None and (src.shape != rows.shape or jnp.dtype(src.dtype) != jnp.int32):
        raise TypeError(
            f"src must be None or int32 of rows' shape {rows.shape}, got {src.dtype}{src.shape}"
        )
    if updates.ndim != 2 or updates.shape[1] != x.shape[1] or updates.dtype != x.dtype:
        raise ValueError(
            f"updates must be (m, {x.shape[1]}) {x.dtype} like x's rows, "
            f"got {updates.dtype}{updates.shape}"
        )
    if src is None and updates.shape[0] < rows.shape[0]:
        raise ValueError(
            f"without src, updates needs at least {rows.shape[0]} rows, got {updates.shape[0]}"
        )
    if jnp.dtype(x.dtype) not in TRITON_TYPES:
        raise TypeError(
            f"the Triton kernel does not store dtype {x.dtype}; supported: "
            + ", ".join(str(t) for t in TRITON_TYPES)
        )


def _grid(n: int, d: int, tiling: TritonTiling) -> tuple[int, int]:
    return _cdiv(n, tiling.block_rows), _cdiv(d, tiling.block_cols)


def _kernel_constexprs(
    num_updates: int,
    num_rows: int,
    row_width: int,
    dtype,
    *,
    has_src: bool,
    check_bounds: bool,
    tiling: TritonTiling,
) -> dict:
    """The compile-time settings, shared by the launcher and :func:`compile_for_target`."""
    return dict(
        NUM_UPDATES=num_updates,
        NUM_ROWS=num_rows,
        ROW_WIDTH=row_width,
        BLOCK_ROWS=tiling.block_rows,
        BLOCK_COLS=tiling.block_cols,
        HAS_SRC=has_src,
        CHECK_BOUNDS=check_bounds,
        AS_BYTES=jnp.dtype(dtype) == jnp.bool_,
        CACHE_MODIFIER=tiling.cache_modifier,
        EVICTION_POLICY=tiling.eviction_policy,
    )


def scatter_rows_triton(
    x: jax.Array,
    rows: jax.Array,
    src: jax.Array | None,
    updates: jax.Array,
    *,
    check_bounds: bool = True,
    tiling: TritonTiling | None = None,
) -> jax.Array:
    """Launches the Triton scatter kernel: ``x[rows[k]] = updates[src[k]]``.

    Same contract as :func:`pallas_pinned.kernels.scatter_pallas.scatter_rows`:
    ``x`` is 2-D ``(num_rows, d)``, ``rows`` ``(n,)`` int32/int64 already
    normalized and de-duplicated (skip markers negative or past the end),
    ``src`` ``(n,)`` int32 or ``None``, ``updates`` ``(m, d)`` of ``x``'s
    dtype. With ``check_bounds`` rows outside ``[0, num_rows)`` are skipped;
    without it the caller promises there are none. Meant to be traced inside
    a CUDA ``jit``: the result aliases ``x`` (donate it, or XLA copies it
    first). Like ``pallas_call``, the result is declared in device memory; for
    a host ``x`` the caller ``device_put``s it to ``jax.memory.Space.Host``.

    Raises:
      TypeError, ValueError: for operands or a tiling the kernel cannot take.
      NotImplementedError: where jax-triton cannot launch (a jaxlib without CUDA).
    """
    _check_operands(x, rows, src, updates)
    num_rows, row_width = x.shape
    (num_updates,) = rows.shape
    if tiling is None:
        tiling = choose_triton_tiling(num_updates, row_width, x.dtype.itemsize)
    _check_tiling(tiling, num_updates, row_width)
    if jax_triton is None:
        raise NotImplementedError(
            "jax-triton cannot launch kernels in this installation (it needs a jaxlib with "
            f"CUDA support): {_JAX_TRITON_UNUSABLE}"
        )
    if num_updates == 0 or x.size == 0:
        return x  # CUDA refuses empty grids, and there is nothing to write.
    constexprs = _kernel_constexprs(
        num_updates, num_rows, row_width, x.dtype,
        has_src=src is not None, check_bounds=check_bounds, tiling=tiling,
    )
    # triton_call takes only arrays; without src, rows fills its slot unread.
    src_or_placeholder = rows if src is None else src
    return jax_triton.triton_call(
        rows,
        src_or_placeholder,
        updates,
        x,
        kernel=scatter_rows_triton_kernel,
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        grid=_grid(num_updates, row_width, tiling),
        name=_NAME,
        num_warps=tiling.num_warps,
        num_stages=1,  # No loop to pipeline.
        input_output_aliases={3: 0},
        **constexprs,
    )


def _pointer_type(dtype) -> str:
    return "*" + TRITON_TYPES[jnp.dtype(dtype)]


def compile_for_target(
    x_shape: tuple[int, int],
    dtype,
    num_updates: int,
    *,
    rows_dtype=jnp.int32,
    has_src: bool = True,
    check_bounds: bool = True,
    tiling: TritonTiling | None = None,
    capability: int = 90,
):
    """Compiles the kernel ahead of time for an NVIDIA target; no GPU needed.

    Uses the signature, 16-byte pointer alignment and compile-time settings
    that :func:`scatter_rows_triton` hands jax-triton, so a kernel that
    compiles here compiles there. Returns Triton's compiled kernel; its
    ``asm["ptx"]`` is the PTX text. Meant for tests and for reading the
    stores the compiler emits.
    """
    num_rows, row_width = x_shape
    itemsize = jnp.dtype(dtype).itemsize
    if tiling is None:
        tiling = choose_triton_tiling(num_updates, row_width, itemsize)
    _check_tiling(tiling, num_updates, row_width)
    pointer_dtypes = (rows_dtype, jnp.int32 if has_src else rows_dtype, dtype, dtype, dtype)
    names = scatter_rows_triton_kernel.arg_names
    signature = {name: _pointer_type(t) for name, t in zip(names, pointer_dtypes, strict=False)}
    constexprs = _kernel_constexprs(
        num_updates, num_rows, row_width, dtype,
        has_src=has_src, check_bounds=check_bounds, tiling=tiling,
    )
    signature.update({name: "constexpr" for name in constexprs})
    # jax-triton promises Triton every array is 16-byte aligned.
    attrs = {(i,): [["tt.divisibility", 16]] for i in range(len(pointer_dtypes))}
    source = triton.compiler.ASTSource(
        fn=scatter_rows_triton_kernel, signature=signature, constexprs=constexprs, attrs=attrs
    )
    # jax-triton blanks TRITON_CACHE_DIR on import, which stops triton.compile;
    # a throw-away cache keeps the user's cache out of it as well.
    with tempfile.TemporaryDirectory() as cache_dir, triton.knobs.cache.scope():
        triton.knobs.cache.dir = cache_dir
        return triton.compile(
            source,
            target=GPUTarget("cuda", capability, 32),
            options={"num_warps": tiling.num_warps, "num_stages": 1},
        )
