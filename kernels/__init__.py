"""Kernel sources of pallas_pinned, shipped inside the wheel as ``pallas_pinned.kernels``.

Each module holds one kernel family in three layers: the kernel body (refs plus
keyword-only settings), a builder that calls ``pl.pallas_call(..., name=...)``,
and the tiling heuristics the builder uses. Validation, index normalization and
the public API live in ``pallas_pinned``; kernels trust what they are handed,
except that they never write outside the buffer unless told the caller promised
the bounds.
"""
