"""``python -m benchmarks.sweep``'s command line: its flags, their checks, the plan and bench."""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from benchmarks import cases, environment, report
from benchmarks.cases import Case
from benchmarks.providers import ALL_PROVIDERS, torch_probe_notes
from benchmarks.workspace import Bench, HostTarget

GIB, MIB = 1 << 30, 1 << 20

_DESCRIPTION = ("Sweep: scatter_to_host against XLA, host round trips, copies and peers, "
                "one call per case.")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.sweep",
                                description=_DESCRIPTION,
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--quick", action="store_true", help="only the target cases")
    p.add_argument("--cpu", action="store_true", help="force the tiny CPU sweep")
    p.add_argument("--dry-run", action="store_true", help="print the plan and exit")
    p.add_argument("--out", type=Path, default=environment.REPO / "benchmarks" / "results")
    p.add_argument("--providers", type=cases.choices(ALL_PROVIDERS), default=None,
                   help=f"comma list from {', '.join(ALL_PROVIDERS)}")
    p.add_argument("--patterns", type=cases.choices(cases.SWEPT_PATTERNS), default=None)
    p.add_argument("--dtypes", type=cases.choices(cases.DTYPES), default=None)
    p.add_argument("--row-bytes", type=cases.parse_counts, default=None, help="e.g. 4,512,8K")
    p.add_argument("--counts", type=cases.parse_counts, default=None,
                   help="update counts, e.g. 5,1K,16M")
    p.add_argument("--max-buffer-gib", type=float, default=None,
                   help="size of the pinned buffer (default 4 on GPU, 1/256 on CPU)")
    p.add_argument("--max-payload-mib", type=float, default=None,
                   help="cap on n_updates * row_bytes (default 512 on GPU, buffer/4 on CPU)")
    p.add_argument("--big-buffer-gib", type=float, default=None,
                   help="also probe device memory growth with a buffer this big (e.g. 32)")
    p.add_argument("--no-memory-probe", action="store_true")
    p.add_argument("--probe-updates", type=cases.parse_count, default=1 << 24)
    p.add_argument("--reps", type=int, default=10, help="timed runs at least")
    p.add_argument("--max-reps", type=int, default=200)
    p.add_argument("--min-time-s", type=float, default=0.05,
                   help="fast cases repeat until this much time is timed")
    p.add_argument("--warmup", type=int, default=1,
                   help="untimed runs after the checked one and the timed program's first call")
    p.add_argument("--max-run-s", type=float, default=2.0,
                   help="a provider whose single run is slower is not timed")
    p.add_argument("--time-budget-s", type=float, default=None,
                   help="skip what is left after this long (default 320 full, 70 quick)")
    p.add_argument("--back-to-back-row-bytes", type=cases.parse_counts, default=(512, 2048, 8192),
                   help="row sizes whose cases are also timed as calls back to back")
    p.add_argument("--back-to-back-calls", type=int, default=10,
                   help="calls per back-to-back round")
    p.add_argument("--check-rows", type=int, default=65536, help="written rows checked at most")
    p.add_argument("--check-mib", type=int, default=32, help="written bytes checked at most")
    p.add_argument("--check-others", type=int, default=4096, help="random other rows checked")
    p.add_argument("--roundtrip-min-updates", type=cases.parse_count, default=1 << 20)
    p.add_argument("--interpret-max-updates", type=cases.parse_count, default=1 << 12)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-plots", action="store_true")
    args = p.parse_args(argv)
    if args.reps < 1 or args.warmup < 1 or args.back_to_back_calls < 1:
        p.error(f"--reps, --warmup and --back-to-back-calls must be >= 1, got {args.reps}, "
                f"{args.warmup} and {args.back_to_back_calls}")
    return args


def resolve(args, gpu: bool) -> tuple[str, list[Case], list[tuple[Case, str]], dict]:
    """The sweep's name, its planned cases, the dropped ones and the sizes."""
    buffer_bytes = int((args.max_buffer_gib or (4.0 if gpu else 1 / 256)) * GIB)
    max_payload = int(args.max_payload_mib * MIB) if args.max_payload_mib else (
        512 * MIB if gpu else buffer_bytes // 4)
    custom = any(v is not None for v in (args.patterns, args.dtypes, args.row_bytes, args.counts))
    name = "custom" if custom else ("cpu" if not gpu else "quick" if args.quick else "full")
    planned_cases = {"custom": lambda: cases.custom_sweep(args), "cpu": cases.cpu_sweep,
                     "quick": cases.quick_sweep, "full": cases.full_sweep}[name]()
    planned, dropped = [], []
    for case in planned_cases:
        reason = cases.why_not_planned(case, buffer_bytes, max_payload)
        if reason:
            dropped.append((case, reason))
        else:
            planned.append(case)
    largest: dict[int, int] = {}
    for c in planned:
        if c.pattern == "random_unique" and c.dtype == "float32":
            largest[c.row_bytes] = max(largest.get(c.row_bytes, 0), c.n_updates)
    if args.time_budget_s is None:
        args.time_budget_s = {"full": 320.0, "quick": 70.0}.get(name, 0.0)
    sizes = {"buffer_bytes": buffer_bytes, "max_payload": max_payload, "largest": largest}
    return name, cases.order_plan(planned, largest), dropped, sizes


def print_plan(sweep, plan, dropped, sizes, names, args) -> None:
    est = cases.estimate_sweep_seconds(plan, names, args, sizes)
    print(f"sweep {sweep}: {len(plan)} cases x {len(names)} providers, buffer "
          f"{sizes['buffer_bytes'] / GIB:g} GiB, payload cap {sizes['max_payload'] / MIB:g} MiB; "
          f"rough GPU estimate {est:.0f} s; time budget "
          f"{args.time_budget_s or 'none'}", flush=True)
    for case, reason in dropped:
        print(f"  not planned: {case.pattern} {case.dtype} {case.row_bytes}B "
              f"n={report.format_count(case.n_updates)}: {reason}")
    if args.dry_run:
        for case in plan:
            print(f"  {case.pattern} {case.dtype} {case.row_bytes}B "
                  f"n={report.format_count(case.n_updates)}")


def setup_bench(args, gpu: bool, sizes: dict, names: tuple[str, ...]) -> Bench:
    bench = Bench(args, gpu, sizes["buffer_bytes"], sizes["max_payload"],
                  np.random.default_rng(args.seed), largest=sizes["largest"])
    host_names = ("ceiling", "host_roundtrip", "torch_index_copy", "torch_triton_zerocopy")
    if gpu and any(n in host_names for n in names):
        torch, why = environment.optional_import("torch")
        if torch is not None and not torch.cuda.is_available():
            torch, why = None, "torch has no CUDA"
        bench.torch = torch
        if torch is None:
            bench.notes["torch_unavailable"] = why
        else:
            bench.notes["torch"] = torch.__version__
            bench.notes.update(torch_probe_notes(torch))
    if any(n in host_names[1:] for n in names) or (bench.torch and "ceiling" in names):
        bench.host = HostTarget(bench.buffer_bytes, bench.torch)
    return bench
