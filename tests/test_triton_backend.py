"""The raw Triton kernels (``kernels/*_triton.py``) launched through jax-triton.

Three groups:

* CPU, needs only ``triton`` installed (skipped only when ``import triton``
  fails; any other failure fails): the import guard in each of its states;
  each kernel compiled ahead of time for sm_90 with the accesses we expect
  (16-byte vectors, cache operators, 64-bit addresses, every access masked,
  which parameters are loaded from and stored to); tiling heuristics within
  Triton's and CUDA's limits; bad settings and operands raise first.
* GPU (marked ``gpu``): the three kernel functions called directly inside
  ``jit`` on random data, in ``pinned_host`` and device memory, against
  numpy; a buffer of more than 2**31 elements; the compiled HLO (one custom
  call, buffer operand in host memory space S(5), no copy, aliasing for the
  in-place ops).
* GPU: the public ops with ``backend="triton"``, which must really take the
  Triton path (checked in the HLO), against the numpy oracles.
"""

from __future__ import annotations

import collections
import dataclasses
import importlib
import importlib.abc
import re
import sys
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallas_pinned
from pallas_pinned.testing import (
    assert_same,
    gather_oracle,
    make_values,
    scatter_add_oracle,
    scatter_oracle,
)

try:
    import triton  # noqa: F401
except ImportError as err:
    _NO_TRITON = f"triton is not installed ({str(err).splitlines()[0]})"
else:
    _NO_TRITON = None
if _NO_TRITON is None:
    # Not guarded: with triton present, failing to import these is a bug.
    from pallas_pinned.kernels import gather_triton as gt
    from pallas_pinned.kernels import scatter_add_triton as at
    from pallas_pinned.kernels import scatter_triton as st
    from pallas_pinned.kernels import triton_common as tc


def _cuda_devices():
    try:
        return jax.devices("cuda")
    except RuntimeError:
        return []


def _jax_triton_missing() -> bool:
    try:
        tc.check_installed()
    except ImportError:
        return True
    return False


def _why_no_launch() -> str | None:
    # A jax-triton that is installed but cannot launch on a CUDA machine is a
    # failure to see, not a reason to skip: the GPU tests then run and fail.
    if _NO_TRITON:
        return _NO_TRITON
    if not _cuda_devices():
        return "needs a CUDA GPU"
    if _jax_triton_missing():
        return "jax-triton is not installed (the optional extra)"
    return None


_NO_LAUNCH = _why_no_launch()
needs_triton = pytest.mark.skipif(_NO_TRITON is not None, reason=_NO_TRITON or "")
on_gpu = [pytest.mark.gpu, pytest.mark.skipif(_NO_LAUNCH is not None, reason=_NO_LAUNCH or "")]
_HINT = re.escape('pip install "pallas-pinned[triton]"')


# --------------------------------------------------------------------------
# CPU: the import guard in each of its states.
# --------------------------------------------------------------------------

_KERNEL_MODULES = ("triton_common", "scatter_triton", "gather_triton", "scatter_add_triton")


def _fresh_import(monkeypatch, name: str):
    """Imports kernel module ``name`` anew; the old modules come back after the test."""
    import pallas_pinned.kernels as package

    for module in _KERNEL_MODULES:
        monkeypatch.delitem(sys.modules, f"pallas_pinned.kernels.{module}", raising=False)
        monkeypatch.delattr(package, module, raising=False)
    return importlib.import_module(f"pallas_pinned.kernels.{name}")


def _small_calls(scatter, gather, add):
    """One valid call of each public kernel function, on CPU arrays."""
    x, rows, updates = jnp.ones((10, 4)), jnp.arange(3, dtype=jnp.int32), jnp.ones((3, 4))
    return {
        "scatter": lambda: scatter.scatter_rows_triton(x, rows, None, updates),
        "gather": lambda: gather.gather_rows_triton(x, rows),
        "add": lambda: add.scatter_add_rows_triton(x, rows, None, updates),
    }


def _fresh_modules(monkeypatch):
    modules = [_fresh_import(monkeypatch, name) for name in _KERNEL_MODULES[1:]]
    return (sys.modules["pallas_pinned.kernels.triton_common"], *modules)


@pytest.mark.parametrize("name", _KERNEL_MODULES)
def test_import_without_triton_names_the_extra(monkeypatch, name):
    # A None entry in sys.modules makes `import triton` fail as if not installed.
    monkeypatch.setitem(sys.modules, "triton", None)
    with pytest.raises(ImportError, match=_HINT):
        _fresh_import(monkeypatch, name)


