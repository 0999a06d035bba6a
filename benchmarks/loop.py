"""Loop: the per-step cost of writing rows into a pinned buffer inside ``lax.scan``.

    python -m benchmarks.loop                 # the grid within --time-budget-s (~4 min on an H200)
    python -m benchmarks.loop --quick         # the issue's target cases only
    python -m benchmarks.loop --cpu           # a tiny grid on CPU, a few seconds (CI)
    python -m benchmarks.loop --dry-run       # the plan and a rough time estimate
    python -m benchmarks.loop --backends pallas,triton   # plus rows per kernel backend

Before the grid, the write patterns of ``benchmarks/loop_patterns.py`` (ring
insert, KV-cache write, per-sequence decode write through
``pallas_pinned.at(x)[index].set``) each against XLA's best formulation of
the same write. Each (case, provider) compiles one jitted scan of ``--steps``
steps with the buffer donated, counts the kernels a step launches in the
compiled HLO, runs it once and checks sampled rows against a numpy replay.
Only when every provider of a case has been checked are they timed, all of
them interleaved (a grid case's as a write pattern's): each gets its
``--warmup`` runs, then ``--rounds`` rounds each give every provider its
share of its ``--runs`` timed runs, the order rotated by one per round, so
that drift of the machine lands on all of them (timed one after the other,
a baseline that writes nothing measured 15.4 us per step on an H200 against
8.2 for XLA's set in the same case). The one pinned buffer is threaded
through every provider in turn (``benchmarks/scan_runner.py``).
``us_per_step`` is the median over a provider's timed runs, over the steps;
``rounds`` the rounds it was timed in; ``op_cost_us`` subtracts
the baseline (the same step without the write); ``kernel_floor_us`` is the
floor_launch step plus the op's bytes over PCIe (``benchmarks/loop_floor.py``).
What a step does is described in ``benchmarks/loop_steps.py``, the kernel
counting rule in ``benchmarks/hlo.py``. Writes ``loop.json`` and
``loop.png`` under ``--out``; exits 1 on any error or wrong result.
"""

from __future__ import annotations

import argparse
import functools
import sys
import time
from pathlib import Path

import jax
import numpy as np

from benchmarks import cases, checks, environment, hlo, loop_floor, loop_patterns, plots, report
from benchmarks.loop_steps import (
    PROVIDER_NAMES,
    PROVIDERS,
    READS_BACK,
    LoopData,
    LoopProvider,
    buffer_shape,
    check_gathered,
    check_read_back,
    check_replay,
    make_loop_data,
    scan_fn,
)
from benchmarks.scan_runner import (
    CheckedScan,
    PinnedBuffer,
    check_scan,
    check_then_time,
    compile_all,
    fill_op_costs,
    own_updates,
    split_runnable,
)
from benchmarks.verdict import verdict_lines
from pallas_pinned._registry import TABLE_ENV
from pallas_pinned.testing import (
    LOOP_CASES,
    LOOP_CPU_CASES,
    LOOP_DTYPES,
    LOOP_TARGETS,
    LoopCase,
)

GIB, MIB = 1 << 30, 1 << 20
KERNEL_BACKENDS = ("pallas", "triton", "interpret")


def base_record(case: LoopCase, provider: LoopProvider, backend: str, steps: int,
                rounds: int) -> dict:
    return {
        "case": case.name, "op": provider.op, "rows": case.rows, "row_bytes": case.row_bytes,
        "dtype": case.dtype, "provider": provider.name, "backend": backend, "steps": steps,
        "status": "ok", "us_per_step": None, "us_min": None, "us_max": None, "runs": 0,
        "rounds": rounds, "op_cost_us": None, "kernels_per_step": None, "op_kernels": None,
        "hlo_ops": None, "correct": None, "check": None, "compile_s": None, "notes": "",
        **dict.fromkeys(loop_floor.FLOOR_FIELDS),
    }


