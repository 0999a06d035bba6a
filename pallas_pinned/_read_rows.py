"""Reads of rows of a 2-D view of the buffer: XLA's, or a kernel family's.

Every read that is not a block copy reaches this module as ``x2d``
``(num_rows, d)`` and normalized ``rows`` (``(n,)``, skip markers past the end);
the result is ``(n, d)`` in device memory, zeros where a row is skipped.
"""

from __future__ import annotations

import functools

import jax.numpy as jnp
from jax import lax

from pallas_pinned import _host_xla, tuning
from pallas_pinned._families import kernels

__all__ = ["read_kernel", "read_reference"]


def read_reference(x2d, rows, *, ascending: bool = False, thresholds=None):
    """XLA's read (it takes the rows in any order: ``ascending`` and ``thresholds`` are
    the kernels' settings)."""
    return _host_xla.gather_rows(x2d, rows)


def read_kernel(x2d, rows, *, family: str, interpret: bool, ascending: bool,
                thresholds: tuning.Thresholds):
    """The kernel family's read on CUDA (on every platform under Pallas's
    interpreter); XLA's elsewhere."""
    kernel = functools.partial(_kernel_read, launch=kernels(family, interpret=interpret),
                               ascending=ascending, thresholds=thresholds)
    if interpret:
        return kernel(x2d, rows)
    return lax.platform_dependent(x2d, rows, cuda=kernel, default=read_reference)


def _kernel_read(x2d, rows, *, launch, ascending: bool, thresholds: tuning.Thresholds):
    num_reads = rows.shape[0]
    dest = None
    if not ascending and num_reads >= thresholds.sort_from:
        # Read in ascending address order (coalesced PCIe reads) and let the
        # kernel store each row straight at its place in the caller's order.
        rows, dest = lax.sort((rows, lax.iota(jnp.int32, num_reads)), num_keys=1)
    return launch.get(x2d, rows, dest)
