"""The raw Triton kernels compiled ahead of time for sm_90, and their plans; CPU only.

Needs only ``triton`` (skipped only when ``import triton`` fails; any other
failure fails): each kernel compiled with the accesses we expect (16-byte
vectors, cache operators, 64-bit addresses, every access masked, which
parameters are loaded from and stored to), in the pointer signature of each
jax-triton series; the tiling heuristic within Triton's and CUDA's limits;
bad settings and operands raise before anything compiles. Compiled kernels
are cached per plan (``triton_aot.compile_for_target``), so cases that
share a plan compile once.
"""

from __future__ import annotations

import collections
import dataclasses
import re

import jax.numpy as jnp
import pytest

from tests.helpers import no_triton

_NO_TRITON = no_triton()
if _NO_TRITON is None:
    from pallas_pinned.kernels import gather_triton as gt
    from pallas_pinned.kernels import scatter_add_triton as at
    from pallas_pinned.kernels import scatter_triton as st
    from pallas_pinned.kernels import triton_aot
    from pallas_pinned.kernels import triton_common as tc

pytestmark = pytest.mark.skipif(_NO_TRITON is not None, reason=_NO_TRITON or "")


def _accesses(ptx: str) -> collections.Counter:
    """Global loads and stores of a PTX text, by instruction, predicated or not."""
    found = collections.Counter()
    for line in ptx.splitlines():
        words = [w for w in line.split() if not w.startswith("@")]
        if words and words[0].startswith(("ld.global", "st.global")):
            found[words[0]] += 1
    return found


def _unpredicated_accesses(ptx: str) -> list[str]:
    return [
        line.strip()
        for line in ptx.splitlines()
        if re.match(r"\s*(ld|st)\.global", line)  # No "@%p" guard in front.
    ]


_PLANS = {"scatter": "plan_scatter_rows", "gather": "plan_gather_rows",
          "add": "plan_scatter_add_rows"}


def _plan(op: str, shape, dtype, n, **options):
    module = {"scatter": st, "gather": gt, "add": at}[op]
    if "store" in options:  # The default tiling with one cache setting changed.
        default = tc.choose_tiling(n, shape[1], jnp.dtype(dtype).itemsize)
        options["tiling"] = dataclasses.replace(default, **options.pop("store"))
    return getattr(module, _PLANS[op])(shape, dtype, n, **options)


def _compile(op: str, shape, dtype, n, *, series=(0, 3), **options):
    return triton_aot.compile_for_target(_plan(op, shape, dtype, n, **dict(options)), series=series)


