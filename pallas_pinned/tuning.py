"""The measured thresholds the ops choose their paths by, and a way to override them.

Results depend on these settings only in the last bits of float sums over
repeated rows: ``fused_max_adds``, ``fused_max_unpromised_adds`` and
``add_runs_in_kernel`` choose which path sums them, and the paths group the
sums differently (each gives the same bits on every call). The others change
only speed. The defaults were
measured on the H200 (each field says where). Benchmarks and tests switch a
path on or off through :func:`override` instead of patching module globals.
The ops read :func:`current` when they are traced (an eager call is traced by
the op's own jit, so a changed setting compiles a new program there). A function
you jit yourself is different: JAX's jit cache does not see these settings, so
it keeps running the program of its first trace, whatever the setting in force
at a later call. To run it under other settings, jit a new function inside the
``with`` block (a new function object: ``jax.jit`` of the same function reuses
its trace), or call ``jax.clear_caches()`` on entering the block and again on
leaving it.

An ``override`` holds in its own thread and its own asyncio task (a context
variable): a thread started inside the block starts from the defaults, and an
asyncio task created inside it inherits it, as it copies its context.

>>> from pallas_pinned import tuning
>>> with tuning.override(sort_min_updates=0):   # always sort for locality
...     pass

A whole process can start from other defaults, set before ``pallas_pinned`` is
imported: ``PALLAS_PINNED_TUNING="relaxed_atomics=true,atomic_add_from=0"``
(comma-separated ``name=value``; booleans as true/false/1/0). So a benchmark
compares settings without an edit, and its results record them (the
``thresholds`` of ``benchmarks.environment``). A bad entry raises ValueError at
import, naming the variable.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import os
from collections.abc import Iterator

__all__ = ["ENV", "Thresholds", "current", "override"]

ENV = "PALLAS_PINNED_TUNING"


@dataclasses.dataclass(frozen=True)
class Thresholds:
    """Batch sizes (in index entries) at which an op changes its path."""

    # scatter_to_host: unique rows are sorted for address locality from this
    # many updates on. Measured on the H200 (benchmarks/results/
    # tune_scatter_h200.log, 2026-12-02): unsorted and sorted random unique
    # rows tie near 16 Ki updates for 4- and 512-byte rows; at 64 Ki sorting is
    # 1.7-1.8x faster, and below 4 Ki the sort's ~30-70 us of fixed cost loses.
    sort_min_updates: int = 16384
    # scatter_add_to_host: the same crossover for distinct rows. A choice, not
    # a measurement of its own: read-add-write moves each row twice over the
    # same bus, so the write crossover is the starting point.
    sort_min_adds: int = 16384
    # gather_from_host: the same crossover for reads, by the same reasoning.
    sort_min_gathers: int = 16384
    # scatter_to_host: up to this many updates, duplicates are resolved by an
    # n x n comparison that fuses with the index normalization, instead of a
    # sort: one launch fewer (the quadratic work is negligible at this size).
    small_dedupe_max: int = 64
    # scatter_add_to_host: up to this many updates, duplicates are put in order
    # by counting ranks (an n x n comparison that fuses) instead of a sort
    # launch. Chosen with the loop benchmark (see fused_max_updates).
    small_combine_max: int = 1024
    # scatter_to_host: up to this many updates, the kernel normalizes the raw
    # indices and drops superseded duplicates itself (one launch per call; its
    # duplicate search grows as n**2). Chosen from the loop benchmark on the
    # H200 (benchmarks/results/loop_h200.json); see docs/PERFORMANCE.md, "Inside a jitted loop".
    fused_max_updates: int = 4096
    # scatter_add_to_host (Pallas): up to this many updates, the kernel
    # normalizes the raw indices and sums duplicates itself, in entry order
    # (one launch instead of about a dozen XLA ops; its duplicate search grows
    # as n**2). The H200 probe of 2026-12-03 (random rows drawn in a scan, us
    # per step at 5 x 4 B / 64 x 1 KiB / 256 x 4 B / 256 x 1 KiB): the
    # unfused path 18.7 / 22.4 / 27.2 / 51.1, this one 10.1 / 12.8 / 12.5 /
    # 19.9, XLA's own add 22.1 / 13.4 / 12.3 / 14.6. 1024 is set's reasoning
    # (its fused path serves 4096), measured in the loop benchmark's add rows.
    fused_max_adds: int = 1024
    # scatter_add_to_host (Pallas): an add whose rows may repeat (not promised or known
    # distinct) takes that one launch only up to this many updates; beyond, its rows are put
    # in a stable order first and one launch sums the runs. In the one launch the owner of a
    # repeated row sums its later duplicates itself, one sub-chunk after another, so a hot row
    # makes one program long. H200 A/B, 2026-12-05 18:12 UTC (docs/lab/fused_add_dups_ab.sh,
    # graphed, us per step, 1024 / 64 here, two runs each): the sparse client on Zipf ids
    # at 1024 ids a step 96.5, 97.2 / 34.7, 34.7 and at 256 ids 37.9, 34.5 / 21.9, 21.6; on
    # uniform ids at 256, 22.3, 17.2 / 25.0, 23.0; the loop's distinct rows, unpromised add,
    # 256 x 4 B 8.4, 8.9 / 15.1, 15.1, 256 x 1 KiB 14.8, 16.6 / 20.9, 19.4, 1024 x 1 KiB
    # 41.5, 41.7 / 45.3, 45.2, 1024 x 4 B 18.6, 19.5 / 17.8, 16.7. (At 4096 ids, H100, the
    # one launch took the client from 70 to 350 us.) Rows that repeat cost the one launch
    # 13-62 us there; distinct rows cost the ordered runs up to 7 us (case means 3.6-6.4).
    fused_max_unpromised_adds: int = 64
    # scatter_add_to_host (Pallas), beyond the one launch (fused_max_unpromised_adds for rows
    # that may repeat): duplicates are summed
    # by the kernel over the runs of a stable order (one launch after it), in
    # entry order, instead of by XLA's segmented scan (log2(n) passes over the
    # updates) before the launch. The scan took 72.4 of the 85.2 us of the
    # sparse client's add (H200 probe, 2026-12-03 14:46 UTC, 4096 Zipf ids).
    add_runs_in_kernel: bool = True
    # scatter_add_to_host (Pallas), on that path: up to this many entries the
    # stable order is counted as ranks (an n x n comparison that XLA fuses)
    # instead of sorted. H200 probes, 2026-12-03 (docs/lab/step_probe.py ranks),
    # us per step to order n Zipf ids in a scan, XLA's sort / the ranks: 16:21
    # UTC 19.4 / 14.3 (1 Ki), 44.2 / 22.7 (4 Ki), 51.5 / 38.0 (8 Ki), 60.7 / 155.0
    # (16 Ki); 16:40 UTC 22.2 / 14.9, 45.8 / 19.9, 54.0 / 41.6 (16 Ki not rerun).
    runs_rank_max: int = 8192
    # scatter_add_to_host (Pallas), on that path: up to this many entries the stable order is
    # formed by one Pallas kernel (kernels/order_pallas.py: each entry counts its rank and is
    # stored there) instead of XLA's ops (the rank count, the permutation's scatter, the sorted
    # rows' gather, a copy: about five launches); 0 leaves it to XLA. Predicted from the H100
    # loop grid (2026-12-05 19:05 UTC, graphed, the unpromised add against the same add
    # promised distinct, which orders nothing: 256 x 4 B 15.5 / 9.0, 1024 x 1 KiB 44.5 / 35.4):
    # about 4 us of the gap back. H200 A/B, 19:18 UTC (docs/lab/order_kernel_ab.sh, A XLA's
    # ops, B the kernel's first tiling, runs A B B A, us per step): the loop's unpromised add
    # 256 x 4 B 16.9, 15.3 / 13.4, 13.5 and 256 x 1 KiB 19.4, 19.5 / 18.9, 17.7; but 1024 x 4 B
    # 17.1, 17.2 / 22.4, 24.0, 1024 x 1 KiB 46.2, 45.7 / 51.7, 50.7, 4096 x 4 B 31.1, 30.5 /
    # 59.4, 60.0, and the sparse client at 4096 Zipf ids 66.6, 70.1 / 95.9, 101.5: 16 serial
    # steps of a 64 x 256 comparison per program. The kernel now has 4-16 entries per program
    # and chunks of 1 Ki. H100 A/B of that tiling, 19:25 UTC (docs/lab/order_kernel_tiling_ab.sh,
    # A 0, B 8192): 256 x 4 B 15.5, 15.5 / 12.4, 11.6; 256 x 1 KiB 20.0, 19.8 / 16.1, 15.7;
    # 1024 x 4 B 17.6, 16.3 / 14.5, 13.8; 1024 x 1 KiB 44.8, 44.3 / 41.4, 41.1; 4096 x 4 B
    # 33.6, 31.6 / 31.8, 29.2; 4096 x 1 KiB 138.3, 138.2 / 135.7, 133.6; the client at 4096
    # Zipf ids 68.0, 69.2 / 64.1, 64.7 and at 1024 27.0, 29.9 / 26.8, 23.9. The rule written
    # before the run (both B runs beat both A runs, there and at every smaller size) holds up to
    # 1024; at 4096 x 4 B one B run (31.8) lost to one A run (31.6) by 0.2. H100 A/B, 2026-12-06
    # 05:05 UTC (A 1024, B 4096; docs/lab/order_kernel_tiling_ab_h100_1206_0505): 4096 x 4 B
    # 29.5, 28.7, 30.1, 29.2 / 26.9, 26.3, 26.8, 26.2; 4096 x 1 KiB 132.9, 132.9, 135.1, 134.9 /
    # 130.9, 130.6, 130.5, 130.6; the client at 4096 Zipf ids 63.4, 64.4 / 59.9, 62.3. Both B
    # runs beat both A runs wherever the arms differ, so the kernel now orders up to 4096.
    order_kernel_max: int = 4096
    # scatter_add_to_host (Pallas), float32 summed in float32: from this many
    # updates on, each row's owner adds its total with one atomic add instead
    # of reading the row and storing the sum (the same bits). Pallas's atomics
    # are acquire-release: docs/lab/atomic_add_probe.py (H200, 2026-12-04 20:49
    # UTC, distinct rows in a graphed scan, us per step, read-add-write / atomic
    # of the plain row kernel): 64 x 1 KiB 14.4 / 17.9, 256 x 1 KiB 15.7 / 19.3,
    # 1024 x 1 KiB 39.8 / 37.5, 4096 x 512 B 75.4 / 67.9, 16384 x 256 B 195.3 /
    # 168.7. Wired into the three Pallas add kernels, auto's unpromised add
    # (20:56 UTC, random rows, read-add-write / atomic): 5 x 4 B 10.3 / 9.6,
    # 64 x 1 KiB 10.9 / 13.3, 256 x 4 B 11.4 / 13.4, 256 x 1 KiB 16.2 / 17.5,
    # 1024 x 1 KiB 53.8 / 50.2, 4096 x 512 B 95.4 / 83.9, 16384 x 256 B 182.0 /
    # 168.0; the sparse client (Zipf) 70.1 / 71.2. Rows with a zero, tiny or
    # non-finite total keep the read and store (kernels/owner_write.py).
    atomic_add_from: int = 1024
    # scatter_add_to_host (Pallas): an add of rows known distinct that it sorts for locality
    # (from sort_min_adds updates), of rows of 256 B or more (_write_rows), and whose owners
    # read their rows (no atomic owner write: see atomic_add_from), is summed by the
    # sorted-runs kernel, each row a run of one, instead of the plain add kernel: what was
    # measured (bfloat16 and float32 rows of 256 B and 1 KiB, 16384 updates); rows promised
    # sorted, narrower rows and other dtypes keep the plain kernel, unmeasured. Both give the
    # same bits; they differ in tiling (the runs kernel puts 2-64 entries in a program where
    # the plain kernel fills 16 KiB tiles) and in when the buffer's rows are read. Measured
    # first: the H100 grid of 2026-12-06 08:53 UTC (benchmarks/results/
    # loop_bf16_quick_graphs_h100_1206_0853.json) added 16384 x 256 B bfloat16 rows promised
    # distinct in 195.1 us per step (sort, plain kernel) against 183.7 unpromised (sort,
    # runs kernel); float32 173.0 against 160.9 (08:10 UTC). H100 A/B, 09:54 UTC
    # (docs/lab/distinct_runs_ab.sh, graphed loop, backend="pallas", A false, B true, runs
    # A B B A, us per step), promised distinct: 16384 x 256 B float32 180.1, 165.0, 163.7,
    # 178.0 (A B B A); bfloat16 195.5, 183.4, 184.0, 195.2; 16384 x 1 KiB bfloat16 581.5,
    # 488.4, 494.3, 582.0; float32 503.8, 503.8, 516.0, 500.4, a tie within the run's noise
    # (the unpromised control, the same code in both arms, 506.6, 505.2, 512.1, 501.8).
    # Its confirmation, 10:04 UTC (A B A B A B): float32 at 1 KiB 498.1, 502.5, 503.4, 510.0,
    # 502.0, 510.1; B's mean 1.27 % over A's, past the 1 % the rule written before it allowed,
    # so the atomic adds (float32 from 1024 updates) keep the plain kernel. The control drifted
    # as much (500.6, 501.7, 506.1, 508.2, 498.9, 515.1), and float32 at 256 B, also atomic,
    # had gained 14 us: left unmeasured again (auto runs XLA's add for such rows promised
    # distinct up to 16384; the kernel serves backend="pallas" and larger adds).
    distinct_adds_by_runs: bool = True
    # scatter_add_to_host (Pallas), with the atomic owner write above: the
    # atomics relaxed instead of acquire-release (kernels/relaxed_atomics.py:
    # no barrier before each, no wait for the old value; what XLA's own
    # scatter-add issues). Off: the H200 A/B (2026-12-05 14:12 UTC, docs/lab/
    # relaxed_ab_h200_1410/, graphed loop, us per step). From 1024 rows,
    # acquire-release / relaxed: 1024 x 1 KiB 49.6 / 48.5, 4096 x 512 B
    # 86.2 / 90.8, 16384 x 256 B 168.8 / 168.1; the sparse client 74.4 / 72.3
    # (read and store there: 71.9). Below 1024 rows, relaxed / the default read
    # and store: 5 x 4 B 8.8 / 8.4, 64 x 1 KiB 10.2 / 11.1, 256 x 4 B 13.7 /
    # 13.5, 256 x 1 KiB 16.4 / 17.6. Relaxed won by up to 8 % and lost by up to
    # 5 %; one call of 4 Mi x 4 B: add at 0.62x set's throughput relaxed, 0.64x
    # by default (predicted >= 0.72x).
    relaxed_atomics: bool = False
    # backend="auto" on a host buffer: a block (ints, step-1 slices, jax.ds) is one XLA copy
    # (dynamic_update_slice / dynamic_slice, the very HLO of XLA's own formulation) for every
    # read, and for a set of a strided block (kv[:, pos]) of fewer than block_rows_from rows that
    # needs no run-time check (mode "clip" or "promise_in_bounds", or static starts); a
    # contiguous block's set is rows (see block_rows_from). A set whose traced start a dropping
    # mode must check would have to read the block back first (one more transfer): rows serve it
    # (the kernel's, or XLA's own scatter where backend_table.json picks it for rows known
    # distinct, as a block's are), and other writes too, unless this is True. Measured on the
    # H200 (benchmarks/results/block_probe_h200.json, 2026-12-03 13:57 UTC, us per step in a
    # scan, 64 x 1 KiB / 1024 x 1 KiB / 16384 x 256 B): the copy without a check 8.2 / 29.3 /
    # 91.8, with the read-back 13.6 / 52.1 / 177.4, kernel rows 8.7 / 29.9 / 91.7, XLA's own
    # copy 9.0 / 29.6 / 94.6. Device-memory buffers always take the copy (XLA's home turf).
    block_copy: bool = False
    # backend="auto" on a host buffer: a block set without a run-time check of this many rows or
    # more runs as rows instead of the copy (the rows of a block are distinct and ascending: one
    # launch, no de-duplication; for float32 of 257-1024 rows backend_table.json picks XLA's own
    # scatter of them, 24.2 against the kernel's 27.2 us at 1024 x 1 KiB graphed,
    # results/loop_quick_graphs_h200.json). The H200 loop benchmark of 2026-12-03 15:05 UTC
    # (results/loop_quick_h200_1505.json; us per step, providers timed interleaved): 64 x 1 KiB
    # copy 17.1, rows 27.1, XLA's copy 16.6; 1024 x 1 KiB copy 36.1, rows 27.1, XLA's copy 35.2;
    # the block probe (13:57) had rows at or below XLA's copy at 1024 x 1 KiB and 16384 x 256 B
    # too (29.9 vs 29.6, 91.7 vs 94.6). With this switch (15:18,
    # benchmarks/results/loop_quick_h200_1518.json): 64 rows 14.5 against XLA's 15.7, 1024 rows
    # 27.6 against 36.2; 16:50 (loop_quick_h200_1650.json): 13.6 against 13.4, 26.6 against
    # 35.5. The block probe at 64 / 128 / 256 / 512 rows x 1 KiB (18:45 UTC, results/
    # block_probe_{graphs,rows}_h200.json), copy / rows / XLA's copy: graphed 9.2 / 9.0 / 9.8,
    # 10.1 / 10.3 / 9.9, 13.4 / 14.1 / 14.0, 18.4 / 19.6 / 19.5; at XLA's defaults 7.6 / 8.1 /
    # 8.6, 11.5 / 11.0 / 12.5, 18.2 / 16.4 / 15.1, 18.6 / 19.7 / 19.1. Below 1024 rows neither
    # is ahead at every size (within 1.8 us, each way at some size): no case to move the switch.
    # Since session 23 the switch applies to strided blocks only (a KV cache's slot, kv[:, pos]);
    # a contiguous block is rows at every size. H100 graphed (2026-12-05, docs/lab/
    # block_rows_ab_h100_1538 and block_rows_s23_h100_1547), the loop's 64 x 1 KiB block: the
    # copy 15.7, rows 5.0-5.1 (XLA's own scatter on the distinct rows), Pallas rows 6.7-6.8, XLA's
    # copy 15.6-15.9; the block probe at 64 / 128 / 256 / 512 rows, auto's rows against XLA's
    # copy: 8.2 / 8.5, 9.4 / 9.7, 12.7 / 13.0, 15.4 / 17.9. The KV block (32 x 2 KiB bf16) as rows
    # 7.1 against the copy's 6.4 and XLA's 6.2: strided blocks keep the copy.
    block_rows_from: int = 1024
    # False turns the locality sort off altogether (rows with duplicates are
    # still de-duplicated). For benchmarks that measure what sorting buys.
    coalesce: bool = True

    def __post_init__(self):
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if field.type == "bool":
                if not isinstance(value, bool):
                    raise TypeError(f"{field.name} must be a bool, got {value!r}")
            elif isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{field.name} must be a non-negative int, got {value!r}")


def _from_environment(text: str) -> Thresholds:
    """The defaults with ``$PALLAS_PINNED_TUNING``'s ``name=value`` entries applied."""
    fields = {field.name: field for field in dataclasses.fields(Thresholds)}
    changes = {}
    for entry in filter(None, (part.strip() for part in text.split(","))):
        name, sep, value = (s.strip() for s in entry.partition("="))
        if name in changes:
            raise ValueError(f"${ENV}: {name} is given twice")
        if not sep or name not in fields:
            raise ValueError(
                f"${ENV}: {entry!r} is not name=value with a name of "
                f"pallas_pinned.tuning.Thresholds ({', '.join(fields)})"
            )
        if fields[name].type == "bool":
            truth = {"true": True, "1": True, "false": False, "0": False}.get(value.lower())
            if truth is None:
                raise ValueError(f"${ENV}: {name} takes true/false/1/0, got {value!r}")
            changes[name] = truth
        else:
            try:
                changes[name] = int(value)
            except ValueError:
                raise ValueError(f"${ENV}: {name} takes an int, got {value!r}") from None
    try:
        return Thresholds(**changes)
    except ValueError as err:  # A negative int.
        raise ValueError(f"${ENV}: {err}") from None


