"""Which implementation serves a call: the one function that decides, and the implementations.

Per op, :data:`IMPLEMENTATIONS` lists implementation objects in the order
``backend="auto"`` tries them; the first whose :meth:`~Implementation.unsupported`
has no objection runs (tokamax's registry is the model):

* :data:`BLOCK`: a block (``_index`` plan kind ``"block"``) as one copy,
  ``lax.dynamic_update_slice`` / ``dynamic_slice``: XLA's asynchronous DMA for a
  host buffer. Every block read; a block write of a device buffer; on a host buffer,
  a set of a strided block that needs no run-time check (``WriteCall.one_copy``).
  Other blocks are rows.
* :data:`XLA_NATIVE`: XLA's own ``x.at[rows].set/.add`` of the normalized rows, for a
  host buffer on a CUDA GPU, where ``backend_table.json`` measured it faster than
  the kernels, on the GPU model and jax release the table was measured on.
* :data:`PALLAS`, :data:`TRITON`: the row kernels (Pallas-Triton, or raw Triton
  through jax-triton), for a host buffer on a CUDA GPU; between the two the table
  decides, and each must import and launch here.
* :data:`REFERENCE`: the plain-jnp reference (``reference.py``), always available:
  the base implementation and ``backend="xla"``.

An explicit ``backend=`` names its own list (``"xla"``: the block copy, else the
reference; a kernel family: that family alone) and is honoured, or refused with
the reason, by :func:`choose` before anything runs: never replaced by another.

Upstream deprecated Pallas's Triton backend (jax 0.11.0) and jax can raise the
deprecation as an error; the module may also disappear. ``auto`` follows the
backend's fate: Pallas-Triton while it lowers, else raw Triton, else XLA, with
one warning that says what to install.
"""


from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib
import re
import threading
import warnings
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from pallas_pinned import _placement, _read_rows, _write_rows
from pallas_pinned._backend_table import (  # noqa: F401 - TABLE_ENV and _table: the tests' handle
    TABLE_ENV,
    _table,
    measured_choice,
    xla_host_path_trusted,
    xla_path_serves,
)
from pallas_pinned._families import import_kernel
from pallas_pinned.kernels.row_layout import offsets_fit

__all__ = [
    "BACKENDS",
    "IMPLEMENTATIONS",
    "PALLAS_TRITON_DEPRECATION",
    "Implementation",
    "check_available",
    "choose",
    "measured_choice",
    "pallas_triton_usable",
]

# The start of upstream's message; tests pin it, so a change upstream shows.
PALLAS_TRITON_DEPRECATION = "The Pallas Triton backend is deprecated"


def _ignore_upstreams_deprecation() -> None:
    warnings.filterwarnings(
        "ignore", message=re.escape(PALLAS_TRITON_DEPRECATION), category=DeprecationWarning
    )


_ignore_upstreams_deprecation()


KERNEL_BACKENDS = ("pallas", "triton", "interpret")
BACKENDS = ("auto", "xla", *KERNEL_BACKENDS)

# Entry numbers are int32 in the kernels' grids.
MAX_KERNEL_ENTRIES = 2**31 - 1


@dataclasses.dataclass(frozen=True)
class Implementation:
    """One way to run a call; :func:`choose` asks :meth:`unsupported` and runs the first yes.

    ``block``: it copies a block whole (``_block``). Else it reads or writes the rows of a
    2-D view: ``write_rows(x2d, rows, updates2d, row_write)`` and
    ``read_rows(x2d, rows, *, ascending, thresholds)``.
    """

    name: str
    write_rows: Callable | None = None
    read_rows: Callable | None = None
    block: bool = False

    def unsupported(self, call: Any, x: Any, auto: bool) -> str | None:
        """Why this cannot serve ``call`` on ``x`` (None: it can). ``auto``: chosen by
        ``backend="auto"``, which also weighs speed; else named by the caller."""
        return None


@dataclasses.dataclass(frozen=True)
class _Block(Implementation):
    def unsupported(self, call, x, auto):
        if call.plan.kind != "block":
            return "the index is not a block"
        if auto and _placement.on_host(x) and not call.one_copy:
            return "on a host buffer this block is written as rows (WriteCall.one_copy)"
        return None


@dataclasses.dataclass(frozen=True)
class _XlaNative(Implementation):
    def unsupported(self, call, x, auto):
        if not _host_on_cuda(x):
            return "XLA's own path is measured for host buffers on CUDA only"
        if call.op not in ("set", "add") or not xla_path_serves(call.op, x.dtype):
            return f"XLA's own {call.op} would differ from ours"
        if measured_choice(call.op, x.dtype, call.plan.num_entries, distinct=call.unique) != "xla":
            return "the backend table measured the kernels faster"
        if not xla_host_path_trusted():
            return "the backend table was measured on another GPU or jax release"
        return None


