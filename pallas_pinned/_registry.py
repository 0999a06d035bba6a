"""What serves a call: the one function that decides, the plan it returns, the implementations.

Per op, :data:`IMPLEMENTATIONS` lists implementation objects in the order
``backend="auto"`` tries them; the first whose :meth:`~Implementation.unsupported`
has no objection runs (tokamax's registry is the model):

* :data:`BLOCK`: a block (``_index`` plan kind ``"block"``) as one copy,
  ``lax.dynamic_update_slice`` / ``dynamic_slice``: XLA's asynchronous DMA for a
  host buffer. Every block read; a block write of a device buffer; on a host buffer,
  a set of a strided block that needs no run-time check (``WriteCall.one_copy``).
  Other blocks are rows.
* :data:`PALLAS`, :data:`TRITON`: the row kernels (Pallas-Triton, or raw Triton
  through jax-triton), for a host buffer on a CUDA GPU; ``auto`` takes Pallas-Triton
  while it lowers, else raw Triton.
* :data:`REFERENCE`: the plain-jnp reference (``reference.py``), always available:
  the base implementation and ``backend="xla"``.

:func:`choose` returns a :class:`Plan`: the implementation and everything below it that
could vary: the path (one launch, rows, sorted runs...), its sorts and atomics, the promises
it may rely on, and whether a kernel falls back to the reference on another platform.
Nothing below it branches on the backend, the kernel family, the platform or a threshold.

An explicit ``backend=`` names its own list (``"xla"``: the block copy, else the
reference; a kernel family: that family alone) and is honoured, or refused with
the reason, by :func:`choose` before anything runs: never replaced by another.

Whether a family imports and lowers here is ``_availability``'s to say.
"""


from __future__ import annotations

import dataclasses
from typing import Any

import jax.numpy as jnp

from pallas_pinned import _placement, _rows
from pallas_pinned._availability import (  # noqa: F401 - re-exported: the ops' one handle
    PALLAS_TRITON_DEPRECATION,
    _without_pallas_triton,
    check_available,
    pallas_triton_importable,
    pallas_triton_usable,
    raw_triton_usable,
)
from pallas_pinned.kernels.row_layout import offsets_fit

__all__ = [
    "BACKENDS",
    "IMPLEMENTATIONS",
    "PALLAS_TRITON_DEPRECATION",
    "Implementation",
    "Plan",
    "check_available",
    "choose",
    "pallas_triton_usable",
    "promises",
]

KERNEL_BACKENDS = ("pallas", "triton", "interpret")
BACKENDS = ("auto", "xla", *KERNEL_BACKENDS)

# Entry numbers are int32 in the kernels' grids (and in XLA's row arithmetic here).
MAX_ENTRIES = 2**31 - 1


def too_many_entries(num_entries: int) -> str | None:
    """Why a call of ``num_entries`` index entries is refused on every backend (None: it
    is not)."""
    if num_entries <= MAX_ENTRIES:
        return None
    return (f"{num_entries} index entries are more than one call numbers (2**31 - 1 at "
            "most); split the call into calls of fewer entries")


@dataclasses.dataclass(frozen=True)
class Implementation:
    """One way to run a call; :func:`choose` asks :meth:`unsupported` and runs the first yes.

    ``kind``: ``"block"`` copies a block whole (``_block``), ``"reference"`` runs the
    plain-jnp rows, ``"kernels"`` a kernel family's rows (the paths :func:`choose` plans);
    any other kind is the name of the implementation's own path in ``_write_rows.PATHS``
    and ``_read_rows.PATHS``.
    """

    name: str
    kind: str = "reference"
    family: str | None = None  # the launchers' family (_families.kernels)
    interpret: bool = False  # Pallas's interpreter: any platform, backend="interpret" only
    # What the family has: one-launch set and add, the sorted-runs add, the order kernel,
    # and float32 atomic adds.
    one_launch: bool = False
    runs: bool = False

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
class _Kernels(Implementation):
    def unsupported(self, call, x, auto):
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
        return _family_unavailable(self.family)


def _kernels(name: str, family: str, *, interpret: bool = False) -> _Kernels:
    pallas = family == "pallas"
    return _Kernels(name, "kernels", family, interpret, one_launch=pallas, runs=pallas)


BLOCK = _Block("block", "block")
PALLAS = _kernels("pallas", "pallas")
TRITON = _kernels("triton", "triton")
INTERPRET = _kernels("interpret", "pallas", interpret=True)
REFERENCE = Implementation("xla")

