"""Whether each kernel family can run here: Pallas-Triton's import and lowering, jax-triton's
launch, and an explicit backend's check before anything runs.

Upstream deprecated Pallas's Triton backend (jax 0.11.0) and jax can raise the
deprecation as an error; the module may also disappear. ``auto`` follows the
backend's fate: Pallas-Triton while it lowers, else raw Triton, else XLA, with
one warning that says what to install.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import re
import threading
import warnings
from typing import Any

import jax
import jax.numpy as jnp

from pallas_pinned import _placement
from pallas_pinned._families import import_kernel

__all__ = [
    "PALLAS_TRITON_DEPRECATION",
    "check_available",
    "pallas_triton_importable",
    "pallas_triton_usable",
    "raw_triton_usable",
]

# The start of upstream's message; tests pin it, so a change upstream shows.
PALLAS_TRITON_DEPRECATION = "The Pallas Triton backend is deprecated"


def _ignore_upstreams_deprecation() -> None:
    warnings.filterwarnings(
        "ignore", message=re.escape(PALLAS_TRITON_DEPRECATION), category=DeprecationWarning
    )


_ignore_upstreams_deprecation()



@functools.cache
def pallas_triton_importable() -> str | None:
    """None when Pallas's Triton backend imports; else why not."""
    try:
        importlib.import_module("jax.experimental.pallas")
        importlib.import_module("jax.experimental.pallas.triton")
    except ImportError as err:
        return f"Pallas's Triton backend does not import in this jax ({err})"
    return None


def _copy_kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...]


@contextlib.contextmanager
def _without_upstreams_deprecation():
    """Upstream's deprecation hidden from the probe, even under a filter that shows every
    warning (pytest's capture, ``simplefilter("always")``), when no other thread runs:
    ``warnings.catch_warnings`` swaps the filters of the whole process, so beside other
    threads it would hide their warnings meanwhile. There only the module's filter
    hides it, so a filter that shows every warning shows it, once. (A thread started
    during the probe's few milliseconds would have that message hidden meanwhile.)"""
    if threading.active_count() > 1:
        yield
        return
    with warnings.catch_warnings():
        _ignore_upstreams_deprecation()
        yield


@functools.cache
def pallas_triton_usable() -> bool:
    """Whether Pallas's Triton backend imports and still lowers a kernel in this jax."""
    if pallas_triton_importable() is not None:
        return False
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import triton as plgpu

    def copy(x):
        return pl.pallas_call(
            _copy_kernel,
            out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
            compiler_params=plgpu.CompilerParams(),
        )(x)

    spec = jax.ShapeDtypeStruct((8,), jnp.float32)
    try:
        with _without_upstreams_deprecation():
            jax.jit(copy).trace(spec).lower(lowering_platforms=("cuda",))
    except Exception as err:  # noqa: BLE001 - any failure to lower is the answer
        # The accelerated deprecation raises its own text. Anything else here
        # (no GPU to lower for on a CPU-only jaxlib) does not say the backend
        # is gone, and "auto" takes no kernel path off CUDA anyway.
        return PALLAS_TRITON_DEPRECATION not in str(err)
    return True


@functools.cache
def raw_triton_usable() -> bool:
    try:
        import_kernel("triton_common").check_can_launch()
    except (ImportError, NotImplementedError):  # Not installed, or cannot launch here.
        return False
    return True


def check_available(facts: Any, backend: str, *arrays: Any) -> None:
    """An explicit kernel backend must be importable and able to run where the buffer is
    (``facts``: ``_placement.facts`` of it) and, for ``"interpret"``, on ``arrays``: the
    call's other inputs. Its limits on the call's shapes are ``_registry.choose``'s to
    check, at trace time, before anything runs."""
    if backend not in ("pallas", "triton", "interpret"):
        return
    if backend == "interpret":
        _check_interpret_invarying(facts.varying.union(*map(_placement.varying_axes, arrays)))
    if backend in ("pallas", "interpret"):
        reason = pallas_triton_importable()
        if reason is not None:
            raise NotImplementedError(
                f"backend={backend!r} needs Pallas's Triton backend, which is unavailable: "
                f"{reason}. Use backend='auto' (raw Triton or XLA) or backend='triton'"
            )
    platform = facts.platform
    off_gpu = (
        f"needs a CUDA GPU, but x is on {platform!r}; use backend='interpret' to run the "
        "Pallas kernel on CPU, or 'auto'"
    )
    if backend == "triton":
        # ImportError naming the extra when triton or jax-triton is missing, reported
        # before the platform; off a GPU it says that too, so that installing the extra
        # is not the whole fix it seems.
        try:
            import_kernel("triton_common").check_installed()
        except ImportError as err:
            if platform == "gpu":
                raise
            raise ImportError(f"{err}; backend='triton' also {off_gpu}") from err
    if backend in ("pallas", "triton") and platform != "gpu":
        raise NotImplementedError(f"backend={backend!r} compiles a Triton kernel and {off_gpu}")


def _check_interpret_invarying(varying: frozenset) -> None:
    """``"interpret"`` inside a ``shard_map`` that checks varying axes (the inputs vary
    along ``varying``): Pallas's interpreter mixes varying and invarying values, and JAX
    failed inside it ("Primitive gather requires varying manual axes to match")."""
    if varying:
        raise NotImplementedError(
            f"backend='interpret' cannot run on inputs that vary along the shard_map axes "
            f"{sorted(varying)} (a shard_map that checks varying axes): Pallas's interpreter "
            "mixes varying and invarying values. Pass check_vma=False to jax.shard_map, or "
            "use backend='xla' or 'auto'"
        )


@functools.cache
def _without_pallas_triton() -> str | None:
    if raw_triton_usable():
        warnings.warn(
            "Pallas's Triton backend is unavailable in this jax (removed, or its deprecation "
            "raised as an error); pallas_pinned's backend='auto' uses the raw Triton kernels "
            "(jax-triton) instead",
            RuntimeWarning,
            stacklevel=2,
        )
        return "triton"
    warnings.warn(
        "Pallas's Triton backend is unavailable in this jax and jax-triton cannot launch; "
        "pallas_pinned's backend='auto' falls back to XLA, which is much slower for host "
        'buffers. pip install -e ".[triton]" (in the clone) restores the kernel path',
        RuntimeWarning,
        stacklevel=2,
    )
    return None


