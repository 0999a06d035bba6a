"""A Pallas kernel that puts row numbers in a stable ascending order in one launch.

The add of rows that may repeat sums each row's entries as one run of a stable
order (:func:`.scatter_add_pallas.scatter_add_sorted_runs`). XLA forms that
order from about five ops: the ``n x n`` rank count, the permutation's scatter,
the gather of the sorted rows and a copy, each a launch the step waits for
(``pallas_pinned/_rows.py``, ``stable_order``). Here each program counts the
ranks of its own entries against every entry, chunk by chunk, and stores each
entry and its row at its rank: the same permutation, one launch.

Ties keep their input order: entry ``k``'s rank is the number of entries ``j``
with a smaller row, or the same row and ``j < k``. Ranks are distinct, so every
output element is stored exactly once.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from .pallas_common import for_chunks, next_pow2, output_type

__all__ = ["order_tiling", "stable_order", "stable_order_kernel"]

# The tiling. Entries per program: few, so that even a small batch spreads over
# many programs (each program's rank count is a serial loop over the chunks);
# entries compared per loop step: up to 1 Ki. The first tiling tried (64 entries
# per program, chunks of 256) won at 256 updates but lost at 1024 and 4096: 16 serial
# steps of a 64 x 256 comparison each (docs/PERFORMANCE.md, "Thresholds").
_MAX_BLOCK = 16
_MIN_BLOCK = 4
_MAX_CHUNK = 1024


def order_tiling(num_entries: int) -> tuple[int, int, int]:
    """``(block, chunk, num_warps)`` for ``num_entries`` entries.

    The power of two at or above ``num_entries`` chooses: 4 entries a program up to 512
    (fewer below 4), 8 up to 1 Ki, 16 beyond. So 512 entries run in 128 programs, 513 in
    65, 1024 in 128, 1025 in 65 and 4096 in 256.
    """
    n = next_pow2(max(num_entries, 1))
    block = min(n, max(_MIN_BLOCK, min(_MAX_BLOCK, n // 128)))
    chunk = min(n, _MAX_CHUNK)
    return block, chunk, 8 if block * chunk >= 8192 else 4


def stable_order_kernel(rows_ref, sorted_ref, perm_ref, *, num_entries: int, block: int,
                        chunk: int):
    """Stores this program's entries ``k`` at their ranks: ``perm[rank] = k``,
    ``sorted[rank] = rows[k]``."""
    k = pl.program_id(0) * block + jnp.arange(block)
    k_ok = k < num_entries
    mine = plgpu.load(rows_ref.at[k], mask=k_ok, other=0)

    def count_chunk(c, rank):
        j = c * chunk + jnp.arange(chunk)
        j_ok = j < num_entries
        other = plgpu.load(rows_ref.at[j], mask=j_ok, other=0)
        before = (other[None, :] < mine[:, None]) | (
            (other[None, :] == mine[:, None]) & (j[None, :] < k[:, None])
        )
        # int32 whatever the rows' type: under x64 a plain sum would be int64 and
        # change the loop's carry type.
        return rank + jnp.sum((before & j_ok[None, :]).astype(jnp.int32), axis=1,
                              dtype=jnp.int32)

    num_chunks = pl.cdiv(num_entries, chunk)
    rank = for_chunks(0, num_chunks, num_chunks, count_chunk, jnp.zeros((block,), jnp.int32))
    # Lanes past the batch store past the end, never onto a real element: the
    # interpreter emulates a masked store with a scatter of the old value.
    rank = jnp.where(k_ok, rank, num_entries)
    plgpu.store(perm_ref.at[rank], k.astype(jnp.int32), mask=k_ok)
    plgpu.store(sorted_ref.at[rank], mine, mask=k_ok)


def stable_order(rows: jax.Array, *, interpret: bool = False) -> tuple[jax.Array, jax.Array]:
    """``(sorted_rows, perm)``: ``rows`` ascending, ties in input order, ``rows[perm]``.

    ``rows`` is a 1-D integer array in device memory. The same permutation as
    ``lax.sort((rows, iota), num_keys=1, is_stable=True)``; the work grows as
    ``n**2`` (the caller keeps ``n`` small).
    """
    (num_entries,) = rows.shape
    if num_entries == 0:  # No program to launch; a grid of none is no kernel.
        return rows, jnp.zeros((0,), jnp.int32)
    block, chunk, num_warps = order_tiling(num_entries)
    any_spec = pl.BlockSpec(memory_space=pl.ANY)

    def body(rows_ref, sorted_ref, perm_ref):
        with jax.numpy_dtype_promotion("standard"):  # As launch_row_kernel says why.
            stable_order_kernel(rows_ref, sorted_ref, perm_ref, num_entries=num_entries,
                                block=block, chunk=chunk)

    return pl.pallas_call(
        body,
        out_shape=(output_type((num_entries,), rows.dtype, [rows]),
                   output_type((num_entries,), jnp.int32, [rows])),
        grid=(pl.cdiv(num_entries, block),),
        in_specs=[any_spec],
        out_specs=(any_spec, any_spec),
        compiler_params=plgpu.CompilerParams(num_warps=num_warps, num_stages=1),
        interpret=interpret,
        name="pallas_pinned_stable_order",
    )(rows)
