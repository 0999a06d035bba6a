"""Loop: the per-step cost of writing rows into a pinned buffer inside ``lax.scan``.

    python -m benchmarks.loop --quick   # the target cases (on CPU: a tiny grid, seconds)
    python -m benchmarks.loop           # the grid within --time-budget-s; --backends pallas,triton

Before the grid, the write patterns of ``benchmarks/loop_patterns.py`` (ring
insert, KV-cache write, per-sequence decode write through
``pallas_pinned.at(x)[index].set``) each against XLA's best formulation of the
same write. Each (case, provider) compiles one jitted scan of ``--steps`` steps
with the buffer donated, counts the kernels a step launches in the compiled HLO,
runs it once and checks sampled rows against a numpy replay. Only when every
provider of a case has been checked are they timed, interleaved in ``--rounds``
rounds with the order rotated, so that drift of the machine lands on all of
them (``benchmarks/scan_runner.py``). ``us_per_step`` is the median over a
provider's timed runs; ``op_cost_us`` subtracts the baseline (the same step
without the write); the floor fields are described in ``benchmarks/loop_steps.py``.
Writes ``loop.json`` and ``loop.png`` under ``--out``; exits 1 on any error or
wrong result.
"""

from __future__ import annotations

import argparse
import functools
import sys
import time
from pathlib import Path

import jax
import numpy as np

from benchmarks import checks, environment, hlo, loop_patterns, loop_steps, report
from benchmarks.loop_steps import PROVIDER_NAMES, PROVIDERS, READS_BACK, LoopData, LoopProvider
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
from pallas_pinned.testing import LOOP_CASES, LOOP_CPU_CASES, LOOP_DTYPES, LOOP_TARGETS, LoopCase

GIB, MIB = 1 << 30, 1 << 20
KERNEL_BACKENDS = ("pallas", "triton", "interpret")
# What auto is held to against XLA on the same semantics (unique rows make XLA's
# set and add mean what ours promise): (label, ours, XLA's, largest ratio of medians).
BARS = (("set, promised distinct", "ours_set_unique", "xla_set", 1.10),
        ("add, promised distinct", "ours_add_unique", "xla_add", 1.10),
        ("add, fixed order", "ours_add", "xla_add", 1.50),
        ("get", "ours_get", "xla_get", 1.00))


def base_record(case: LoopCase, provider: LoopProvider, backend: str, steps: int,
                rounds: int) -> dict:
    return {
        "case": case.name, "op": provider.op, "rows": case.rows, "row_bytes": case.row_bytes,
        "dtype": case.dtype, "provider": provider.name, "backend": backend, "steps": steps,
        "status": "ok", "us_per_step": None, "us_min": None, "us_max": None, "runs": 0,
        "rounds": rounds, "op_cost_us": None, "kernels_per_step": None, "op_kernels": None,
        "hlo_ops": None, "correct": None, "check": None, "compile_s": None, "notes": "",
        **dict.fromkeys(loop_steps.FLOOR_FIELDS),
    }


