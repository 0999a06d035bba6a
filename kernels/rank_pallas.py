"""Pallas kernel that counts each entry's place in a stable ascending order of a batch.

``rank[i]`` is the number of entries ``j`` with ``keys[j] < keys[i]``, or
``keys[j] == keys[i]`` and ``j < i``: where entry ``i`` goes in a stable sort.
It is the ``n x n`` comparison that ``pallas_pinned._rows.stable_order`` asks
XLA to fuse, as one launch: each program takes ``block`` entries and walks the
batch in chunks, counting. Quadratic, so for batches of a few thousand entries,
where XLA's sort launches many passes.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

__all__ = ["stable_ranks", "stable_ranks_kernel"]


def stable_ranks_kernel(keys_ref, rank_ref, *, num_entries: int, block: int, chunk: int):
    """Counts, for one block of entries, the entries ordered before each of them."""
    i = pl.program_id(0) * block + jnp.arange(block)
    i_ok = i < num_entries
    mine = plgpu.load(keys_ref.at[i], mask=i_ok, other=0)

    def count_chunk(c, counts):
        j = c * chunk + jnp.arange(chunk)
        j_ok = j < num_entries
        theirs = plgpu.load(keys_ref.at[j], mask=j_ok, other=0)
        before = (theirs[None, :] < mine[:, None]) | (
            (theirs[None, :] == mine[:, None]) & (j[None, :] < i[:, None])
        )
        return counts + jnp.sum((before & j_ok[None, :]).astype(jnp.int32), axis=1)

    counts = lax.fori_loop(0, pl.cdiv(num_entries, chunk), count_chunk,
                           jnp.zeros((block,), jnp.int32))
    plgpu.store(rank_ref.at[i], counts, mask=i_ok)


def stable_ranks(keys: jax.Array, *, block: int = 32, chunk: int = 512, num_warps: int = 4,
                 interpret: bool = False) -> jax.Array:
    """``(n,)`` int32 ranks of ``keys`` ``(n,)`` (any integer type) in a stable ascending order."""
    (n,) = keys.shape
    chunk = min(chunk, max(16, 1 << max(0, (n - 1).bit_length())))
    any_spec = pl.BlockSpec(memory_space=pl.ANY)
    return pl.pallas_call(
        lambda k, r: stable_ranks_kernel(k, r, num_entries=n, block=block, chunk=chunk),
        out_shape=jax.ShapeDtypeStruct((n,), jnp.int32),
        grid=(pl.cdiv(n, block),),
        in_specs=[any_spec],
        out_specs=any_spec,
        compiler_params=plgpu.CompilerParams(num_warps=num_warps, num_stages=1),
        interpret=interpret,
        name="pallas_pinned_stable_ranks",
    )(keys)
