"""``triton_common.launch`` traced and lowered for CUDA on CPU, for each jax-triton series.

jax-triton compiles its kernel while lowering; only handing the compiled
kernel over needs jaxlib's CUDA Triton plugin. A stand-in for that plugin
records what it is given, so on CPU these tests see the whole launch of the
installed jax-triton: the in-place buffer staying in pinned host memory and
aliased to the custom call's result (0.3.1: as operand and output; 0.4: once,
as a Ref); the kernel jax-triton compiles being the one ``compile_for_target``
compiles. 0.3.1 refuses to import without CUDA, so its stand-in goes in
before the import, in a fresh process. Each series' tests skip where the
other is installed (the ``[triton]`` extra pins 0.3.1). With jax 0.12,
jax-triton 0.4.1's dead-code rule does not fit jax's: ``keep_unused=True``
keeps jit from calling it here (``triton_common`` refuses to launch there).
"""

from __future__ import annotations

import importlib.metadata
import json
import re
import subprocess
import sys
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
    from pallas_pinned.kernels import triton_aot
    from pallas_pinned.kernels import triton_common as tc

try:
    _INSTALLED = importlib.metadata.version("jax-triton")
except importlib.metadata.PackageNotFoundError:
    _INSTALLED = None


def _needs_series(series: str):
    """Skips unless jax-triton ``series`` is installed; 0.4's tests also carry the
    ``jax_triton_04`` marker: ``bash dev.sh test`` runs them in a second environment
    with that series (it cannot be installed beside the [triton] pair)."""
    skip = _skip_unless_series(series)
    if series != "0.4":
        return skip
    return lambda test: pytest.mark.jax_triton_04(skip(test))


def _skip_unless_series(series: str):
    if _NO_TRITON is not None:
        reason = _NO_TRITON
    elif _INSTALLED is None:
        reason = JAX_TRITON_MISSING
    elif not _INSTALLED.startswith(series + "."):
        reason = f"checks jax-triton {series}; {_INSTALLED} is installed"
    else:
        reason = None
    return pytest.mark.skipif(reason is not None, reason=reason or "")


pytestmark = pytest.mark.skipif(_NO_TRITON is not None, reason=_NO_TRITON or "")

# Lowers the three ops through jax-triton 0.3.1 with jaxlib's CUDA Triton
# plugin replaced by a recording stand-in; prints what it saw as JSON.
_LOWER_03 = r"""
import json, re
import jax, jax.numpy as jnp
from jax._src.lib import gpu_triton
compiled = []
class Call:
    def __init__(self, *args): pass
    def to_proto(self, name, metadata): return name.encode()
def kernel(*args):
    compiled.append(args)
    return args
stand_in = dict(
    get_compute_capability=lambda device: 90, get_serialized_metadata=lambda *a: b"",
    TritonKernel=kernel, TritonKernelCall=Call, TritonAutotunedKernelCall=Call,
    create_array_parameter=lambda *a: a, create_scalar_parameter=lambda *a: a)
for name, value in stand_in.items():
    setattr(gpu_triton, name, value)
import jax_triton
from pallas_pinned.kernels import gather_triton as gt, scatter_add_triton as at
from pallas_pinned.kernels import scatter_triton as st, triton_aot, triton_common as tc
host = lambda a: jax.device_put(a, jax.memory.Space.Host)
x = host(jnp.ones((20, 8), jnp.float32))
rows, updates = jnp.arange(5, dtype=jnp.int32), jnp.ones((5, 8))
theirs = jax_triton.triton_lib._JAX_TO_TRITON_TYPE_MAP
report = dict(series=tc.INSTALLED_SERIES, unusable=tc.JAX_TRITON_UNUSABLE,
              types_match={str(t): theirs[t] for t in tc.TRITON_TYPES} == {
                  str(t): n for t, n in tc.TRITON_TYPES.items()})
ops = dict(scatter=(st.scatter_rows_triton, st.plan_scatter_rows),
           add=(at.scatter_add_rows_triton, at.plan_scatter_add_rows),
           gather=(gt.gather_rows_triton, gt.plan_gather_rows))
for op, (function, plan) in ops.items():
    if op == "gather":
        traced = jax.jit(function).trace(x, rows, rows)
    else:
        run = lambda x, r, s, u, f=function: host(f(x, r, s, u))
        traced = jax.jit(run, donate_argnums=0).trace(x, rows, rows, updates)
    text = traced.lower(lowering_platforms=("cuda",)).as_text()
    call = next(l for l in text.splitlines() if "custom_call @triton_kernel_call" in l)
    main = next(l for l in text.splitlines() if "func.func public @main" in l)
    ptx = triton_aot.compile_for_target(plan((20, 8), "float32", 5), series=(0, 3)).asm["ptx"]
    report[op] = dict(
        operands=re.search(r"call\(([^)]*)\)", call).group(1).split(", "),
        aliases=re.findall(r"operand_index = (\d+)", call),
        arg0=main.partition("%arg1")[0], result=main.partition("->")[2],
        same_ptx=ptx in compiled[-1])
print(json.dumps(report))
"""