IMPLEMENTATIONS: dict[str, tuple[Implementation, ...]] = {
    **{op: (BLOCK, PALLAS, TRITON, REFERENCE) for op in ("set", "add", "min", "max", "mul")},
    "get": (BLOCK, PALLAS, TRITON, REFERENCE),
}
_EXPLICIT = {
    "xla": (BLOCK, REFERENCE),
    "pallas": (PALLAS,),
    "triton": (TRITON,),
    "interpret": (INTERPRET,),
}


@dataclasses.dataclass(frozen=True)
class Plan:
    """Everything that runs for one call, decided by :func:`choose` alone.

    ``path`` names the code that runs (``_write_rows.PATHS``, ``_read_rows.PATHS``):

    * ``"block"``: one copy; ``"scalar"``: a rank-0 host buffer's one value;
    * ``"reference"``: the plain-jnp rows (``backend="xla"``, and ``auto`` off CUDA);
    * ``"set_one_launch"``, ``"add_one_launch"``: one kernel that normalizes the raw
      indices and finds duplicates itself (small batches);
    * ``"set_rows"``, ``"add_rows"``: normalized rows, duplicates resolved by XLA ops first
      when ``dedupe``, then one row kernel;
    * ``"add_runs"``: a stable order of the rows (``order``), then the sorted-runs kernel;
    * ``"combine"``: min, max, mul and new ops: read the distinct rows, combine, write back;
    * ``"get_rows"``: the gather kernel (after a locality sort when ``sort``).

    ``platforms``: where a program may be lowered for several platforms, the path each
    runs (``lax.platform_dependent``'s branches, ``"default"`` for the rest): a kernel
    path on CUDA, the reference elsewhere; the reference's set, XLA's scatter in entry
    order on the CPU (``"reference_in_order"``: the last duplicate wins there without a
    sort). Empty: ``path`` everywhere.
    """

    impl: Implementation
    path: str
    platforms: tuple[tuple[str, str], ...] = ()
    # The rows are distinct / ascending and the path relies on it (the promises as
    # :func:`promises` keeps them).
    unique: bool = False
    ascending: bool = False
    # One launch on rows promised distinct as written with a signed index type: the
    # kernel searches for duplicates only when some raw index is negative (it checks).
    unless_negative: bool = False
    dedupe: bool = False  # set rows: superseded entries dropped by a sort first
    sort: bool = False  # a locality sort (ascending PCIe addresses) before the kernel
    order: str | None = None  # add runs: "kernel" (one launch) or "sort" (XLA's)
    atomic: bool = False  # add: each row's total added with one float32 atomic
    check_bounds: bool = True  # the kernel masks rows outside the buffer

    @property
    def name(self) -> str:
        return self.impl.name


def choose(call: Any, x: Any, index_dtype: Any = None) -> Plan:
    """The plan that runs ``call`` on ``x``: the one place that decides.

    ``call`` is the call's frozen description (``op``, ``plan``, ``mode``, ``backend``,
    the promises, ``thresholds``); ``index_dtype`` is the axis-0 index array's type, if
    any. ``auto`` walks the op's :data:`IMPLEMENTATIONS`; an explicit backend walks its own
    list and raises NotImplementedError (with every reason) when none of it can serve.
    """
    too_many = too_many_entries(call.plan.num_entries)
    if too_many is not None:
        raise ValueError(too_many)
    impl = _implementation(call, x)
    if call.op != "get" and x.ndim == 0 and _placement.on_host(x):
        # JAX types a whole rank-0 array's replacement in device memory: computed there.
        return Plan(impl, "scalar")
    unique, ascending, unless_negative = promises(call, index_dtype)
    reference = _reference_platforms(call.op)
    if impl.kind == "reference":
        return Plan(impl, "reference", reference if len(reference) > 1 else (),
                    unique=unique, ascending=ascending)
    if impl.kind != "kernels":  # "block", or an implementation's own path
        return Plan(impl, impl.kind, unique=unique, ascending=ascending)
    # The one-launch kernels wrap negatives in the indices' own type, past normalize_rows:
    # refuse rows that type cannot number here, for every kernel path.
    _rows.check_rows_addressable(call.plan.num_rows)
    route = _ROUTES.get(call.op, _combine_route)
    plan = route(call, x, impl, unique=unique, ascending=ascending,
                 unless_negative=unless_negative)
    if impl.interpret:  # Pallas's interpreter runs on every platform.
        return plan
    return dataclasses.replace(plan, platforms=(("cuda", plan.path), *reference))


def _reference_platforms(op: str) -> tuple[tuple[str, str], ...]:
    """The reference's branches: on the CPU XLA's scatter applies duplicates in entry order
    (the last wins, as ours), so a set needs no sort there; elsewhere XLA promises no
    order."""
    if op == "set":
        return ("cpu", "reference_in_order"), ("default", "reference")
    return (("default", "reference"),)


def _implementation(call: Any, x: Any) -> Implementation:
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


