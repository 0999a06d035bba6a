"""What ``backend="auto"`` chooses, asked directly of ``_registry.choose``."""

from __future__ import annotations

import types

import jax

from pallas_pinned import _placement, _registry, tuning


def call_of(op, num_entries, *, distinct=False, sorted_=False, kind="axis0", mode=None,
            backend="auto", num_rows=64, width=4, thresholds=None):
    """A call's static description as ``_registry.choose`` reads it."""
    plan = types.SimpleNamespace(kind=kind, num_entries=num_entries, num_rows=num_rows,
                                 width=width, unique=False, ascending=False)
    row_mode = mode if kind == "axis0" and mode != "wrap" else "drop"
    return types.SimpleNamespace(
        op=op, plan=plan, mode=mode, row_mode=row_mode, backend=backend,
        promised_distinct=distinct, promised_sorted=sorted_, one_copy=False,
        thresholds=thresholds or tuning.current())


def on_cuda(monkeypatch):
    """``auto`` as on a CUDA GPU with Pallas-Triton; returns ``chosen(op, x, num_entries,
    distinct=False, kind="axis0")``: the name of what :func:`_registry.choose` picks for
    such a call on ``x``."""
    monkeypatch.setattr(_registry, "_host_on_cuda", _placement.on_host)
    monkeypatch.setattr(_registry, "pallas_triton_usable", lambda: True)

    def chosen(op, x, num_entries, distinct=False, kind="axis0"):
        call = call_of(op, num_entries, distinct=distinct, kind=kind, num_rows=x.shape[0],
                       width=x.shape[-1])
        return _registry.choose(call, x).name

    return chosen


def auto_kernel_family() -> str | None:
    """The kernel family ``auto`` runs for a host buffer on CUDA here, or None (XLA)."""
    for impl in (_registry.PALLAS, _registry.TRITON):
        if _registry._family_unavailable(impl.family) is None:
            return impl.name
    return None


def picked(monkeypatch) -> list[str]:
    """The names of the implementations ``_registry.choose`` picks from now on.

    It is asked while a call is traced, and JAX keeps the trace of a call's rules (built
    once per frozen WriteCall) across jits: its caches are cleared first, so that an earlier
    test's call of the same signature does not answer for this one."""
    jax.clear_caches()
    names, real = [], _registry.choose

    def spy(call, x, *args):
        plan = real(call, x, *args)
        names.append(plan.name)
        return plan

    monkeypatch.setattr(_registry, "choose", spy)
    return names
