"""``triton_common.launch`` through jax-triton 0.4, traced and lowered for CUDA on CPU.

jax-triton 0.4 imports on a CPU jaxlib and compiles its kernel while
lowering; only the last step, handing the compiled kernel to jaxlib's CUDA
Triton plugin, needs a CUDA jaxlib. A stand-in for that plugin records what
it is given, so on CPU these tests see the whole 0.4 launch: the in-place
buffer passed once, as a Ref, in pinned host memory and aliased to the
custom call's result; the kernel jax-triton compiles being the one
``compile_for_target`` compiles. Two workarounds, both of the installed
pair and not of this backend: jax-triton 0.4.1's dead-code rule does not fit
jax 0.12's (``keep_unused=True`` keeps jit from calling it), and the 0.3.1
launch cannot be traced here (0.3.1 does not import without CUDA); it runs
in the GPU tests.
"""

from __future__ import annotations

import re
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.helpers import JAX_TRITON_MISSING, no_triton

_NO_TRITON = no_triton()
if _NO_TRITON is None:
    from pallas_pinned.kernels import gather_triton as gt
    from pallas_pinned.kernels import scatter_add_triton as at
    from pallas_pinned.kernels import scatter_triton as st
    from pallas_pinned.kernels import triton_common as tc

try:
    import jax_triton
except ImportError:  # Missing, or 0.3.1 on a jaxlib without CUDA.
    jax_triton = None


def _why_skip() -> str | None:
    if _NO_TRITON is not None:
        return _NO_TRITON
    if jax_triton is None:
        try:
            tc.check_installed()
        except ImportError:
            return JAX_TRITON_MISSING
        return "jax-triton is installed but does not import here (0.3.1 needs CUDA)"
    return None


pytestmark = pytest.mark.skipif(_why_skip() is not None, reason=_why_skip() or "")
_OPS = {"scatter": (lambda: st.scatter_rows_triton, lambda: st.plan_scatter_rows),
        "add": (lambda: at.scatter_add_rows_triton, lambda: at.plan_scatter_add_rows)}


def test_triton_types_match_jax_triton():
    # compile_for_target types pointers itself; it must agree with jax-triton.
    theirs = jax_triton.triton_lib._JAX_TO_TRITON_TYPE_MAP
    assert {t: theirs[t] for t in tc.TRITON_TYPES} == tc.TRITON_TYPES


class _Plugin:
    """Stands in for jaxlib's CUDA Triton plugin; keeps the kernels it is handed."""

    def __init__(self):
        self.kernels = []

    def TritonKernel(self, *args):  # noqa: N802 (the plugin's name)
        self.kernels.append(args)
        return args

    def TritonKernelCall(self, kernel, *grid_and_params):  # noqa: N802
        return types.SimpleNamespace(to_proto=lambda name, metadata: name.encode())

    @staticmethod
    def get_compute_capability(device):
        return 90  # An H100/H200, as compile_for_target's default.

    @staticmethod
    def create_array_parameter(zeroed_bytes, alignment):
        return ("array", alignment)

    @staticmethod
    def create_scalar_parameter(value, dtype):
        return ("scalar", value)


@pytest.fixture
def plugin(monkeypatch):
    """Lets ``launch`` use the installed jax-triton 0.4 with a recording plugin."""
    if tuple(jax_triton.__version_info__[:2]) != (0, 4):
        pytest.skip(f"checks jax-triton 0.4; {jax_triton.__version__} is installed")
    stand_in = _Plugin()
    monkeypatch.setattr(jax_triton.triton_lib, "triton_kernel_call_lib", stand_in)
    monkeypatch.setattr(tc, "jax_triton", jax_triton)
    monkeypatch.setattr(tc, "JAX_TRITON_UNUSABLE", None)
    monkeypatch.setattr(tc, "INSTALLED_SERIES", (0, 4))
    return stand_in


def _host(array):
    return jax.device_put(array, jax.memory.Space.Host)


def _lower(function, *args, donate: bool = True):
    jitted = jax.jit(function, donate_argnums=0 if donate else (), keep_unused=True)
    return jitted.trace(*args).lower(lowering_platforms=("cuda",)).as_text()


def _custom_calls(module: str) -> list[str]:
    return [line for line in module.splitlines() if "custom_call @triton_kernel_call" in line]


def _main_signature(module: str) -> str:
    return next(line for line in module.splitlines() if "func.func public @main" in line)


