"""The raw Triton backend on a CUDA GPU: compiled HLO and the public ops (marked ``gpu``).

The kernel functions compile to one jax-triton custom call on the host
buffer (memory space S(5)), with no copy and, for the in-place ops, the
result aliased to the buffer; the public ops with ``backend="triton"`` really
take that path (checked in the HLO) and agree with the numpy oracles.
"""

from __future__ import annotations

import re

import jax
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
from tests.helpers import cuda_devices, entry_rows, in_place_jit, why_no_triton_launch

_NO_LAUNCH = why_no_triton_launch()
if _NO_LAUNCH is None:
    from pallas_pinned.kernels import gather_triton as gt
    from pallas_pinned.kernels import scatter_add_triton as at
    from pallas_pinned.kernels import scatter_triton as st

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(_NO_LAUNCH is not None, reason=_NO_LAUNCH or "")]


def _put(a, memory_kind: str = "device"):
    sharding = jax.sharding.make_single_device_sharding(cuda_devices()[0], memory_kind=memory_kind)
    return jax.device_put(a, sharding)


def _hlo_definition(hlo: str, name: str) -> str:
    """The HLO line that defines instruction ``name`` (names are unique per module)."""
    pattern = re.compile(r"^\s*(ROOT\s+)?" + re.escape(name) + r"\s*=")
    lines = [line for line in hlo.splitlines() if pattern.match(line)]
    assert len(lines) == 1, f"{name} defined {len(lines)} times in\n{hlo}"
    return lines[0]


# jax-triton 0.3's custom call target (0.4 renames it triton_kernel_call_ffi).
_TRITON_CALL = re.compile(r'custom_call_target="triton_kernel_call(_ffi)?"')


@pytest.mark.parametrize("op", ["scatter", "gather", "add"])
def test_hlo_one_custom_call_on_the_host_buffer_no_copy(op):
    num_rows, d, n = 1000, 128, 300
    rng = np.random.default_rng(9)
    x = _put(make_values(rng, (num_rows, d), "float32"), "pinned_host")
    rows = _put(entry_rows(rng, num_rows, n, distinct=True, markers=True))
    src = _put(rng.permutation(n).astype(np.int32))
    updates = _put(make_values(rng, (n, d), "float32"))
    if op == "gather":
        run, args, buffer_operand = jax.jit(gt.gather_rows_triton), (x, rows, src), 2
    else:
        function = st.scatter_rows_triton if op == "scatter" else at.scatter_add_rows_triton
        run, args, buffer_operand = in_place_jit(function, True), (x, rows, src, updates), 3
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


def _assert_takes_triton_path(function, *args):
    """The jitted op lowers to jax-triton's custom call: no silent fallback."""
    hlo = jax.jit(function).lower(*args).compile().as_text()
    assert _TRITON_CALL.search(hlo), hlo


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