@needs_triton
def test_without_jax_triton_compiles_but_launching_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "jax_triton", None)
    modules = _fresh_modules(monkeypatch)
    common = modules[0]
    assert common.jax_triton is None
    compiled = common.compile_for_target(modules[2].plan_gather_rows((10, 4), jnp.float32, 3))
    assert compiled.asm["ptx"]
    with pytest.raises(ImportError, match=_HINT):
        common.check_installed()
    for call in _small_calls(*modules[1:]).values():
        with pytest.raises(ImportError, match=_HINT):
            call()


class _RefuseJaxTriton(importlib.abc.MetaPathFinder):
    """Makes ``import jax_triton`` fail the way 0.3.1 does on a jaxlib without CUDA."""

    def find_spec(self, name, path=None, target=None):
        if name == "jax_triton":
            raise ImportError("jax-triton requires JAX to be installed with GPU support.")
        return None


def _fake_jax_triton(version: str) -> types.ModuleType:
    fake = types.ModuleType("jax_triton")
    fake.__version__ = version
    fake.__version_info__ = tuple(int(part) for part in version.split("."))
    return fake


@needs_triton
@pytest.mark.parametrize("state", ["no_gpu_jaxlib", "jax_triton_0.4"])
def test_unusable_jax_triton_compiles_but_refuses_to_launch(monkeypatch, state):
    if state == "no_gpu_jaxlib":
        monkeypatch.delitem(sys.modules, "jax_triton", raising=False)
        monkeypatch.setattr(sys, "meta_path", [_RefuseJaxTriton(), *sys.meta_path])
        reason = "requires JAX to be installed with GPU support"
    else:
        monkeypatch.setitem(sys.modules, "jax_triton", _fake_jax_triton("0.4.1"))
        reason = r"jax-triton 0\.4\.1 is installed, but this backend is written for .*0\.3\.x"
    modules = _fresh_modules(monkeypatch)
    common = modules[0]
    assert common.jax_triton is None
    common.check_installed()  # Installed: not an ImportError.
    compiled = common.compile_for_target(modules[3].plan_scatter_add_rows((10, 4), "float32", 3))
    assert compiled.asm["ptx"]
    for call in _small_calls(*modules[1:]).values():
        with pytest.raises(NotImplementedError, match=f"jax-triton cannot launch.*{reason}"):
            call()


@needs_triton
def test_launch_here_says_why():
    if _cuda_devices() and not tc.JAX_TRITON_UNUSABLE:
        pytest.skip("jax-triton can launch here; nothing to refuse")
    expected = ImportError if _jax_triton_missing() else NotImplementedError
    for call in _small_calls(st, gt, at).values():
        with pytest.raises(expected, match="jax-triton"):
            call()


# --------------------------------------------------------------------------
# CPU: ahead-of-time compilation for sm_90.
# --------------------------------------------------------------------------


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


def _plan(op: str, shape, dtype, n, **options):
    plan_fn = {"scatter": "plan_scatter_rows", "gather": "plan_gather_rows",
               "add": "plan_scatter_add_rows"}[op]
    module = {"scatter": st, "gather": gt, "add": at}[op]
    if "store" in options:  # The default tiling with one cache setting changed.
        chooser = {"scatter": st.choose_scatter_triton_tiling,
                   "gather": gt.choose_gather_triton_tiling,
                   "add": at.choose_scatter_add_triton_tiling}[op]
        default = chooser(n, shape[1], jnp.dtype(dtype).itemsize)
        options["tiling"] = dataclasses.replace(default, **options.pop("store"))
    return getattr(module, plan_fn)(shape, dtype, n, **options)


def _compile(op: str, shape, dtype, n, **options):
    return tc.compile_for_target(_plan(op, shape, dtype, n, **dict(options)))


@needs_triton
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


@needs_triton
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


@needs_triton
@pytest.mark.parametrize(
    "op, options, loads, stores",
    [
        ("scatter", {}, {"rows_ptr", "src_ptr", "updates_ptr"}, {"x_out_ptr"}),
        ("scatter", dict(has_src=False), {"rows_ptr", "updates_ptr"}, {"x_out_ptr"}),
        # The gather never writes x: only the fresh output.
        ("gather", {}, {"rows_ptr", "dest_ptr", "x_ptr"}, {"out_ptr"}),
        ("gather", dict(has_dest=False), {"rows_ptr", "x_ptr"}, {"out_ptr"}),
        ("add", {}, {"rows_ptr", "src_ptr", "updates_ptr", "x_out_ptr"}, {"x_out_ptr"}),
        ("add", dict(has_src=False), {"rows_ptr", "updates_ptr", "x_out_ptr"}, {"x_out_ptr"}),
    ],
)
@pytest.mark.parametrize("dtype", ["float32", "bool"])
def test_kernel_reads_and_writes_only_its_operands(op, options, loads, stores, dtype):
    if op == "add" and dtype == "bool":
        pytest.skip("bool has no sum; the op layer refuses it")
    ttir = _compile(op, (1000, 100), dtype, 37, **options).asm["ttir"]
    assert _pointer_params(ttir) == {"load": loads, "store": stores}


