"""Which cases each benchmark runs, in which order, and a rough GPU time for the plan.

The sweep (``benchmarks.sweep``) times one scatter call per case; the loop
benchmark (``benchmarks.loop``) times steps of a ``lax.scan``. Both put the
cases their summary reads first, so a run cut short by its time budget still
answers the question asked, and both print their plan with ``--dry-run``.
"""

from __future__ import annotations

import argparse
from typing import NamedTuple

import numpy as np

from pallas_pinned import tuning
from pallas_pinned.testing import LoopCase

GIB, MIB = 1 << 30, 1 << 20
INT32_MAX = np.iinfo(np.int32).max

ROW_BYTES = (4, 16, 128, 512, 2048, 8192)
COUNTS = (5, 1 << 10, 1 << 16, 1 << 20, 1 << 24)
SWEPT_PATTERNS = ("random_unique", "random_dup25", "sorted", "contiguous")
DTYPES = ("float32", "bfloat16")
UNIQUE_PATTERNS = ("random_unique", "sorted", "contiguous")
ASCENDING_PATTERNS = ("sorted", "contiguous")


class Case(NamedTuple):
    """One case of the sweep: ``n_updates`` rows of ``row_bytes`` in one call."""

    pattern: str
    dtype: str
    row_bytes: int
    n_updates: int


# ---------------------------------------------------------------------------
# Command-line values


def parse_counts(text: str) -> tuple[int, ...]:
    """``"5,1K,16M"`` -> ``(5, 1024, 16777216)``."""
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    out = []
    for part in text.split(","):
        part = part.strip().upper()
        try:
            out.append(int(part[:-1]) * scale[part[-1]] if part[-1] in scale else int(part))
        except (ValueError, IndexError) as err:
            raise argparse.ArgumentTypeError(f"bad count {part!r} in {text!r}") from err
    if any(n < 1 for n in out):
        raise argparse.ArgumentTypeError(f"counts must be positive, got {text!r}")
    return tuple(out)


def parse_count(text: str) -> int:
    (n,) = parse_counts(text)
    return n


def choices(allowed: tuple[str, ...]):
    """An argparse type for a comma list drawn from ``allowed``; names the bad value."""

    def parse(text: str) -> tuple[str, ...]:
        items = tuple(s.strip() for s in text.split(",") if s.strip())
        bad = [s for s in items if s not in allowed]
        if bad or not items:
            raise argparse.ArgumentTypeError(f"unknown {bad or text!r}; choose from {allowed}")
        return items

    return parse


# ---------------------------------------------------------------------------
# The sweep


def full_sweep() -> list[Case]:
    """Every row size x count for random unique f32; a corner of the rest.

    Five updates are pure latency, the same for every row size, so only the
    narrowest and widest rows are timed there. The other patterns and bf16
    reuse shapes of the main grid: they add runs but few compilations.
    """
    cases = [Case("random_unique", "float32", rb, n) for rb in ROW_BYTES for n in COUNTS
             if n != min(COUNTS) or rb in (min(ROW_BYTES), max(ROW_BYTES))]
    for pattern in ("random_dup25", "sorted", "contiguous"):
        cases += [Case(pattern, "float32", rb, n) for rb in (4, 512) for n in (1 << 10, 1 << 20)]
    cases += [
        Case("random_unique", "bfloat16", rb, n) for rb in (4, 512) for n in (1 << 10, 1 << 20)
    ]
    return cases


def quick_sweep() -> list[Case]:
    """The cases the summary's targets are read from, plus one of each kind."""
    return [
        Case("random_unique", "float32", 4, 5),
        Case("random_unique", "float32", 4, 1 << 24),
        Case("random_unique", "float32", 512, 1 << 20),
        Case("random_unique", "float32", 2048, 1 << 16),
        Case("random_unique", "float32", 8192, 1 << 14),
        Case("random_dup25", "float32", 4, 1 << 16),
        Case("sorted", "float32", 512, 1 << 16),
        Case("random_unique", "bfloat16", 512, 1 << 16),
    ]


