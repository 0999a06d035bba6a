"""One call: ``scatter_to_host`` against XLA, a host round trip, a raw Triton peer and the copy.

    python -m benchmarks.one_call --quick   # the target cases (on CPU: a tiny sweep, seconds)
    python -m benchmarks.one_call           # every row size, count, pattern and dtype

Each (case, provider) is checked once against the numpy oracle on sampled rows, then
timed: the median of at least ``--reps`` device-synchronized calls, and for 512 B-8 KiB
rows also calls back to back, as a loop of calls runs. The ceiling is the copy engine's
device->pinned copy, checked too. Writes ``one_call_<sweep>.json`` and a plot per
(pattern, dtype); exits 1 when a provider failed, was wrong (but :func:`exempt`), or
``ours`` went untimed on a target case.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import jax
import numpy as np

from benchmarks import environment, report, timing
from benchmarks import one_call_cases as cases
from benchmarks import one_call_providers as oc
from benchmarks.checks import check_rows, read_rows
from benchmarks.one_call_cases import Case
from benchmarks.one_call_providers import Bench, CaseData, CheckUpdates, Provider

GIB, MIB = 1 << 30, 1 << 20
PROVIDERS = ("ceiling", "ours", "ours_triton", "xla", "host_roundtrip", "torch_triton_zerocopy")
QUICK_PROVIDERS = PROVIDERS[:-1]
# The summary reads these: on a target case they run whatever the time budget says.
SUMMARY_PROVIDERS = ("ceiling", "ours", "ours_triton", "xla")
BACK_TO_BACK_PROVIDERS = ("ceiling", "ours", "ours_triton")
BACK_TO_BACK_ROUNDS = 5


def base_record(bench: Bench, data: CaseData, provider: Provider) -> dict:
    c = data.case
    return {
        "case": f"{c.pattern}-{c.dtype}-{c.row_bytes}B-n{c.n_updates}",
        "provider": provider.name, "pattern": c.pattern, "dtype": c.dtype,
        "row_bytes": c.row_bytes, "n_updates": c.n_updates, "num_rows": data.shape[0],
        "buffer_bytes": bench.buffer_bytes, "impl": provider.impl,
        "duplicates": provider.duplicates, "target_case": cases.is_target(c, bench.args.largest),
        "status": "ok", "correct": None, "check": None, "median_s": None, "min_s": None,
        "max_s": None, "reps": 0, "gbps": None, "updates_per_s": None, "ceiling_gbps": None,
        "frac_of_ceiling": None, "b2b_median_s": None, "b2b_min_s": None, "b2b_max_s": None,
        "b2b_calls": 0, "b2b_gbps": None, "b2b_frac_of_ceiling": None, "notes": "",
    }


def _call_once(bench: Bench, provider: Provider, bound) -> None:
    state = bench.x if provider.target == "jax" else None
    args = bound.prepare() if bound.prepare else bound.args
    state = jax.block_until_ready(bound.step(state, *args))
    if provider.target == "jax":
        bench.x = state


def check_once(bench: Bench, data: CaseData, provider: Provider, k: int) -> tuple[str, str]:
    """Runs the provider once (compiling it) and checks sampled rows: ``(mismatch or "",
    captured output)``."""
    updates = CheckUpdates.for_provider(bench, data, k)
    bound = provider.bind(data, updates.as_kind(bench, data, provider.updates))
    if provider.target == "none":
        return check_copy(bench, data, provider, bound, updates)
    if provider.target not in data.before:
        data.before[provider.target] = oc.read_rows(bench, data, provider.target)
    with environment.captured_output() as out:
        _call_once(bench, provider, bound)
    after = oc.read_rows(bench, data, provider.target)
    mismatch = check_rows(data.before[provider.target], after, data.sample,
                          updates.host_hits(data), duplicates=provider.duplicates)
    if mismatch:  # it may have changed rows it must not touch: the next one reads afresh
        data.before.pop(provider.target)
    return mismatch or "", out["text"]


def check_copy(bench: Bench, data: CaseData, provider: Provider, bound,
               updates: CheckUpdates) -> tuple[str, str]:
    """A copy (the ceiling, which every "of ceiling" ratio divides by): sampled rows
    against the updates, bit for bit. The torch copy writes the head of the host buffer,
    first set to the complement of what it must write; the jax one deletes its copy inside
    the call, so the rows are read through ``Bound.observed`` before that."""
    positions = data.sample.hit_positions
    want = _row_bytes(updates.host_hits(data))
    if provider.updates == "torch":
        n = data.case.n_updates
        head = bench.host.raw[: n * data.case.row_bytes].reshape(n, data.case.row_bytes)
        head[positions] = ~want
        with environment.captured_output() as out:
            _call_once(bench, provider, bound)
        got = head[positions]
    elif bound.observed is None:
        return "the copy cannot be checked (its Bound has no observed)", ""
    else:
        kept: list[np.ndarray] = []

        def keep(copy: jax.Array) -> None:
            if copy.sharding.memory_kind == "pinned_host":
                kept.append(read_rows(copy, positions))

        with environment.captured_output() as out:
            _call_once(bench, provider, bound.observed(keep))
        if not kept:
            return "the copy put nothing in pinned memory", out["text"]
        got = _row_bytes(kept[-1])
    same = np.array_equal(got, want)
    return "" if same else "sampled rows of the copy differ from the updates", out["text"]


def _row_bytes(rows: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(rows).reshape(rows.shape[0], -1).view(np.uint8)


def measure(bench: Bench, data: CaseData, provider: Provider):
    """The synchronized timing (or the seconds of one run when that is over --max-run-s)
    and, where the row size asks for it and the provider can, the calls back to back."""
    bound = provider.bind(data, oc.main_updates(bench, data, provider.updates))
    args = bench.args
    state = bench.x if provider.target == "jax" else None

    def timed(state, repeats):
        state, result = timing.measure(bound.step, state, *bound.args, repeats=repeats,
                                       warmup=0, prepare=bound.prepare)
        if provider.target == "jax":  # the buffer was donated: keep the one returned
            bench.x = state
        return state, result

    # The first call of the timed program may compile it: never judged. --max-run-s and
    # the repeat count read the last warm-up call, compiled and touched.
    state, warm = timed(state, 1)
    for _ in range(args.warmup):
        state, warm = timed(state, 1)
    if warm.max_s > args.max_run_s:
        return warm.max_s, None
    reps = timing.choose_reps(warm.median_s, min_reps=args.reps, max_reps=args.max_reps,
                              min_total_s=args.min_time_s)
    state, synchronized = timed(state, reps)
    wanted = (data.case.row_bytes in args.back_to_back_row_bytes
              and provider.name in BACK_TO_BACK_PROVIDERS)
    if not wanted or bound.unsynced is None or bound.prepare is not None:
        return synchronized, None
    state, back_to_back = timing.measure_back_to_back(
        bound.unsynced, bound.wait, state, *bound.args, calls=args.back_to_back_calls,
        rounds=BACK_TO_BACK_ROUNDS)
    if provider.target == "jax":
        bench.x = state
    return synchronized, back_to_back


def run_pair(bench: Bench, data: CaseData, provider: Provider, k: int) -> dict:
    record = base_record(bench, data, provider)
    budget = bench.args.time_budget_s
    essential = provider.name in SUMMARY_PROVIDERS and record["target_case"]
    if budget and bench.elapsed() > budget and not essential:
        record["status"] = f"skipped: time budget of {budget:.0f} s used up"
        return record
    try:
        mismatch, captured = check_once(bench, data, provider, k)
        measured, back_to_back = measure(bench, data, provider)
    except Exception as err:  # noqa: BLE001 - recorded as an error; the run fails at the end
        if provider.target == "jax" and bench.ensure_buffer():
            data.before.pop("jax", None)
        record.update(status="error", error=f"{type(err).__name__}: {err}"[:600])
        return record
    record.update(notes=environment.first_lines(captured), correct=not mismatch,
                  check=mismatch[:600] or f"{data.sample.rows.size} sampled rows match")
    if isinstance(measured, float):
        record.update(status=f"skipped: one run took {measured:.2f} s > --max-run-s",
                      single_run_s=measured)
        return record
    payload = data.case.n_updates * data.case.row_bytes
    record.update(median_s=measured.median_s, min_s=measured.min_s, max_s=measured.max_s,
                  reps=measured.reps, gbps=payload / measured.median_s / 1e9,
                  updates_per_s=data.case.n_updates / measured.median_s)
    if back_to_back is not None:
        record.update(b2b_median_s=back_to_back.median_s, b2b_min_s=back_to_back.min_s,
                      b2b_max_s=back_to_back.max_s, b2b_calls=bench.args.back_to_back_calls,
                      b2b_gbps=payload / back_to_back.median_s / 1e9)
    return record


def why_unusable(r: dict | None) -> str | None:
    """Why a record gives no ratio (None: it does)."""
    if r is None:
        return "not run"
    if r["status"] != "ok":
        return r["status"]
    return "incorrect" if r.get("correct") is False else None if r["gbps"] else "untimed"


def fill_ceiling(records: list[dict]) -> None:
    """Each record's rate against its case's ceiling, synchronized and back to back;
    none, with the reason, where the ceiling has no checked timing."""
    ceiling = next((r for r in records if r["provider"] == "ceiling"), None)
    if why := why_unusable(ceiling):
        for r in records:
            r["ceiling_note"] = f"no ratio: ceiling {why}"
        return
    for r in records:
        r["ceiling_gbps"] = ceiling["gbps"]
        if r["gbps"]:
            r["frac_of_ceiling"] = r["gbps"] / ceiling["gbps"]
        if r["b2b_gbps"] and ceiling["b2b_gbps"]:
            r["b2b_frac_of_ceiling"] = r["b2b_gbps"] / ceiling["b2b_gbps"]


def run_case(bench: Bench, case: Case, providers: list[Provider], progress) -> list[dict]:
    num_rows, row_shape = oc.layout_of(case, bench.buffer_bytes)
    bench.set_layout(case.dtype, (num_rows, *row_shape))
    data = oc.make_case_data(bench, case)
    records = []
    try:
        for k, provider in enumerate(providers):
            records.append(run_pair(bench, data, provider, k))
            progress.step(f"{records[-1]['case']} {provider.name}")
    finally:
        data.release()
    fill_ceiling(records)
    return records


def _rate(r: dict, b2b: str = "") -> str:
    """Updates/s for 4 B rows (what bounds them), GB/s for wider: median [slowest–fastest]."""
    per_s = r["n_updates"] if r["row_bytes"] == 4 else r["n_updates"] * r["row_bytes"]
    unit, scale = ("M/s", 1e-6) if r["row_bytes"] == 4 else ("GB/s", 1e-9)
    med, slowest, fastest = (per_s * scale / r[f"{b2b}{k}"] for k in ("median_s", "max_s",
                                                                       "min_s"))
    return f"{med:.1f} {unit}{report.span(slowest, fastest, '.1f')}"


def summary(records: list[dict]) -> list[str]:
    """Per target case: ours, then each other provider with ours over it (rates of medians,
    between checked results only), and back to back where timed so."""
    lines = []
    for case in dict.fromkeys(r["case"] for r in records if r["target_case"]):
        by = {r["provider"]: r for r in records if r["case"] == case}
        ours = by.get("ours")
        if why := why_unusable(ours):
            lines.append(f"{case}: ours not timed ({why})")
            continue
        parts = []
        for name, r in by.items():
            if name != "ours":
                why = why_unusable(r)
                parts.append(f"{name} n/a ({why})" if why else
                             f"{name} {_rate(r)} (ours/{name} {ours['gbps'] / r['gbps']:.2f}x)")
        line = f"{case}: ours {_rate(ours)}; " + ", ".join(parts)
        ceiling = by.get("ceiling")
        if ours["b2b_gbps"] and ceiling and ceiling.get("b2b_gbps") and not why_unusable(ceiling):
            line += (f"; {ours['b2b_calls']} calls back to back: ours {_rate(ours, 'b2b_')}, "
                     f"ceiling {_rate(ceiling, 'b2b_')}, ours/ceiling "
                     f"{ours['b2b_frac_of_ceiling']:.2f}x")
        lines.append(line)
    return lines


def print_records(records: list[dict], title: str) -> None:
    header = ["case", "provider", "median [min–max]", "GB/s", "M upd/s", "of ceiling",
              "back to back", "correct", "note"]
    rows = [[r["case"], r["provider"],
             report.format_seconds_span(r["median_s"], r["min_s"], r["max_s"]),
             "-" if r["gbps"] is None else f"{r['gbps']:.2f}",
             "-" if r["updates_per_s"] is None else f"{r['updates_per_s'] / 1e6:.1f}",
             "-" if r["frac_of_ceiling"] is None else f"{100 * r['frac_of_ceiling']:.0f}%",
             "-" if r["b2b_frac_of_ceiling"] is None else f"{100 * r['b2b_frac_of_ceiling']:.0f}%",
             {True: "yes", False: "NO", None: "-"}[r["correct"]],
             "" if r["status"] == "ok" else r["status"]] for r in records]
    report.print_table(header, rows, title, left=("case", "provider", "note"))


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.one_call",
                                description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--quick", action="store_true", help="only the target cases")
    p.add_argument("--out", type=Path, default=environment.REPO / "benchmarks" / "results")
    p.add_argument("--providers", type=environment.choices(PROVIDERS), default=None,
                   help=f"comma list from {', '.join(PROVIDERS)}")
    p.add_argument("--patterns", type=environment.choices(cases.PATTERNS), default=None)
    p.add_argument("--dtypes", type=environment.choices(cases.DTYPES), default=None)
    p.add_argument("--row-bytes", type=environment.parse_counts, default=None,
                   help="e.g. 4,512,8K")
    p.add_argument("--counts", type=environment.parse_counts, default=None,
                   help="updates per call, e.g. 5,1K,16M")
    p.add_argument("--buffer-gib", type=float, default=None,
                   help="size of the pinned buffer (default 4 on GPU, 1/256 on CPU)")
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
    p.add_argument("--back-to-back-row-bytes", type=environment.parse_counts,
                   default=(512, 2048, 8192), help="row sizes also timed as calls back to back")
    p.add_argument("--back-to-back-calls", type=int, default=10, help="calls per round")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-plots", action="store_true")
    args = p.parse_args(argv)
    if args.reps < 1 or args.warmup < 1 or args.back_to_back_calls < 1:
        p.error("--reps, --warmup and --back-to-back-calls must be >= 1")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    gpu = environment.has_gpu()
    args.buffer_bytes = int((args.buffer_gib or (4.0 if gpu else 1 / 256)) * GIB)
    args.max_payload = 512 * MIB if gpu else args.buffer_bytes // 4
    sweep, plan = cases.plan(args, gpu)
    if args.time_budget_s is None:
        args.time_budget_s = {"full": 320.0, "quick": 70.0}.get(sweep, 0.0)
    names = args.providers or (QUICK_PROVIDERS if sweep != "full" else PROVIDERS)
    print(f"one_call {sweep}: {len(plan)} cases x {len(names)} providers, buffer "
          f"{report.format_bytes(args.buffer_bytes)}, time budget {args.time_budget_s or 'none'}",
          flush=True)
    bench = Bench(args, gpu, args.buffer_bytes, np.random.default_rng(args.seed))
    if gpu and any(n in ("ceiling", "torch_triton_zerocopy") for n in names):
        torch, why = environment.optional_import("torch")
        if torch is not None and not torch.cuda.is_available():
            torch, why = None, "torch has no CUDA"
        bench.torch = torch
        bench.notes.update({"torch": torch.__version__} if torch else {"torch_unavailable": why})
    if "host_roundtrip" in names or "torch_triton_zerocopy" in names or bench.torch:
        bench.host = oc.HostTarget(bench.buffer_bytes, bench.torch)
    absent = oc.unavailable(bench, names)
    providers = oc.build_providers(bench, names)
    for name, reason in absent.items():
        print(f"  left out: {name}: {reason}")
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"one_call_{sweep}.json"
    meta = {"benchmark": "one_call", "sweep": sweep, "argv": sys.argv[1:],
            "providers": [p.name for p in providers], "providers_left_out": absent,
            "buffer_bytes": args.buffer_bytes, "max_payload": args.max_payload,
            "host_buffer": bench.host and bench.host.kind, **environment.environment(),
            **bench.notes}
    records: list[dict] = []
    progress = report.Progress(len(plan) * len(providers), desc=f"one_call {sweep}")
    try:
        for case in plan:
            try:
                records += run_case(bench, case, providers, progress)
            except Exception as err:  # noqa: BLE001 - e.g. out of memory making the data
                meta.setdefault("case_errors", []).append(f"{case}: {type(err).__name__}: {err}")
            report.write_json(path, {"meta": meta, "records": records})  # survives a kill
    finally:
        progress.close()
    lines = summary(records)
    report.write_json(path, {"meta": meta, "records": records, "summary": lines})
    print_records(records, f"scatter_to_host, one call ({sweep}, {meta['device_kind']})")
    plots = None if args.no_plots else report.plot_sweep(records, args.out, path.stem, "ceiling")
    if plots is None and not args.no_plots:
        print("matplotlib is not installed: no plots")
    print(f"\nwrote {path} and {len(plots or [])} plot(s) in {bench.elapsed():.0f} s")
    print("\nsummary:\n  " + "\n  ".join(lines or ["no target case measured"]))
    return exit_status(records, meta)


def exit_status(records: list[dict], meta: dict) -> int:
    """1 when anything failed: a provider or case error, a wrong result (:func:`exempt`
    names the one kind that does not fail), or ``ours`` untimed on a target case."""
    failed = False
    for r in records:
        if r["status"] == "error":
            print(f"ERROR: {r['provider']} on {r['case']}: {r['error'][:300]}")
            failed = True
        elif r["provider"] == "ours" and r["target_case"] and r["median_s"] is None:
            print(f"UNTIMED: ours on target case {r['case']}: {r['status']}")
            failed = True  # the summary reads this timing: a skip would hide a regression
        if r["correct"] is False:
            why = exempt(r)
            print(f"INCORRECT: {r['provider']} on {r['case']}: {r['check'][:200]}"
                  + (f"\n  not failed, exempt: {why}" if why else ""))
            failed = failed or not why
    for line in meta.get("case_errors", []):
        print(f"ERROR: case {line[:300]}")
        failed = True
    return 1 if failed else 0


def exempt(r: dict) -> str | None:
    """Why a wrong result does not fail the run (None: it does): only an alternative whose
    duplicate order is unspecified (XLA, the peers) on a pattern that repeats rows, where
    XLA's scatter may leave a row mixing elements of different updates, which jnp allows."""
    if (r["provider"].startswith("ours") or r.get("duplicates") != "any"
            or r.get("pattern") in cases.UNIQUE_PATTERNS):
        return None
    return (f"{r['provider']} leaves the order of repeated rows unspecified and "
            f"{r['pattern']} repeats rows")


if __name__ == "__main__":
    sys.exit(main())