def check_pair(args, buf: PinnedBuffer, data: LoopData, provider: LoopProvider, backend: str,
               compiled_and_s) -> tuple[dict, CheckedScan | None]:
    """Runs one compiled grid scan once and checks it against the replay (timed later)."""
    data = own_updates(data, f"{provider.name}[{backend}]")
    record = base_record(data.case, provider, backend, args.steps, args.rounds)
    record["check"] = f"{data.sample.size} sampled rows match the numpy replay"
    table = data.sorted_dev if provider.sorted_rows else data.table_dev
    reads_back = provider.op in READS_BACK
    # A read-back check reads the last step's rows before the run too (add_read's oracle).
    rows = np.concatenate([data.sample, data.table[-1]]) if reads_back else data.sample
    if reads_back:
        record["check"] += ("; so do the rows read after the last step's "
                            + provider.op.removesuffix("_read"))

    def judge(before, outputs):
        before, before_last = before[:data.sample.size], before[data.sample.size:]
        after = checks.read_rows(outputs[0], data.sample)
        mismatch = check_replay(data, provider, before, after)
        if mismatch is None and provider.op == "get":
            x_rows = checks.read_rows(outputs[0], data.table[-1])
            mismatch = check_gathered(data, np.asarray(outputs[1]), x_rows)
        if mismatch is None and reads_back:
            mismatch = check_read_back(data, provider.op, before_last, np.asarray(outputs[1]))
        return mismatch

    scan = check_scan(args, buf, record, compiled_and_s, (table, data.base_dev),
                      lambda x: checks.read_rows(x, rows), judge)
    return record, scan


def pairs(args) -> list[tuple[LoopProvider, str]]:
    """(provider, backend) of every row of a case: defaults first, then per kernel backend."""
    wanted = [p for p in PROVIDERS if p.name in args.providers or p.name == "baseline"]
    out = [(p, "auto" if p.ours else "-") for p in wanted]
    out += [(p, b) for b in args.backends for p in wanted if p.ours]
    return out


def run_case(args, buf: PinnedBuffer, case: LoopCase, started: float, progress) -> list[dict]:
    """Every (provider, backend) of one grid case: compiled side by side, each checked,
    then all timed interleaved in ``--rounds`` rounds (the module's docstring says why);
    the whole case is skipped once ``--time-budget-s`` is used up."""
    over_budget = bool(args.time_budget_s) and time.monotonic() - started > args.time_budget_s
    todo, records = split_runnable(
        args, pairs(args), over_budget,
        lambda p, b: base_record(case, p, b, args.steps, args.rounds), progress, case.name)
    if not todo:
        return records
    buf.ensure(case.dtype, buffer_shape(case, args.buffer_bytes))
    # A seed per case from plain numbers: the same data on every run and machine.
    rng = np.random.default_rng([args.seed, case.rows, case.row_bytes,
                                 LOOP_DTYPES.index(case.dtype)])
    data = make_loop_data(case, args.buffer_bytes, args.steps, rng,
                          check_written=args.check_written, check_others=args.check_others)
    lowerings = {
        (p.name, b): functools.partial(
            lambda p, b: scan_fn(p, b, materialized=args.inputs == "materialized").lower(
                buf.x, data.sorted_dev if p.sorted_rows else data.table_dev, data.base_dev),
            p, b)
        for p, b in todo
    }
    try:
        compiled = compile_all(lowerings, args.compiler_options)
        records += check_then_time(
            buf, todo,
            lambda p, b: check_pair(args, buf, data, p, b, compiled[(p.name, b)]),
            args.rounds, progress, case.name)
    finally:
        data.release()
    order = {(p.name, b): k for k, (p, b) in enumerate(pairs(args))}
    records.sort(key=lambda r: order[(r["provider"], r["backend"])])
    fill_op_costs(records)
    loop_floor.fill_floors(records)
    return records


# ---------------------------------------------------------------------------
# Plan


