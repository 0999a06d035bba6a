"""Pallas-Triton kernels compiled ahead of time for the H200, without a GPU.

JAX lowers a Pallas-Triton call for a GPU it does not have when an abstract
mesh names the device kind; the lowering hands the kernel's Triton module to
XLA inside the custom call. This helper keeps that module and compiles it with
the installed ``triton`` for sm_90, down to PTX and the cubin (Triton's own
``ptxas``), so CPU tests can read what a Pallas kernel emits: its atomics, its
masked accesses, whether it compiles at all. (On the GPU, jaxlib compiles the
same module with the Triton it bundles.)
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import tempfile
from collections.abc import Callable, Iterator

import jax
from jax._src import mesh as mesh_lib
from jax._src.pallas.triton import pallas_call_registration as registration

H200 = "NVIDIA H200"


@contextlib.contextmanager
def _modules_kept() -> Iterator[list[str]]:
    """The Triton modules of the Pallas calls lowered inside the block, as text."""
    lower = registration.lowering.lower_jaxpr_to_triton_module
    kept: list[str] = []

    def keep(*args, **kwargs):
        result = lower(*args, **kwargs)
        kept.append(result.module.operation.get_asm())
        return result

    registration.lowering.lower_jaxpr_to_triton_module = keep
    try:
        yield kept
    finally:
        registration.lowering.lower_jaxpr_to_triton_module = lower


def triton_modules(fn: Callable, *specs, device_kind: str = H200) -> list[str]:
    """The Triton modules (text) of every Pallas call in ``jit(fn)(*specs)``, lowered for CUDA."""
    device = mesh_lib.AbstractDevice(device_kind=device_kind, num_cores=None, platform="cuda")
    mesh = mesh_lib.AbstractMesh(
        (1,), ("x",), axis_types=(jax.sharding.AxisType.Auto,), abstract_device=device
    )
    with _modules_kept() as kept, jax.sharding.use_abstract_mesh(mesh):
        jax.jit(fn).trace(*specs).lower(lowering_platforms=("cuda",))
    if not kept:
        raise AssertionError("no Pallas-Triton call was lowered")
    return kept


def compile_module(ttir: str, *, capability: int = 90, num_warps: int = 4):
    """Triton's compiled kernel for one module (``asm["ptx"]``, ``["cubin"]``)."""
    import triton
    from triton.backends.compiler import GPUTarget

    with tempfile.TemporaryDirectory() as work, triton.knobs.cache.scope():
        triton.knobs.cache.dir = work
        path = f"{work}/kernel.ttir"
        with open(path, "w") as f:
            f.write(ttir)
        return triton.compile(
            path, target=GPUTarget("cuda", capability, 32), options={"num_warps": num_warps}
        )


def sass(compiled) -> str:
    """The cubin's SASS, disassembled by the ``nvdisasm`` that ships with triton."""
    import triton

    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "nvdisasm")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(compiled.asm["cubin"])
        f.flush()
        return subprocess.run([tool, f.name], capture_output=True, text=True, check=True).stdout