def check_pair(args, buf: PinnedBuffer, data: LoopData, provider: LoopProvider, backend: str,
               compiled_and_s) -> tuple[dict, CheckedScan | None]:
    """Runs one compiled grid scan once and checks it against the replay (timed later)."""
    data = own_updates(data, f"{provider.name}[{backend}]")
    record = base_record(data.case, provider, backend, args.steps, args.rounds)
    record["check"] = f"{data.sample.size} sampled rows match the numpy replay"
    reads_back = provider.op in READS_BACK
    # A read-back check reads the last step's rows before the run too (add_read's oracle).
    rows = np.concatenate([data.sample, data.table[-1]]) if reads_back else data.sample
    if reads_back:
        record["check"] += ("; so do the rows read after the last step's "
                            + provider.op.removesuffix("_read"))

    def judge(before, outputs):
        before, before_last = before[:data.sample.size], before[data.sample.size:]
        after = checks.read_rows(outputs[0], data.sample)
        mismatch = loop_steps.check_replay(data, provider, before, after)
        if mismatch is None and provider.op == "get":
            x_rows = checks.read_rows(outputs[0], data.table[-1])
            mismatch = loop_steps.check_gathered(data, np.asarray(outputs[1]), x_rows)
        if mismatch is None and reads_back:
            mismatch = loop_steps.check_read_back(data, provider.op, before_last,
                                                  np.asarray(outputs[1]))
        return mismatch

    scan = check_scan(args, buf, record, compiled_and_s, (data.table_dev, data.base_dev),
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
    then all timed interleaved; the whole case is skipped once ``--time-budget-s`` is used."""
    over_budget = bool(args.time_budget_s) and time.monotonic() - started > args.time_budget_s
    todo, records = split_runnable(
        args, pairs(args), over_budget,
        lambda p, b: base_record(case, p, b, args.steps, args.rounds), progress, case.name)
    if not todo:
        return records
    buf.ensure(case.dtype, loop_steps.buffer_shape(case, args.buffer_bytes))
    # A seed per case from plain numbers: the same data on every run and machine.
    rng = np.random.default_rng([args.seed, case.rows, case.row_bytes,
                                 LOOP_DTYPES.index(case.dtype)])
    data = loop_steps.make_loop_data(case, args.buffer_bytes, args.steps, rng,
                                     check_written=args.check_written,
                                     check_others=args.check_others)
    materialized = args.inputs == "materialized"
    lowerings = {
        (p.name, b): functools.partial(
            lambda p, b: loop_steps.scan_fn(p, b, materialized=materialized).lower(
                buf.x, data.table_dev, data.base_dev), p, b)
        for p, b in todo
    }
    try:
        compiled = compile_all(lowerings, args.compiler_options)
        records += check_then_time(
            buf, todo, lambda p, b: check_pair(args, buf, data, p, b, compiled[(p.name, b)]),
            args.rounds, progress, case.name)
    finally:
        data.release()
    order = {(p.name, b): k for k, (p, b) in enumerate(pairs(args))}
    records.sort(key=lambda r: order[(r["provider"], r["backend"])])
    fill_op_costs(records)
    loop_steps.fill_floors(records)
    return records


# ---------------------------------------------------------------------------
# Plan


def plan_cases(args) -> tuple[str, list[LoopCase], list[tuple[LoopCase, str]]]:
    """The grid's name, its planned cases (most wanted first) and the dropped ones."""
    if not args.gpu:  # seconds: one case with --quick
        base, grid = ((LoopCase(64, 256),), "cpu_quick") if args.quick else (LOOP_CPU_CASES, "cpu")
    else:
        base, grid = (LOOP_TARGETS, "quick") if args.quick else (LOOP_CASES, "full")
    if args.rows or args.row_bytes:
        grid = "custom"
        wanted = [LoopCase(r, b, d) for r in args.rows or (1024,)
                  for b in args.row_bytes or (1024,) for d in args.dtypes or ("float32",)]
    elif args.dtypes:  # the chosen grid's (rows, row bytes) in these dtypes
        grid = "custom"
        shapes = dict.fromkeys((c.rows, c.row_bytes) for c in base)
        wanted = [LoopCase(r, b, d) for d in args.dtypes for r, b in shapes]
    else:
        wanted = list(base)
    planned, dropped = [], []
    for case in wanted:
        why = why_not_planned(case, args)
        (dropped.append((case, why)) if why else planned.append(case))
    return grid, planned, dropped


def why_not_planned(case: LoopCase, args) -> str | None:
    if case.row_bytes % np.dtype(jax.numpy.dtype(case.dtype)).itemsize:
        return f"{case.row_bytes} B is not a whole number of {case.dtype}"
    num_rows = args.buffer_bytes // case.row_bytes
    if case.rows > num_rows:
        return f"{case.rows} unique rows per step > {num_rows} rows in the buffer"
    if case.step_bytes > args.max_step_mib * MIB:
        return f"{case.step_bytes / MIB:g} MiB per step > --max-step-mib"
    return None


def planned_patterns(args) -> list[loop_patterns.PatternCase]:
    """The write patterns to run (before the grid): those of ``--patterns``, at this size."""
    sized = loop_patterns.GPU_PATTERNS if args.gpu else loop_patterns.CPU_PATTERNS
    return [c for c in sized if c.op in args.patterns]


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.loop",
                                description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--quick", action="store_true", help="only the target cases")
    p.add_argument("--out", type=Path, default=environment.REPO / "benchmarks" / "results")
    p.add_argument("--providers", type=environment.choices(PROVIDER_NAMES),
                   default=PROVIDER_NAMES, help="comma list (the baseline always runs)")
    p.add_argument("--backends", type=environment.choices(KERNEL_BACKENDS), default=(),
                   help="extra rows of every ours_* provider per kernel backend")
    p.add_argument("--patterns", type=environment.choices((*loop_patterns.PATTERN_OPS, "none")),
                   default=None, help="write patterns run before the grid (default: all; "
                   "none with a custom grid)")
    p.add_argument("--rows", type=environment.parse_counts, default=None, help="custom grid")
    p.add_argument("--row-bytes", type=environment.parse_counts, default=None)
    p.add_argument("--dtypes", type=environment.choices(LOOP_DTYPES), default=None)
    p.add_argument("--steps", type=int, default=None, help="steps per scan (200; 20 on CPU)")
    p.add_argument("--runs", type=int, default=None, help="timed runs (5; 3 on CPU)")
    p.add_argument("--warmup", type=int, default=1, help="untimed runs after the checked one")
    p.add_argument("--rounds", type=int, default=loop_patterns.ROUNDS,
                   help="a case's providers are timed interleaved in this many rounds")
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
                   help="'materialized' computes each step's indices and updates into buffers "
                   "first (an optimization barrier), so XLA cannot fuse their making into its "
                   "scatter, as for a real step's matmul outputs; write patterns unchanged")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-plots", action="store_true")
    environment.add_xla_option(p)
    args = p.parse_args(argv)
    with_defaults(args, gpu=environment.has_gpu())
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


