"""Which kernel backend ``backend="auto"`` runs, and upstream's Pallas-Triton deprecation.

Upstream deprecated Pallas's Triton backend (jax 0.11.0, no removal date) and
jax can raise that deprecation as an error (``jax._src.deprecations``'s
"accelerated" state). Its warning fires when XLA lowers our kernels, inside
the user's own ``jit``, where the user can do nothing about it: the package
filters exactly that message, and ``auto`` follows the backend's fate itself.
Pallas-Triton while it lowers; else the raw Triton kernels (jax-triton);
else XLA, with one warning that says what to install.
"""

from __future__ import annotations

import functools
import re
import warnings

import jax
import jax.numpy as jnp

__all__ = ["PALLAS_TRITON_DEPRECATION", "auto_kernel_backend", "pallas_triton_usable"]

# The start of upstream's message; tests pin it, so a change upstream shows.
PALLAS_TRITON_DEPRECATION = "The Pallas Triton backend is deprecated"

warnings.filterwarnings(
    "ignore", message=re.escape(PALLAS_TRITON_DEPRECATION), category=DeprecationWarning
)


def _copy_kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...]


@functools.cache
def pallas_triton_usable() -> bool:
    """Whether Pallas's Triton backend still lowers a kernel in this jax."""
    try:
        from jax.experimental import pallas as pl
        from jax.experimental.pallas import triton as plgpu
    except ImportError:
        return False  # Removed upstream.

    def copy(x):
        return pl.pallas_call(
            _copy_kernel,
            out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
            compiler_params=plgpu.CompilerParams(),
        )(x)

    spec = jax.ShapeDtypeStruct((8,), jnp.float32)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            jax.jit(copy).trace(spec).lower(lowering_platforms=("cuda",))
    except Exception as err:  # noqa: BLE001 - any failure to lower is the answer
        # The accelerated deprecation raises its own text. Anything else here
        # (no GPU to lower for on a CPU-only jaxlib) does not say the backend
        # is gone, and "auto" takes no kernel path off CUDA anyway.
        return PALLAS_TRITON_DEPRECATION not in str(err)
    return True


@functools.cache
def _raw_triton_usable() -> bool:
    try:
        from pallas_pinned.kernels import triton_common

        triton_common.check_can_launch()
    except (ImportError, NotImplementedError):  # Not installed, or cannot launch here.
        return False
    return True


@functools.cache
def auto_kernel_backend() -> str | None:
    """``"pallas"``, ``"triton"`` or ``None`` (XLA) for ``backend="auto"`` on CUDA."""
    if pallas_triton_usable():
        return "pallas"
    if _raw_triton_usable():
        warnings.warn(
            "Pallas's Triton backend is unavailable in this jax (removed, or its deprecation "
            "raised as an error); pallas_pinned's backend='auto' uses the raw Triton kernels "
            "(jax-triton) instead",
            RuntimeWarning,
            stacklevel=2,
        )
        return "triton"
    warnings.warn(
        "Pallas's Triton backend is unavailable in this jax and jax-triton is not installed; "
        "pallas_pinned's backend='auto' falls back to XLA, which is much slower for host "
        'buffers. pip install "pallas-pinned[triton]" restores the kernel path',
        RuntimeWarning,
        stacklevel=2,
    )
    return None