def plan_cases(args) -> tuple[str, list[LoopCase], list[tuple[LoopCase, str]]]:
    """The grid's name, its planned cases (most wanted first) and the dropped ones."""
    if args.rows or args.row_bytes:
        grid = "custom"
        picked = {LoopCase(r, b, d) for r in args.rows or (1024,)
                  for b in args.row_bytes or (1024,) for d in args.dtypes or ("float32",)}
        order = {c: k for k, c in enumerate(LOOP_CASES)}
        wanted = sorted(picked, key=lambda c: (order.get(c, len(order)), c.rows, c.row_bytes))
    elif args.dtypes:
        # The chosen grid's (rows, row bytes) in these dtypes: --quick --dtypes bfloat16
        # is the grid in bfloat16 (it was one 1024 x 1 KiB case before).
        base = LOOP_CPU_CASES if not args.gpu else LOOP_TARGETS if args.quick else LOOP_CASES
        shapes = dict.fromkeys((c.rows, c.row_bytes) for c in base)
        grid = "custom"
        wanted = [LoopCase(r, b, d) for d in args.dtypes for r, b in shapes]
    elif not args.gpu:
        grid, wanted = "cpu", list(LOOP_CPU_CASES)
    elif args.quick:
        grid, wanted = "quick", list(LOOP_TARGETS)
    else:
        grid, wanted = "full", list(LOOP_CASES)
    planned, dropped = [], []
    for case in wanted:
        why = cases.why_loop_case_not_planned(case, args.buffer_bytes,
                                              int(args.max_step_mib * MIB), args.steps)
        (dropped.append((case, why)) if why else planned.append(case))
    return grid, planned, dropped


def planned_patterns(args) -> list[loop_patterns.PatternCase]:
    """The write patterns to run (before the grid): those of ``--patterns``, at this size."""
    sized = loop_patterns.GPU_PATTERNS if args.gpu else loop_patterns.CPU_PATTERNS
    return [c for c in sized if c.op in args.patterns]


def estimate_seconds(args, plan: list[LoopCase]) -> list[float]:
    """Rough cumulative GPU seconds after each planned case (the patterns first)."""
    runs = 1 + args.warmup + args.runs
    total, out = 0.0, []
    for case in planned_patterns(args):
        total += cases.LOOP_CASE_OVERHEAD_S + sum(
            cases.loop_pair_seconds(case, p, args.steps, runs)
            for p, _ in loop_patterns.pattern_providers(case, args.backends))
    for case in plan:
        total += cases.LOOP_CASE_OVERHEAD_S + sum(
            cases.loop_pair_seconds(case, p.name, args.steps, runs) for p, _ in pairs(args))
        out.append(total)
    return out


def print_plan(args, grid: str, plan, dropped) -> None:
    cumulative = estimate_seconds(args, plan)
    fits = sum(1 for s in cumulative if not args.time_budget_s or s <= args.time_budget_s)
    patterns = planned_patterns(args)
    print(f"loop {grid}: {len(patterns)} write patterns ({', '.join(c.op for c in patterns)}), "
          f"then {len(plan)} cases x {len(pairs(args))} rows each, {args.steps} steps, "
          f"{args.runs} runs interleaved in {min(args.rounds, args.runs)} rounds, pinned "
          f"buffer {report.format_bytes(args.buffer_bytes)}; rough GPU estimate "
          f"{cumulative[-1] if cumulative else 0:.0f} s; time budget "
          f"{args.time_budget_s or 'none'} s (about {fits} cases fit)", flush=True)
    table = environment.backend_table()
    if table != "shipped":
        print(f"  backend 'auto' follows ${TABLE_ENV}={table}, not the shipped table")
    for case, why in dropped:
        print(f"  not planned: {case.name}: {why}")
    if args.dry_run:
        for case, s in zip(plan, cumulative, strict=True):
            print(f"  {case.name:24} by ~{s:5.0f} s")