@_needs_series("0.3")
def test_jax_triton_03_launch_lowers_in_place_on_the_host_buffer():
    done = subprocess.run([sys.executable, "-c", _LOWER_03], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["series"] == [0, 3] and report["unusable"] is None, report
    # triton_aot types pointers itself; it must agree with jax-triton.
    assert report["types_match"], report
    for op in ("scatter", "add"):  # rows, src, updates, the buffer: aliased to the result.
        seen = report[op]
        assert seen["operands"] == ["%arg1", "%arg2", "%arg3", "%arg0"], seen
        assert seen["aliases"] == ["3"], seen
        assert 'mhlo.memory_kind = "pinned_host"' in seen["arg0"], seen
        assert "tf.aliasing_output = 0" in seen["arg0"], seen
        assert 'mhlo.memory_kind = "pinned_host"' in seen["result"], seen
    gather = report["gather"]
    assert gather["aliases"] == [] and 'memory_kind = "pinned_host"' in gather["arg0"], gather
    # What jax-triton compiled is what compile_for_target compiles.
    assert all(report[op]["same_ptx"] for op in ("scatter", "add", "gather")), report


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


_needs_04 = _needs_series("0.4")
_OPS = {"scatter": (lambda: st.scatter_rows_triton, lambda: st.plan_scatter_rows),
        "add": (lambda: at.scatter_add_rows_triton, lambda: at.plan_scatter_add_rows)}


@pytest.fixture
def plugin(monkeypatch):
    """Lets ``launch`` use the installed jax-triton 0.4 with a recording plugin."""
    import jax_triton

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


@_needs_04
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
    ours = triton_aot.compile_for_target(plan_of((20, 8), "float32", 5), series=(0, 4))
    assert kernel[4] == ours.asm["ptx"]  # 0.4 hands jaxlib the PTX.


@_needs_04
def test_triton_types_match_jax_triton_04(plugin):
    # triton_aot types pointers itself; it must agree with jax-triton.
    import jax_triton

    theirs = jax_triton.triton_lib._JAX_TO_TRITON_TYPE_MAP
    assert {t: theirs[t] for t in tc.TRITON_TYPES} == tc.TRITON_TYPES


@_needs_04
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


@_needs_04
def test_gather_reads_the_host_buffer_into_a_fresh_device_array(plugin):
    x, rows, dest, _ = _args()
    module = _lower(gt.gather_rows_triton, x, rows, dest, donate=False)
    (call,) = _custom_calls(module)
    assert "output_operand_aliases" not in call, call
    assert 'mhlo.memory_kind = "pinned_host"' in _main_signature(module).partition("%arg1")[0]
    (kernel,) = plugin.kernels
    ours = triton_aot.compile_for_target(gt.plan_gather_rows((20, 8), "float32", 5), series=(0, 4))
    assert kernel[4] == ours.asm["ptx"]  # 0.4 hands jaxlib the PTX.


@_needs_04
def test_nothing_to_do_launches_nothing(plugin):
    x, _, _, _ = _args()
    empty = jnp.zeros((0,), jnp.int32)
    jaxpr = str(jax.make_jaxpr(st.scatter_rows_triton)(x, empty, None, jnp.zeros((0, 8))))
    assert "triton_kernel_call" not in jaxpr, jaxpr
    no_rows = jnp.zeros((0, 8))
    out = jax.make_jaxpr(gt.gather_rows_triton)(no_rows, jnp.arange(3, dtype=jnp.int32))
    assert "triton_kernel_call" not in str(out) and out.out_avals[0].shape == (3, 8)
    assert plugin.kernels == []


@_needs_04
def test_launch_refuses_operands_its_plan_did_not_compile(plugin):
    plan = st.plan_scatter_rows((20, 8), "float32", 5)
    x, rows, src, updates = _args()
    with pytest.raises(TypeError, match="are not"):
        tc.launch(plan, rows, src, updates.astype(jnp.float16), x)
    np.testing.assert_array_equal(np.asarray(x), 1)  # Nothing ran.
