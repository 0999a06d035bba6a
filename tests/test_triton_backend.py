"""The raw Triton kernel (``kernels/scatter_triton.py``) launched through jax-triton.

Three groups:

* CPU, needs only ``triton`` installed: the kernel compiles ahead of time to
  PTX for sm_90 with the stores we expect, the tiling heuristic respects
  Triton's and CUDA's limits, bad settings raise before anything runs, and a
  missing install says which extra to install.
* GPU (marked ``gpu``, skipped without CUDA or jax-triton): the launcher,
  called directly inside ``jit(..., donate_argnums=0)`` on buffers in
  ``pinned_host`` and device memory, against the numpy oracle; a buffer of
  more than 2**31 elements; and the compiled HLO (one custom call, buffer in
  host memory space S(5), no copy).
* ``scatter_to_host(..., backend="triton")``: skipped until the backend is
  wired into the public op.
"""

from __future__ import annotations

import dataclasses
import importlib
import re
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_pinned import scatter_to_host
from pallas_pinned.testing import (
    ScatterSpec,
    assert_same,
    make_indices,
    make_values,
    scatter_oracle,
)

_MODULE = "pallas_pinned.kernels.scatter_triton"

try:
    st = importlib.import_module(_MODULE)
    _NO_TRITON = None
except ImportError as err:
    st = None
    _NO_TRITON = f"triton / jax-triton not installed ({str(err).splitlines()[0]})"


def _cuda_devices():
    try:
        return jax.devices("cuda")
    except RuntimeError:
        return []


def _why_no_launch() -> str | None:
    if _NO_TRITON:
        return _NO_TRITON
    if not _cuda_devices():
        return "needs a CUDA GPU"
    if st.jax_triton is None:
        return f"jax-triton cannot launch here: {st._JAX_TRITON_UNUSABLE}"
    return None


_NO_LAUNCH = _why_no_launch()
needs_triton = pytest.mark.skipif(_NO_TRITON is not None, reason=_NO_TRITON or "")
on_gpu = [pytest.mark.gpu, pytest.mark.skipif(_NO_LAUNCH is not None, reason=_NO_LAUNCH or "")]

# Buffer dtypes the GPU tests cover: the common ones, both 1-byte integer
# signs, and bool (stored through a byte view).
DTYPES = ("float32", "bfloat16", "float16", "int32", "int8", "uint8", "bool")


# --------------------------------------------------------------------------
# CPU: import guard, ahead-of-time compilation, heuristics, validation.
# --------------------------------------------------------------------------


@pytest.mark.parametrize("missing", ["triton", "jax_triton"])
def test_import_without_triton_names_the_extra(monkeypatch, missing):
    # A None entry in sys.modules makes `import name` fail as if not installed.
    monkeypatch.setitem(sys.modules, missing, None)
    monkeypatch.delitem(sys.modules, _MODULE, raising=False)
    with pytest.raises(ImportError, match=re.escape('pip install "pallas-pinned[triton]"')):
        importlib.import_module(_MODULE)


def _stores(ptx: str) -> set[str]:
    """The store instructions of a PTX text, without predicates and operands."""
    found = set()
    for line in ptx.splitlines():
        words = [w for w in line.split() if not w.startswith("@")]
        if words and words[0].startswith("st.global"):
            found.add(words[0])
    return found