@needs_triton
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


@needs_triton
@pytest.mark.parametrize("op", ["scatter", "gather", "add"])
@pytest.mark.parametrize("shape, n", [((1000, 100), 37), ((1000, 128), 256), ((7, 3), 1)])
def test_every_global_access_is_masked(op, shape, n):
    # With bounds checks each access depends on the row indices at run time,
    # so each must carry a predicate: none may touch memory unconditionally.
    ptx = _compile(op, shape, "float32", n).asm["ptx"]
    assert _accesses(ptx)
    assert not _unpredicated_accesses(ptx)


_CHOOSERS = {
    "scatter": lambda: st.choose_scatter_triton_tiling,
    "gather": lambda: gt.choose_gather_triton_tiling,
    "add": lambda: at.choose_scatter_add_triton_tiling,
}


@needs_triton
@pytest.mark.parametrize("op", list(_CHOOSERS))
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
def test_tiling_heuristic_within_limits(op, n, d, itemsize):
    tiling = _CHOOSERS[op]()(n, d, itemsize)
    for size in (tiling.block_rows, tiling.block_cols, tiling.num_warps):
        assert size & (size - 1) == 0, tiling
    # Raises if a CUDA or Triton limit is broken.
    tc.check_tiling(tiling, n, d, cache_modifiers=("",))
    assert tiling.block_rows <= max(1, 2 * n)  # No tile much taller than the work.


@needs_triton
@pytest.mark.parametrize("op", ["scatter", "gather", "add"])
@pytest.mark.parametrize(
    "tiling, message",
    [
        (dict(block_rows=3), "block_rows must be a positive power of two, got 3"),
        (dict(block_cols=0), "block_cols must be a positive power of two, got 0"),
        (dict(num_warps=3), "num_warps must be a power of two in \\[1, 32\\], got 3"),
        (dict(block_rows=1024, block_cols=2048), "tile 1024x2048"),
        (dict(cache_modifier=".xx"), "unknown cache_modifier '.xx'"),
        (dict(eviction_policy="evict_never"), "unknown eviction_policy 'evict_never'"),
        (dict(cache_modifier=".cg", eviction_policy="evict_first"), "cannot be combined"),
        (dict(block_cols=1), "exceeds CUDA's limits"),  # 100000 column programs.
    ],
)
def test_bad_tiling_raises_before_compiling(op, tiling, message):
    settings = dict(block_rows=4, block_cols=128, num_warps=4) | tiling
    with pytest.raises(ValueError, match=message):
        _plan(op, (8, 100_000), jnp.float32, 4, tiling=tc.TritonTiling(**settings))


@needs_triton
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


@needs_triton
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


@needs_triton
def test_compile_refuses_a_plan_that_does_not_fit_its_kernel():
    plan = dataclasses.replace(gt.plan_gather_rows((10, 4), "float32", 3),
                               kernel=st.scatter_rows_triton_kernel)
    with pytest.raises(ValueError, match="do not match"):
        tc.compile_for_target(plan)


# --------------------------------------------------------------------------
# GPU: the three kernel functions against numpy.
# --------------------------------------------------------------------------


def _sharding(memory_kind: str):
    return jax.sharding.SingleDeviceSharding(_cuda_devices()[0], memory_kind=memory_kind)


def _put(a, memory_kind: str = "device"):
    return None if a is None else jax.device_put(a, _sharding(memory_kind))