@pytest.mark.parametrize(
    "op, shape, dtype, n, options, host_access",
    [
        # 512-byte rows: whole rows per program, 16-byte vector stores.
        ("scatter", (1000, 128), "float32", 300, {}, "st.global.v4.b32"),
        # 400-byte rows are 16-byte aligned too, even with a masked column tail.
        ("scatter", (1000, 100), "float32", 37, {}, "st.global.v4.b32"),
        # Bool goes through a byte view: 64-byte rows, still 16-byte vectors.
        ("scatter", (1000, 64), "bool", 300, {}, "st.global.v4.b32"),
        # 6-byte rows cannot vectorize; int64 rows and no src permutation.
        ("scatter", (1000, 3), "bfloat16", 5, dict(rows_dtype=jnp.int64, has_src=False),
         "st.global.b16"),
        ("scatter", (1000, 128), "float32", 300, dict(store=dict(cache_modifier=".cs")),
         "st.global.cs.v4.b32"),
        ("scatter", (1000, 128), "float32", 300, dict(store=dict(eviction_policy="evict_first")),
         "st.global.L1::evict_first.L2::cache_hint.v4.b32"),
        # float64 without bounds checks: two 8-byte lanes per store.
        ("scatter", (1000, 128), "float64", 300, dict(check_bounds=False), "st.global.v2.b64"),
        # Gather: the host access is the load from x.
        ("gather", (1000, 128), "float32", 300, {}, "ld.global.v4.b32"),
        ("gather", (1000, 100), "float32", 37, {}, "ld.global.v4.b32"),
        ("gather", (1000, 64), "bool", 300, {}, "ld.global.v4.b32"),
        ("gather", (1000, 3), "bfloat16", 5, dict(rows_dtype=jnp.int64, has_dest=False),
         "ld.global.b16"),
        ("gather", (1000, 128), "float32", 300, dict(store=dict(cache_modifier=".cg")),
         "ld.global.cg.v4.b32"),
        ("gather", (1000, 128), "float32", 300, dict(store=dict(eviction_policy="evict_first")),
         "ld.global.L1::evict_first.L2::cache_hint.v4.b32"),
        ("gather", (1000, 128), "float64", 300, {}, "ld.global.v2.b64"),
        # Add: the host store after the read (and the read itself is a vector).
        ("add", (1000, 128), "float32", 300, {}, "st.global.v4.b32"),
        # 112-byte rows with a masked tail: 16-byte vectors; 100-byte rows only
        # align to 4 bytes, so four int8 per store.
        ("add", (1000, 112), "int8", 37, {}, "st.global.v4.b32"),
        ("add", (1000, 100), "int8", 37, {}, "st.global.b32"),
        # bfloat16 buffer, float32 updates and sums: 8 bf16 per 16-byte store.
        ("add", (1000, 128), "bfloat16", 300, dict(acc_dtype="float32", updates_dtype="float32"),
         "st.global.v4.b32"),
        ("add", (1000, 3), "float16", 5, dict(acc_dtype="float32", has_src=False),
         "st.global.b16"),
        ("add", (1000, 128), "float32", 300, dict(store=dict(cache_modifier=".cs")),
         "st.global.cs.v4.b32"),
        ("add", (1000, 64), "int64", 300, dict(rows_dtype=jnp.int64, check_bounds=False),
         "st.global.v2.b64"),
    ],
)
def test_kernel_compiles_for_sm90(op, shape, dtype, n, options, host_access):
    compiled = _compile(op, shape, dtype, n, **options)
    accesses = _accesses(compiled.asm["ptx"])
    assert host_access in accesses, accesses
    stores = {a for a in accesses if a.startswith("st.")}
    if op != "gather":
        assert stores == {host_access}, stores
    else:  # Into the fresh device output: as wide as the loads, no cache setting.
        plain = re.sub(r"\.(ca|cg|cv|L1::\w+|L2::\w+)", "", host_access)
        assert stores == {plain.replace("ld.", "st.")}, stores
    assert compiled.asm["cubin"], "ptxas produced no binary"


def test_add_eviction_policy_reaches_the_read_and_the_write():
    compiled = _compile("add", (1000, 128), "float32", 300,
                        store=dict(eviction_policy="evict_last"))
    accesses = _accesses(compiled.asm["ptx"])
    hint = ".L1::evict_last.L2::cache_hint.v4.b32"
    assert {"ld.global" + hint, "st.global" + hint} <= set(accesses), accesses


def _pointer_params(ttir: str) -> dict[str, set[str]]:
    """Which kernel parameters the loads and the stores of a TTIR text go through.

    Follows each access's pointer back through splat, addptr, bitcast and
    broadcast (their first operand) to a function parameter.
    """
    params = set(re.findall(r"%(\w+): !tt\.ptr", ttir))
    first_operand = {}
    for line in ttir.splitlines():
        match = re.match(r"\s*%([\w.]+) = \S+ %([\w.]+)", line)
        if match:
            first_operand[match.group(1)] = match.group(2)
    found = {"load": set(), "store": set()}
    for line in ttir.splitlines():
        match = re.search(r"\btt\.(load|store) %([\w.]+)", line)
        if match:
            value = match.group(2)
            while value not in params:
                value = first_operand[value]
            found[match.group(1)].add(value)
    return found