@needs_triton
@pytest.mark.parametrize(
    "shape, dtype, n, options, expected_store",
    [
        # 512-byte rows: whole rows per program, 16-byte vector stores.
        ((1000, 128), "float32", 300, {}, "st.global.v4.b32"),
        # 400-byte rows are 16-byte aligned too, even with a masked column tail.
        ((1000, 100), "float32", 37, {}, "st.global.v4.b32"),
        # Bool goes through a byte view: 64-byte rows, still 16-byte vectors.
        ((1000, 64), "bool", 300, {}, "st.global.v4.b32"),
        # 6-byte rows cannot vectorize; int64 rows and no src permutation.
        ((1000, 3), "bfloat16", 5, dict(rows_dtype=jnp.int64, has_src=False), "st.global.b16"),
        # The streaming cache operator reaches the store.
        ((1000, 128), "float32", 300, dict(store=dict(cache_modifier=".cs")),
         "st.global.cs.v4.b32"),
        # So does the eviction priority.
        ((1000, 128), "float32", 300, dict(store=dict(eviction_policy="evict_first")),
         "st.global.L1::evict_first.L2::cache_hint.v4.b32"),
        # float64 without bounds checks: two 8-byte lanes per store.
        ((1000, 128), "float64", 300, dict(check_bounds=False), "st.global.v2.b64"),
    ],
)
def test_kernel_compiles_for_sm90(shape, dtype, n, options, expected_store):
    options = dict(options)
    if "store" in options:  # The default tiling with one store setting changed.
        default = st.choose_triton_tiling(n, shape[1], jnp.dtype(dtype).itemsize)
        options["tiling"] = dataclasses.replace(default, **options.pop("store"))
    compiled = st.compile_for_target(shape, jnp.dtype(dtype), n, **options)
    stores = _stores(compiled.asm["ptx"])
    assert stores == {expected_store}, stores
    assert compiled.asm["cubin"], "ptxas produced no binary"


@needs_triton
def test_store_offsets_are_64_bit():
    # A buffer of 1000 rows would never overflow 32 bits; the offsets must be
    # 64-bit anyway, since the kernel is compiled without looking at sizes.
    ttir = st.compile_for_target((1000, 100), jnp.float32, 37).asm["ttir"]
    pointer_math = [line for line in ttir.splitlines() if "tt.addptr" in line]
    assert pointer_math
    for line in pointer_math:
        assert re.search(r"tensor<[0-9x]*xi64>", line), line


@needs_triton
@pytest.mark.parametrize(
    "n, d, itemsize",
    [
        (0, 128, 4),  # No updates: still a valid tiling.
        (1, 1, 4),  # One scalar.
        (5, 3, 2),  # Tiny rows, fewer updates than a block.
        (16_000_000, 1, 4),  # Many scalars: rows fill the tile.
        (1000, 1000, 4),  # Rows of 4000 bytes: one column block each.
        (1000, 100_000, 1),  # Rows wider than a column block.
        (3, 2**31, 1),  # Rows so wide that 65535 column programs need wider blocks.
    ],
)
def test_tiling_heuristic_within_limits(n, d, itemsize):
    tiling = st.choose_triton_tiling(n, d, itemsize)
    for size in (tiling.block_rows, tiling.block_cols, tiling.num_warps):
        assert size & (size - 1) == 0, tiling
    st._check_tiling(tiling, n, d)  # Raises if a CUDA or Triton limit is broken.
    assert tiling.block_rows <= max(1, 2 * n)  # No tile much taller than the work.


@needs_triton
@pytest.mark.parametrize(
    "tiling, message",
    [
        (dict(block_rows=3), "block_rows must be a positive power of two, got 3"),
        (dict(block_cols=0), "block_cols must be a positive power of two, got 0"),
        (dict(num_warps=3), "num_warps must be a power of two in \\[1, 32\\], got 3"),
        (dict(block_rows=1024, block_cols=2048), "tile 1024x2048"),
        (dict(cache_modifier=".ca"), "unknown cache_modifier '.ca'"),
        (dict(eviction_policy="evict_never"), "unknown eviction_policy 'evict_never'"),
        (dict(cache_modifier=".cs", eviction_policy="evict_first"), "cannot be combined"),
        (dict(block_cols=1), "exceeds CUDA's limits"),  # 100000 column programs.
    ],
)
def test_bad_tiling_raises_before_compiling(tiling, message):
    settings = dict(block_rows=4, block_cols=128, num_warps=4) | tiling
    with pytest.raises(ValueError, match=message):
        st.compile_for_target((8, 100_000), jnp.float32, 4, tiling=st.TritonTiling(**settings))


