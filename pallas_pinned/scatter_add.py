"""``scatter_add_to_host``: ``x.at[index].add(updates)`` on a buffer in host memory."""

from __future__ import annotations

from typing import Any

import jax

from pallas_pinned import _front

__all__ = ["scatter_add_to_host"]


def scatter_add_to_host(
    x: jax.Array,
    indices: Any,
    updates: Any,
    *,
    mode: str | None = None,
    unique_indices: bool = False,
    indices_are_sorted: bool = False,
    backend: str = "auto",
) -> jax.Array:
    """Returns ``x.at[indices].add(updates, mode=mode)``.

    Built for ``x`` in ``pinned_host`` memory of a GPU: updates of the same
    position are summed first, in a fixed order, so the result is
    deterministic; then a kernel reads each distinct row once over PCIe, adds,
    and writes it back into the host buffer, which is never copied (a
    contiguous block too, as rows known distinct; with ``tuning``
    ``block_copy`` it is one read and one copy back). Pallas sums them in the
    kernel, in entry order: small batches (up to ``tuning``
    ``fused_max_unpromised_adds`` updates, or ``fused_max_updates`` for rows known
    distinct) in one launch that finds the duplicates itself, larger ones in
    one launch over the runs of a stable order. Raw Triton and XLA sum them on
    the device first (a stable order and a segmented scan). Any other ``x``
    gets the same arithmetic through XLA.

    Args:
      x: the buffer, as for :func:`scatter_to_host`; any supported dtype
        except bool (jnp's ``.add`` refuses bool too).
      indices, updates, mode, unique_indices, indices_are_sorted, backend:
        as for :func:`scatter_to_host` (``unique_indices`` is ignored with
        ``"clip"``, which can make positions repeat). A false promise gives
        unspecified values in the repeated rows only, as everywhere.

    Returns:
      The updated buffer, with ``x``'s sharding and memory kind. Rounding:
      the updates of one position are combined first, then added to the
      buffer's value once; jnp adds them to the buffer one after another. So
      with duplicate indices the result can differ from jnp's in the last
      bits, float32 included (float16/bfloat16 sums are formed in float32 and
      rounded once). Without duplicates it is jnp's, bit for bit. Integers
      wrap as in jnp. The order within a position is fixed, so repeated calls
      give the same bits. Outside ``jit`` ``x`` is consumed as for
      :func:`scatter_to_host`.

    Raises:
      As :func:`scatter_to_host`; TypeError for a bool buffer.
    """
    return _front.write(
        "add", x, indices, updates, mode=mode, unique_indices=unique_indices,
        indices_are_sorted=indices_are_sorted, backend=backend,
    )
