"""``gather_from_host``: ``x.at[index].get()`` read straight from host memory into the device."""

from __future__ import annotations

from typing import Any

import jax

from pallas_pinned import _front

__all__ = ["gather_from_host"]


def gather_from_host(
    x: jax.Array,
    indices: Any,
    *,
    mode: str | None = None,
    fill_value: Any = None,
    indices_are_sorted: bool = False,
    unique_indices: bool = False,
    backend: str = "auto",
) -> jax.Array:
    """Returns ``x.at[indices].get(mode=mode, fill_value=fill_value)``, in device memory.

    Built for ``x`` in ``pinned_host`` memory of a GPU: a contiguous block is
    one copy (XLA's DMA); other index forms become rows a kernel reads over
    PCIe straight from the host buffer into a device array, without copying
    the buffer. Large unsorted batches are read in ascending address order
    (the kernel stores each row back at its place in the caller's order).
    Any other ``x`` gets the same semantics through XLA.

    Args:
      x: the buffer, as for :func:`scatter_to_host` (one device, sharded
        along axis 0, or replicated).
      indices: any index form :func:`scatter_to_host` takes.
      mode: as jnp's ``get`` (jax 0.11.2 and 0.12): ``None`` (jnp's default,
        ``"promise_in_bounds"``) and ``"promise_in_bounds"`` give what XLA
        gives, i.e. negative indices wrap once and the rest are clamped into
        range, exactly like ``"clip"`` (the kernel never reads outside the
        buffer); ``"fill"`` and ``"drop"`` wrap negatives once and return
        ``fill_value`` for entries still out of range (a ``jax.ds`` window
        that does not fit is filled whole, as jnp does); ``"wrap"`` takes
        every index modulo its axis.
      fill_value: static scalar for ``"fill"``/``"drop"``, converted to
        ``x.dtype`` as jnp does. Default: NaN for floats, the minimum of
        signed and the maximum of unsigned integers, True for bool.
        Unused in the other modes, as in jnp, but checked in every mode (a
        string or a complex number is refused where jnp ignores it).
      indices_are_sorted: promise that the positions ascend, after negative indices wrap
        (skips the sort that coalesces reads; not used under ``"wrap"``). Only speed
        depends on it.
      unique_indices: accepted for parity with jnp; a read does not need it.
      backend: as for :func:`scatter_to_host`.

    Returns:
      The shape of ``x.at[indices].get()``, of ``x.dtype``, in device memory
      of ``x``'s device (replicated over the mesh for a sharded ``x``), even
      when ``x`` is on the host. ``x`` is not consumed.

    Raises:
      TypeError, IndexError, ValueError, NotImplementedError: for bad input,
        before anything runs. TypeError under ``jax.grad``/``jax.jvp`` with
        respect to a host ``x`` (a device ``x`` differentiates like jnp's
        gather); NotImplementedError under ``jax.vmap`` over a host ``x``
        (vmap over index arrays is folded into one read; over a block's start
        of a host ``x``, one copy per batch entry).
    """
    return _front.read(
        x, indices, mode=mode, fill_value=fill_value, indices_are_sorted=indices_are_sorted,
        unique_indices=unique_indices, backend=backend,
    )
