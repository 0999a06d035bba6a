"""The measured thresholds the ops choose their paths by, and a way to override them.

Each threshold names the committed result it was chosen from: docs/PERFORMANCE.md,
"Thresholds", gives the figures and the result files (some in git history). Results
depend on them only in the last bits of float sums over repeated rows:
``fused_max_updates`` and ``fused_max_unpromised_adds`` choose which path sums them,
and the paths group the sums differently (each gives the same bits on every call).
The others change only speed. Benchmarks and tests switch a path through
:func:`override` instead of patching module globals.

The ops read :func:`current` when they are traced (an eager call is traced by
the op's own jit, so a changed setting compiles a new program there). A function
you jit yourself keeps the program of its first trace: to run it under other
settings, jit a new function inside the ``with`` block, or call
``jax.clear_caches()`` on entering and leaving it. An ``override`` holds in its
own thread and asyncio task (a context variable).

>>> from pallas_pinned import tuning
>>> with tuning.override(sort_from=0):   # always sort for locality
...     pass

A whole process can start from other defaults, set before ``pallas_pinned`` is
imported: ``PALLAS_PINNED_TUNING="atomic_add_from=0,sort_from=4096"``
(comma-separated ``name=value``). A bad entry raises ValueError at import,
naming the variable.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import os
from collections.abc import Iterator

__all__ = ["ENV", "Thresholds", "current", "override"]

ENV = "PALLAS_PINNED_TUNING"


@dataclasses.dataclass(frozen=True)
class Thresholds:
    """Batch sizes (in index entries) at which an op changes its path."""

    # Writes and reads of this many entries or more, not promised sorted, are sorted first,
    # so that they reach the bus in ascending address order. benchmarks/results/
    # tune_scatter_h200.log: unsorted and sorted random distinct rows tie near 16 Ki
    # updates; at 64 Ki sorting is 1.7-1.8x faster, and below 4 Ki the sort's fixed cost
    # loses. Adds and reads take the write's crossover (each moves a row over the same bus).
    sort_from: int = 16384
    # scatter_to_host, and scatter_add_to_host of rows promised or known distinct (Pallas):
    # up to this many updates, one launch normalizes the raw indices and finds duplicates
    # itself (its duplicate search grows as n**2) (docs/PERFORMANCE.md, "Thresholds").
    fused_max_updates: int = 4096
    # scatter_add_to_host (Pallas), rows that may repeat: the one launch up to this many
    # updates, beyond a stable order and the sorted-runs kernel. In the one launch a hot
    # row's owner sums its duplicates alone (docs/PERFORMANCE.md, "Thresholds").
    fused_max_unpromised_adds: int = 64
    # scatter_add_to_host (Pallas): up to this many entries the stable order is one Pallas
    # kernel (kernels/order_pallas.py) instead of XLA's sort (docs/PERFORMANCE.md,
    # "Thresholds").
    order_kernel_max: int = 4096
    # scatter_add_to_host (Pallas), float32 summed in float32: from this many updates on,
    # each row's owner adds its total with one atomic add instead of reading the row and
    # storing the sum (the same bits); below this the atomic lost (docs/PERFORMANCE.md,
    # "Thresholds").
    atomic_add_from: int = 1024

    def __post_init__(self):
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{field.name} must be a non-negative int, got {value!r}")


def _from_environment(text: str) -> Thresholds:
    """The defaults with ``$PALLAS_PINNED_TUNING``'s ``name=value`` entries applied."""
    fields = {field.name: field for field in dataclasses.fields(Thresholds)}
    changes = {}
    for entry in filter(None, (part.strip() for part in text.split(","))):
        name, sep, value = (s.strip() for s in entry.partition("="))
        if name in changes:
            raise ValueError(f"${ENV}: {name} is given twice")
        if not sep or name not in fields:
            raise ValueError(
                f"${ENV}: {entry!r} is not name=value with a name of "
                f"pallas_pinned.tuning.Thresholds ({', '.join(fields)})"
            )
        try:
            changes[name] = int(value)
        except ValueError:
            raise ValueError(f"${ENV}: {name} takes an int, got {value!r}") from None
    try:
        return Thresholds(**changes)
    except ValueError as err:  # A negative int.
        raise ValueError(f"${ENV}: {err}") from None


_DEFAULTS = _from_environment(os.environ.get(ENV, ""))
# A context variable, not a thread-local: asyncio tasks sharing a thread must not
# see each other's override.
_THRESHOLDS = contextvars.ContextVar("pallas_pinned_thresholds", default=_DEFAULTS)


def current() -> Thresholds:
    """The thresholds in force in this context (thread, asyncio task)."""
    return _THRESHOLDS.get()


@contextlib.contextmanager
def override(**changes) -> Iterator[Thresholds]:
    """Within the ``with`` block, calls of the ops use these thresholds.

    Unknown names raise ``TypeError``; negative or
    non-int thresholds raise ``ValueError``.
    """
    previous = current()
    names = [field.name for field in dataclasses.fields(Thresholds)]
    unknown = sorted(set(changes) - set(names))
    if unknown:
        raise TypeError(f"tuning.override: unknown setting(s) {', '.join(unknown)}; the "
                        f"settings are {', '.join(names)}")
    updated = dataclasses.replace(previous, **changes)
    token = _THRESHOLDS.set(updated)
    try:
        yield updated
    finally:
        try:
            _THRESHOLDS.reset(token)
        except ValueError:  # Left in another context (an async fixture's teardown task).
            _THRESHOLDS.set(previous)