def _entry_rows(rng, num_rows: int, n: int, *, distinct: bool, markers: bool, dtype=np.int32):
    """Rows in random order (distinct, or with repeats), some replaced by out-of-range ones.

    The out-of-range rows are what the caller's normalization produces (one
    past the end, -1) plus the extremes of the index type, which a 32-bit or
    unsigned bounds check would get wrong.
    """
    if n > num_rows:  # Fewer rows than entries: the rows past the end are out of range.
        rows = rng.permutation(n)
    elif distinct:
        rows = rng.permutation(num_rows)[:n]
    else:
        rows = rng.integers(0, num_rows, size=n)
    rows = rows.astype(dtype)
    if markers and n >= 8:  # Fewer entries all stay real, so that something happens.
        info = np.iinfo(dtype)
        choices = np.array([num_rows, -1, info.max, info.min], dtype)
        where = rng.choice(n, n // 8, replace=False)
        rows[where] = rng.choice(choices, where.size)
    return rows


def _in_range(row, num_rows: int) -> bool:
    return 0 <= int(row) < num_rows


def _poison_device_memory(nbytes: int) -> None:
    """Fills and frees device memory, so that a fresh output likely starts as 0xA5 bytes.

    A kernel that leaves output elements unwritten then shows garbage
    instead of the zeros a fresh allocation often happens to hold.
    """
    if nbytes:
        jax.device_put(np.full(nbytes, 0xA5, np.uint8), _sharding("device")).block_until_ready()


def _in_place_jit(function, on_host: bool):
    def run(x, *args):
        out = function(x, *args)
        if on_host:
            # Like pallas_call, triton_call declares its result in device
            # memory; it is the aliased host buffer, so say where it lives.
            out = jax.device_put(out, jax.memory.Space.Host)
        return out

    return jax.jit(run, donate_argnums=0)


def _scatter_case(rng, memory_kind, dtype, num_rows, d, n, *, with_src=True, markers=True,
                  rows_dtype=np.int32, **kernel_kwargs):
    x_np = make_values(rng, (num_rows, d), dtype)
    m = n + 3  # More update rows than writes, so src must pick the right ones.
    updates_np = make_values(rng, (m, d), dtype)
    rows_np = _entry_rows(rng, num_rows, n, distinct=True, markers=markers, dtype=rows_dtype)
    src_np = rng.permutation(m)[:n].astype(np.int32) if with_src else None
    expected = x_np.copy()
    for k, row in enumerate(rows_np):
        if _in_range(row, num_rows):
            expected[row] = updates_np[k if src_np is None else src_np[k]]
    run = _in_place_jit(
        lambda x, r, s, u: st.scatter_rows_triton(x, r, s, u, **kernel_kwargs),
        memory_kind == "pinned_host",
    )
    out = run(_put(x_np, memory_kind), _put(rows_np), _put(src_np), _put(updates_np))
    assert out.sharding.memory_kind == memory_kind
    assert_same(np.asarray(out), expected)


def _gather_case(rng, memory_kind, dtype, num_rows, d, n, *, with_dest=True, markers=True,
                 rows_dtype=np.int32, **kernel_kwargs):
    x_np = make_values(rng, (num_rows, d), dtype)
    rows_np = _entry_rows(rng, num_rows, n, distinct=False, markers=markers, dtype=rows_dtype)
    dest_np = rng.permutation(n).astype(np.int32) if with_dest else None
    expected = np.zeros((n, d), x_np.dtype)
    for k, row in enumerate(rows_np):
        if _in_range(row, num_rows):
            expected[k if dest_np is None else dest_np[k]] = x_np[row]
    x = _put(x_np, memory_kind)
    rows, dest = _put(rows_np), _put(dest_np)
    _poison_device_memory(expected.nbytes)
    out = jax.jit(lambda x, r, t: gt.gather_rows_triton(x, r, t, **kernel_kwargs))(x, rows, dest)
    assert out.sharding.memory_kind == "device"
    assert_same(np.asarray(out), expected)
    assert not x.is_deleted()  # Only read.


def _add_case(rng, memory_kind, dtype, num_rows, d, n, *, acc_dtype=None, updates_dtype=None,
              with_src=True, markers=True, rows_dtype=np.int32, **kernel_kwargs):
    x_np = make_values(rng, (num_rows, d), dtype)
    m = n + 3
    updates_np = make_values(rng, (m, d), updates_dtype or dtype)
    rows_np = _entry_rows(rng, num_rows, n, distinct=True, markers=markers, dtype=rows_dtype)
    src_np = rng.permutation(m)[:n].astype(np.int32) if with_src else None
    acc = jnp.dtype(acc_dtype or dtype)  # A numpy dtype (ml_dtypes for bfloat16).
    expected = x_np.copy()
    for k, row in enumerate(rows_np):
        if _in_range(row, num_rows):
            addend = updates_np[k if src_np is None else src_np[k]]
            # One rounding, of the sum formed in acc; integer sums wrap.
            with np.errstate(over="ignore"):
                expected[row] = (x_np[row].astype(acc) + addend.astype(acc)).astype(x_np.dtype)
    run = _in_place_jit(
        lambda x, r, s, u: at.scatter_add_rows_triton(x, r, s, u, acc_dtype=acc_dtype,
                                                      **kernel_kwargs),
        memory_kind == "pinned_host",
    )
    out = run(_put(x_np, memory_kind), _put(rows_np), _put(src_np), _put(updates_np))
    assert out.sharding.memory_kind == memory_kind
    assert_same(np.asarray(out), expected)


_CASES = {"scatter": _scatter_case, "gather": _gather_case, "add": _add_case}
# Buffer dtypes: the common ones, both 1-byte integer signs, and bool (copied
# through a byte view; the add refuses it).
DTYPES = ("float32", "bfloat16", "float16", "int8", "uint8", "bool")


def _op_dtype(op: str, dtype: str) -> dict:
    if op == "add" and dtype == "bool":
        pytest.skip("bool has no sum; the op layer refuses it")
    if op == "add" and dtype in ("bfloat16", "float16"):
        return dict(acc_dtype="float32")  # What the op layer passes for 16-bit floats.
    return {}


@pytest.mark.parametrize("memory_kind", ["pinned_host", "device"])
@pytest.mark.parametrize("op", list(_CASES))
class TestKernelsOnGpu:
    pytestmark = on_gpu

    @pytest.mark.parametrize("dtype", DTYPES)
    @pytest.mark.parametrize(
        "d",
        [
            1,  # One element per row: scalar accesses only.
            3,  # Odd width: no vectors, masked column tail.
            100,  # 400-byte f32 rows: vectors plus a masked tail in the column block.
            1000,  # A 1024-wide column block with a masked tail; many rows per tile.
            5000,  # Wider than one column block: five column programs, the last partial.
        ],
    )
    def test_widths_and_dtypes(self, memory_kind, op, dtype, d):
        # 37 entries: off every power-of-two block size.
        _CASES[op](np.random.default_rng(d), memory_kind, dtype, 101, d, 37,
                   **_op_dtype(op, dtype))

    @pytest.mark.parametrize(
        "num_rows, n",
        [
            (1, 1),  # A buffer of one row, read or written once.
            (11, 1),  # A single entry.
            (21, 5),  # Fewer entries than any block.
            (85, 37),  # Off the block size.
            (8209, 4099),  # Large and off the block size: many programs.
            (13, 0),  # Nothing to do: no launch at all (CUDA refuses empty grids).
            (0, 4),  # No rows at all: every entry is out of range.
        ],
    )
    @pytest.mark.parametrize("dtype", ["float32", "bool"])
    @pytest.mark.parametrize("d", [3, 100])
    def test_counts(self, memory_kind, op, num_rows, n, dtype, d):
        _CASES[op](np.random.default_rng(n), memory_kind, dtype, num_rows, d, n,
                   **_op_dtype(op, dtype))

    @pytest.mark.parametrize("with_partner", [True, False])
    def test_with_and_without_permutation(self, memory_kind, op, with_partner):
        # Without src/dest, entry k pairs with row k; the rows fill the slot.
        key = "with_dest" if op == "gather" else "with_src"
        _CASES[op](np.random.default_rng(1), memory_kind, "float32", 300, 100, 97,
                   **{key: with_partner})

    def test_only_out_of_range_rows(self, memory_kind, op):
        rng = np.random.default_rng(2)
        rows = np.array([64, -1, 2**31 - 1, -(2**31), 65, 1000], np.int32)
        x_np = make_values(rng, (64, 10), "float32")
        updates = make_values(rng, (6, 10), "float32")
        if op == "gather":
            out = jax.jit(gt.gather_rows_triton)(_put(x_np, memory_kind), _put(rows))
            assert_same(np.asarray(out), np.zeros((6, 10), np.float32))
            return
        function = st.scatter_rows_triton if op == "scatter" else at.scatter_add_rows_triton
        run = _in_place_jit(function, memory_kind == "pinned_host")
        out = run(_put(x_np, memory_kind), _put(rows), None, _put(updates))
        assert_same(np.asarray(out), x_np)

    def test_rows_promised_in_range(self, memory_kind, op):
        kwargs = {} if op == "gather" else dict(check_bounds=False)
        _CASES[op](np.random.default_rng(3), memory_kind, "bfloat16", 500, 130, 203,
                   markers=False, **kwargs, **_op_dtype(op, "bfloat16"))

    @pytest.mark.parametrize("dtype", ["int64", "float64", "float32"])
    def test_x64(self, memory_kind, op, dtype):
        # int64 rows with int64 extremes as out-of-range markers; 8-byte elements.
        with jax.enable_x64(True):
            _CASES[op](np.random.default_rng(4), memory_kind, dtype, 300, 33, 77,
                       rows_dtype=np.int64)

    @pytest.mark.parametrize(
        "tiling",
        [
            (1, 1, 1, "", ""),  # One element per program: scalar accesses everywhere.
            (8, 32, 4, "", ""),  # Several column programs, the last one partial (d=100).
            (64, 128, 8, ".cg", ""),  # Accepted by loads and stores alike.
            (64, 128, 8, "", "evict_first"),  # Eviction hints instead of a cache operator.
            (64, 128, 8, "", "evict_last"),
        ],
    )
    def test_explicit_tilings(self, memory_kind, op, tiling):
        _CASES[op](np.random.default_rng(5), memory_kind, "float32", 400, 100, 150,
                   tiling=tc.TritonTiling(*tiling))

    @pytest.mark.parametrize("modifier", [".cs", ".wt", ".wb", ".ca", ".cv"])
    def test_cache_modifiers(self, memory_kind, op, modifier):
        accepted = tc.LOAD_CACHE_MODIFIERS if op == "gather" else tc.STORE_CACHE_MODIFIERS
        if modifier not in accepted:
            pytest.skip(f"{modifier} is not a modifier of this op's host access")
        _CASES[op](np.random.default_rng(6), memory_kind, "float32", 400, 100, 150,
                   tiling=tc.TritonTiling(64, 128, 8, modifier))

    def test_add_updates_in_the_accumulator_type(self, memory_kind, op):
        if op != "add":
            pytest.skip("only the add converts its updates")
        # What the op layer hands over after summing duplicates in float32.
        _add_case(np.random.default_rng(7), memory_kind, "bfloat16", 300, 100, 97,
                  acc_dtype="float32", updates_dtype="float32")


@pytest.mark.gpu
@pytest.mark.skipif(_NO_LAUNCH is not None, reason=_NO_LAUNCH or "")
def test_triton_types_match_jax_triton():
    # compile_for_target types pointers itself; it must agree with jax-triton.
    theirs = tc.jax_triton.triton_lib._JAX_TO_TRITON_TYPE_MAP
    assert {t: theirs[t] for t in tc.TRITON_TYPES} == tc.TRITON_TYPES


@pytest.mark.gpu
@pytest.mark.skipif(_NO_LAUNCH is not None, reason=_NO_LAUNCH or "")
def test_pinned_buffer_beyond_2_31_elements():
    """Rows past element offset 2**31 (byte offset 2**33) of an 8.7 GB pinned buffer.

    The same buffer goes through all three kernels: scatter, add, then gather.
    """
    num_rows, d = 2**24 + 5, 130
    fill = np.float32(7.0)  # Not zero: rows the kernels must not touch keep it.
    x = jax.jit(
        lambda: jnp.full((num_rows, d), fill, jnp.float32),
        out_shardings=_sharding("pinned_host"),
    )()
    boundary = 2**31 // d  # Row whose elements straddle offset 2**31.
    rows_np = np.array(
        [0, 1, 2**23, boundary - 1, boundary, boundary + 1, num_rows - 2, num_rows - 1,
         num_rows, -1],  # The last two are out of range.
        np.int32,
    )
    valid = np.array([_in_range(r, num_rows) for r in rows_np])
    rng = np.random.default_rng(8)
    updates_np = make_values(rng, (rows_np.size, d), "float32")
    addends_np = make_values(rng, (rows_np.size, d), "float32")
    src_np = rng.permutation(rows_np.size).astype(np.int32)
    rows, src = _put(rows_np), _put(src_np)
    x = _in_place_jit(st.scatter_rows_triton, True)(x, rows, src, _put(updates_np))
    x = _in_place_jit(at.scatter_add_rows_triton, True)(x, rows, src, _put(addends_np))
    expected = np.where(valid[:, None], updates_np[src_np] + addends_np[src_np], 0)
    gathered = jax.jit(gt.gather_rows_triton)(x, rows, src)  # src as dest: a permutation.
    expected_gather = np.zeros_like(expected)
    expected_gather[src_np] = expected
    assert_same(np.asarray(gathered), expected_gather)
    host = np.asarray(x)
    for k in np.flatnonzero(valid):
        assert_same(host[rows_np[k]], expected[k], what=f"row {rows_np[k]}")
    changed = np.flatnonzero((host != fill).any(axis=1))
    np.testing.assert_array_equal(changed, np.sort(rows_np[valid]))


def _hlo_definition(hlo: str, name: str) -> str:
    """The HLO line that defines instruction ``name`` (names are unique per module)."""
    pattern = re.compile(r"^\s*(ROOT\s+)?" + re.escape(name) + r"\s*=")
    lines = [line for line in hlo.splitlines() if pattern.match(line)]
    assert len(lines) == 1, f"{name} defined {len(lines)} times in\n{hlo}"
    return lines[0]


# jax-triton 0.3's custom call target (0.4 renames it triton_kernel_call_ffi).
_TRITON_CALL = re.compile(r'custom_call_target="triton_kernel_call(_ffi)?"')


@pytest.mark.gpu
@pytest.mark.skipif(_NO_LAUNCH is not None, reason=_NO_LAUNCH or "")
@pytest.mark.parametrize("op", ["scatter", "gather", "add"])
def test_hlo_one_custom_call_on_the_host_buffer_no_copy(op):
    num_rows, d, n = 1000, 128, 300
    rng = np.random.default_rng(9)
    x = _put(make_values(rng, (num_rows, d), "float32"), "pinned_host")
    rows = _put(_entry_rows(rng, num_rows, n, distinct=True, markers=True))
    src = _put(rng.permutation(n).astype(np.int32))
    updates = _put(make_values(rng, (n, d), "float32"))
    if op == "gather":
        run, args, buffer_operand = jax.jit(gt.gather_rows_triton), (x, rows, src), 2
    else:
        function = st.scatter_rows_triton if op == "scatter" else at.scatter_add_rows_triton
        run, args, buffer_operand = _in_place_jit(function, True), (x, rows, src, updates), 3
    hlo = run.lower(*args).compile().as_text()
    calls = [line for line in hlo.splitlines() if _TRITON_CALL.search(line)]
    assert len(calls) == 1, hlo
    call = calls[0]
    buffer_type = re.escape(f"f32[{num_rows},{d}]") + r"\{[^}]*S\(5\)"
    result, _, rest = call.partition("custom-call(")
    # Compiled HLO may print operands without their shapes, so look the
    # buffer operand up where it is defined.
    operands = re.findall(r"%[\w.\-]+", rest.partition("=")[0])  # Up to the first attribute.
    assert len(operands) == len(args), call
    definition = _hlo_definition(hlo, operands[buffer_operand])
    assert re.search(buffer_type, definition), definition
    assert " copy(" not in definition, definition
    copies = re.findall(re.escape(f"f32[{num_rows},{d}]") + r"\{[^}]*\}\s+copy\(", hlo)
    assert not copies, hlo
    if op == "gather":  # A fresh device array; x only read.
        assert "S(5)" not in result and "output_to_operand_aliasing" not in call, call
        return
    assert re.search(buffer_type, result), call
    assert "output_to_operand_aliasing" in call, call
    # And at run time: the result is the same host allocation.
    pointer = x.unsafe_buffer_pointer()
    assert run(*args).unsafe_buffer_pointer() == pointer


# --------------------------------------------------------------------------
# GPU: the public ops with backend="triton".
# --------------------------------------------------------------------------


def _assert_takes_triton_path(function, *args):
    """The jitted op lowers to jax-triton's custom call: no silent fallback."""
    hlo = jax.jit(function).lower(*args).compile().as_text()
    assert _TRITON_CALL.search(hlo), hlo


@pytest.mark.gpu
@pytest.mark.skipif(_NO_LAUNCH is not None, reason=_NO_LAUNCH or "")
@pytest.mark.parametrize("memory_kind", ["pinned_host", "device"])
@pytest.mark.parametrize(
    "dtype, index_shape, low, mode",
    [
        ("float32", (300,), -2000, None),  # Negative indices wrap once.
        ("bool", (20, 15), 0, None),  # 2-D indices, with repeats.
        ("bfloat16", (1200,), 0, None),  # Unsorted and above the sort threshold.
        ("int8", (257,), -2003, "drop"),  # Out-of-range indices dropped.
        ("float32", (257,), -2003, "clip"),  # ... or clipped.
        ("float32", (0,), 0, None),  # Nothing to write.
    ],
)
def test_public_scatter_backend_triton(memory_kind, dtype, index_shape, low, mode):
    rng = np.random.default_rng(10)
    num_rows, row_shape = 2000, (2, 5)
    x_np = make_values(rng, (num_rows,) + row_shape, dtype)
    indices = rng.integers(low, num_rows + (3 if mode else 0), size=index_shape)
    updates = make_values(rng, index_shape + row_shape, dtype)
    args = (_put(indices), _put(updates))

    def scatter(x, i, u):
        return pallas_pinned.scatter_to_host(x, i, u, mode=mode, backend="triton")

    if indices.size:
        _assert_takes_triton_path(scatter, _put(x_np, memory_kind), *args)
    out = scatter(_put(x_np, memory_kind), *args)
    assert out.sharding.memory_kind == memory_kind
    assert_same(np.asarray(out), scatter_oracle(x_np, indices, updates, mode=mode))


@pytest.mark.gpu
@pytest.mark.skipif(_NO_LAUNCH is not None, reason=_NO_LAUNCH or "")
@pytest.mark.parametrize("memory_kind", ["pinned_host", "device"])
@pytest.mark.parametrize(
    "dtype, index_shape, low, high, mode",
    [
        ("float32", (300,), -2000, 2000, None),  # Negative indices wrap once.
        ("bool", (20, 15), 0, 2000, None),  # 2-D indices with repeats.
        ("bfloat16", (1200,), 0, 2000, None),  # Above the sort threshold: read in order.
        ("int8", (257,), -2003, 2003, "fill"),  # Out of range: the fill value.
        ("float32", (257,), -2003, 2003, "clip"),
    ],
)
def test_public_gather_backend_triton(memory_kind, dtype, index_shape, low, high, mode):
    rng = np.random.default_rng(11)
    x_np = make_values(rng, (2000, 2, 5), dtype)
    indices = rng.integers(low, high, size=index_shape)
    x, i = _put(x_np, memory_kind), _put(indices)

    def gather(x, i):
        return pallas_pinned.gather_from_host(x, i, mode=mode, backend="triton")

    _assert_takes_triton_path(gather, x, i)
    out = gather(x, i)
    assert out.sharding.memory_kind == "device"
    assert_same(np.asarray(out), gather_oracle(x_np, indices, mode=mode))


@pytest.mark.gpu
@pytest.mark.skipif(_NO_LAUNCH is not None, reason=_NO_LAUNCH or "")
@pytest.mark.parametrize("memory_kind", ["pinned_host", "device"])
@pytest.mark.parametrize(
    "dtype, index_shape, unique, mode",
    [
        # Distinct rows: float sums are exact whatever the order.
        ("float32", (300,), True, None),
        ("bfloat16", (1200,), True, None),  # Summed in float32, rounded once.
        # Repeats are summed on the device first; integers wrap, in any order.
        ("int32", (20, 15), False, None),
        ("int8", (257,), False, "drop"),
    ],
)
def test_public_scatter_add_backend_triton(memory_kind, dtype, index_shape, unique, mode):
    rng = np.random.default_rng(12)
    num_rows, row_shape = 2000, (2, 5)
    x_np = make_values(rng, (num_rows,) + row_shape, dtype)
    size = int(np.prod(index_shape))
    if unique:
        indices = rng.permutation(num_rows)[:size].reshape(index_shape)
    else:
        indices = rng.integers(-num_rows - 3, num_rows + 3, size=index_shape)
    updates = make_values(rng, index_shape + row_shape, dtype)
    args = (_put(indices), _put(updates))

    def add(x, i, u):
        return pallas_pinned.scatter_add_to_host(x, i, u, mode=mode, backend="triton")

    _assert_takes_triton_path(add, _put(x_np, memory_kind), *args)
    out = jax.jit(add, donate_argnums=0)(_put(x_np, memory_kind), *args)
    assert out.sharding.memory_kind == memory_kind
    assert_same(np.asarray(out), scatter_add_oracle(x_np, indices, updates, mode=mode))


def test_public_backend_triton_refused_without_cuda():
    if _cuda_devices():
        pytest.skip("a CUDA GPU is present; the refusal is for other platforms")
    x = jnp.ones((10, 3))
    # Without triton the ImportError names the extra; with jax-triton, the
    # platform is refused. With triton alone both refusals are true.
    expected, message = (NotImplementedError, "CUDA")
    if _NO_TRITON is not None:
        expected, message = ImportError, _HINT
    elif _jax_triton_missing():
        expected, message = (ImportError, NotImplementedError), f"{_HINT}|CUDA"
    calls = {
        "scatter": lambda: pallas_pinned.scatter_to_host(
            x, np.array([1, 2]), jnp.zeros((2, 3)), backend="triton"),
        "gather": lambda: pallas_pinned.gather_from_host(x, np.array([1, 2]), backend="triton"),
        "add": lambda: pallas_pinned.scatter_add_to_host(
            x, np.array([1, 2]), jnp.zeros((2, 3)), backend="triton"),
    }
    for op, call in calls.items():
        with pytest.raises(expected, match=message):
            call()
        assert not x.is_deleted(), op  # Refused before anything ran.