@dataclasses.dataclass(frozen=True)
class _Kernels(Implementation):
    family: str = "pallas"  # the launchers' family (_families.kernels)
    interpret: bool = False  # Pallas's interpreter: any platform, backend="interpret" only

    def unsupported(self, call, x, auto):
        if call.plan.num_entries > MAX_KERNEL_ENTRIES:
            return (f"{call.plan.num_entries} entries are more than its int32 entry numbers "
                    f"reach ({MAX_KERNEL_ENTRIES}); split the call")
        if self.family == "pallas" and not self.interpret:
            for what, rows in (("x", call.plan.num_rows),
                               ("the rows read or written", call.plan.num_entries)):
                if not offsets_fit((rows, call.plan.width), x.dtype):
                    return (f"Pallas's 32-bit offsets cannot address {what} "
                            f"({rows} x {call.plan.width} {jnp.dtype(x.dtype)})")
        if not auto:
            return None
        if self.interpret:
            return "the interpreter serves backend='interpret' only"
        if not _host_on_cuda(x):
            return "the kernels serve host buffers on a CUDA GPU"
        return _family_unavailable(self.family, call.op, x.dtype, call.plan.num_entries)


def _kernels(name: str, family: str, *, interpret: bool = False) -> _Kernels:
    how = {"family": family, "interpret": interpret}
    return _Kernels(
        name, functools.partial(_write_rows.write_kernel, **how),
        functools.partial(_read_rows.read_kernel, **how), **how,
    )


BLOCK = _Block("block", block=True)
XLA_NATIVE = _XlaNative("xla_native", _write_rows.write_xla_native)
PALLAS = _kernels("pallas", "pallas")
TRITON = _kernels("triton", "triton")
INTERPRET = _kernels("interpret", "pallas", interpret=True)
REFERENCE = Implementation("xla", _write_rows.write_reference, _read_rows.read_reference)

IMPLEMENTATIONS: dict[str, tuple[Implementation, ...]] = {
    **{op: (BLOCK, XLA_NATIVE, PALLAS, TRITON, REFERENCE)
       for op in ("set", "add", "min", "max", "mul")},
    "get": (BLOCK, PALLAS, TRITON, REFERENCE),  # A read has one XLA formulation.
}
_EXPLICIT = {
    "xla": (BLOCK, REFERENCE),
    "pallas": (PALLAS,),
    "triton": (TRITON,),
    "interpret": (INTERPRET,),
}


def choose(call: Any, x: Any) -> Implementation:
    """The implementation that runs ``call`` on ``x``: the one place that decides.

    ``call`` is the call's frozen plan (``op``, ``plan``, ``backend``, ``unique``,
    ``one_copy``). ``auto`` walks the op's :data:`IMPLEMENTATIONS`; an explicit backend
    walks its own list and raises NotImplementedError (with every reason) when none of
    it can serve. A kernel chosen here still runs the reference off CUDA (a jit may be
    lowered for another platform: ``lax.platform_dependent``).
    """
    auto = call.backend == "auto"
    candidates = IMPLEMENTATIONS[call.op] if auto else _EXPLICIT[call.backend]
    reasons = []
    for impl in candidates:
        reason = impl.unsupported(call, x, auto)
        if reason is None:
            return impl
        reasons.append(f"{impl.name}: {reason}")
    raise NotImplementedError(
        f"backend={call.backend!r} cannot serve this call ({'; '.join(reasons)}); use "
        "backend='auto', which falls back to XLA, or backend='xla'"
    )


def _host_on_cuda(x: Any) -> bool:
    return _placement.on_host(x) and _placement.platform_of(x) == "gpu"


def _family_unavailable(family: str, op: str, dtype, num_entries: int) -> str | None:
    """Why ``auto`` does not run this kernel family here (None: it does)."""
    if not pallas_triton_usable():
        if family == "pallas":
            return "Pallas's Triton backend does not lower in this jax"
        return None if _without_pallas_triton() == "triton" else "jax-triton cannot launch"
    triton_measured_faster = (
        measured_choice(op, dtype, num_entries) == "triton" and raw_triton_usable()
    )
    if family == "pallas" and triton_measured_faster:
        return "the backend table measured raw Triton faster"
    return None

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


def check_available(x: Any, backend: str) -> None:
    """An explicit kernel backend must be importable and able to run where ``x`` is."""
    if backend in ("pallas", "interpret"):
        reason = pallas_triton_importable()
        if reason is not None:
            raise NotImplementedError(
                f"backend={backend!r} needs Pallas's Triton backend, which is unavailable: "
                f"{reason}. Use backend='auto' (raw Triton or XLA) or backend='triton'"
            )
    platform = _placement.platform_of(x)
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