@pytest.mark.parametrize(
    "op, options, loads, stores",
    [
        # x_in_ptr (the aliased operand, or 0.4's placeholder) is never touched.
        ("scatter", {}, {"rows_ptr", "src_ptr", "updates_ptr"}, {"x_ptr"}),
        ("scatter", dict(has_src=False), {"rows_ptr", "updates_ptr"}, {"x_ptr"}),
        # The gather never writes x: only the fresh output.
        ("gather", {}, {"rows_ptr", "dest_ptr", "x_ptr"}, {"out_ptr"}),
        ("gather", dict(has_dest=False), {"rows_ptr", "x_ptr"}, {"out_ptr"}),
        ("add", {}, {"rows_ptr", "src_ptr", "updates_ptr", "x_ptr"}, {"x_ptr"}),
        ("add", dict(has_src=False), {"rows_ptr", "updates_ptr", "x_ptr"}, {"x_ptr"}),
    ],
)
@pytest.mark.parametrize("dtype", ["float32", "bool"])
def test_kernel_reads_and_writes_only_its_operands(op, options, loads, stores, dtype):
    if op == "add" and dtype == "bool":
        pytest.skip("bool has no sum; the op layer refuses it")
    ttir = _compile(op, (1000, 100), dtype, 37, **options).asm["ttir"]
    assert _pointer_params(ttir) == {"load": loads, "store": stores}


@pytest.mark.parametrize("op", ["scatter", "gather", "add"])
def test_jax_triton_04_signature_compiles_the_same_kernel(op):
    # 0.4 passes the in-place buffer once (a Ref in x_ptr) and a placeholder
    # (the rows) in x_in_ptr: a pointer of another type that the kernel never
    # touches, so the code is that of the 0.3 signature.
    options = {} if op == "gather" else dict(rows_dtype=jnp.int64)
    old, new = (_compile(op, (1000, 100), "float32", 37, series=s, **options)
                for s in ((0, 3), (0, 4)))
    assert _accesses(new.asm["ptx"]) == _accesses(old.asm["ptx"])
    assert new.asm["cubin"]
    params = dict(re.findall(r"%(\w+): !tt\.ptr<(\w+)>", new.asm["ttir"]))
    if op == "gather":
        assert params == {"rows_ptr": "i32", "dest_ptr": "i32", "x_ptr": "f32", "out_ptr": "f32"}
    else:
        assert params["x_in_ptr"] == "i64" and params["x_ptr"] == "f32", params
    ttir = new.asm["ttir"]
    assert "x_in_ptr" not in str(_pointer_params(ttir)), ttir


@pytest.mark.parametrize("op", ["scatter", "gather", "add"])
@pytest.mark.parametrize("rows_dtype", [jnp.int32, jnp.int64])
def test_addresses_are_64_bit(op, rows_dtype):
    # A buffer of 1000 rows would never overflow 32 bits; the offsets must be
    # 64-bit anyway, since the kernel is compiled without looking at sizes
    # beyond the row width.
    compiled = _compile(op, (1000, 100), "float32", 37, rows_dtype=rows_dtype)
    pointer_math = [line for line in compiled.asm["ttir"].splitlines() if "tt.addptr" in line]
    assert pointer_math
    for line in pointer_math:
        assert re.search(r"tensor<[0-9x]*xi64>", line), line
    # In the PTX, row times 400 bytes is formed in a 64-bit register, from a
    # 32-bit row (widening multiply) or a 64-bit one, never in 32 bits.
    ptx = compiled.asm["ptx"]
    assert re.search(r"\b(mad|mul)\.(wide\.s32|lo\.s64)\s+%rd\d+, %rd?\d+, 400\b", ptx), ptx
    assert not re.search(r"\b(mad|mul)\.lo\.[su]32\s+%r\d+, %r\d+, (400|100)\b", ptx)


