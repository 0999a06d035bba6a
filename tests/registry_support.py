"""What ``backend="auto"`` chooses, asked directly of ``_registry.choose``."""

from __future__ import annotations

import types

import jax

from pallas_pinned import _backend_table, _placement, _registry


def on_cuda(monkeypatch, table: dict | None = None):
    """``auto`` as on a CUDA GPU with Pallas-Triton (and ``table``, trusted, if given);
    returns ``chosen(op, x, num_entries, distinct=False, kind="axis0")``: the name of what
    :func:`_registry.choose` picks for such a call on ``x``."""
    if table is not None:
        monkeypatch.setattr(_backend_table, "_table", lambda: table)
        monkeypatch.setattr(_registry, "xla_host_path_trusted", lambda: True)
    monkeypatch.setattr(_registry, "_host_on_cuda", _placement.on_host)
    monkeypatch.setattr(_registry, "pallas_triton_usable", lambda: True)

    def chosen(op, x, num_entries, distinct=False, kind="axis0"):
        plan = types.SimpleNamespace(kind=kind, num_entries=num_entries, num_rows=x.shape[0],
                                     width=x.shape[-1])
        call = types.SimpleNamespace(op=op, plan=plan, backend="auto", unique=distinct,
                                     one_copy=False)
        return _registry.choose(call, x).name

    return chosen


def auto_kernel_family() -> str | None:
    """The kernel family ``auto`` runs for a host buffer on CUDA here, or None (XLA)."""
    for impl in (_registry.PALLAS, _registry.TRITON):
        if _registry._family_unavailable(impl.family, "set", "float32", 4096) is None:
            return impl.name
    return None


def picked(monkeypatch) -> list[str]:
    """The names of the implementations ``_registry.choose`` picks from now on.

    It is asked while a call is traced, and JAX keeps the trace of a call's rules (built
    once per frozen WriteCall) across jits: its caches are cleared first, so that an earlier
    test's call of the same signature does not answer for this one."""
    jax.clear_caches()
    names, real = [], _registry.choose

    def spy(call, x):
        impl = real(call, x)
        names.append(impl.name)
        return impl

    monkeypatch.setattr(_registry, "choose", spy)
    return names