# ---------------------------------------------------------------------------
# Output


def _us(r: dict | None, cost: bool = True) -> str:
    """``us_per_step [min–max] (op cost)``, or the status where it was not timed."""
    if not r or r["us_per_step"] is None:
        return "-" if not r else r["status"][:10]
    extra = "" if not cost or r.get("op_cost_us") is None else f" ({r['op_cost_us']:.1f})"
    return f"{r['us_per_step']:.1f}{report.span(r.get('us_min'), r.get('us_max'), '.1f')}{extra}"


def print_table(records: list[dict], title: str) -> None:
    """One line per (case, op, backend): us/step [min–max] (op cost), kernels/step, ours/xla.

    ``launch`` is the floor_launch step, ``floor`` that plus the op's bytes over PCIe.
    """
    header = ["rows", "row B", "dtype", "op", "base us", "launch (op)", "xla us (op)",
              "ours us [min–max] (op)", "floor (+pcie)", "unique", "kernels x/o", "ours/xla"]
    by = {(r["case"], r["provider"], r["backend"]): r for r in records}
    rows, seen = [], set()
    for r in records:
        auto = r["backend"] in ("auto", "-")
        backend = "auto" if auto else r["backend"]
        if r["op"] in ("none", "floor") or (r["case"], r["op"], backend) in seen:
            continue
        seen.add((r["case"], r["op"], backend))
        xla = by.get((r["case"], f"xla_{r['op']}", "-"))
        ours = by.get((r["case"], f"ours_{r['op']}", backend))
        if ours is None:
            continue
        ratio = (f"{ours['us_per_step'] / xla['us_per_step']:.2f}"
                 if xla and xla["us_per_step"] and ours["us_per_step"] else "-")
        if any(k and k.get("correct") is False for k in (xla, ours)):
            ratio = "n/a (incorrect)"  # no ratio against a wrong result
        kernels = "/".join("-" if not k or k["kernels_per_step"] is None
                           else f"{k['kernels_per_step']:g}" for k in (xla, ours))
        floor = ("-" if ours.get("kernel_floor_us") is None
                 else f"{ours['kernel_floor_us']:.1f} (+{ours['pcie_us']:.1f})")
        rows.append([str(r["rows"]), str(r["row_bytes"]), r["dtype"],
                     r["op"] if auto else f"{r['op']}[{backend}]",
                     _us(by.get((r["case"], "baseline", "-")), cost=False),
                     _us(by.get((r["case"], "floor_launch", "-"))) if auto else "",
                     _us(xla) if auto else "", _us(ours), floor,
                     _us(by.get((r["case"], f"ours_{r['op']}_unique", backend))),
                     kernels, ratio])
    report.print_table(header, rows, title, left=("dtype", "op"))


