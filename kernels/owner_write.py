"""The one write of each row's owner in the Pallas add kernels: ``x + total``, rounded once.

The owner reads its row and stores ``x + total``. With ``atomic_write`` (float32
buffers summed in float32, see :func:`atomic_write_allowed`) it adds its total
with one atomic add instead: still one rounding of ``x + total`` per row, but
no PCIe read in the program's chain. A float32 atomic add on NVIDIA GPUs
flushes subnormal inputs and results to zero (the PTX ISA's
``atom.add.f32``; the cubin's ``.FTZ``), where the store keeps them, so only
rows whose totals are all finite and at least ``2**-102`` in magnitude take the
atomic; the others (a zero, tiny or non-finite total) are read and stored.
From ``2**-102`` on, half an ulp of the total exceeds every subnormal ``x``, and
a sum of it with any normal ``x`` is zero or normal, so both writes give the
same bits. Pallas's atomics are acquire-release, which costs more than the read
on small batches (``pallas_pinned.tuning`` ``atomic_add_from`` says from where
it pays). The Pallas interpreter cannot run masked atomics: interpret mode
makes the same choice of rows and does each atomic as a read and a store.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax.experimental.pallas import triton as plgpu

__all__ = [
    "ATOMIC_EXACT_FROM",
    "atomic_rows",
    "atomic_write_allowed",
    "check_atomic",
    "read_row",
    "write_total",
]


def atomic_write_allowed(dtype, acc_dtype) -> bool:
    """Whether the owners may add with one atomic: float32 summed in float32.

    The atomic adds the total in the buffer's type, so the sum must already be
    in it; float32 is the type it was measured with.
    """
    return jnp.dtype(dtype) == jnp.float32 and jnp.dtype(acc_dtype) == jnp.float32


def check_atomic(x, acc_dtype, atomic_write: bool, interpret: bool) -> str | None:
    """The kernels' ``atomic`` setting; raises where the atomic would change the bits.

    None: read and store; "atomic": the atomic add; "emulated" (interpret mode,
    whose interpreter has no masked atomics): the same rows' choice, each
    atomic done as a read and a store.
    """
    if atomic_write and not atomic_write_allowed(x.dtype, acc_dtype):
        raise ValueError(
            f"atomic_write needs a float32 buffer summed in float32, got {x.dtype} "
            f"summed in {jnp.dtype(acc_dtype)}"
        )
    if not atomic_write:
        return None
    return "emulated" if interpret else "atomic"


# The smallest total an atomic add may write: from here on it gives the store's
# bits (see the module's doc); below it, and for 0, inf and NaN, the element is
# read and stored.
ATOMIC_EXACT_FROM = 2.0**-102


def atomic_rows(total, mask):
    """``(rows, 1)``: the rows whose every written total the atomic adds exactly."""
    magnitude = jnp.abs(total)
    exact = (magnitude >= ATOMIC_EXACT_FROM) & (magnitude < jnp.inf)  # False for NaN.
    # One choice per row: a mask constant along the row keeps the atomics
    # 16-byte vectors (v4.f32), where a per-element one splits them up.
    return jnp.min((exact | ~mask).astype(jnp.int32), axis=1)[:, None] > 0


def write_total(x_out_ref, rows, cols, mask, total, current, *, atomic: str | None):
    """The owner's one write of ``x + total`` (``current`` is ``x``'s row, read before).

    With ``atomic``, ``current`` is None: the rows the atomic would flush are
    read here, after the total is known (few, or none).
    """
    at = (rows[:, None], cols[None, :])
    if atomic:
        row_exact = atomic_rows(total, mask)
        by_atomic = mask & row_exact
        if atomic == "emulated":
            before = plgpu.load(x_out_ref.at[at], mask=by_atomic, other=0)
            plgpu.store(x_out_ref.at[at], before + total.astype(x_out_ref.dtype), mask=by_atomic)
        else:
            plgpu.atomic_add(x_out_ref, at, total.astype(x_out_ref.dtype), mask=by_atomic)
        mask = mask & ~row_exact
        current = plgpu.load(x_out_ref.at[at], mask=mask, other=0)
    plgpu.store(x_out_ref.at[at],
                (current.astype(total.dtype) + total).astype(x_out_ref.dtype), mask=mask)


def read_row(x_out_ref, rows, cols, mask, *, atomic: str | None):
    """``x``'s rows for the store, or nothing when an atomic adds (see :func:`write_total`)."""
    if atomic:
        return None
    return plgpu.load(x_out_ref.at[rows[:, None], cols[None, :]], mask=mask, other=0)