_DEFAULTS = _from_environment(os.environ.get(ENV, ""))
# A context variable, not a thread-local: asyncio tasks sharing a thread must not
# see each other's override (kernels/relaxed_atomics.py scopes its switch alike).
_THRESHOLDS = contextvars.ContextVar("pallas_pinned_thresholds", default=_DEFAULTS)


def current() -> Thresholds:
    """The thresholds in force in this context (thread, asyncio task)."""
    return _THRESHOLDS.get()


@contextlib.contextmanager
def override(**changes) -> Iterator[Thresholds]:
    """Within the ``with`` block, calls of the ops use these thresholds.

    Unknown names and non-bool flags raise ``TypeError``; negative or
    non-int thresholds raise ``ValueError``.
    """
    previous = current()
    names = [field.name for field in dataclasses.fields(Thresholds)]
    unknown = sorted(set(changes) - set(names))
    if unknown:
        raise TypeError(f"tuning.override: unknown setting(s) {', '.join(unknown)}; the "
                        f"settings are {', '.join(names)}")
    updated = dataclasses.replace(previous, **changes)
    token = _THRESHOLDS.set(updated)
    try:
        yield updated
    finally:
        try:
            _THRESHOLDS.reset(token)
        except ValueError:  # Left in another context (an async fixture's teardown task).
            _THRESHOLDS.set(previous)