@needs_triton
@pytest.mark.parametrize(
    "shapes, error, message",
    [
        # x must already be flattened to rows.
        (dict(x=((4, 2, 3), "float32")), ValueError, r"x must be 2-D"),
        # Float rows are a caller bug, not something to cast.
        (dict(rows=((3,), "float32")), TypeError, r"rows must be 1-D int32 or int64"),
        # src is the int32 permutation from the sort.
        (dict(src=((3,), "int16")), TypeError, r"src must be None or int32"),
        # Updates narrower than x's rows would make the kernel read past them.
        (dict(updates=((3, 5), "float32")), ValueError, r"updates must be \(m, 6\) float32"),
        # Same element type: the kernel copies bits, it does not convert.
        (dict(updates=((3, 6), "float16")), ValueError, r"got float16\(3, 6\)"),
        # Without src, row k of updates goes to rows[k]: it must exist.
        (dict(src=None, updates=((2, 6), "float32")), ValueError, r"at least 3 rows, got 2"),
    ],
)
def test_bad_operands_raise(shapes, error, message):
    spec = dict(x=((10, 6), "float32"), rows=((3,), "int32"), src=((3,), "int32"),
                updates=((3, 6), "float32")) | shapes
    args = {name: None if s is None else jnp.zeros(s[0], s[1]) for name, s in spec.items()}
    with pytest.raises(error, match=message):
        st.scatter_rows_triton(args["x"], args["rows"], args["src"], args["updates"])


@needs_triton
def test_launch_without_cuda_jaxlib_says_why():
    if st.jax_triton is not None:
        pytest.skip("jax-triton is usable here; nothing to refuse")
    x, rows = jnp.ones((10, 4)), jnp.arange(3, dtype=jnp.int32)
    with pytest.raises(NotImplementedError, match="jax-triton cannot launch"):
        st.scatter_rows_triton(x, rows, None, jnp.ones((3, 4)))


# --------------------------------------------------------------------------
# GPU: the launcher against the oracle.
# --------------------------------------------------------------------------


def _sharding(memory_kind: str):
    return jax.sharding.SingleDeviceSharding(_cuda_devices()[0], memory_kind=memory_kind)


def _put(a, memory_kind: str = "device"):
    return jax.device_put(a, _sharding(memory_kind))


