"""Which cases ``benchmarks.one_call`` runs, and in which order.

A case is one call writing ``n_updates`` rows of ``row_bytes``; the summary reads
the target cases (:func:`is_target`), which run first so that a run cut short by
its time budget still answers the question asked.
"""

from __future__ import annotations

from typing import NamedTuple

import jax.numpy as jnp
import numpy as np

MIB = 1 << 20
K, M = 1 << 10, 1 << 20
PATTERNS = ("random_unique", "random_dup25", "sorted", "contiguous")
UNIQUE_PATTERNS = ("random_unique", "sorted", "contiguous")
DTYPES = ("float32", "bfloat16")
ROW_BYTES = (4, 16, 128, 512, 2048, 8192)
COUNTS = (5, K, 64 * K, M, 16 * M)


class Case(NamedTuple):
    """One case: ``n_updates`` rows of ``row_bytes`` in one call."""

    pattern: str
    dtype: str
    row_bytes: int
    n_updates: int


def layout_of(case: Case, buffer_bytes: int) -> tuple[int, tuple[int, ...]]:
    """``(num_rows, row_shape)``; one-element rows make a 1-D buffer."""
    row_elems = case.row_bytes // jnp.dtype(case.dtype).itemsize
    return buffer_bytes // case.row_bytes, (() if row_elems == 1 else (row_elems,))


def plan(args, gpu: bool) -> tuple[str, list[Case]]:
    """The sweep's name and its cases, the targets first (a run cut short by its time
    budget still answers the question asked), then grouped by buffer layout."""
    if any(v is not None for v in (args.patterns, args.dtypes, args.row_bytes, args.counts)):
        name = "custom"
        cases = [Case(p, d, rb, n) for p in args.patterns or ("random_unique",)
                 for d in args.dtypes or ("float32",) for rb in args.row_bytes or ROW_BYTES
                 for n in args.counts or COUNTS]
    elif not gpu:
        name = "cpu"
        cases = [Case("random_unique", "float32", 4, 5), Case("random_unique", "float32", 4, K),
                 Case("random_unique", "float32", 512, K), Case("random_dup25", "float32", 4, K),
                 Case("sorted", "float32", 128, K), Case("random_unique", "bfloat16", 128, K)]
    elif args.quick:
        name = "quick"
        cases = [Case("random_unique", "float32", 4, 5),
                 Case("random_unique", "float32", 4, 16 * M),
                 Case("random_unique", "float32", 512, M),
                 Case("random_unique", "float32", 2048, 64 * K),
                 Case("random_unique", "float32", 8192, 16 * K),
                 Case("random_dup25", "float32", 4, 64 * K), Case("sorted", "float32", 512, 64 * K),
                 Case("random_unique", "bfloat16", 512, 64 * K)]
    else:  # five updates are latency alone: timed at the narrowest and widest rows only
        name = "full"
        cases = [Case("random_unique", "float32", rb, n) for rb in ROW_BYTES for n in COUNTS
                 if n != 5 or rb in (4, 8192)]
        cases += [Case(p, "float32", rb, n) for p in PATTERNS[1:] for rb in (4, 512)
                  for n in (1 << 10, 1 << 20)]
        cases += [Case("random_unique", "bfloat16", rb, n) for rb in (4, 512)
                  for n in (1 << 10, 1 << 20)]
    planned = []
    for c in cases:
        if why := why_not_planned(c, args.buffer_bytes, args.max_payload):
            print(f"  not planned: {c.pattern} {c.dtype} {c.row_bytes}B n={c.n_updates}: {why}")
        else:
            planned.append(c)
    largest: dict[int, int] = {}
    for c in planned:
        if (c.pattern, c.dtype) == ("random_unique", "float32"):
            largest[c.row_bytes] = max(largest.get(c.row_bytes, 0), c.n_updates)
    args.largest = largest

    def key(c: Case):
        target = is_target(c, largest)
        return (not target, DTYPES.index(c.dtype), c.row_bytes if target else -c.row_bytes,
                PATTERNS.index(c.pattern), c.n_updates)

    return name, sorted(dict.fromkeys(planned), key=key)


def why_not_planned(case: Case, buffer_bytes: int, max_payload: int) -> str | None:
    if case.row_bytes % jnp.dtype(case.dtype).itemsize:
        return f"{case.row_bytes} B is not a whole number of {case.dtype}"
    num_rows = buffer_bytes // case.row_bytes
    if not 1 <= num_rows <= np.iinfo(np.int32).max:
        return f"{num_rows} rows: none, or more than int32 indices reach"
    if case.n_updates * case.row_bytes > max_payload:
        return f"payload {case.n_updates * case.row_bytes / MIB:.0f} MiB > cap"
    if case.pattern in UNIQUE_PATTERNS and case.n_updates > num_rows:
        return f"{case.n_updates} unique rows > {num_rows} rows"
    return None


def is_target(case: Case, largest: dict[int, int]) -> bool:
    """A case the summary reads: random unique float32, the latency case and the largest
    planned count of 4 B, 512 B, 2 KiB and 8 KiB rows."""
    if (case.pattern, case.dtype) != ("random_unique", "float32"):
        return False
    if case.row_bytes == 4:
        return case.n_updates in (5, largest.get(4))
    return case.row_bytes in (512, 2048, 8192) and case.n_updates == largest.get(case.row_bytes)