@pytest.mark.parametrize("op", ["scatter", "gather", "add"])
@pytest.mark.parametrize("shape, n", [((1000, 100), 37), ((1000, 128), 256), ((7, 3), 1)])
def test_every_global_access_is_masked(op, shape, n):
    # With bounds checks each access depends on the row indices at run time,
    # so each must carry a predicate: none may touch memory unconditionally.
    ptx = _compile(op, shape, "float32", n).asm["ptx"]
    assert _accesses(ptx)
    assert not _unpredicated_accesses(ptx)


@pytest.mark.parametrize(
    "n, d, itemsize",
    [
        (0, 128, 4),  # No entries: still a valid tiling.
        (1, 1, 4),  # One scalar.
        (5, 3, 2),  # Tiny rows, fewer entries than a block.
        (16_000_000, 1, 4),  # Many scalars: rows fill the tile.
        (1000, 1000, 4),  # Rows of 4000 bytes: one column block each.
        (1000, 100_000, 1),  # Rows wider than a column block.
        (3, 2**31, 1),  # Rows so wide that 65535 column programs need wider blocks.
    ],
)
def test_tiling_heuristic_within_limits(n, d, itemsize):
    # One heuristic serves all three ops (plan_rows).
    tiling = tc.choose_tiling(n, d, itemsize)
    for size in (tiling.block_rows, tiling.block_cols, tiling.num_warps):
        assert size & (size - 1) == 0, tiling
    # Raises if a CUDA or Triton limit is broken.
    tc.check_tiling(tiling, n, d, cache_modifiers=("",))
    assert tiling.block_rows <= max(1, 2 * n)  # No tile much taller than the work.


def test_default_tiling_of_each_op():
    # The add sizes its tile by the accumulator when it is wider than x.
    assert _plan("scatter", (10, 100), "float16", 7).tiling == tc.choose_tiling(7, 100, 2)
    assert _plan("gather", (10, 100), "int8", 7).tiling == tc.choose_tiling(7, 100, 1)
    add = _plan("add", (10, 100), "bfloat16", 7, acc_dtype="float32")
    assert add.tiling == tc.choose_tiling(7, 100, 4)


@pytest.mark.parametrize(
    "op, tiling, message",
    [
        # The checks are shared (plan_rows); the ops take turns running them.
        ("scatter", dict(block_rows=3), "block_rows must be a positive power of two, got 3"),
        ("gather", dict(block_cols=0), "block_cols must be a positive power of two, got 0"),
        ("add", dict(num_warps=3), "num_warps must be a power of two in \\[1, 32\\], got 3"),
        ("scatter", dict(block_rows=1024, block_cols=2048), "tile 1024x2048"),
        ("gather", dict(cache_modifier=".xx"), "unknown cache_modifier '.xx'"),
        ("add", dict(eviction_policy="evict_never"), "unknown eviction_policy 'evict_never'"),
        ("scatter", dict(cache_modifier=".cg", eviction_policy="evict_first"),
         "cannot be combined"),
        ("gather", dict(block_cols=1), "exceeds CUDA's limits"),  # 100000 column programs.
        ("add", dict(block_cols=1), "exceeds CUDA's limits"),
    ],
)
def test_bad_tiling_raises_before_compiling(op, tiling, message):
    settings = dict(block_rows=4, block_cols=128, num_warps=4) | tiling
    with pytest.raises(ValueError, match=message):
        _plan(op, (8, 100_000), jnp.float32, 4, tiling=tc.TritonTiling(**settings))


@pytest.mark.parametrize(
    "op, modifier, accepted",
    [
        ("scatter", ".cs", True), ("scatter", ".ca", False),  # Stores take .wb .cg .cs .wt.
        ("add", ".wt", True), ("add", ".cv", False),  # The add's modifier goes to the store.
        ("gather", ".cv", True), ("gather", ".cs", False),  # Loads take .ca .cg .cv.
    ],
)
def test_cache_modifier_must_suit_the_access(op, modifier, accepted):
    tiling = tc.TritonTiling(8, 128, 4, cache_modifier=modifier)
    if accepted:
        _plan(op, (100, 128), "float32", 8, tiling=tiling)
    else:
        with pytest.raises(ValueError, match=f"unknown cache_modifier '{modifier}'"):
            _plan(op, (100, 128), "float32", 8, tiling=tiling)