# ---------------------------------------------------------------------------
# Output


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.loop",
                                description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--quick", action="store_true", help="only the issue's target cases")
    p.add_argument("--cpu", action="store_true", help="force the tiny CPU grid")
    p.add_argument("--dry-run", action="store_true", help="print the plan and exit")
    p.add_argument("--out", type=Path, default=environment.REPO / "benchmarks" / "results")
    p.add_argument("--providers", type=cases.choices(PROVIDER_NAMES), default=PROVIDER_NAMES,
                   help="comma list (the baseline always runs)")
    p.add_argument("--backends", type=cases.choices(KERNEL_BACKENDS), default=(),
                   help="extra rows of every ours_* provider per kernel backend")
    p.add_argument("--patterns", type=cases.choices((*loop_patterns.PATTERN_OPS, "none")),
                   default=None, help="write patterns run before the grid (default: all; "
                   "none with a custom grid); see benchmarks/loop_patterns.py")
    p.add_argument("--rows", type=cases.parse_counts, default=None, help="custom grid: rows")
    p.add_argument("--row-bytes", type=cases.parse_counts, default=None)
    p.add_argument("--dtypes", type=cases.choices(LOOP_DTYPES), default=None)
    p.add_argument("--steps", type=int, default=None, help="steps per scan (200; 20 on CPU)")
    p.add_argument("--runs", type=int, default=None, help="timed runs (5; 3 on CPU)")
    p.add_argument("--warmup", type=int, default=1, help="untimed runs after the checked one")
    p.add_argument("--rounds", type=int, default=loop_patterns.ROUNDS,
                   help="a case's providers (grid and write patterns) are timed interleaved "
                   "in this many rounds, each a share of --runs, the order rotated per round")
    p.add_argument("--buffer-gib", type=float, default=None,
                   help="pinned buffer size (1 on GPU, 1/256 on CPU)")
    p.add_argument("--max-step-mib", type=float, default=64.0,
                   help="cases writing more per step are not planned")
    p.add_argument("--max-run-s", type=float, default=5.0,
                   help="a scan slower than this is timed once, without warm-up")
    p.add_argument("--time-budget-s", type=float, default=None,
                   help="skip what is left after this long (default 240 on GPU, none on CPU)")
    p.add_argument("--check-written", type=int, default=4096, help="written rows checked")
    p.add_argument("--check-others", type=int, default=1024, help="random other rows checked")
    p.add_argument("--inputs", choices=("fused", "materialized"), default="fused",
                   help="grid steps: 'materialized' computes each step's indices and updates "
                        "into buffers first (an optimization barrier), so XLA cannot fuse "
                        "their making into its scatter kernel, as for a real step's matmul "
                        "outputs or arguments; the write patterns are left as they are")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-plots", action="store_true")
    environment.add_xla_option(p)
    args = p.parse_args(argv)
    if args.cpu:
        jax.config.update("jax_platforms", "cpu")
    with_defaults(args, gpu=not args.cpu and environment.has_gpu())
    if args.steps < 1 or args.runs < 1 or args.warmup < 0 or args.rounds < 1:
        p.error("--steps, --runs and --rounds must be >= 1 and --warmup >= 0")
    return args