def cpu_sweep() -> list[Case]:
    return [
        Case("random_unique", "float32", 4, 5),
        Case("random_unique", "float32", 4, 1 << 10),
        Case("random_unique", "float32", 128, 1 << 10),
        Case("random_dup25", "float32", 4, 1 << 10),
        Case("sorted", "float32", 128, 1 << 10),
        Case("random_unique", "bfloat16", 128, 1 << 10),
    ]


def custom_sweep(args) -> list[Case]:
    """Product of the lists given on the command line (defaults: f32, random unique)."""
    return [
        Case(p, d, rb, n)
        for p in args.patterns or ("random_unique",)
        for d in args.dtypes or ("float32",)
        for rb in args.row_bytes or ROW_BYTES
        for n in args.counts or COUNTS
    ]


def itemsize(dtype: str) -> int:
    return 2 if dtype == "bfloat16" else np.dtype(dtype).itemsize


def why_not_planned(case: Case, buffer_bytes: int, max_payload: int) -> str | None:
    """Reason a case does not fit this buffer and payload cap, or None."""
    if case.row_bytes % itemsize(case.dtype):
        return f"{case.row_bytes} B is not a whole number of {case.dtype}"
    num_rows = buffer_bytes // case.row_bytes
    if num_rows < 1:
        return "buffer smaller than one row"
    if num_rows > INT32_MAX:
        return f"{num_rows} rows do not fit int32 indices (x64 is off)"
    if case.n_updates * case.row_bytes > max_payload:
        return f"payload {case.n_updates * case.row_bytes / MIB:.0f} MiB > cap"
    if case.pattern in UNIQUE_PATTERNS and case.n_updates > num_rows:
        return f"{case.n_updates} unique rows > {num_rows} rows"
    return None


def is_target(case: Case, largest: dict[int, int]) -> bool:
    """Cases the final summary reads; they run first in case time runs out.

    ``largest[row_bytes]``: the largest planned count of random unique f32.
    """
    if (case.pattern, case.dtype) != ("random_unique", "float32"):
        return False
    if case.row_bytes == 4:
        return case.n_updates in (min(COUNTS), largest.get(4))
    return case.row_bytes in (512, 2048, 8192) and case.n_updates == largest.get(case.row_bytes)


def order_plan(cases: list[Case], largest: dict[int, int]) -> list[Case]:
    """Targets first, then grouped by buffer layout so it is rebuilt rarely.

    Targets go up in row size and the rest down, so the last target's layout
    is also the first of the rest.
    """

    def key(c: Case):
        target = is_target(c, largest)
        pattern = SWEPT_PATTERNS.index(c.pattern) if c.pattern in SWEPT_PATTERNS else 9
        dtype = DTYPES.index(c.dtype) if c.dtype in DTYPES else 9
        rows = c.row_bytes if target else -c.row_bytes
        return (not target, dtype, rows, pattern, c.n_updates)

    return sorted(dict.fromkeys(cases), key=key)


def static_skip(name: str, case: Case, args, gpu: bool) -> str | None:
    """Why a sweep provider does not run a case, from the case alone (None: it runs).

    Shared by the run and the time estimate.
    """
    unique = case.pattern in UNIQUE_PATTERNS
    if name == "ours_hinted" and not unique:
        return "indices repeat: no hint applies"
    if name == "ours_hinted" and case.pattern not in ASCENDING_PATTERNS and (
            case.n_updates >= tuning.current().sort_from):
        return "same code path as ours (the unique hint alone still sorts at this size)"
    if name == "ours_nocoalesce" and not unique:
        return "needs unique indices"
    if name == "ours_interpret" and case.n_updates > args.interpret_max_updates:
        return "too big for the interpreter"
    if name == "device_roundtrip" and gpu and case.n_updates < args.roundtrip_min_updates:
        return "fixed cost of two whole-buffer copies; measured only for large counts"
    return None


