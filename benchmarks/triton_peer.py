"""The ``torch_triton_zerocopy`` peer: a raw Triton kernel launched from PyTorch.

It stores rows straight through a pinned tensor's ``data_ptr()`` (host-mapped
under UVA): what a hand-written kernel outside JAX gets. Importing this module
raises ImportError when triton is absent, which makes the peer "unavailable".

Triton compiles into its cache directory, ``triton.knobs.cache.dir``. In the
H200 sweep of 2026-12-02 every launch raised "Could not create or locate
cache dir" (34 error records): jax-triton deletes ``TRITON_CACHE_DIR`` from
the environment when it is imported, and triton's fallback was unusable
there. Before its first launch the peer now points the cache at a directory
it has made and can write (``environment.ensure_triton_cache_dir``:
``$PALLAS_PINNED_TRITON_CACHE`` or a fresh temporary one), whatever was
imported first.
"""

from __future__ import annotations

import triton
import triton.language as tl

from benchmarks.environment import ensure_triton_cache_dir


@triton.jit
def _store_rows_kernel(dst_ptr, rows_ptr, src_ptr, n_updates, row_elems,
                       BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    # dst[rows[k], c] = src[k, c] for one BLOCK_R x BLOCK_C tile.
    k = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    k_ok = k < n_updates
    mask = k_ok[:, None] & (cols < row_elems)[None, :]
    rows = tl.load(rows_ptr + k, mask=k_ok, other=0)
    src = k.to(tl.int64)[:, None] * row_elems + cols[None, :]
    dst = rows.to(tl.int64)[:, None] * row_elems + cols[None, :]
    tl.store(dst_ptr + dst, tl.load(src_ptr + src, mask=mask), mask=mask)


def _next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def version() -> str:
    return triton.__version__


def make_store_rows(torch, dst, rows, updates):
    """A call that writes ``dst[rows] = updates`` (CUDA rows and updates, pinned dst)."""
    ensure_triton_cache_dir(getattr(triton, "knobs", None))
    n, d = updates.shape
    itemsize = updates.element_size()
    block_c = min(_next_pow2(d), 4096 // itemsize)  # 16 KiB tiles, as the Pallas kernel's
    block_r = max(1, min(_next_pow2(n), 16384 // (block_c * itemsize)))
    grid = (triton.cdiv(n, block_r), triton.cdiv(d, block_c))

    def store_rows(state):
        _store_rows_kernel[grid](dst, rows, updates, n, d, BLOCK_R=block_r, BLOCK_C=block_c,
                                 num_warps=4)
        torch.cuda.synchronize()
        return state

    return store_rows
