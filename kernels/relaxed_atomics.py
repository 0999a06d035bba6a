"""Relaxed atomics for the owner write of the Pallas add kernels (``tuning.relaxed_atomics``).

Pallas-Triton lowers every atomic as acquire-release. In the sm_90 cubin each
one is ``MEMBAR.ALL.GPU``, ``ATOMG`` (which returns the old value) and
``CCTL.IVALL``: the barrier waits until the thread's earlier accesses are
visible, PCIe ones included, so a thread's atomics into host memory go one
round trip after another. The owner write needs no ordering: one program
writes each row, and the kernel's end publishes its writes. Relaxed, the same
atomic compiles to ``REDG.E.ADD.F32x4`` (no barrier, nothing to wait for), the
instruction of XLA's own scatter-add (its emitter's atomics are monotonic).

Pallas offers no semantic for its atomics, so this module reaches into three
private hooks of JAX (present in jax 0.11.2, 0.12.0.1 and 0.12.1): Pallas's lowering
rules are keyed by the exact type of the compiler params
(``jax._src.pallas.core.register_lowering_rule``), so a subclass of
Pallas-Triton's ``CompilerParams`` gets a rule of its own, which lowers the
call as usual (``pallas_call_registration.pallas_call_lowering``) with a
context variable set; a wrapper installed around the Triton lowering's
``_atomic_rmw`` asks for relaxed semantics while the variable is set, and
changes nothing otherwise (other threads and other Pallas calls included).
:func:`compiler_params` installs both on first use and raises, naming the
setting to turn off, where the hooks are missing.
"""

from __future__ import annotations

import contextvars
import dataclasses
import functools

from jax.experimental.pallas import triton as plgpu

__all__ = ["RelaxedAtomicsParams", "compiler_params"]

_RELAXED = contextvars.ContextVar("pallas_pinned_relaxed_atomics", default=False)


@dataclasses.dataclass(frozen=True)
class RelaxedAtomicsParams(plgpu.CompilerParams):
    """Pallas-Triton's compiler params, for a call whose atomics are relaxed."""


@functools.cache
def _install() -> None:
    try:
        from jax._src.lib.triton import dialect as tt_dialect
        from jax._src.pallas import core as pallas_core
        from jax._src.pallas.triton import lowering
        from jax._src.pallas.triton import pallas_call_registration as registration

        original = lowering._atomic_rmw
        relaxed = tt_dialect.MemSemantic.RELAXED
        lower_call = registration.pallas_call_lowering
        register = pallas_core.register_lowering_rule
    except (ImportError, AttributeError) as err:
        raise NotImplementedError(
            f"relaxed atomics need private hooks of this jax's Pallas-Triton lowering ({err}); "
            "turn them off with pallas_pinned.tuning.override(relaxed_atomics=False)"
        ) from err

    @functools.wraps(original)
    def atomic_rmw(*args, **kwargs):
        if _RELAXED.get():
            if len(args) > 4:  # (op, ptr, val, mask, semantic, ...)
                args = (*args[:4], relaxed, *args[5:])
            else:
                kwargs["semantic"] = relaxed
        return original(*args, **kwargs)

    def lower_relaxed(ctx, *in_nodes, **params):
        token = _RELAXED.set(True)
        try:
            return lower_call(ctx, *in_nodes, **params)
        finally:
            _RELAXED.reset(token)

    lowering._atomic_rmw = atomic_rmw
    register(RelaxedAtomicsParams, lower_relaxed, "gpu")


def compiler_params(*, relaxed: bool, **settings) -> plgpu.CompilerParams:
    """Pallas-Triton's compiler params with ``settings``; relaxed atomics if ``relaxed``."""
    if not relaxed:
        return plgpu.CompilerParams(**settings)
    _install()
    return RelaxedAtomicsParams(**settings)
