"""A table in pinned host memory with a device cache of its busiest rows, an optimizer
built in, and a prefetch pipeline.

An embedding table too big for the GPU lives in ``pinned_host`` memory; the rows a
training uses most are kept in a device cache (as FBGEMM's table-batched embeddings
keep theirs in HBM), and the table's optimizer updates the rows a batch touched, its
state in companion tables beside the table. Everything is a pytree and a pure function,
so it goes under ``jit`` and ``lax.scan`` and donates like any carry::

    cache = cached_table.create(table, cache_size, optimizer=cached_table.rowwise_adagrad(0.1))
    rows, cache = cached_table.lookup(cache, ids)          # (B, D), device memory
    cache = cached_table.add_rows(cache, ids, deltas)       # or set_rows(cache, ids, rows)
    cache = cached_table.refresh(cache)                     # cache the busiest ids
    cache, carry, ys = cached_table.scan(step, cache, carry, ids, xs)   # a pipelined training
    cache = cached_table.flush(cache); cache.table, cache.state   # plain arrays, to save

``scan``'s step hands back ``Grads(g)``: per-entry gradients, aligned with the ids, with
respect to ``rows.per_entry()``; the library sums each row's in a fixed order and applies
the optimizer (:func:`sgd`, :func:`adagrad`, :func:`rowwise_adagrad`, :func:`adam`,
:func:`custom_optimizer`) once per distinct row. ``Deltas(d)`` adds to the distinct rows
instead. ``caches`` may be a tuple or dict of caches (many tables in one step, one
compiled program); ``refresh``, ``flush``, ``stats`` and ``reset_stats`` take them too.

Ids cached are chosen by :func:`refresh` from what the lookups observed: ``"lfu"`` counts
each id's lookups (the counts halve at every refresh, a window that forgets), ``"lru"``
records the step of its last use. Evicted rows that were written are written back
(``scatter_to_host``) and new ones loaded (``gather_from_host``); :func:`flush` writes
every written row back, before a checkpoint or reading the table.

Ids are row numbers in ``[0, N)``, of any integer dtype; any other id (negative,
``2**31``, ``2**32 + k`` with x64) reads zeros and its updates are dropped: ids are
compared in their own dtype, never wrapped (``at(x)[...]`` wraps negative ids, as jnp).
Outside ``jit`` every entry point consumes the cache it is given (its buffers are donated,
as the library's writes consume ``x``): use the one it returns. A refused call raises
before anything runs and consumes nothing.

Reproducible: a cached row and a row of the pinned table get the same arithmetic. The
updates of an id that repeats within a batch (``add_rows``, ``Grads``) are summed in a
fixed order that depends only on that id's entries (a pairwise tree in entry order, in
float32 for floats of up to 32 bits), then applied once; so the same training gives the
same bits whatever the cache holds, with or without prefetch, run after run. ``jnp``'s
``.at[ids].add`` sums repeats one after another: with ``k`` repeats a float32 row can
differ from a device table's by about ``k * 2**-24 * sum|update|``; without repeats the
result is jnp's bit for bit, and optax's within one float32 rounding per step (bit for
bit on CPU; :mod:`pallas_pinned._cache_optim`).
"""

from __future__ import annotations

# The one module users import: the state and its checks, the optimizers, the plain ops, the
# policy and the pipeline live in the private modules _cache_state, _cache_optim,
# _cache_ops, _cache_policy and _cache_pipeline.
from pallas_pinned._cache_ops import add_rows, create, lookup, reset_stats, set_rows, stats
from pallas_pinned._cache_optim import (
    Deltas,
    Grads,
    RowOptimizer,
    StateSpec,
    adagrad,
    adam,
    custom_optimizer,
    rowwise_adagrad,
    sgd,
)
from pallas_pinned._cache_pipeline import Rows, scan
from pallas_pinned._cache_policy import flush, refresh
from pallas_pinned._cache_state import POLICIES, CachedTable, CacheStats

__all__ = [
    "POLICIES",
    "CacheStats",
    "CachedTable",
    "Deltas",
    "Grads",
    "RowOptimizer",
    "Rows",
    "StateSpec",
    "adagrad",
    "adam",
    "add_rows",
    "create",
    "custom_optimizer",
    "flush",
    "lookup",
    "refresh",
    "reset_stats",
    "rowwise_adagrad",
    "scan",
    "set_rows",
    "sgd",
    "stats",
]
