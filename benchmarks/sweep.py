"""Sweep: ``scatter_to_host`` against XLA, host round trips, copies and peers, one call per case.

    python -m benchmarks.sweep            # full sweep, 4 GiB buffer (planned ~5 min on an H200)
    python -m benchmarks.sweep --quick    # the targets only (planned ~1 min)
    python -m benchmarks.sweep --cpu      # tiny CPU sweep (automatic without a GPU)
    python -m benchmarks.sweep --dry-run  # print the plan and a time estimate

Every provider writes the same indices and updates into a buffer of the same
size; each (case, provider) is checked once against the numpy oracle on a
sample of rows, then timed (median of at least ``--reps`` device-synchronized
runs); the 512 B-8 KiB cases are also timed as calls back to back, as a loop
of calls runs, against the copy engine back to back. Results go to ``--out`` as
JSON and CSV (plus PNG plots with matplotlib); see benchmarks/README.md for what
each provider measures. The ceiling (a copy) is checked too: where it is wrong
no ratio reads it. The exit status is 1 when a provider failed, gave a wrong
result (one exemption: an alternative whose duplicate order is unspecified, on a
pattern that repeats rows), or ``ours`` went untimed on a target case (slower
than ``--max-run-s``): the summary reads those.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import jax
import numpy as np

from benchmarks import cases, checks, environment, plots, report, timing
from benchmarks.cases import Case
from benchmarks.memory import run_memory_probes
from benchmarks.providers import Provider, build_providers, default_providers, unavailable
from benchmarks.sweep_args import parse_args, print_plan, resolve, setup_bench
from benchmarks.workspace import (
    Bench,
    CaseData,
    CheckUpdates,
    layout_of,
    main_updates,
    make_case_data,
    read_rows,
)

CSV_LEADING = ["case", "provider", "pattern", "dtype", "row_bytes", "n_updates", "median_s",
               "min_s", "max_s", "reps", "gbps", "updates_per_s", "ceiling_gbps",
               "frac_of_ceiling", "b2b_gbps", "b2b_frac_of_ceiling", "correct", "status"]
# Rounds of back-to-back calls a record gets (each round one sample).
BACK_TO_BACK_ROUNDS = 5
# What the summary's ratios read, plus raw Triton beside ours (the README's
# back-to-back table compares the two). In a target case these run whatever the
# time budget says, and only these are also timed back to back: XLA's call of
# these sizes takes 15-70 ms, and 50 more of them would spend seconds of the
# budget that nothing reads.
SUMMARY_PROVIDERS = ("ceiling", "ours", "ours_triton", "xla")
BACK_TO_BACK_PROVIDERS = ("ceiling", "ours", "ours_triton")


def base_record(bench: Bench, data: CaseData, name: str, impl: str) -> dict:
    c = data.case
    return {
        "case": data.spec.name, "provider": name, "pattern": c.pattern,
        "dtype": c.dtype, "row_bytes": c.row_bytes, "n_updates": c.n_updates,
        "row_elems": data.row_elems, "num_rows": data.num_rows,
        "buffer_bytes": bench.buffer_bytes, "payload_bytes": c.n_updates * c.row_bytes,
        "status": "ok", "correct": None, "median_s": None, "min_s": None, "max_s": None,
        "reps": 0, "gbps": None, "updates_per_s": None, "ceiling_gbps": None,
        "frac_of_ceiling": None, "b2b_median_s": None, "b2b_min_s": None, "b2b_max_s": None,
        "b2b_calls": 0, "b2b_gbps": None, "b2b_ceiling_gbps": None, "b2b_frac_of_ceiling": None,
        "impl": impl, "check": None, "notes": "",
    }


def _call_once(bench: Bench, provider: Provider, bound) -> None:
    state = bench.x if provider.target == "jax" else None
    args = bound.prepare() if bound.prepare else bound.args
    state = jax.block_until_ready(bound.step(state, *args))
    if provider.target == "jax":
        bench.x = state


def check_once(bench: Bench, data: CaseData, provider: Provider, k: int) -> tuple[str, str]:
    """Runs the provider once (compiling it) and checks sampled rows.

    Returns ``(mismatch, captured output)``; the mismatch is "" when the rows
    match the oracle.
    """
    updates = CheckUpdates.for_provider(bench, data, k)
    bound = provider.bind(data, updates.as_kind(bench, data, provider.updates))
    if provider.target == "none":
        return check_copy(bench, data, provider, bound, updates)
    if provider.target not in data.before:
        data.before[provider.target] = read_rows(bench, data, provider.target)
    with environment.captured_output() as out:
        _call_once(bench, provider, bound)
    after = read_rows(bench, data, provider.target)
    mismatch = checks.check_rows(
        data.before[provider.target], after, data.sample, updates.host_hits(data),
        duplicates=provider.duplicates,
    )
    if mismatch:
        # A wrong provider may have changed sampled rows it must not touch:
        # read them afresh for the next provider.
        data.before.pop(provider.target)
    return mismatch or "", out["text"]


def check_copy(bench: Bench, data: CaseData, provider: Provider, bound,
               updates: CheckUpdates) -> tuple[str, str]:
    """A copy of the updates (a ceiling): sampled rows against the updates, bit for bit.

    Every "of ceiling" ratio divides by its rate: a copy that moved nothing must
    fail. Checked: the updates at ``sample.hit_positions`` (the scatters' sample).
    The torch ceiling copies into the head of the host buffer, those rows first
    set to the complement of what it must write; the jax one deletes its copy
    inside the call, so the rows are read through ``Bound.observed`` before that.
    """
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
                kept.append(checks.read_rows(copy, positions))

        checked = bound.observed(keep)
        with environment.captured_output() as out:
            _call_once(bench, provider, checked)
        if not kept:
            return "the copy put nothing in pinned memory", out["text"]
        got = _row_bytes(kept[-1])
    same = np.array_equal(got, want)
    return "" if same else "sampled rows of the copy differ from the updates", out["text"]


def _row_bytes(rows: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(rows).reshape(rows.shape[0], -1).view(np.uint8)


def measure(
    bench: Bench, data: CaseData, provider: Provider,
) -> tuple[timing.Timing | float, timing.Timing | None]:
    """The synchronized timing (or the seconds of one run when that is over --max-run-s)
    and, where the case's row size asks for it and the provider can, the calls back to back.
    """
    bound = provider.bind(data, main_updates(bench, data, provider.updates))
    state = bench.x if provider.target == "jax" else None
    args = bench.args

    def kept(state):
        # The buffer was donated to the calls: the bench holds the one they returned.
        if provider.target == "jax":
            bench.x = state
        return state

    def timed(state, repeats):
        state, result = timing.measure(bound.step, state, *bound.args, repeats=repeats,
                                       warmup=0, prepare=bound.prepare)
        return kept(state), result

    # The first call of the timed program may compile it (the checked call ran other
    # updates through another binding): never judged. --max-run-s and the repeat count
    # read the last warm-up call, compiled and touched.
    state, _ = timed(state, 1)
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
    kept(state)
    return synchronized, back_to_back


def _fail(record: dict, err: BaseException) -> dict:
    record["status"] = "error"
    record["error"] = f"{type(err).__name__}: {err}"[:600]
    return record


def run_pair(bench: Bench, data: CaseData, provider: Provider, k: int) -> dict:
    record = base_record(bench, data, provider.name, provider.impl)
    record["duplicates"] = provider.duplicates  # exit_status reads it
    reason = cases.static_skip(provider.name, data.case, bench.args, bench.gpu)
    reason = reason or provider.skip(data)
    budget = bench.args.time_budget_s
    record["target_case"] = cases.is_target(data.case, bench.largest)
    essential = provider.name in SUMMARY_PROVIDERS and record["target_case"]
    if reason is None and budget and bench.elapsed() > budget and not essential:
        reason = f"time budget of {budget:.0f} s used up"
    if reason:
        record["status"] = "skipped: " + reason
        return record
    try:
        mismatch, captured = check_once(bench, data, provider, k)
        measured, back_to_back = measure(bench, data, provider)
    except Exception as err:  # noqa: BLE001 - recorded as an error; the run fails at the end
        if provider.target == "jax" and bench.ensure_buffer():
            data.before.pop("jax", None)
        return _fail(record, err)
    record["notes"] = environment.first_lines(captured)
    record["correct"] = not mismatch
    record["check"] = mismatch[:600] or (
        f"{data.sample.hit_positions.size} sampled rows of the copy match the updates"
        if provider.target == "none" else
        f"{data.sample.rows.size} sampled rows match the oracle ({provider.duplicates} "
        "duplicate wins)")
    if isinstance(measured, float):
        record["status"] = f"skipped: one run took {measured:.2f} s > --max-run-s"
        record["single_run_s"] = measured
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


def fill_ceiling(records: list[dict]) -> None:
    """Each record's rate against the case's ceiling; none, with the reason, where the
    ceiling has no checked timing (a wrong copy, an error, a skip)."""
    ceiling = next((r for r in records if r["provider"] == "ceiling"), None)
    why = report.why_unusable(ceiling) or (None if ceiling["gbps"] else "untimed")
    if why:
        for r in records:
            r["ceiling_note"] = f"no ratio: ceiling {why}"
        return
    for r in records:
        r["ceiling_gbps"] = ceiling["gbps"]
        if r["gbps"]:
            r["frac_of_ceiling"] = r["gbps"] / ceiling["gbps"]
        if r["b2b_gbps"] and ceiling["b2b_gbps"]:
            # Back to back against the copy engine back to back: the same loop of calls.
            r["b2b_ceiling_gbps"] = ceiling["b2b_gbps"]
            r["b2b_frac_of_ceiling"] = r["b2b_gbps"] / ceiling["b2b_gbps"]


def run_case(bench: Bench, case: Case, providers: list[Provider], absent: dict[str, str],
             progress) -> list[dict]:
    num_rows, row_shape = layout_of(case, bench.buffer_bytes)
    bench.set_layout(case.dtype, (num_rows, *row_shape))
    data = make_case_data(bench, case)
    records = []
    try:
        # Ceilings run first: the torch one writes the head of the host
        # buffer, which must happen before that buffer's rows are sampled.
        for k, provider in enumerate(providers):
            records.append(run_pair(bench, data, provider, k))
            progress.step(f"{case.pattern} {case.dtype} {case.row_bytes}B "
                          f"n={report.format_count(case.n_updates)} {provider.name}")
        for name, why in absent.items():
            record = base_record(bench, data, name, "")
            record["status"] = f"skipped: {why}"
            records.append(record)
    finally:
        data.release()
    fill_ceiling(records)
    return records


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.cpu:
        jax.config.update("jax_platforms", "cpu")
    probes = []
    if not (args.cpu or args.no_memory_probe or args.dry_run) and shutil.which("nvidia-smi"):
        sizes_gib = [args.max_buffer_gib or 4.0] + (
            [args.big_buffer_gib] if args.big_buffer_gib else [])
        # Before this process holds the GPU, so each probe's peak is its own.
        probes = run_memory_probes(sizes_gib, args.probe_updates, args.seed)
    gpu = not args.cpu and environment.has_gpu()
    if not gpu and not args.cpu:
        print("no GPU found: running the CPU sweep (as with --cpu)")
    sweep, plan, dropped, sizes = resolve(args, gpu)
    names = args.providers or default_providers(gpu, sweep)
    print_plan(sweep, plan, dropped, sizes, names, args)
    if args.dry_run:
        return 0
    return run_all(args, gpu, sweep, plan, sizes, names, probes)


def run_all(args, gpu, sweep, plan, sizes, names, probes) -> int:
    bench = setup_bench(args, gpu, sizes, names)
    absent = unavailable(bench, names)
    providers = build_providers(bench, names)
    args.out.mkdir(parents=True, exist_ok=True)
    stem = f"scatter_{sweep}"
    meta = {"sweep": sweep, "argv": sys.argv[1:], "providers": [p.name for p in providers],
            "providers_left_out": absent, "host_buffer": bench.host and bench.host.kind,
            **sizes, **environment.environment(), **bench.notes}
    for name, reason in absent.items():
        print(f"  left out: {name}: {reason}")
    records: list[dict] = []
    progress = report.Progress(len(plan) * len(providers), desc=f"scatter {sweep}")
    try:
        for case in plan:
            try:
                records += run_case(bench, case, providers, absent, progress)
            except Exception as err:  # noqa: BLE001 - e.g. out of memory making the data
                print(f"case {case} failed: {type(err).__name__}: {err}", flush=True)
                meta.setdefault("case_errors", []).append(f"{case}: {type(err).__name__}: {err}")
            _write(args.out, stem, meta, records, probes, None)  # partial results survive a kill
    finally:
        progress.close()
    summary = report.sweep_summary(records, probes, bench.buffer_bytes)
    _write(args.out, stem, meta, records, probes, summary)
    report.print_sweep_table(records, f"scatter_to_host benchmark ({sweep}, {meta['device_kind']})")
    plotted = None if args.no_plots else plots.plot_sweep(records, args.out, stem, "ceiling")
    if plotted is None and not args.no_plots:
        print("matplotlib is not installed: no plots")
    print(f"\nwrote {args.out / (stem + '.json')}, .csv and {len(plotted or [])} plot(s) "
          f"in {bench.elapsed():.0f} s")
    print("\nsummary:\n  " + "\n  ".join(summary or ["no target cases measured"]))
    return exit_status(records, probes, meta)


def exit_status(records: list[dict], probes: list[dict], meta: dict) -> int:
    """1 when anything failed: a provider error, a case or probe error, a wrong result
    (:func:`exempt` names the one kind that does not fail), or ``ours`` untimed on a
    target case (one the summary reads)."""
    failed = False
    for r in records:
        if r["status"] == "error":
            print(f"ERROR: {r['provider']} on {r['case']}: {r['error'][:300]}")
            failed = True
        elif r["provider"] == "ours" and r.get("target_case") and r["median_s"] is None:
            # The summary reads this timing: a skip here would hide a regression.
            print(f"UNTIMED: ours on target case {r['case']}: {r['status']}")
            failed = True
        if r["correct"] is False:
            why = exempt(r)
            print(f"INCORRECT: {r['provider']} on {r['case']}: {r['check'][:200]}"
                  + (f"\n  not failed, exempt: {why}" if why else ""))
            failed = failed or not why
    for p in probes:
        if "error" in p:
            print(f"ERROR: memory probe {p['buffer_gib']:g} GiB: {p['error'][:300]}")
            failed = True
    for line in meta.get("case_errors", []):
        print(f"ERROR: case {line[:300]}")
        failed = True
    return 1 if failed else 0


def exempt(r: dict) -> str | None:
    """Why a wrong result does not fail the run (None: it does). Only an alternative whose
    duplicate order is unspecified (``duplicates="any"``: XLA, the peers) on a pattern that
    repeats rows: XLA's scatter was seen (H200, 2026-12-02) to leave such rows mixing
    elements of different updates, which jnp allows. Unique rows have no order to blame."""
    repeats = r.get("pattern") in cases.SWEPT_PATTERNS and (
        r.get("pattern") not in cases.UNIQUE_PATTERNS)
    if r["provider"].startswith("ours") or r.get("duplicates") != "any" or not repeats:
        return None
    return (f"{r['provider']} leaves the order of repeated rows unspecified and "
            f"{r['pattern']} repeats rows (XLA was seen tearing them on the H200)")


def _write(out: Path, stem: str, meta, records, probes, summary) -> None:
    report.write_json(out / f"{stem}.json", {"meta": meta, "records": records,
                                             "memory_probes": probes, "summary": summary})
    report.write_csv(out / f"{stem}.csv", records, CSV_LEADING)


if __name__ == "__main__":
    sys.exit(main())