def bar_lines(records: list[dict]) -> list[str]:
    """auto against XLA on the same semantics (:data:`BARS`): each ratio of medians over
    its bar named, then the count within."""
    timed = {(r["case"], r["provider"]): r for r in records if r["backend"] in ("auto", "-")
             and r["us_per_step"] is not None and r["correct"] is True}
    within, over = 0, []
    for case in dict.fromkeys(r["case"] for r in records):
        for label, ours, xla, bar in BARS:
            a, b = timed.get((case, ours)), timed.get((case, xla))
            if a is None or b is None:
                continue
            ratio = a["us_per_step"] / b["us_per_step"]
            if ratio <= bar:
                within += 1
            else:
                over.append(f"  over: {case:30} {label:24} {a['us_per_step']:.1f} / "
                            f"{b['us_per_step']:.1f} us = {ratio:.2f}x (bar {bar:.2f}x)")
    return [f"auto against XLA, same semantics: {within} of {within + len(over)} pairs "
            "within their bar (set and add promised distinct 1.10x, add 1.50x, get 1.00x)",
            *over]


def main(argv=None) -> int:
    args = parse_args(argv)
    if not args.gpu:
        print("note: no GPU: 'auto' runs XLA's fallback; floor_launch's kernel is removed")
    grid, plan, dropped = plan_cases(args)
    patterns = planned_patterns(args)
    print(f"loop {grid}: {len(patterns)} write patterns, then {len(plan)} cases x "
          f"{len(pairs(args))} rows each, {args.steps} steps, {args.runs} runs in "
          f"{min(args.rounds, args.runs)} rounds, pinned buffer "
          f"{report.format_bytes(args.buffer_bytes)}, time budget "
          f"{args.time_budget_s or 'none'} s", flush=True)
    for case, why in dropped:
        print(f"  not planned: {case.name}: {why}")
    args.out.mkdir(parents=True, exist_ok=True)
    meta = {"benchmark": "loop", "grid": grid, "argv": sys.argv[1:], "steps": args.steps,
            "runs": args.runs, "warmup": args.warmup, "rounds": args.rounds,
            "buffer_bytes": args.buffer_bytes, "time_budget_s": args.time_budget_s,
            "backends": list(args.backends), "inputs": args.inputs,
            "indices": "per step a row of a table of random rows without replacement, made "
                       "with numpy before timing and sliced on the device; updates base + step",
            "patterns": {c.name: loop_patterns.describe(c) for c in patterns},
            "kernel_count_rule": hlo.COUNTING_RULE,
            "pcie_bytes_per_s": loop_steps.PCIE_BYTES_PER_S,
            "kernel_floor": loop_steps.FLOOR_RULE, "compiler_options": args.compiler_options,
            **environment.environment()}
    buf, started, records = PinnedBuffer(args.seed), time.monotonic(), []
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
    print_table(records, f"per-step cost in lax.scan ({grid}{inputs}, {meta['device_kind']}, "
                f"{args.steps} steps, median of {args.runs} runs in "
                f"{min(args.rounds, args.runs)} rounds{fewer_runs(args, records)}; us, op cost "
                "in parentheses, min-max in brackets)")
    print(loop_steps.FLOOR_NOTE, *bar_lines(records), sep="\n")
    plot = None if args.no_plots else report.plot_loop(records, args.out / "loop.png")
    if plot is None and not args.no_plots:
        print("no plot: matplotlib is not installed (or nothing was timed)")
    print(f"wrote {args.out / 'loop.json'}{' and ' + str(plot) if plot else ''} in "
          f"{time.monotonic() - started:.0f} s")
    return exit_status(records)


def fewer_runs(args, records: list[dict]) -> str:
    """The header's word on rows timed fewer times than ``--runs`` ('' when none were)."""
    fewer = [r for r in records if r.get("runs") is not None and r["runs"] < args.runs
             and r["status"] == "ok"]
    if not fewer:
        return ""
    return (f" ({len(fewer)} rows timed once, without warm-up, being slower than "
            f"--max-run-s {args.max_run_s:g} s)")


def exit_status(records: list[dict]) -> int:
    """1 when a row errored or was wrong; says so, and what the time budget left out."""
    skipped = [r for r in records if r["status"].startswith("skipped: time budget")]
    if skipped:  # the caller's budget, not a failure; but not a complete run either
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