def _args(n=5, num_rows=20, d=8, dtype="float32"):
    x = _host(jnp.ones((num_rows, d), dtype))
    rows = jnp.arange(n, dtype=jnp.int32)
    return x, rows, jnp.arange(n, dtype=jnp.int32)[::-1], jnp.ones((n, d), dtype)


@pytest.mark.parametrize("op", list(_OPS))
def test_in_place_buffer_is_one_ref_aliased_in_host_memory(plugin, op):
    function, plan_of = (f() for f in _OPS[op])

    def run(x, rows, src, updates):
        return _host(function(x, rows, src, updates))

    args = _args()
    module = _lower(run, *args)
    (call,) = _custom_calls(module)
    # rows, src, updates, the placeholder (rows again) and the buffer.
    operands = re.search(r"\(([^)]*)\)", call.partition("triton_kernel_call_ffi")[2]).group(1)
    assert operands.split(", ") == ["%arg1", "%arg2", "%arg3", "%arg1", "%arg0"], call
    assert "operand_index = 4" in call, call  # The result is the buffer itself...
    signature = _main_signature(module)
    arg0 = signature.partition("%arg1")[0]
    # ... which stays in pinned host memory, donated to the result, no copy.
    assert 'mhlo.memory_kind = "pinned_host"' in arg0 and "tf.aliasing_output = 0" in arg0
    assert re.search(r'-> \(tensor<20x8xf32> \{[^}]*mhlo.memory_kind = "pinned_host"', signature)
    assert "stablehlo.copy" not in module and "MoveToDevice" not in module, module
    # The kernel jax-triton compiled is compile_for_target's, in the 0.4 signature.
    (kernel,) = plugin.kernels
    ours = tc.compile_for_target(plan_of((20, 8), "float32", 5), series=(0, 4))
    assert kernel[4] == ours.asm["ptx"]  # 0.4 hands jaxlib the PTX.


def test_the_ref_value_after_the_call_is_declared_in_device_memory(plugin):
    # What a 0.4 call gives back: the Ref lives in host memory, but reading
    # it after the call yields a device-typed value (as 0.3.1's declared
    # output), which callers place back with device_put (see the test above).
    x, rows, src, updates = _args()
    jaxpr = jax.make_jaxpr(st.scatter_rows_triton)(x, rows, src, updates)
    text = str(jaxpr)
    assert re.search(r"Ref<MemorySpace\.Host>\{f32\[20,8\]\} = new_ref", text), text
    assert jax.typeof(x).memory_space == jax.memory.Space.Host
    (out,) = jaxpr.out_avals
    assert out.memory_space == jax.memory.Space.Device, out


def test_gather_reads_the_host_buffer_into_a_fresh_device_array(plugin):
    x, rows, dest, _ = _args()
    module = _lower(gt.gather_rows_triton, x, rows, dest, donate=False)
    (call,) = _custom_calls(module)
    assert "output_operand_aliases" not in call, call
    assert 'mhlo.memory_kind = "pinned_host"' in _main_signature(module).partition("%arg1")[0]
    (kernel,) = plugin.kernels
    ours = tc.compile_for_target(gt.plan_gather_rows((20, 8), "float32", 5), series=(0, 4))
    assert kernel[4] == ours.asm["ptx"]  # 0.4 hands jaxlib the PTX.


def test_nothing_to_do_launches_nothing(plugin):
    x, _, _, _ = _args()
    empty = jnp.zeros((0,), jnp.int32)
    jaxpr = str(jax.make_jaxpr(st.scatter_rows_triton)(x, empty, None, jnp.zeros((0, 8))))
    assert "triton_kernel_call" not in jaxpr, jaxpr
    no_rows = jnp.zeros((0, 8))
    out = jax.make_jaxpr(gt.gather_rows_triton)(no_rows, jnp.arange(3, dtype=jnp.int32))
    assert "triton_kernel_call" not in str(out) and out.out_avals[0].shape == (3, 8)
    assert plugin.kernels == []


def test_launch_refuses_operands_its_plan_did_not_compile(plugin):
    plan = st.plan_scatter_rows((20, 8), "float32", 5)
    x, rows, src, updates = _args()
    with pytest.raises(TypeError, match="are not"):
        tc.launch(plan, rows, src, updates.astype(jnp.float16), x)
    np.testing.assert_array_equal(np.asarray(x), 1)  # Nothing ran.
