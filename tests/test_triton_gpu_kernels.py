"""The raw Triton kernel functions on a CUDA GPU against numpy (marked ``gpu``).

The three functions of ``kernels/*_triton.py`` called directly inside
``jit`` on random data, in ``pinned_host`` and device memory: widths,
dtypes, counts, permutations, out-of-range rows, 64-bit types, explicit
tilings and cache settings, and a pinned buffer of more than 2**31
elements. The compiled HLO and the public ops are in
``test_triton_gpu_ops.py``; what runs without a GPU in the other
``test_triton_*.py`` files.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_pinned.testing import assert_same, make_values
from tests.helpers import cuda_devices, entry_rows, in_place_jit, why_no_triton_launch

_NO_LAUNCH = why_no_triton_launch()
if _NO_LAUNCH is None:
    from pallas_pinned.kernels import gather_triton as gt
    from pallas_pinned.kernels import scatter_add_triton as at
    from pallas_pinned.kernels import scatter_triton as st
    from pallas_pinned.kernels import triton_common as tc

on_gpu = [pytest.mark.gpu, pytest.mark.skipif(_NO_LAUNCH is not None, reason=_NO_LAUNCH or "")]


def _sharding(memory_kind: str):
    return jax.sharding.make_single_device_sharding(cuda_devices()[0], memory_kind=memory_kind)


def _put(a, memory_kind: str = "device"):
    return None if a is None else jax.device_put(a, _sharding(memory_kind))


def _in_range(row, num_rows: int) -> bool:
    return 0 <= int(row) < num_rows


def _poison_device_memory(nbytes: int) -> None:
    """Fills and frees device memory, so that a fresh output likely starts as 0xA5 bytes.

    A kernel that leaves output elements unwritten then shows garbage
    instead of the zeros a fresh allocation often happens to hold.
    """
    if nbytes:
        jax.device_put(np.full(nbytes, 0xA5, np.uint8), _sharding("device")).block_until_ready()


def _scatter_case(rng, memory_kind, dtype, num_rows, d, n, *, with_src=True, markers=True,
                  rows_dtype=np.int32, **kernel_kwargs):
    x_np = make_values(rng, (num_rows, d), dtype)
    m = n + 3  # More update rows than writes, so src must pick the right ones.
    updates_np = make_values(rng, (m, d), dtype)
    rows_np = entry_rows(rng, num_rows, n, distinct=True, markers=markers, dtype=rows_dtype)
    src_np = rng.permutation(m)[:n].astype(np.int32) if with_src else None
    expected = x_np.copy()
    for k, row in enumerate(rows_np):
        if _in_range(row, num_rows):
            expected[row] = updates_np[k if src_np is None else src_np[k]]
    run = in_place_jit(
        lambda x, r, s, u: st.scatter_rows_triton(x, r, s, u, **kernel_kwargs),
        memory_kind == "pinned_host",
    )
    out = run(_put(x_np, memory_kind), _put(rows_np), _put(src_np), _put(updates_np))
    assert out.sharding.memory_kind == memory_kind
    assert_same(np.asarray(out), expected)


def _gather_case(rng, memory_kind, dtype, num_rows, d, n, *, with_dest=True, markers=True,
                 rows_dtype=np.int32, **kernel_kwargs):
    x_np = make_values(rng, (num_rows, d), dtype)
    rows_np = entry_rows(rng, num_rows, n, distinct=False, markers=markers, dtype=rows_dtype)
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
    rows_np = entry_rows(rng, num_rows, n, distinct=True, markers=markers, dtype=rows_dtype)
    src_np = rng.permutation(m)[:n].astype(np.int32) if with_src else None
    acc = jnp.dtype(acc_dtype or dtype)  # A numpy dtype (ml_dtypes for bfloat16).
    expected = x_np.copy()
    for k, row in enumerate(rows_np):
        if _in_range(row, num_rows):
            addend = updates_np[k if src_np is None else src_np[k]]
            # One rounding, of the sum formed in acc; integer sums wrap.
            with np.errstate(over="ignore"):
                expected[row] = (x_np[row].astype(acc) + addend.astype(acc)).astype(x_np.dtype)
    run = in_place_jit(
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
        run = in_place_jit(function, memory_kind == "pinned_host")
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
    x = in_place_jit(st.scatter_rows_triton, True)(x, rows, src, _put(updates_np))
    x = in_place_jit(at.scatter_add_rows_triton, True)(x, rows, src, _put(addends_np))
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
