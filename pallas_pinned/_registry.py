"""The implementations of each op, which one ``backend="auto"`` runs, and how kernels load.

Per op, :data:`IMPLEMENTATIONS` lists the mechanisms in the order ``auto``
tries them; the first that can serve the call runs, the others are fallen
through to (tokamax's registry is the model):

* ``"block"``: a contiguous block (``_index`` plan kind ``"block"``) is one
  copy, ``lax.dynamic_update_slice`` / ``dynamic_slice``: XLA's asynchronous
  DMA for a host buffer (the fact this library builds on: an aliased host
  buffer stays on the host, and XLA's own copy of a block into it is a DMA);
* ``"pallas"``, ``"triton"``: the row kernels (Pallas-Triton, or raw Triton
  through jax-triton), for a host buffer on a CUDA GPU. Between the two,
  ``backend_table.json`` decides (written by ``python -m
  benchmarks.choose_backends`` from the loop benchmark; the file names its
  source); each must also be importable and able to launch here;
* ``"xla_native"``: XLA's own formulation, ``x.at[rows].set(y)`` or
  ``.add(y)``; for a host buffer XLA compiles it to a GPU scatter kernel that
  stores into the buffer over PCIe, as ours do (it tags that kernel host
  compute but runs it on the GPU). ``auto`` runs it where the table
  measured it faster than the kernels (float32 sets and adds of rows known
  distinct, an entry's ``distinct_backend``; a table may also send unpromised
  sets there, after our de-duplication); a
  set's bits are the same (the last write wins), an add's sums too up to the
  rounding order of duplicates;
* ``"xla"``: the plain-jnp reference (``reference.py``, ``_host_xla.py``),
  always available: the base implementation, and ``backend="xla"``.

An explicit ``backend=`` names one kernel family and is honoured for every
index form, or refused before anything runs with the reason
(:func:`check_available`). :func:`kernels` is the one launcher per backend:
it imports that family's kernel modules on first use, so importing the package
imports no kernel module and not Triton (it does import Pallas and Pallas's
Triton backend, see ``__init__.py``; ``auto``'s first call on a host buffer
lowers a probe kernel: :func:`pallas_triton_usable`).

Upstream deprecated Pallas's Triton backend (jax 0.11.0) and jax can raise the
deprecation as an error (``jax._src.deprecations``' "accelerated" state); the
module may also disappear. Its warning fires when XLA lowers our kernels,
inside the user's own ``jit``: the package filters exactly that message, and
``auto`` follows the backend's fate itself: Pallas-Triton while it lowers,
else raw Triton, else XLA, with one warning that says what to install.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import json
import os
import pathlib
import re
import threading
import types
import warnings
from importlib import resources
from typing import Any

import jax
import jax.numpy as jnp

from pallas_pinned import _placement, _rows

__all__ = [
    "IMPLEMENTATIONS",
    "PALLAS_TRITON_DEPRECATION",
    "check_available",
    "choose",
    "kernels",
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
IMPLEMENTATIONS: dict[str, tuple[str, ...]] = {
    **{op: ("block", "pallas", "triton", "xla_native", "xla")
       for op in ("set", "add", "min", "max", "mul")},
    "get": ("block", "pallas", "triton", "xla"),  # A read has one XLA formulation.
}

# The kernel modules of each family, imported on first launch.
_FAMILIES = {
    "pallas": {
        "set": "scatter_pallas", "add": "scatter_add_pallas", "get": "gather_pallas",
        "order": "order_pallas",
    },
    "triton": {
        "set": "scatter_triton", "add": "scatter_add_triton", "get": "gather_triton",
    },
}


def _import_kernel(name: str):
    return importlib.import_module(f"pallas_pinned.kernels.{name}")


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
        _import_kernel("triton_common").check_can_launch()
    except (ImportError, NotImplementedError):  # Not installed, or cannot launch here.
        return False
    return True


def kernels(backend: str) -> types.SimpleNamespace:
    """The launchers of one kernel family, by op and path (None where the family has none).

    ``set``, ``set_fused``, ``add``, ``add_fused``, ``add_sorted``, ``order`` (a stable
    order of row numbers), ``get``, and
    ``atomic_write_allowed(dtype, acc_dtype)``: whether the family's adds take
    ``atomic_write=True`` for such a buffer.

    ``"interpret"`` is the Pallas family run by the Pallas interpreter.
    Imports the family's modules on first use (ImportError with the reason
    when they cannot be imported).
    """
    family = "pallas" if backend == "interpret" else backend
    modules = {op: _import_kernel(name) for op, name in _FAMILIES[family].items()}
    interpret = {"interpret": True} if backend == "interpret" else {}
    if family == "triton":
        return types.SimpleNamespace(
            set=modules["set"].scatter_rows_triton,
            set_fused=None,
            add=modules["add"].scatter_add_rows_triton,
            add_fused=None,
            add_sorted=None,
            order=None,
            get=modules["get"].gather_rows_triton,
            atomic_write_allowed=lambda dtype, acc_dtype: False,
        )
    return types.SimpleNamespace(
        set=functools.partial(modules["set"].scatter_rows, **interpret),
        set_fused=functools.partial(modules["set"].scatter_rows_fused, **interpret),
        add=functools.partial(modules["add"].scatter_add_rows, **interpret),
        add_fused=functools.partial(modules["add"].scatter_add_rows_fused, **interpret),
        add_sorted=functools.partial(modules["add"].scatter_add_sorted_runs, **interpret),
        order=functools.partial(modules["order"].stable_order, **interpret),
        get=functools.partial(modules["get"].gather_rows, **interpret),
        atomic_write_allowed=modules["add"].atomic_write_allowed,
    )


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
            _import_kernel("triton_common").check_installed()
        except ImportError as err:
            if platform == "gpu":
                raise
            raise ImportError(f"{err}; backend='triton' also {off_gpu}") from err
    if backend in ("pallas", "triton") and platform != "gpu":
        raise NotImplementedError(f"backend={backend!r} compiles a Triton kernel and {off_gpu}")


# Names a table to use instead of the shipped one: one that ``python -m
# benchmarks.choose_backends --out FILE`` wrote from a loop run on your own machine.
TABLE_ENV = "PALLAS_PINNED_BACKEND_TABLE"


@functools.cache
def _table() -> dict:
    """The table ``auto`` follows: ``$PALLAS_PINNED_BACKEND_TABLE``, else the shipped one.

    Read once per process, on the first ``auto`` call that consults it.
    """
    path = os.environ.get(TABLE_ENV)
    if not path:
        text = resources.files("pallas_pinned").joinpath("backend_table.json").read_text()
        return json.loads(text)
    try:
        table = json.loads(pathlib.Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise ValueError(
            f"${TABLE_ENV}={path!r} is not a readable backend table ({err}); write one with "
            f"python -m benchmarks.choose_backends --out FILE, or unset {TABLE_ENV}"
        ) from err
    if not isinstance(table, dict) or not isinstance(table.get("choices"), dict):
        raise ValueError(
            f"${TABLE_ENV}={path!r} has no 'choices': not a table written by "
            "python -m benchmarks.choose_backends"
        )
    return table


def measured_choice(op: str, dtype, num_entries: int, *, distinct: bool = False) -> str:
    """The implementation the table measured fastest: ``"pallas"``, ``"triton"`` or ``"xla"``.

    The table lists, per op and dtype, size classes by their largest entry
    count (``"size_classes"``); a call falls in the first class that holds it
    (the last one beyond, except that XLA's path is never taken beyond the
    measured classes). Where the table says nothing: ``"pallas"``. min,
    max and mul read and write rows as add does: they follow add's entries.
    ``distinct``: the rows are known distinct (``unique_indices=True``, or an index
    form that cannot repeat a row); an entry's ``"distinct_backend"`` then decides,
    where the table measured such rows apart (XLA's set path skips our
    de-duplication there, and its add is slow on rows that repeat).
    """
    table = _table()
    op = {"min": "add", "max": "add", "mul": "add", "get": "gather"}.get(op, op)
    entries = table["choices"].get(op, {}).get(str(jnp.dtype(dtype)), {})
    bounds = table.get("size_classes", [])
    bound = next((b for b in bounds if num_entries <= b), None)
    beyond = bound is None  # more entries than any measured class
    entry = entries.get(str(bounds[-1] if beyond and bounds else bound))
    if not entry:
        return "pallas"
    choice = entry.get("distinct_backend", entry["backend"]) if distinct else entry["backend"]
    if beyond and choice == "xla":
        # XLA's host path was measured up to the last class only, and XLA's own one-shot
        # add of 256 Ki and 4 Mi rows took 1.8x and 7.9x the kernels' time
        # (benchmarks.gather_add, 2026-12-03): the kernels serve beyond.
        return entry["backend"] if entry["backend"] != "xla" else "pallas"
    return choice


def _auto_kernel(op: str, dtype, num_entries: int, distinct: bool = False) -> str | None:
    """``"pallas"``, ``"triton"``, ``"xla_native"``, or None (no kernel runs) for ``auto``."""
    choice = measured_choice(op, dtype, num_entries, distinct=distinct)
    if choice == "xla" and _xla_path_serves(op, dtype) and xla_host_path_trusted():
        return "xla_native"
    if not pallas_triton_usable():
        return _without_pallas_triton()
    if choice == "triton" and raw_triton_usable():
        return "triton"
    return "pallas"


def _xla_path_serves(op: str, dtype) -> bool:
    """Whether XLA's own formulation gives what the kernels give, for a table's xla entry.

    Set: the same bits (our de-duplication runs first, the last write wins), at a cost
    that does not grow with duplicate indices. Add: the same sums up to the rounding
    order of duplicates, where XLA adds in our accumulator's dtype (float32; bfloat16
    sums would round at every step). min, max and mul follow add's entries but have no
    XLA formulation here. The table takes XLA's path only where it was also measured
    with the rows read back (XLA's path lost there in some cases), and for add only
    where a real client measured it too: XLA's add slowed tenfold on ids that repeat
    (``benchmarks.choose_backends``).
    """
    if op == "set":
        return True
    return op == "add" and _rows.add_accumulator_dtype(dtype) == jnp.dtype(dtype)


@functools.cache
def xla_host_path_trusted() -> bool:
    """Whether ``auto`` may take XLA's own path for a host buffer where the table says so.

    Only on the jax release the table was measured with: XLA's handling of
    dynamic indices into host memory changes between releases (older ones
    abort, 0.11 tags it host compute), so elsewhere it is unmeasured and the
    kernels serve. Never when XLA is told not to offload host compute
    (``--xla_disable_automatic_host_compute_offload``), which that path needs.
    """
    measured = str(_table().get("measured", {}).get("jax") or "")
    same_release = measured.split(".")[:2] == jax.__version__.split(".")[:2]
    flags = os.environ.get("XLA_FLAGS", "")
    disabled = re.search(r"xla_disable_automatic_host_compute_offload(=(true|1))?(\s|$)", flags)
    return same_release and not disabled


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


def choose(
    op: str, plan_kind: str, x: Any, num_entries: int, backend: str, *, block_copy: bool = False,
    distinct: bool = False,
) -> str:
    """The implementation that serves one traced call: a name of :data:`IMPLEMENTATIONS`.

    For an explicit kernel backend, that backend (its availability was
    checked up front); for ``"xla"``, ``"block"`` where the index is a block,
    else ``"xla"``. ``"auto"`` walks the op's list: a block copy for a block
    in device memory (or on a host buffer with ``block_copy``, the measured
    switch of :class:`tuning.Thresholds`); for a host buffer what the table
    measured fastest (a kernel that can run here, or XLA's own formulation);
    XLA otherwise. A kernel choice still runs XLA off CUDA
    (the caller wraps it in ``lax.platform_dependent``). ``distinct``: the rows are
    known distinct (:func:`measured_choice`).
    """
    if backend in KERNEL_BACKENDS:
        return backend
    host = _placement.on_host(x)
    block_ok = plan_kind == "block" and (backend == "xla" or not host or block_copy)
    for name in IMPLEMENTATIONS[op]:
        if name == "block" and block_ok:
            return name
        if name in ("pallas", "triton", "xla_native") and backend == "auto" and host:
            picked = _auto_kernel(op, x.dtype, num_entries, distinct)
            if picked is not None:
                return picked
        if name == "xla":
            return name
    raise AssertionError(f"no implementation of {op}")  # "xla" always serves.