_OPERANDS = dict(x=((10, 6), "float32"), rows=((3,), "int32"), src=((3,), "int32"),
                 updates=((3, 6), "float32"))


def _call_with(op: str, shapes: dict, **kwargs):
    spec = _OPERANDS | shapes
    args = {name: None if s is None else jnp.zeros(s[0], s[1]) for name, s in spec.items()}
    if op == "gather":
        return gt.gather_rows_triton(args["x"], args["rows"], args["src"], **kwargs)
    function = st.scatter_rows_triton if op == "scatter" else at.scatter_add_rows_triton
    return function(args["x"], args["rows"], args["src"], args["updates"], **kwargs)


@pytest.mark.parametrize(
    "op, shapes, kwargs, error, message",
    [
        # x must already be flattened to rows.
        ("scatter", dict(x=((4, 2, 3), "float32")), {}, ValueError, r"x must be 2-D"),
        ("gather", dict(x=((4, 2, 3), "float32")), {}, ValueError, r"x must be 2-D"),
        # Float rows are a caller bug, not something to cast.
        ("scatter", dict(rows=((3,), "float32")), {}, TypeError, r"rows must be 1-D int32"),
        ("gather", dict(rows=((3, 1), "int32")), {}, TypeError, r"rows must be 1-D int32"),
        # src / dest is the int32 permutation from the sort, one per row.
        ("scatter", dict(src=((3,), "int16")), {}, TypeError, r"src must be None or int32"),
        ("gather", dict(src=((4,), "int32")), {}, TypeError, r"dest must be None or int32"),
        # Updates narrower than x's rows would make the kernel read past them.
        ("scatter", dict(updates=((3, 5), "float32")), {}, ValueError,
         r"updates must be \(m, 6\) float32"),
        # The scatter copies bits: same element type only.
        ("scatter", dict(updates=((3, 6), "float16")), {}, ValueError, r"got float16\(3, 6\)"),
        # The add converts from x's type or the accumulator's, nothing else.
        ("add", dict(updates=((3, 6), "float16")), dict(acc_dtype="float64"), ValueError,
         r"float32 or float64 like x's rows, got float16"),
        ("add", dict(x=((10, 6), "bool"), updates=((3, 6), "bool")), {}, TypeError,
         r"does not add bool"),
        # Without src, row k of updates goes to rows[k]: it must exist.
        ("scatter", dict(src=None, updates=((2, 6), "float32")), {}, ValueError,
         r"at least 3 rows, got 2"),
        ("add", dict(src=None, updates=((2, 6), "float32")), {}, ValueError,
         r"at least 3 rows, got 2"),
        ("gather", dict(x=((10, 6), "complex64")), {}, TypeError, r"do not handle x"),
    ],
)
def test_bad_operands_raise(op, shapes, kwargs, error, message):
    with pytest.raises(error, match=message):
        _call_with(op, shapes, **kwargs)


def test_compile_refuses_a_plan_that_does_not_fit_its_kernel():
    plan = dataclasses.replace(gt.plan_gather_rows((10, 4), "float32", 3),
                               kernel=st.scatter_rows_triton_kernel)
    with pytest.raises(ValueError, match="do not match"):
        triton_aot.compile_for_target(plan)
    with pytest.raises(ValueError, match="series must be one of"):
        triton_aot.compile_for_target(gt.plan_gather_rows((10, 4), "float32", 3), series=(0, 5))


def test_compiled_once_per_plan():
    plan = st.plan_scatter_rows((1000, 100), "float32", 37)
    again = st.plan_scatter_rows((1000, 100), "float32", 37)
    assert triton_aot.compile_for_target(plan) is triton_aot.compile_for_target(again)
    other = st.plan_scatter_rows((1000, 100), "float32", 37, check_bounds=False)
    assert triton_aot.compile_for_target(other) is not triton_aot.compile_for_target(plan)
