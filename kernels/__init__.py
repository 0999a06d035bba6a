"""Kernel sources of pallas_pinned, shipped inside the wheel as ``pallas_pinned.kernels``.

Each kernel module holds one op of one family: the kernel body (refs, or Triton
pointers, plus keyword-only settings) and a builder that calls
``pl.pallas_call(..., name=...)`` or plans a ``triton_call``. Beside them:
``pallas_common`` and ``triton_common`` (+ ``triton_tiling``) with each family's
tiling and launch, ``owner_write`` (the Pallas add's write of a row), ``row_layout``
(skip markers, offset limits; no Pallas or Triton import) and ``triton_aot``
(ahead-of-time compiles for the tests).
Validation, index parsing and the public API live in ``pallas_pinned``; the Pallas
one-launch set and add apply the mode to the raw axis-0 index they are handed
themselves (the other kernels get normalized rows);
kernels trust the dtypes and shapes they are handed, but never write outside
the buffer unless told the caller promised the bounds.
"""