def _kernel_rows(rng, num_rows: int, n: int, *, markers: bool, dtype=np.int32) -> np.ndarray:
    """Unique in-range rows in random order, some replaced by skip markers.

    Markers are what the caller's normalization produces (one past the end,
    -1) plus the extremes of the index type, which a 32-bit bounds check
    would get wrong.
    """
    spec = ScatterSpec(num_rows, (1,), "float32", n, "random_unique")
    rows = make_indices(rng, spec).astype(dtype)
    if markers and n:
        info = np.iinfo(dtype)
        choices = np.array([num_rows, -1, info.max, info.min], dtype)
        where = rng.choice(n, max(1, n // 8), replace=False)
        rows[where] = rng.choice(choices, where.size)
    return rows


def _expected(x, rows, src, updates):
    # The kernel's contract in the oracle's terms: negative rows are skip
    # markers (the oracle would wrap them), so move them past the end.
    num_rows = x.shape[0]
    rows = np.where(rows < 0, num_rows, rows.astype(np.int64))
    picked = updates[: rows.size] if src is None else updates[src]
    return scatter_oracle(x, rows, picked)


def _scatter_jit(on_host: bool, **kernel_kwargs):
    def scatter(x, rows, src, updates):
        out = st.scatter_rows_triton(x, rows, src, updates, **kernel_kwargs)
        if on_host:
            # Like pallas_call, triton_call declares its result in device
            # memory; it is the aliased host buffer, so say where it lives.
            out = jax.device_put(out, jax.memory.Space.Host)
        return out

    return jax.jit(scatter, donate_argnums=0)


def _run_case(
    rng, memory_kind, dtype, num_rows, d, n, *,
    markers=True, with_src=True, rows_dtype=np.int32, **kernel_kwargs,
):
    """Scatters fresh random rows into a fresh random buffer; checks every row."""
    x_np = make_values(rng, (num_rows, d), dtype)
    m = n + 3  # More update rows than writes, so src must pick the right ones.
    updates_np = make_values(rng, (m, d), dtype)
    rows_np = _kernel_rows(rng, num_rows, n, markers=markers, dtype=rows_dtype)
    src_np = rng.permutation(m)[:n].astype(np.int32) if with_src else None
    x = _put(x_np, memory_kind)
    src = None if src_np is None else _put(src_np)
    out = _scatter_jit(memory_kind == "pinned_host", **kernel_kwargs)(
        x, _put(rows_np), src, _put(updates_np)
    )
    assert out.sharding.memory_kind == memory_kind
    assert_same(np.asarray(out), _expected(x_np, rows_np, src_np, updates_np))


@pytest.mark.parametrize("memory_kind", ["pinned_host", "device"])
class TestLauncherOnGpu:
    pytestmark = on_gpu

    @pytest.mark.parametrize("dtype", DTYPES)
    @pytest.mark.parametrize(
        "d",
        [
            1,  # One element per row: scalar stores only.
            3,  # Odd width: no vector stores, masked column tail.
            100,  # 400-byte f32 rows: vectors plus a masked tail in the column block.
            1000,  # A 1024-wide column block with a masked tail; many rows per tile.
        ],
    )
    def test_widths_and_dtypes(self, memory_kind, dtype, d):
        # 37 updates: off every power-of-two block size.
        _run_case(np.random.default_rng(d), memory_kind, dtype, 101, d, 37)

    @pytest.mark.parametrize(
        "n",
        [
            0,  # Nothing to write: no launch at all (CUDA refuses empty grids).
            1,  # A single row.
            5,  # Fewer rows than any block.
            37,  # Off the block size.
            4099,  # Large and off the block size: many programs.
        ],
    )
    @pytest.mark.parametrize("dtype", ["float32", "bool"])
    @pytest.mark.parametrize("d", [3, 100])
    def test_counts(self, memory_kind, n, dtype, d):
        _run_case(np.random.default_rng(n), memory_kind, dtype, 2 * n + 11, d, n)

    def test_without_src(self, memory_kind):
        # src None: updates row k goes to rows[k]; the rows fill src's slot.
        _run_case(np.random.default_rng(1), memory_kind, "float32", 300, 100, 97, with_src=False)

    def test_only_skip_markers_write_nothing(self, memory_kind):
        rng = np.random.default_rng(2)
        x_np = make_values(rng, (64, 10), "float32")
        rows = np.array([64, -1, 2**31 - 1, -(2**31), 65, 1000], np.int32)
        updates = make_values(rng, (6, 10), "float32")
        out = _scatter_jit(memory_kind == "pinned_host")(
            _put(x_np, memory_kind), _put(rows), None, _put(updates)
        )
        assert_same(np.asarray(out), x_np)

    def test_check_bounds_false_with_rows_in_range(self, memory_kind):
        _run_case(np.random.default_rng(3), memory_kind, "bfloat16", 500, 130, 203,
                  markers=False, check_bounds=False)

    def test_int64_rows(self, memory_kind):
        # x64 rows, with int64 extremes as skip markers.
        with jax.enable_x64(True):
            _run_case(np.random.default_rng(4), memory_kind, "float16", 300, 33, 77,
                      rows_dtype=np.int64)

    @pytest.mark.parametrize(
        "tiling",
        [
            (1, 1, 1, "", ""),  # One element per program: scalar stores everywhere.
            (8, 32, 4, "", ""),  # Several column programs, the last one partial (d=100).
            (64, 128, 8, ".cs", ""),  # Streaming stores.
            (64, 128, 8, ".cg", ""),  # Stores cached at L2 only.
            (64, 128, 8, ".wt", ""),  # Write-through stores.
            (64, 128, 8, "", "evict_first"),  # Eviction hints instead of a cache operator.
            (64, 128, 8, "", "evict_last"),
        ],
    )
    def test_explicit_tilings(self, memory_kind, tiling):
        _run_case(np.random.default_rng(5), memory_kind, "float32", 400, 100, 150,
                  tiling=st.TritonTiling(*tiling))


@pytest.mark.gpu
@pytest.mark.skipif(_NO_LAUNCH is not None, reason=_NO_LAUNCH or "")
def test_triton_types_match_jax_triton():
    # compile_for_target types pointers itself; it must agree with jax-triton.
    ours = st.TRITON_TYPES
    theirs = st.jax_triton.triton_lib._JAX_TO_TRITON_TYPE_MAP
    assert {t: theirs[t] for t in ours} == ours


@pytest.mark.gpu
@pytest.mark.skipif(_NO_LAUNCH is not None, reason=_NO_LAUNCH or "")
def test_pinned_buffer_beyond_2_31_elements():
    """Rows past element offset 2**31 (and byte offset 2**33) of an 8.7 GB pinned buffer."""
    num_rows, d = 2**24 + 5, 130
    fill = np.float32(7.0)  # Not zero: rows the kernel must not touch keep it.
    x = jax.jit(
        lambda: jnp.full((num_rows, d), fill, jnp.float32),
        out_shardings=_sharding("pinned_host"),
    )()
    boundary = 2**31 // d  # Row whose elements straddle offset 2**31.
    rows_np = np.array(
        [0, 1, 2**23, boundary - 1, boundary, boundary + 1, num_rows - 2, num_rows - 1,
         num_rows, -1],  # The last two are skip markers.
        np.int32,
    )
    rng = np.random.default_rng(6)
    updates_np = make_values(rng, (rows_np.size, d), "float32")
    src_np = rng.permutation(rows_np.size).astype(np.int32)
    out = _scatter_jit(True)(x, _put(rows_np), _put(src_np), _put(updates_np))
    host = np.asarray(out)
    written = rows_np[rows_np >= 0]
    written = written[written < num_rows]
    for k, row in enumerate(rows_np):
        if 0 <= row < num_rows:
            assert_same(host[row], updates_np[src_np[k]], what=f"row {row}")
    changed = np.flatnonzero((host != fill).any(axis=1))
    np.testing.assert_array_equal(changed, np.sort(written))


def _hlo_definition(hlo: str, name: str) -> str:
    """The HLO line that defines instruction ``name`` (names are unique per module)."""
    pattern = re.compile(r"^\s*(ROOT\s+)?" + re.escape(name) + r"\s*=")
    lines = [line for line in hlo.splitlines() if pattern.match(line)]
    assert len(lines) == 1, f"{name} defined {len(lines)} times in\n{hlo}"
    return lines[0]


@pytest.mark.gpu
@pytest.mark.skipif(_NO_LAUNCH is not None, reason=_NO_LAUNCH or "")
def test_hlo_one_custom_call_in_host_memory_no_copy():
    num_rows, d, n = 1000, 128, 300
    rng = np.random.default_rng(7)
    x = _put(make_values(rng, (num_rows, d), "float32"), "pinned_host")
    rows = _put(_kernel_rows(rng, num_rows, n, markers=True))
    src = _put(rng.permutation(n).astype(np.int32))
    updates = _put(make_values(rng, (n, d), "float32"))
    hlo = _scatter_jit(True).lower(x, rows, src, updates).compile().as_text()
    calls = [line for line in hlo.splitlines() if 'custom_call_target="triton_kernel_call"' in line]
    assert len(calls) == 1, hlo
    call = calls[0]
    in_host_memory = re.escape(f"f32[{num_rows},{d}]") + r"\{[^}]*S\(5\)"
    result, _, rest = call.partition("custom-call(")
    assert re.search(in_host_memory, result), call
    assert "output_to_operand_aliasing" in call, call
    # Operand 3 is the buffer. Compiled HLO may print operands without their
    # shapes, so look the operand up where it is defined.
    operands = re.findall(r"%[\w.\-]+", rest.partition("=")[0])  # Up to the first attribute.
    assert len(operands) == 4, call
    definition = _hlo_definition(hlo, operands[3])
    assert re.search(in_host_memory, definition), definition
    assert " copy(" not in definition, definition
    copies = re.findall(re.escape(f"f32[{num_rows},{d}]") + r"\{[^}]*\}\s+copy\(", hlo)
    assert not copies, hlo
    # And at run time: the result is the same host allocation.
    pointer = x.unsafe_buffer_pointer()
    out = _scatter_jit(True)(x, rows, src, updates)
    assert out.unsafe_buffer_pointer() == pointer


# --------------------------------------------------------------------------
# The public op with backend="triton", once the lead wires it in.
# --------------------------------------------------------------------------


def _scatter_to_host_triton(x, indices, updates, **kwargs):
    try:
        return scatter_to_host(x, indices, updates, backend="triton", **kwargs)
    except ValueError as err:
        if "unknown backend" in str(err):
            pytest.skip("backend='triton' is not wired into scatter_to_host yet")
        raise


def test_public_backend_triton_needs_cuda():
    if _cuda_devices():
        pytest.skip("a CUDA GPU is present; the refusal is for other platforms")
    x = jnp.ones((10, 3))
    # Without the extra the ImportError names it; with it, the platform is refused.
    expected = NotImplementedError if _NO_TRITON is None else ImportError
    with pytest.raises(expected, match="triton"):
        _scatter_to_host_triton(x, np.array([1, 2]), jnp.zeros((2, 3)))
    assert not x.is_deleted()  # Refused before anything ran.


@pytest.mark.gpu
@pytest.mark.skipif(_NO_LAUNCH is not None, reason=_NO_LAUNCH or "")
@pytest.mark.parametrize("memory_kind", ["pinned_host", "device"])
@pytest.mark.parametrize(
    "pattern, mode, index_shape",
    [
        ("random_unique", None, (300,)),  # The common case.
        ("random_dup25", None, (20, 15)),  # Duplicates, last wins; 2-D indices.
        ("sorted", None, (1200,)),  # Ascending, above the sort threshold.
        ("random_any", "drop", (257,)),  # Negative and out-of-range indices dropped.
        ("random_any", "clip", (257,)),  # ... or clipped.
        ("random_unique", None, (0,)),  # Nothing to write.
    ],
)
@pytest.mark.parametrize("dtype", ["float32", "bool"])
def test_public_op_backend_triton(memory_kind, pattern, mode, index_shape, dtype):
    rng = np.random.default_rng(8)
    row_shape = (2, 5)
    spec = ScatterSpec(2000, row_shape, dtype, int(np.prod(index_shape)), pattern)
    x_np = make_values(rng, (spec.num_rows,) + row_shape, dtype)
    indices = make_indices(rng, spec).reshape(index_shape)
    updates = make_values(rng, index_shape + row_shape, dtype)
    x = _put(x_np, memory_kind)
    out = _scatter_to_host_triton(x, _put(indices), _put(updates), mode=mode)
    assert out.sharding.memory_kind == memory_kind
    assert_same(np.asarray(out), scatter_oracle(x_np, indices, updates, mode=mode))


@pytest.mark.gpu
@pytest.mark.skipif(_NO_LAUNCH is not None, reason=_NO_LAUNCH or "")
def test_public_op_backend_triton_inside_jit_donated():
    rng = np.random.default_rng(9)
    x_np = make_values(rng, (500, 64), "bfloat16")
    indices = rng.integers(-500, 500, size=(123,))
    updates = make_values(rng, (123, 64), "bfloat16")

    def run(x, i, u):
        return _scatter_to_host_triton(x, i, u)

    out = jax.jit(run, donate_argnums=0)(_put(x_np, "pinned_host"), _put(indices), _put(updates))
    assert out.sharding.memory_kind == "pinned_host"
    assert_same(np.asarray(out), scatter_oracle(x_np, indices, updates))