def with_defaults(args: argparse.Namespace, gpu: bool) -> argparse.Namespace:
    """Fills the machine-dependent defaults: H200 sizes on a GPU, a few seconds on CPU."""
    args.gpu = gpu
    args.steps = args.steps or (200 if gpu else 20)
    args.runs = args.runs or (5 if gpu else 3)
    args.buffer_bytes = int((args.buffer_gib or (1.0 if gpu else 1 / 256)) * GIB)
    if args.time_budget_s is None:
        args.time_budget_s = 240.0 if gpu else 0.0
    if args.patterns is None:
        custom = bool(args.rows or args.row_bytes or args.dtypes)
        args.patterns = () if custom else loop_patterns.PATTERN_OPS
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if not args.gpu and not args.cpu:
        print("no GPU found: running the CPU grid (as with --cpu)")
    if not args.gpu:
        print("note: on CPU the ours_* providers with backend 'auto' run XLA's fallback, "
              "so they measure XLA, not the kernel; floor_launch's kernel is interpreted, "
              "and XLA removes it (its floor is the baseline)")
    grid, plan, dropped = plan_cases(args)
    print_plan(args, grid, plan, dropped)
    if args.dry_run:
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    meta = {"benchmark": "loop", "grid": grid, "argv": sys.argv[1:], "steps": args.steps,
            "runs": args.runs, "warmup": args.warmup, "rounds": args.rounds,
            "buffer_bytes": args.buffer_bytes,
            "time_budget_s": args.time_budget_s, "backends": list(args.backends),
            "indices": "per step a row of a table of random rows without replacement, made "
                       "with numpy before timing and sliced on the device (sorted per row for "
                       "ours_set_unique_sorted); updates base + step in the buffer's dtype",
            "inputs": args.inputs,
            "patterns": {c.name: loop_patterns.describe(c) for c in planned_patterns(args)},
            "kernel_count_rule": hlo.COUNTING_RULE,
            "pcie_bytes_per_s": loop_floor.PCIE_BYTES_PER_S,
            "kernel_floor": loop_floor.FLOOR_RULE,
            "compiler_options": args.compiler_options, "backend_table": environment.backend_table(),
            **environment.environment()}
    buf, started, records = PinnedBuffer(args.seed), time.monotonic(), []
    patterns = planned_patterns(args)
    total = (sum(len(loop_patterns.pattern_providers(c, args.backends)) for c in patterns)
             + len(plan) * len(pairs(args)))
    progress = report.Progress(total, desc=f"loop {grid}")
    try:
        for case in patterns:
            over = bool(args.time_budget_s) and time.monotonic() - started > args.time_budget_s
            records += loop_patterns.run_pattern_case(args, buf, case, over, progress)
            report.write_json(args.out / "loop.json", {"meta": meta, "records": records})
        for case in plan:
            records += run_case(args, buf, case, started, progress)
            report.write_json(args.out / "loop.json", {"meta": meta, "records": records})
    finally:
        progress.close()
    inputs = ", inputs materialized" if args.inputs == "materialized" else ""
    report.print_loop_table(records, f"per-step cost in lax.scan ({grid}{inputs}, "
                            f"{meta['device_kind']}, {args.steps} steps, median of {args.runs} "
                            f"runs interleaved in {min(args.rounds, args.runs)} rounds"
                            f"{fewer_runs(args, records)}; us, op cost in parentheses, "
                            "min-max in brackets)")
    print(loop_floor.FLOOR_NOTE, *verdict_lines(records), sep="\n")
    plot = None if args.no_plots else plots.plot_loop(records, args.out / "loop.png")
    if plot is None and not args.no_plots:
        print("no plot: matplotlib is not installed (or nothing was timed)")
    print(f"wrote {args.out / 'loop.json'}{' and ' + str(plot) if plot else ''} in "
          f"{time.monotonic() - started:.0f} s")
    return exit_status(records)


def fewer_runs(args, records: list[dict]) -> str:
    """The header's word on rows timed fewer times than ``--runs`` ('' when none were)."""
    fewer = [r for r in records if r.get("runs") is not None and r["runs"] < args.runs]
    if not fewer:
        return ""
    return (f" ({len(fewer)} rows fewer: timed once, without warm-up, being slower than "
            f"--max-run-s {args.max_run_s:g} s; their records say runs 1)")


def exit_status(records: list[dict]) -> int:
    """1 when a row errored or was wrong; says so, and what the time budget left out."""
    skipped = [r for r in records if r["status"].startswith("skipped: time budget")]
    if skipped:
        # Not a failure (the budget is the caller's choice), but not a complete run either.
        cases_left = sorted({r["case"] for r in skipped})
        print(f"INCOMPLETE: the time budget left out {len(skipped)} of {len(records)} rows, "
              f"in {len(cases_left)} cases: {', '.join(cases_left)[:400]}")
    failed = False
    for r in records:
        label = f"{r['provider']}[{r['backend']}] on {r['case']}"
        if r["status"] == "error":
            print(f"ERROR: {label}: {r['error'][:300]}")
            failed = True
        elif r["correct"] is False:
            print(f"INCORRECT: {label}: {r['check'][:300]}")
            failed = True
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
