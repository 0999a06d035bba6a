"""``scatter_to_host``: ``x.at[index].set(updates)`` straight into a buffer in host memory."""

from __future__ import annotations

from typing import Any

import jax

from pallas_pinned import _front

__all__ = ["scatter_to_host"]


def scatter_to_host(
    x: jax.Array,
    indices: Any,
    updates: Any,
    *,
    mode: str | None = None,
    unique_indices: bool = False,
    indices_are_sorted: bool = False,
    backend: str = "auto",
) -> jax.Array:
    """Returns ``x.at[indices].set(updates, mode=mode)``.

    Built for ``x`` in ``pinned_host`` memory of a GPU: indices and updates
    stay in device memory and the data is written straight into the host
    buffer, which is never copied. A strided block (``kv[:, pos]``) that needs
    no run-time check is one copy (XLA's asynchronous DMA); other blocks and index
    forms become rows that a
    kernel stores over PCIe (or XLA's own scatter, where the backend table
    measured it faster). Any other ``x`` (device memory, CPU-only JAX) gets
    the same semantics through XLA.

    Args:
      x: the buffer, of any rank (a 0-d one takes ``()``, ``None`` or ``...``) and a
        supported dtype; on one device, or sharded along axis 0 over a mesh
        (``NamedSharding(mesh, P(axes))``), or replicated.
      indices: any index jnp's ``x.at[...]`` takes except boolean masks:
        ints, integer arrays of any shape (numpy or jax, traced under jit),
        lists of ints, static slices with any step, ``jax.ds(start, size)``
        with a static or traced start, ``Ellipsis``, ``None``, or a tuple of
        these, one per axis, with numpy's rules for advanced indexing. Integer
        values are compared at full width: an int64 index past the buffer is
        out of range, never truncated onto a real row.
      updates: broadcast to the shape of ``x.at[indices].get()`` and cast to
        ``x.dtype`` as jnp does (with its FutureWarning for lossy casts).
      mode: jnp's: ``None``, ``"drop"`` or ``"fill"`` (negative indices wrap
        once as in numpy; entries still out of range are skipped; a
        ``jax.ds`` window that does not fit is skipped whole), ``"clip"``,
        ``"promise_in_bounds"`` (axis-0 index arrays skip the bounds check: an
        out-of-range index writes outside the buffer; use only when you
        know); and ours, ``"wrap"``: every index modulo its axis, so a ring
        insert is ``at(x)[jax.ds(pos, n)].set(y, mode="wrap")``.
      unique_indices: promise that no index repeats, as written (skips
        de-duplication where that is safe).
      indices_are_sorted: promise that the indices ascend, as written (skips the
        sort where that is safe); ``sort_indices`` gives such an order. Negative
        indices wrap as in jnp, so indices distinct or sorted as written may name
        one row twice or descend: of a signed index type the promises are used only
        where the kernel checks that no index is negative. Under ``"clip"`` and
        ``"wrap"``, and for indices other than one array on axis 0, they are not
        used. A false promise can change only the rows the call names.
      backend: ``"auto"`` (on a host buffer of a CUDA GPU, the copy above
        for such a block, else the Pallas kernels, or the raw Triton ones where
        Pallas-Triton does not lower; XLA otherwise), ``"pallas"`` (the
        Pallas kernel, CUDA only), ``"triton"`` (the raw Triton kernel through
        jax-triton, CUDA only, needs the ``triton`` extra), ``"interpret"``
        (the Pallas kernel in interpret mode, any platform) or ``"xla"``.

    Returns:
      The updated buffer, with ``x``'s sharding and memory kind. Duplicates:
      the last occurrence (row-major over the index) wins. Outside ``jit``
      a buffer in host memory is updated in place and consumed, as if donated
      (unless the call is being transformed, e.g. by an eager ``jax.grad``, or
      ``jax_debug_nans``/``jax_debug_infs`` is on), and the call returns once the
      write is done; a device-memory ``x`` is never consumed, as in jnp;
      inside ``jit`` the enclosing ``donate_argnums`` decides (without
      donation XLA copies the buffer first).

    Raises:
      TypeError, IndexError, ValueError, NotImplementedError: for bad input,
        before anything runs; ``x`` is then left alive and unchanged. Under
        ``jax.grad`` with respect to ``x``: TypeError (with respect to
        ``updates`` it works); under ``jax.vmap``: NotImplementedError naming
        the folded alternative.
    """
    return _front.write(
        "set", x, indices, updates, mode=mode, unique_indices=unique_indices,
        indices_are_sorted=indices_are_sorted, backend=backend,
    )
