"""A table in pinned host memory with a device cache of its busiest rows, and a prefetch pipeline.

An embedding table too big for the GPU lives in ``pinned_host`` memory; the rows a
training uses most are kept in a device cache (as FBGEMM's table-batched embeddings
keep theirs in HBM). Everything is a pytree and a pure function, so it goes under
``jit`` and ``lax.scan`` and donates like any carry::

    cache = cached_table.create(table, cache_size, companions=(accumulators,))
    rows, cache = cached_table.lookup(cache, ids)          # (B, D), device memory
    cache = cached_table.add_rows(cache, ids, deltas)       # or set_rows(cache, ids, rows)
    cache = cached_table.refresh(cache)                     # cache the busiest ids
    cache, carry, ys = cached_table.scan(step, cache, carry, ids, xs)   # a pipelined training
    cache = cached_table.flush(cache); cache.table          # the table as a plain array

Ids cached are chosen by :func:`refresh` from what the lookups observed: ``"lfu"`` counts
each id's lookups (the counts halve at every refresh, a window that forgets), ``"lru"``
records the step of its last use. Evicted rows that were written are written back
(``scatter_to_host``) and new ones loaded (``gather_from_host``); :func:`flush` writes
every written row back, before a checkpoint or reading the table. Companion tables (per-row
optimizer state, such as row-wise Adagrad's accumulators) share the ids, slots and dirty
flags of the table.

Ids are row numbers in ``[0, N)``; any other id reads zeros and its updates are dropped
(no wrapping of negative ids). Outside ``jit`` every entry point consumes the cache it is
given (its buffers are donated, as the library's writes consume ``x``): use the one it
returns. A refused call raises before anything runs and consumes nothing.

Rounding: a cached row and a row of the pinned table get the same arithmetic.
:func:`lookup` and :func:`set_rows` are exact. :func:`add_rows` and :func:`scan` sum the
updates of an id that repeats within a batch before adding them once (``jnp``'s
``.at[ids].add`` adds them one after another): with repeated ids a float32 row may differ
from a device table's in the last bits, about ``k * 2**-24 * max|row|`` for ``k``
repeats; without repeats the result is jnp's, bit for bit.
"""

from __future__ import annotations

# The one module users import: the state and its checks, the plain ops, the policy and the
# pipeline live in the private modules _cache_state, _cache_ops, _cache_policy and
# _cache_pipeline.
from pallas_pinned._cache_ops import add_rows, create, lookup, reset_stats, set_rows, stats
from pallas_pinned._cache_pipeline import Rows, scan
from pallas_pinned._cache_policy import flush, refresh
from pallas_pinned._cache_state import POLICIES, CachedTable, CacheStats

__all__ = [
    "POLICIES",
    "CacheStats",
    "CachedTable",
    "Rows",
    "add_rows",
    "create",
    "flush",
    "lookup",
    "refresh",
    "reset_stats",
    "scan",
    "set_rows",
    "stats",
]
