"""Which kernel backend ``backend="auto"`` runs, and upstream's Pallas-Triton deprecation.

While both backends work, ``auto`` follows ``backend_table.json``: per op,
dtype and batch-size class, the backend measured faster on the H200, written
by ``python -m benchmarks.choose_backends`` from the loop benchmark's results
(the file names its source). Cases the table does not cover use Pallas.

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
import json
import re
import warnings
from importlib import resources

import jax
import jax.numpy as jnp

__all__ = [
    "PALLAS_TRITON_DEPRECATION",
    "auto_kernel_backend",
    "measured_choice",
    "pallas_triton_usable",
]

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
def _table() -> dict:
    text = resources.files("pallas_pinned").joinpath("backend_table.json").read_text()
    return json.loads(text)


def measured_choice(op: str, dtype, num_entries: int) -> str:
    """The backend the table measured faster for this call ("pallas" where it says nothing)."""
    table = _table()
    size = "small" if num_entries <= table["small_max_rows"] else "large"
    entry = table["choices"].get(op, {}).get(str(jnp.dtype(dtype)), {}).get(size)
    return entry["backend"] if entry else "pallas"


def auto_kernel_backend(op: str, dtype, num_entries: int) -> str | None:
    """``"pallas"``, ``"triton"`` or ``None`` (XLA) for ``backend="auto"`` on CUDA."""
    if not pallas_triton_usable():
        return _without_pallas_triton()
    if measured_choice(op, dtype, num_entries) == "triton" and _raw_triton_usable():
        return "triton"
    return "pallas"


@functools.cache
def _without_pallas_triton() -> str | None:
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
