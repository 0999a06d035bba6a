"""Reads of rows of a 2-D view of the buffer: XLA's, or a kernel family's.

Every read that is not a block copy reaches this module as ``x2d``
``(num_rows, d)``, normalized ``rows`` (``(n,)``, skip markers past the end) and the
:class:`~pallas_pinned._registry.Plan` that ``_registry.choose`` made; the result is
``(n, d)`` in device memory, zeros where a row is skipped. :func:`read` runs the plan's
path (:data:`PATHS`), deciding nothing itself.
"""

from __future__ import annotations

import functools

import jax.numpy as jnp
from jax import lax

from pallas_pinned import _host_xla
from pallas_pinned._families import kernels

__all__ = ["PATHS", "read"]


def read(x2d, rows, *, plan):
    """``plan``'s path, or its branches per platform (``Plan.platforms``)."""
    def run(path):
        return functools.partial(PATHS[path], plan=plan)

    if not plan.platforms:
        return run(plan.path)(x2d, rows)
    branches = {platform: run(path) for platform, path in plan.platforms}
    return lax.platform_dependent(x2d, rows, **branches)


def _reference(x2d, rows, *, plan=None):
    """XLA's read: it takes the rows in any order."""
    return _host_xla.gather_rows(x2d, rows)


def _get_rows(x2d, rows, *, plan):
    """The gather kernel, after a sort for ascending PCIe addresses when ``plan.sort``."""
    dest = None
    if plan.sort:
        rows, dest = lax.sort((rows, lax.iota(jnp.int32, rows.shape[0])), num_keys=1)
    return kernels(plan.impl.family, interpret=plan.impl.interpret).get(x2d, rows, dest)


PATHS = {"reference": _reference, "get_rows": _get_rows}
