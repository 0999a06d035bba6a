"""Row addressing facts every kernel family and the ops share, free of any kernel import.

The ops mark entries with :func:`skip_row` and ask :func:`offsets_fit` before
they pick a Pallas kernel; neither may import Pallas or Triton, so that the
package imports (and falls back to XLA) where those are gone.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["next_pow2", "offsets_fit", "skip_row"]


def next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def offsets_fit(shape: tuple[int, ...], dtype) -> bool:
    """Whether Pallas's Triton lowering computes correct offsets for ``shape``.

    It switches to 64-bit offsets only for arrays over 2**32 bytes and counts
    offsets in elements with signed arithmetic, so a 1-byte dtype between
    2**31 and 2**32 elements would wrap to negative offsets: outside the array.
    """
    size = math.prod(shape)
    return not (np.dtype(dtype).itemsize == 1 and 2**31 < size <= 2**32)


def skip_row(num_rows: int, dtype) -> int:
    """The row number that marks an entry as not to be touched.

    One past the end when the index type can hold it (every kernel masks it;
    interpret mode drops it), else -1: buffers of more rows than the type holds,
    which the ops refuse before they mark anything (``_rows.check_rows_addressable``).
    """
    return num_rows if num_rows <= np.iinfo(dtype).max else -1