# Rough H200 rates (updates/s, bytes/s) from the committed results, used only
# for the printed time estimate.
_RATES = {
    "ours": (690e6, 45e9), "ours_hinted": (690e6, 45e9), "ours_triton": (690e6, 45e9),
    "ours_nocoalesce": (48e6, 20e9), "torch_triton_zerocopy": (48e6, 20e9),
    "xla": (46e6, 5e9), "host_roundtrip": (150e6, 5e9), "torch_index_copy": (150e6, 5e9),
    "ceiling": (1e12, 50e9), "ceiling_device_put": (1e12, 30e9),
}
# Per (case, provider) overhead: compilation and two reads of the buffer for
# the jitted JAX providers, less for the rest.
_OVERHEAD_S = {"jax": 0.8, "other": 0.15}
JITTED_PROVIDERS = ("ours", "ours_hinted", "ours_triton", "ours_interpret", "ours_nocoalesce",
                    "xla", "device_roundtrip")


def estimate_sweep_seconds(plan: list[Case], providers: tuple[str, ...], args, sizes,
                           gpu: bool = True) -> float:
    """A rough GPU run time: buffers, data, compilation, reads and the timed runs."""
    layouts = sum(1 for a, b in zip([None, *plan], plan, strict=False)
                  if a is None or (a.dtype, a.row_bytes) != (b.dtype, b.row_bytes))
    total = 1.0 * layouts  # filling a pinned buffer of the new layout
    for case in plan:
        payload = case.n_updates * case.row_bytes
        total += 1e-7 * case.n_updates * max(1.0, case.row_bytes / 16)  # making the data
        for p in providers:
            if static_skip(p, case, args, gpu):
                continue
            if p == "device_roundtrip":
                one = 2 * sizes["buffer_bytes"] / 50e9
            else:
                ups, bps = _RATES.get(p, (1e8, 1e10))
                one = 3e-5 + case.n_updates / ups + payload / bps
            runs = 2 + args.warmup + max(args.reps, min(args.max_reps, args.min_time_s / one))
            total += _OVERHEAD_S["jax" if p in JITTED_PROVIDERS else "other"] + runs * one
    return total


# ---------------------------------------------------------------------------
# The loop benchmark

# Rough H200 per-step costs for the estimate only: a fixed launch cost per
# kernel-bound step plus the step's bytes at a rate. XLA's scatter into a
# pinned buffer (a GPU kernel tagged host compute on jax 0.11.2) slows from a
# few thousand rows; ours is a kernel.
_LOOP_STEP = {"ours": (25e-6, 20e9), "xla": (60e-6, 3e9), "baseline": (8e-6, 1e12)}
# Per case: making and uploading the tables, compiling its programs side by
# side (~0.5-1 s each on 16 cores). Per (case, provider): two sampled reads of
# the buffer (a 1 GiB copy to the device each) and the replay.
LOOP_CASE_OVERHEAD_S = 2.0
LOOP_PAIR_OVERHEAD_S = 0.15


def loop_step_seconds(case: LoopCase, provider: str) -> float:
    fixed, rate = _LOOP_STEP["xla" if provider.startswith("xla") else
                             "baseline" if provider == "baseline" else "ours"]
    per_row = 60e-9 if provider.startswith("xla") else 2e-9  # per-update bookkeeping
    return fixed + case.step_bytes / rate + case.rows * per_row


def loop_pair_seconds(case: LoopCase, provider: str, steps: int, runs: int) -> float:
    """Estimated wall time of one (case, provider): overhead plus every scan run."""
    return LOOP_PAIR_OVERHEAD_S + runs * steps * loop_step_seconds(case, provider)


def why_loop_case_not_planned(case: LoopCase, buffer_bytes: int, max_step_bytes: int,
                              steps: int) -> str | None:
    if case.row_bytes % itemsize(case.dtype):
        return f"{case.row_bytes} B is not a whole number of {case.dtype}"
    num_rows = buffer_bytes // case.row_bytes
    if num_rows > INT32_MAX:
        return f"{num_rows} rows do not fit int32 indices"
    if case.rows > num_rows:
        return f"{case.rows} unique rows per step > {num_rows} rows in the buffer"
    if case.step_bytes > max_step_bytes:
        return f"{case.step_bytes / MIB:g} MiB per step > --max-step-mib"
    if steps * case.rows * 4 > 256 * MIB:
        return "index table over 256 MiB"
    return None