# The modes under which unique_indices and indices_are_sorted are not used: "clip" and
# "wrap" may map distinct indices onto one row (0, n and 2n wrap onto row 0).
PROMISE_FREE_MODES = ("clip", "wrap")


def promises(call: Any, index_dtype: Any) -> tuple[bool, bool, bool]:
    """``(unique, ascending, unless_negative)``: what the promises let a path rely on.

    The promises describe the indices as the caller wrote them, and negative indices wrap
    as in jnp: sorted indices ``[-1, 0, 7]`` of 8 rows are rows ``[7, 0, 7]``, and the
    distinct ``[-1, 7]`` are one row. So they say something of the rows only for an
    axis-0 index array, outside "clip" and "wrap", and, for a signed index type, only
    where no index is negative: ``unless_negative`` asks a one-launch kernel to check
    that on the device; every other path does the work the promise would skip. The
    index form's own guarantees (``plan.unique``, ``plan.ascending``) hold of its rows.
    """
    plan = call.plan
    if call.op == "get":
        # A read's order changes only its speed: its locality sort is skipped.
        promised = call.promised_sorted and call.mode != "wrap"
        return False, promised or plan.ascending, False
    usable = plan.kind == "axis0" and call.mode not in PROMISE_FREE_MODES
    signed = index_dtype is not None and jnp.issubdtype(index_dtype, jnp.signedinteger)
    distinct = usable and call.promised_distinct
    ascending = (usable and call.promised_sorted and not signed) or plan.ascending
    unique = (distinct and not signed) or plan.unique
    return unique, ascending, distinct and signed and not unique


def _set_route(call, x, impl, *, unique, ascending, unless_negative) -> Plan:
    limits, n = call.thresholds, call.plan.num_entries
    if impl.one_launch and n <= limits.fused_max_updates:
        return Plan(impl, "set_one_launch", unique=unique, unless_negative=unless_negative)
    # Sorting turns scattered PCIe writes into ascending ones; it also drops duplicates.
    sort = not ascending and n >= limits.sort_from
    dedupe = not unique or sort
    # De-duplication marks superseded rows past the end: those must always be masked.
    check_bounds = dedupe or call.row_mode != "promise_in_bounds"
    return Plan(impl, "set_rows", unique=unique, ascending=ascending, dedupe=dedupe,
                check_bounds=check_bounds)


def _add_route(call, x, impl, *, unique, ascending, unless_negative) -> Plan:
    limits, n = call.thresholds, call.plan.num_entries
    atomic = (impl.family == "pallas" and n >= limits.atomic_add_from
              and jnp.dtype(x.dtype) == jnp.float32)
    # Hot rows make the one launch's duplicate sums long: rows that may repeat take it
    # for fewer updates.
    distinct = unique or unless_negative
    one_launch_max = limits.fused_max_updates if distinct else limits.fused_max_unpromised_adds
    if impl.one_launch and n <= one_launch_max:
        return Plan(impl, "add_one_launch", unique=unique, unless_negative=unless_negative,
                    atomic=atomic)
    repeats = not unique and n > 1
    sort = not ascending and n >= limits.sort_from
    if impl.runs and (repeats or sort):
        # A stable order makes each row's entries one run, summed in entry order.
        order = None
        if not ascending:
            order = "kernel" if n <= limits.order_kernel_max else "sort"
        return Plan(impl, "add_runs", unique=unique, ascending=ascending, order=order,
                    atomic=atomic)
    # A family without the runs kernel sums repeated rows on the device first
    # (dedupe), leaving skip markers that must always be masked.
    return Plan(impl, "add_rows", unique=unique, ascending=ascending, dedupe=repeats,
                atomic=atomic, check_bounds=repeats or call.row_mode != "promise_in_bounds")


def _combine_route(call, x, impl, *, unique, ascending, unless_negative) -> Plan:
    return Plan(impl, "combine", unique=unique, ascending=ascending)


def _get_route(call, x, impl, *, unique, ascending, unless_negative) -> Plan:
    sort = not ascending and call.plan.num_entries >= call.thresholds.sort_from
    return Plan(impl, "get_rows", ascending=ascending, sort=sort)


_ROUTES = {"set": _set_route, "add": _add_route, "get": _get_route}


def _host_on_cuda(x: Any) -> bool:
    return _placement.on_host(x) and _placement.platform_of(x) == "gpu"


def _family_unavailable(family: str) -> str | None:
    """Why ``auto`` does not run this kernel family here (None: it does)."""
    if pallas_triton_usable():
        return None
    if family == "pallas":
        return "Pallas's Triton backend does not lower in this jax"
    return None if _without_pallas_triton() == "triton" else "jax-triton cannot launch"
