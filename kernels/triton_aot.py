"""The raw Triton kernels compiled ahead of time, for an NVIDIA target, without a GPU.

:func:`compile_for_target` compiles a :class:`~triton_common.TritonLaunch`
(an op's ``plan_*``) exactly as :func:`triton_common.launch` hands it to
jax-triton: the same pointer types for the jax-triton series, 16-byte pointer
alignment and compile-time settings. So the PTX and SASS the CPU tests and the
lab probes read are the launched kernel's. It needs triton alone, not
jax-triton: importing this module without triton raises the ImportError that
names the extra (:mod:`triton_common`'s guard).
"""

from __future__ import annotations

import functools
import tempfile

from triton.backends.compiler import GPUTarget

from .triton_common import (
    INSTALLED_SERIES,
    JAX_TRITON_SERIES,
    TRITON_TYPES,
    TritonLaunch,
    pointer_dtypes,
    triton,
)

__all__ = ["compile_for_target"]


def compile_for_target(
    plan: TritonLaunch, *, capability: int = 90, series: tuple[int, int] | None = None
):
    """Compiles ``plan``'s kernel ahead of time for an NVIDIA target; no GPU needed.

    Same signature, 16-byte pointer alignment and compile-time settings as
    :func:`triton_common.launch` hands jax-triton ``series`` (default: the
    installed one's, else 0.3), so what compiles here compiles there. Returns
    Triton's compiled kernel (``asm["ttir"]``, ``["ptx"]``, ``["cubin"]``),
    for tests and for reading the accesses it emits; compiled once per
    distinct plan.
    """
    series = series or INSTALLED_SERIES or JAX_TRITON_SERIES[0]
    if series not in JAX_TRITON_SERIES:
        raise ValueError(f"series must be one of {JAX_TRITON_SERIES}, got {series}")
    pointers = pointer_dtypes(plan, series)
    names = plan.kernel.arg_names
    settings = names[len(pointers) :]
    if set(settings) != set(plan.constexprs):
        raise ValueError(
            f"{plan.name}: the kernel's parameters {names} do not match {len(pointers)} "
            f"pointers and the settings {sorted(plan.constexprs)}"
        )
    return _compile(
        plan.kernel, pointers, tuple(sorted(plan.constexprs.items())),
        plan.tiling.num_warps, capability,
    )


@functools.lru_cache(maxsize=256)
def _compile(kernel, pointer_types, constexprs, num_warps: int, capability: int):
    pointers = zip(kernel.arg_names, pointer_types, strict=False)  # Then the settings.
    signature = {name: "*" + TRITON_TYPES[t] for name, t in pointers}
    signature.update({name: "constexpr" for name, _ in constexprs})
    # jax-triton promises Triton every array is 16-byte aligned.
    attrs = {(i,): [["tt.divisibility", 16]] for i in range(len(pointer_types))}
    source = triton.compiler.ASTSource(
        fn=kernel, signature=signature, constexprs=dict(constexprs), attrs=attrs
    )
    # jax-triton blanks TRITON_CACHE_DIR on import, which stops triton.compile;
    # a throw-away cache keeps the user's cache out of it as well.
    with tempfile.TemporaryDirectory() as cache_dir, triton.knobs.cache.scope():
        triton.knobs.cache.dir = cache_dir
        return triton.compile(
            source,
            target=GPUTarget("cuda", capability, 32),
            # jax-triton 0.3.1 asks for FP fusion; 0.4 takes triton's default,
            # fusion on up to triton 3.9 (the kernels have no multiply-add anyway).
            options={"num_warps": num_warps, "num_stages": 1, "enable_fp_fusion": True},
        )
