"""What the raw Triton kernels (launched through jax-triton) share.

The Triton backend sits beside the Pallas one with the same contracts (upstream
deprecated Pallas's Triton backend, and Mosaic GPU has no host memory space):
:mod:`scatter_triton` and :mod:`gather_triton` hold the kernels (the add of
:mod:`scatter_add_triton` is the scatter kernel with ``ADD``), each op module
its plan and public function. Written once here: the import guard (without
triton, importing a kernel module raises an ImportError naming the extra;
without jax-triton kernels still compile and launching raises it; where
jax-triton cannot launch, NotImplementedError: :func:`check_can_launch`); the
tiling and checks of :mod:`triton_tiling`, re-exported; the in-kernel
:func:`tile_entries` and :func:`tile_mask`; :func:`plan_rows`, an op's shapes
and dtypes made a :class:`TritonLaunch`, which :func:`launch` hands to
``triton_call`` and :func:`triton_aot.compile_for_target` compiles ahead of
time (so the PTX the tests read is the launched kernel's).

Every kernel sees a ``(num_rows, d)`` buffer ``x`` and ``n`` entries, entry
``k`` pairing buffer row ``rows[k]`` with row ``partner[k]`` of the other side
(the update row, or the gather's output row), on the grid
``(cdiv(n, block_rows), cdiv(d, block_cols))`` (CUDA's ``x`` axis, then ``y``).

Two jax-triton conventions, one kernel for both: a kernel's pointers are its
operands' and then the result's, for an in-place op the buffer ``x`` itself.
jax-triton 0.3 passes ``x`` twice (as the aliased operand, which the kernel
ignores, and as the output: the same memory); 0.4 passes it once, a
``jax.new_ref`` in the result's slot, with a placeholder in the operand slot.
Either way the result is declared in device memory; callers ``device_put`` it
to the host space (:func:`launch`).

Install with ``pip install -e ".[triton]"`` (jax-triton 0.3.1, triton
3.6). Combinations, and where they were tested:

* jax-triton 0.3.1 + triton 3.6.0, jax 0.11.2: launched on a GPU (docs/GPU_RUNS.md).
* jax-triton 0.3.1 + triton 3.6.0, jax 0.12.0.1 and 0.12.1, CPU (CI): 0.3.1 does not
  import without CUDA; the kernels compile for sm_90 (both signatures) and
  the launch lowers for CUDA with a stand-in for jaxlib's CUDA Triton plugin,
  jax-triton compiling the very PTX of :func:`triton_aot.compile_for_target`.
* jax-triton 0.4.1 + triton 3.9.0 (0.4 needs triton >= 3.7), jax 0.12.0.1 and
  0.12.1, CPU (``dev.sh test``'s ``.venv-jt04``, same tests): imports, compiles,
  its launch lowers the same way, but with jax 0.12 it cannot launch: 0.4.1's
  dead-code rule takes the old arguments, so ``jit`` fails to lower it
  (``keep_unused=True`` aside);
  :func:`check_can_launch` refuses it (:data:`JAX_TRITON_UNUSABLE`).
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp

from .triton_tiling import (  # Re-exported: the kernel modules import them from here.
    EVICTION_POLICIES,
    LOAD_CACHE_MODIFIERS,
    STORE_CACHE_MODIFIERS,
    TritonTiling,
    check_entries,
    check_tiling,
    check_updates,
    choose_tiling,
    grid,
    tiling_for_tile_bytes,
)

INSTALL_HINT = 'pip install -e ".[triton]"'
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
except ImportError as err:
    raise _not_installed(err) from err


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
# needs jax-triton: triton_aot compiles with triton alone (PTX tests on CPU).
JAX_TRITON_UNUSABLE: str | None = None
_JAX_TRITON_MISSING: ImportError | None = None
# The installed jax-triton's series, launchable or not (triton_aot's default).
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
    INSTALLED_SERIES = tuple(jax_triton.__version_info__[:2])
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
    "check_installed", "check_tiling", "check_updates", "choose_tiling", "element_type",
    "grid", "launch", "plan_rows", "pointer_dtypes", "tile_entries", "tile_mask",
    "tiling_for_tile_bytes",
]

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


@triton.jit
def tile_entries(
    rows_ptr, partner_ptr, NUM_ENTRIES: tl.constexpr, NUM_ROWS: tl.constexpr,
    ROW_WIDTH: tl.constexpr, BLOCK_ROWS: tl.constexpr, BLOCK_COLS: tl.constexpr,
    HAS_PARTNER: tl.constexpr, CHECK_BOUNDS: tl.constexpr,
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
    kernel, op: str, x_shape: tuple[int, int], dtype, num_entries: int, *, rows_dtype,
    has_partner: bool, data_dtypes: tuple, in_place: bool, cache_modifiers: tuple[str, ...],
    tiling: TritonTiling | None, itemsize: int | None = None, **constexprs,
) -> TritonLaunch:
    """The launch of one row kernel, from shapes and dtypes alone.

    The kernel's operands are ``rows``, the partner (``src``/``dest``,
    int32, or ``rows`` again unread without one) and ``data_dtypes`` (the
    last is ``x``'s, aliased when ``in_place``); a fresh result is
    ``(num_entries, d)`` of ``dtype``. Every kernel takes ``NUM_ENTRIES``,
    ``NUM_ROWS``, ``ROW_WIDTH``, ``BLOCK_ROWS``, ``BLOCK_COLS``,
    ``HAS_PARTNER``, ``CACHE_MODIFIER``, ``EVICTION_POLICY`` and ``AS_BYTES``
    (a bool buffer, which jax-triton types ``*i1``, moves as raw bytes), plus
    its own ``constexprs``. ``itemsize`` (default ``dtype``'s) sizes the
    default tiling. Each op's ``plan_*`` is this for its kernel:
    ``triton_aot.compile_for_target(plan)`` compiles exactly what the op launches.
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
            NUM_ENTRIES=num_entries, NUM_ROWS=num_rows, ROW_WIDTH=row_width,
            BLOCK_ROWS=tiling.block_rows, BLOCK_COLS=tiling.block_cols, HAS_PARTNER=has_partner,
            CACHE_MODIFIER=tiling.cache_modifier, EVICTION_POLICY=tiling.eviction_policy,
            **constexprs, AS_BYTES=dtype == jnp.bool_,
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

    (A jaxlib without CUDA, a jax-triton other than 0.3 or 0.4, or one that
    does not fit this jax.)
    """
    check_installed()
    if jax_triton is None:
        raise NotImplementedError(
            f"jax-triton cannot launch kernels in this installation (it needs a jaxlib with "
            f"CUDA support and jax-triton 0.3 or 0.4): {JAX_TRITON_UNUSABLE}"
        )


def pointer_dtypes(plan: TritonLaunch, series: tuple[int, int]) -> tuple[jnp.dtype, ...]:
    """The kernel's pointer types as jax-triton ``series`` passes them (see :func:`launch`)."""
    dtypes = list(plan.operand_dtypes)
    if series >= (0, 4) and plan.aliased_operand is not None:
        dtypes[plan.aliased_operand] = dtypes[0]  # The placeholder: the first operand again.
    return (*dtypes, plan.out_dtype)


def launch(plan: TritonLaunch, *operands: jax.Array | None) -> jax.Array:
    """Calls ``plan``'s kernel on ``operands`` through ``jax_triton.triton_call``.

    Meant to be traced inside a CUDA ``jit``. A ``None`` operand (no partner)
    is filled with the first, unread. Each operand keeps its memory space and
    the kernel gets its raw pointer: an aliased ``pinned_host`` buffer is
    written over PCIe in place (donate it, or XLA copies it first). jax-triton
    0.3 gets it as an operand and, through ``input_output_aliases``, as the
    output; 0.4 once, as a ``jax.new_ref`` in the output's slot (the first
    operand stands in its operand slot), the result being the Ref's value
    after the call. Either way (as with ``pallas_call``) the result is
    declared in device memory: callers ``device_put`` an aliased host buffer
    to ``jax.memory.Space.Host``, which XLA keeps in place. An empty grid or
    buffer launches nothing: the aliased buffer comes back, or zeros.
    """
    check_can_launch()
    operands = tuple(operands[0] if a is None else a for a in operands)
    dtypes = tuple(jnp.dtype(a.dtype) for a in operands)
    if dtypes != plan.operand_dtypes:
        # The plan is what triton_aot compiles; launching other types
        # would run a kernel the PTX tests never saw.
        raise TypeError(f"{plan.name}: operands {dtypes} are not {plan.operand_dtypes}")
    aliased = plan.aliased_operand
    if 0 in plan.grid:
        if aliased is not None:
            return operands[aliased]
        return jnp.zeros(plan.out_shape, plan.out_dtype)
    settings = dict(  # num_stages=1: no loop to pipeline.
        kernel=plan.kernel, grid=plan.grid, name=plan.name, num_warps=plan.tiling.num_warps,
        num_stages=1, **plan.constexprs,
    )
    out = jax.ShapeDtypeStruct(plan.out_shape, plan.out_dtype)
    if INSTALLED_SERIES == (0, 3):
        aliases = None if aliased is None else {aliased: 0}
        return jax_triton.triton_call(*operands, out_shape=out, input_output_aliases=aliases,
                                      **settings)
    if aliased is None:
        return jax_triton.triton_call(*operands, out_type=out, **settings)
    buffer = jax.new_ref(operands[aliased])
    placed = operands[:aliased] + (operands[0],) + operands[aliased + 1 :]
    jax_triton.triton_call(*placed, buffer, out_type=(), **settings)
    return buffer[...]

