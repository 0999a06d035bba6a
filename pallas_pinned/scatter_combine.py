"""``scatter_min_to_host``, ``scatter_max_to_host``, ``scatter_mul_to_host``: jnp's others."""

from __future__ import annotations

from typing import Any

import jax

from pallas_pinned import _front

__all__ = ["scatter_max_to_host", "scatter_min_to_host", "scatter_mul_to_host"]

_DOC = """Returns ``x.at[indices].{method}(updates, mode=mode)``.

    The updates of one position are combined on the device first, in a fixed
    order ({combine}), then each distinct row is read once, combined with the
    update and written back (a kernel for a host buffer on a CUDA GPU: the
    gather kernel reads, the set kernel writes; a contiguous block too, as
    rows, or with ``tuning`` ``block_copy`` one read and one copy).
    Deterministic with duplicate indices.{rounding} Arguments,
    return value and errors as for :func:`scatter_to_host`, except that
    these ops are not differentiable (TypeError under ``jax.grad``){bool}.
    """


def _combining_op(op: str, name: str):
    def scatter_op(
        x: jax.Array, indices: Any, updates: Any, *, mode: str | None = None,
        unique_indices: bool = False, indices_are_sorted: bool = False, backend: str = "auto",
    ) -> jax.Array:
        return _front.write(
            op, x, indices, updates, mode=mode, unique_indices=unique_indices,
            indices_are_sorted=indices_are_sorted, backend=backend,
        )

    scatter_op.__name__ = scatter_op.__qualname__ = name
    return scatter_op


scatter_min_to_host = _combining_op("min", "scatter_min_to_host")
scatter_max_to_host = _combining_op("max", "scatter_max_to_host")
scatter_mul_to_host = _combining_op("mul", "scatter_mul_to_host")
scatter_min_to_host.__doc__ = _DOC.format(
    method="min", combine="jnp.minimum", rounding="", bool=""
)
scatter_max_to_host.__doc__ = _DOC.format(
    method="max", combine="jnp.maximum", rounding="", bool=""
)
scatter_mul_to_host.__doc__ = _DOC.format(
    method="multiply",
    combine="a product tree",
    rounding=(
        " Products of duplicates are formed first (in float32 for 16-bit floats) and "
        "applied once, so they can differ from jnp's sequential products in the last bits."
    ),
    bool="; a bool buffer is refused as for add",
)
