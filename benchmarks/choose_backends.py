"""Writes the table ``backend="auto"`` picks its implementation from, out of a loop run.

    python -m benchmarks.choose_backends [benchmarks/results/loop_quick_graphs_h200.json]

The source is a loop run whose steps ran as CUDA graphs (``python -m benchmarks.loop
--backends pallas,triton --xla-option xla_gpu_graph_min_graph_size=1``): XLA graphs a
run of 5 or more kernels (its default ``xla_gpu_graph_min_graph_size``), which every
real training or decode step has, but the loop's toy steps have 3 to 6 kernels, so at
XLA's defaults each of their kernels is launched alone and the launch decides
(benchmarks/README.md has the runs that showed the choices differ).

For each op (set, add, gather), dtype and size class (the run's row counts:
a call of ``n`` entries falls in the smallest measured count ``>= n``), the
per-step times of the kernel rows (``ours_set`` / ``ours_add`` / ``ours_get``
measured with ``backend="pallas"`` and ``backend="triton"``, ``python -m
benchmarks.loop --backends pallas,triton`` on a GPU) and of XLA's own
formulation (``xla_set`` / ``xla_add`` / ``xla_get``) decide:

* between the two kernels, summed over the class's cases timed with both, Triton only
  where it is faster by more than :data:`NOISE` (a closer result keeps Pallas, the
  one with the one-launch path for small sets);
* for set and add, the kernel is kept where it is no slower than XLA in **every**
  case of the class timed with both. Elsewhere an ``xla`` entry would make ``auto`` run
  ``x.at[rows].set(y)`` / ``.add(y)`` itself, after our normalization (and for set
  our de-duplication, so the last duplicate wins as everywhere): not XLA's bare op.
  So the class takes it only where that path itself was measured faster than the
  kernel by more than :data:`NOISE` in some case and slower by more than the noise
  in none (a tie says nothing of which is faster): ``ours_set`` / ``ours_add`` with
  ``backend="auto"`` whose step launched none of our kernels (the table in force
  then said ``xla``), in the source run or else in an earlier run
  (``--xla-path-from``), judged against that same run's kernel. The write-then-read
  rows that run timed (``ours_set_read`` / ``ours_add_read``) are cases of the class
  too: a fast write can still lose once the step reads the rows back, and a win there
  counts as one, and so do the cases of a run whose step inputs were materialized
  (``--materialized-from``, ``benchmarks.loop --inputs materialized``): in the toy step XLA
  fuses the making of the inputs into its own scatter, which no custom call can have and no
  real step offers. Where no run measured it, the kernel stays. The default evidence for
  XLA's path is a graphed run made for it (2026-12-04 16:22 UTC, under a table with ``xla``
  for every float32 set and add class); docs/PERFORMANCE.md's "What ``auto`` runs" has its figures.
* add needs a real client's word too. The loop's rows never repeat within a step; the
  sparse-training client's Zipf ids do. Run under the same table (``--add-client-from``),
  ``auto`` on XLA's add path took 705.0 us per step against the kernels' 73.2; on uniform
  ids (``--distinct-client-from``) 120.0 against 135.3. So an add class takes XLA's path
  only where the Zipf client was not slower by more than the noise; where only the uniform
  one was not, the entry's ``distinct_backend`` is ``xla``: what ``auto`` runs for rows
  known distinct (``unique_indices=True`` without ``mode="clip"``, or an index form that
  cannot repeat a row).
* gather stays on the kernels: XLA's gather lost in every loop case.

The table, with where it came from, goes to ``pallas_pinned/backend_table.json``,
which the package ships. An op the source has no rows for is listed under
``unmeasured`` (``auto`` then uses Pallas for it) and named in a warning. A row of any run
read with no usable time is named on stderr; a case that lacks one, in its entry's
``left_out``; a win of XLA's path beside a row left out, which may be the loss, is
``undecided`` (the kernel stays) and the entry's ``xla_path`` names the row.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

from benchmarks.backend_evidence import (
    NOISE,
    UNMEASURED_CLIENT,
    XLA_PATH_OPS,
    client_verdict,
    faster,
    named_or_default,
    path_verdict,
    say_left_out,
    unusable,
    usable,
    xla_path_table,
)

REPO = Path(__file__).resolve().parent.parent
TABLE = REPO / "pallas_pinned" / "backend_table.json"
DEFAULT_SOURCE = REPO / "benchmarks" / "results" / "loop_quick_graphs_h200.json"
# A graphed run in which auto ran XLA's own set and add path (with our normalization,
# and for set our de-duplication) in every float32 set and add class, read-back and
# promised-unique rows included (2026-12-04 16:22 UTC): where the source run lacks
# that measurement, this one judges it.
DEFAULT_XLA_PATH = REPO / "benchmarks" / "results" / "loop_xla_path_graphs_h200.json"
# The sparse-training client under a table with XLA's add path: Zipf ids, uniform ids.
DEFAULT_ADD_CLIENT = REPO / "benchmarks" / "results" / "sparse_training_graphs_h200_xla_path.json"
DEFAULT_DISTINCT_CLIENT = DEFAULT_ADD_CLIENT.with_name(
    "sparse_training_graphs_h200_xla_path_uniform.json")
# The same grid with each step's inputs materialized (benchmarks.loop --inputs materialized).
DEFAULT_MATERIALIZED = REPO / "benchmarks" / "results" / "loop_quick_graphs_materialized_h200.json"


def _label(path: Path) -> str:
    path = path.resolve()
    return str(path.relative_to(REPO) if path.is_relative_to(REPO) else path)


PROVIDERS = {
    "ours_set": "set", "ours_add": "add", "ours_get": "gather",
    "xla_set": "set", "xla_add": "add", "xla_get": "gather",
    # Evidence only, no table entry: how XLA's path fares when the step reads back, and
    # on rows promised distinct (an entry's distinct_backend).
    "ours_set_read": "set_read", "ours_add_read": "add_read",
    "ours_set_unique": "set_distinct", "ours_add_unique": "add_distinct",
    "ours_set_unique_read": "set_distinct_read", "ours_add_unique_read": "add_distinct_read",
}
# The providers whose auto rows, with no kernel of ours in the step, measured XLA's path.
_WRITES = ("ours_set", "ours_add", "ours_set_unique", "ours_add_unique")
OPS = ("set", "add", "gather")


def _ran_kernel(r: dict) -> bool:
    return any(k.startswith("custom-call") for k in r.get("hlo_ops") or {})


def _class_times(records: list[dict]) -> tuple[dict, dict]:
    """``(op, dtype, rows) -> (rows, row_bytes) -> {"pallas"|"triton"|"xla"|"auto": us}``,
    and ``(op, dtype, rows) -> [(name, why)]``: the rows left out for no usable time.

    ``auto`` counts only where it ran XLA's path: for a write, where its step
    launched none of our kernels; for a write read back (the read is our kernel),
    where the same run's write of that case did so.
    """
    xla_path = {(PROVIDERS[r["provider"]], r["dtype"], r["rows"], r["row_bytes"])
                for r in records
                if r["provider"] in _WRITES and r.get("backend") == "auto"
                and usable(r) and not _ran_kernel(r)}
    times, left = defaultdict(lambda: defaultdict(dict)), defaultdict(list)
    for r in records:
        op = PROVIDERS.get(r["provider"])
        name = "xla" if r["provider"].startswith("xla_") else r.get("backend")
        if op is None or name not in ("pallas", "triton", "xla", "auto"):
            continue
        case = (r["dtype"], r["rows"], r["row_bytes"])
        reads = op.endswith("_read")
        if name == "auto" and ((op.removesuffix("_read"), *case) not in xla_path if reads
                               else _ran_kernel(r)):
            # auto ran one of our kernels in that run (its table said so then):
            # no measurement of XLA's path with our de-duplication.
            continue
        if usable(r):
            times[(op, r["dtype"], r["rows"])][(r["rows"], r["row_bytes"])][name] = r["us_per_step"]
        else:  # kept so that a verdict resting on this class can say what it lacked
            left[(op, r["dtype"], r["rows"])].append((name, unusable([r], PROVIDERS)[0]))
    return times, left


def _compared(cases: dict, dropped: list[str], where: str) -> tuple[list[dict], str, dict]:
    """The cases timed with the kernel and XLA, the kernel chosen on those timed with both
    kernels, and each provider's time summed over the former (where timed in all). Each
    comparison reads every case with both its sides: an errored Triton row takes no case
    out of the judgement against XLA. A case a comparison lacks a time for (its provider
    errored, was wrong or did not run) is named in ``dropped``."""
    pair = [c for c in cases.values() if {"pallas", "triton"} <= set(c)]
    triton = pair and faster(sum(c["triton"] for c in pair), sum(c["pallas"] for c in pair))
    kernel = "triton" if triton else "pallas"
    full = [c for c in cases.values() if {kernel, "xla"} <= set(c)]
    for (rows, row_bytes), c in cases.items() if full else ():
        if lack := {kernel, "xla"} - set(c):
            why = f"no usable {', '.join(sorted(lack))}"
        elif pair and (lack := {"pallas", "triton"} - set(c)):
            # Only a class where Triton ran at all: a run without it lacks nothing.
            why = f"no usable {', '.join(sorted(lack))}: judged against XLA, not between kernels"
        else:
            continue
        dropped.append(f"{where}: {rows} rows x {row_bytes} B: {why}")
    totals = {k: sum(c[k] for c in full) for k in sorted(set.intersection(*map(set, full or [{}])))}
    return full, kernel, totals


_VERDICT_WORDS = {True: "not slower", False: "slower", None: "unmeasured"}


def choose(records: list[dict], xla_path_records: dict[str, list[dict]] | None = None,
           add_client: tuple[bool | None, str] = UNMEASURED_CLIENT,
           distinct_client: tuple[bool | None, str] = UNMEASURED_CLIENT,
           materialized: list[dict] | None = None,
           dropped: list[str] | None = None) -> tuple[list[int], dict]:
    """``(size_classes, choices)`` from a loop run's records.

    ``xla_path_records`` (label -> records) are earlier runs in which ``auto``
    ran XLA's path with our de-duplication: for a set or add class where the kernel
    loses to XLA's bare op, and the source run has no such measurement, that
    path is judged against the kernel of the same earlier run. Where no run
    measured it, the kernel stays (the entry says ``"xla_path": "unmeasured"``).
    ``add_client`` (:func:`client_verdict`) must also be True for any add class to
    take XLA's path: the entry's ``"client"`` says how it came out. Where it is not
    but ``distinct_client`` (the client on ids that seldom repeat) is, the entry's
    ``"distinct_backend"`` is ``xla``: what ``auto`` runs for rows known distinct. XLA's
    add path does not de-duplicate, so the loop's unpromised rows (distinct, as its
    rows always are) measured the very program a promised add runs. ``materialized``
    (records of the grid with each step's inputs materialized) adds its cases to every
    judgment of XLA's path, not to the kernel choice. ``dropped`` (when given) gets the
    cases a class left out for a provider with no usable time, as its ``left_out`` does.
    """
    dropped = [] if dropped is None else dropped
    times = (sources := {"this run": _class_times(records)})["this run"][0]
    sources |= {label: _class_times(r) for label, r in (xla_path_records or {}).items()}
    classes = sorted({rows for (op, _, rows) in times if op in OPS})
    materialized = _class_times(materialized or [])
    choices: dict = {}
    for key, cases in sorted(times.items()):
        op, dtype, rows = key
        if op not in OPS:  # evidence for another op's entry
            continue
        before = len(dropped)
        full, kernel, totals = _compared(cases, dropped, f"{op} {dtype} <= {rows} rows")
        if not full:
            continue
        entry = {"backend": kernel, "cases": len(full)}
        if dropped[before:]:  # the table says it too, not only this run's stderr
            entry["left_out"] = [d.split(": ", 1)[1] for d in dropped[before:]]
        if op in XLA_PATH_OPS:
            _judge_xla_path(entry, key, full, kernel, sources, add_client, distinct_client,
                            materialized)
        entry.update({f"{k}_us": round(v, 1) for k, v in totals.items()})
        choices.setdefault(op, {}).setdefault(dtype, {})[str(rows)] = entry
    return classes, choices


def _kernel_never_slower(cases: list[dict], kernel: str) -> bool:
    """Whether the kernel took no longer than XLA's bare op in every case."""
    return all(c[kernel] <= c["xla"] for c in cases)


def _judge_xla_path(entry: dict, key: tuple, full: list[dict], kernel: str, sources: dict,
                    add_client: tuple, distinct_client: tuple, materialized: tuple) -> None:
    """Fills a set or add entry's ``backend`` and ``distinct_backend`` from XLA's path.

    XLA's path is judged only where the kernel lost to XLA's bare op in some case: for
    rows known distinct, with the kernel told so (``ours_*_unique``), where measured;
    where that kernel lost in no case, rows known distinct stay on it whatever the
    unpromised rows took. Add also needs the client's word (:func:`choose`).
    """
    op, dtype, rows = key
    verdict = None
    if not _kernel_never_slower(full, kernel):
        verdict, entry["xla_path"] = path_verdict(key, kernel, sources, materialized)
    distinct_cases = sources["this run"][0].get((f"{op}_distinct", dtype, rows), {})
    promised = [c | {"xla": bare["xla"]} for case, bare in sources["this run"][0][key].items()
                if "xla" in bare and kernel in (c := distinct_cases.get(case, {}))]
    distinct_verdict = None
    if promised and _kernel_never_slower(promised, kernel):
        distinct_verdict = False  # the kernel told so is no slower than XLA's bare op
    elif promised:
        distinct_verdict, entry["distinct_xla_path"] = path_verdict(
            (f"{op}_distinct", dtype, rows), kernel, sources, materialized)
    if op == "add":  # the loop's verdict alone does not decide add's
        if distinct_verdict is None and verdict is not None:
            # XLA's add path does not de-duplicate: unpromised rows, distinct as the
            # loop's always are, ran the very program a promised add runs.
            distinct_verdict = verdict
            entry["distinct_xla_path"] = "as xla_path (the same program)"
        entry["client"], entry["distinct_client"] = (
            _VERDICT_WORDS[add_client[0]], _VERDICT_WORDS[distinct_client[0]])
        verdict = verdict and bool(add_client[0])
        distinct_verdict = distinct_verdict and bool(distinct_client[0])
    if verdict:
        entry["backend"] = "xla"
    if distinct_verdict is not None:
        distinct = "xla" if distinct_verdict else kernel
        if distinct != entry["backend"]:
            entry["distinct_backend"] = distinct


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", nargs="?", type=Path, default=None,
                        help=f"the loop run (default: {_label(DEFAULT_SOURCE)})")
    parser.add_argument("--out", type=Path, default=TABLE)
    parser.add_argument(
        "--xla-path-from", type=Path, action="append", default=None,
        help="earlier loop runs in which auto ran XLA's path with our de-duplication "
             f"(default: {DEFAULT_XLA_PATH.relative_to(REPO)})")
    parser.add_argument(
        "--add-client-from", type=Path, default=None,
        help="a sparse-training run under a table with XLA's add path: add takes that path "
             f"only where it was not slower there (default: {_label(DEFAULT_ADD_CLIENT)})")
    parser.add_argument(
        "--distinct-client-from", type=Path, default=None,
        help="the same on ids that seldom repeat: decides add's distinct_backend (default: "
             f"{_label(DEFAULT_DISTINCT_CLIENT)})")
    parser.add_argument(
        "--materialized-from", type=Path, default=None,
        help="the loop with its step inputs materialized: its cases also judge XLA's path "
             f"(default: {_label(DEFAULT_MATERIALIZED)})")
    parser.add_argument(
        "--xla-path-table", type=Path, default=None, metavar="FILE",
        help="only write the shipped table with XLA's path for every set and add class to "
             "FILE (run a loop with $PALLAS_PINNED_BACKEND_TABLE=FILE to measure that path) "
             "and exit")
    args = parser.parse_args(argv)
    if args.xla_path_table:
        args.xla_path_table.write_text(
            json.dumps(xla_path_table(json.loads(TABLE.read_text())), indent=1) + "\n")
        print(f"wrote {args.xla_path_table}: the shipped table, every set and add class on "
              "XLA's path")
        return 0
    named_or_default(args, {"source": DEFAULT_SOURCE, "xla_path_from": [DEFAULT_XLA_PATH],
                            "add_client_from": DEFAULT_ADD_CLIENT,
                            "distinct_client_from": DEFAULT_DISTINCT_CLIENT,
                            "materialized_from": DEFAULT_MATERIALIZED})
    run = json.loads(args.source.read_text())
    meta = run["meta"]
    earlier = {_label(p): json.loads(p.read_text())["records"] for p in args.xla_path_from
               if p.resolve() != args.source.resolve() and p.exists()}
    clients = [client_verdict(json.loads(p.read_text()) if p.exists() else None, _label(p))
               for p in (args.add_client_from, args.distinct_client_from)]
    materialized = (json.loads(args.materialized_from.read_text())
                    if args.materialized_from.exists() else None)
    if materialized is not None and materialized["meta"].get("inputs") != "materialized":
        raise SystemExit(f"{args.materialized_from} is not a run with --inputs materialized")
    classes, choices = choose(run["records"], earlier, *clients,
                              materialized=materialized and materialized["records"],
                              dropped=(dropped := []))
    say_left_out(run["records"], PROVIDERS, dropped)
    for label, records in [*earlier.items(), (_label(args.materialized_from),
                                              (materialized or {}).get("records", []))]:
        for line in unusable(records, PROVIDERS):  # the evidence runs', as the source's
            print(f"  row not read ({label}): {line}", file=sys.stderr)
    source = args.source.resolve()
    table = {
        "source": str(source.relative_to(REPO) if source.is_relative_to(REPO) else source),
        "xla_path_from": sorted(earlier),
        "add_client_from": _label(args.add_client_from),
        "distinct_client_from": _label(args.distinct_client_from),
        "materialized_from": _label(args.materialized_from) if materialized else None,
        "clients": {"add": clients[0][1], "distinct": clients[1][1]},
        "measured": {k: meta.get(k) for k in ("date_utc", "gpu_name", "jax", "triton",
                                             "jax_triton", "compiler_options")},
        "rule": (
            f"per size class: the kernel (triton only where faster than pallas by more than "
            f"{NOISE:.0%}); for set and add, where the kernel is slower than XLA in any case, xla "
            f"only if ours with auto (XLA's path, for set with our de-duplication, measured in "
            f"this run or else in xla_path_from) was faster than the kernel of the same run by "
            f"more than {NOISE:.0%} in some case and slower by more than {NOISE:.0%} in none, "
            f"the cases read back and those with materialized inputs (materialized_from) "
            f"counted too, and for add not slower "
            f"in the sparse-training client (add_client_from) either; distinct_backend: the "
            f"same for rows known distinct, judged by the client on ids that seldom repeat "
            f"(distinct_client_from); unmeasured, the kernel stays"
        ),
        "size_classes": classes,
        "choices": choices,
    }
    table["unmeasured"] = [op for op in OPS if op not in choices]
    args.out.write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")
    print(f"wrote {args.out} from {args.source}")
    for op in table["unmeasured"]:
        print(f"  warning: {args.source} has no {op} rows timed with pallas and XLA: no {op} "
              "entry (auto uses Pallas); run python -m benchmarks.loop --backends "
              "pallas,triton on a GPU")
    for name, text in table["clients"].items():
        print(f"  {name} client: {text}")
    for op, dtypes in choices.items():
        for dtype, sizes in dtypes.items():
            for size, c in sizes.items():
                times = ", ".join(f"{k[:-3]} {v} us" for k, v in sorted(c.items())
                                  if k.endswith("_us"))
                note = f"; XLA's path {c['xla_path']}" if "xla_path" in c else ""
                note += f"; the client: {c['client']}" if "client" in c else ""
                note += (f"; distinct rows: {c['distinct_backend']}"
                         if "distinct_backend" in c else "")
                print(f"  {op} {dtype} <= {size} rows: {c['backend']} ({times}, "
                      f"{c['cases']} cases{note})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
