"""The evidence :mod:`benchmarks.choose_backends` reads beside its loop run.

How much two timings must differ to say which is faster, the sparse-training
client's verdict on XLA's add path, the verdict of the loop runs on that path
(:func:`path_verdict`), and the table that makes a loop run measure that path
(``--xla-path-table``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

# Repeated runs of one case spread by a few percent (benchmarks/results/loop_quick_graphs_h200.json,
# min/max per record): a smaller difference is not a measurement of which is faster.
NOISE = 0.05


def slower(us: float, than: float) -> bool:
    """``us`` took longer than ``than`` by more than :data:`NOISE`."""
    return us > than * (1 + NOISE)


def faster(us: float, than: float) -> bool:
    """``us`` took less than ``than`` by more than :data:`NOISE`."""
    return us < than * (1 - NOISE)

# The ops auto may run as XLA's own formulation (``pallas_pinned._registry``).
XLA_PATH_OPS = ("set", "add")
UNMEASURED_CLIENT = (None, "the sparse-training client: unmeasured")


def usable(r: dict) -> bool:
    # Checked and right: a row left unchecked (correct None) is no evidence either way.
    return r.get("us_per_step") is not None and r.get("correct") is True


def unusable(records: list[dict], providers) -> list[str]:
    """The rows of ``providers`` no choice reads, each with why: its status where not ok
    (an error, a skip), else its check (wrong, or unchecked) or its missing time."""
    def why(r):
        if r.get("status", "ok") != "ok":
            return r["status"]
        return {False: "incorrect", None: "unchecked"}.get(r.get("correct"), "untimed")

    return [f"{r['provider']}[{r.get('backend')}] {r['dtype']} {r['rows']} rows x "
            f"{r['row_bytes']} B: {why(r)}"
            for r in records if r["provider"] in providers and not usable(r)]


def say_left_out(records: list[dict], providers, dropped: list[str]) -> None:
    """Names, on stderr, the rows of ``providers`` no choice read and the cases that
    left out (``dropped``, from :func:`benchmarks.choose_backends.choose`)."""
    for line in [*(f"row not read: {u}" for u in unusable(records, providers)),
                 *(f"case dropped: {d}" for d in dropped)]:
        print(f"  {line}", file=sys.stderr)


def named_or_default(args, defaults: dict[str, Path | list[Path]]) -> None:
    """Sets each argument of ``defaults`` the user left out (None) to its default.

    A file the user named must exist: the run exits naming every one that does not. An
    absent default (they are committed) is said, and its evidence is then unmeasured.
    """
    missing = []
    for name, default in defaults.items():
        given = getattr(args, name)
        if given is None:
            setattr(args, name, default)
            for path in default if isinstance(default, list) else [default]:
                if not path.exists():
                    print(f"  note: the default {path} is absent: that evidence is unmeasured",
                          file=sys.stderr)
        else:
            missing += [str(p) for p in (given if isinstance(given, list) else [given])
                        if not p.exists()]
    if missing:
        raise SystemExit(f"no such file: {', '.join(missing)}")


def client_verdict(run: dict | None, label: str = "") -> tuple[bool | None, str]:
    """Whether the sparse-training client, run under a table with XLA's add path, was no
    slower with it (``ours``) than with the kernels (``ours_kernels``) by more than the
    noise; None where no such run measured it. Its steps read back the rows the last
    step added, with Zipf ids that repeat: what the loop's add rows lack."""
    where = f"the sparse-training client ({label})" if label else "the sparse-training client"
    if run is None:
        return None, f"{where}: unmeasured"
    distinct = run["meta"].get("distinct_ids_per_step", {}).get("mean")
    if distinct is not None:
        where += (f", Zipf s={run['meta'].get('zipf_s')} ids, {distinct:.0f} distinct of "
                  f"{run['meta'].get('batch')} per step")
    if run["meta"].get("auto_choices", {}).get("add") != "xla":
        return None, f"{where}: did not run XLA's add path"
    us = {r["provider"]: r["us_per_step"] for r in run["records"] if usable(r)}
    if "ours" not in us or "ours_kernels" not in us:
        return None, f"{where}: unmeasured"
    ours, kernels = us["ours"], us["ours_kernels"]
    lost = slower(ours, kernels)
    return not lost, (f"{where}: {'slower' if lost else 'not slower'}, {ours:.1f} against "
                        f"the kernels' {kernels:.1f} us per step")


def xla_path_table(table: dict) -> dict:
    """``table`` with XLA's path for every set and add class. A loop run under it (named
    by ``$PALLAS_PINNED_BACKEND_TABLE``) measures that path in its ``auto`` set and add
    rows: the evidence ``--xla-path-from`` reads (``benchmarks/gpu_session.sh`` stage
    ``xlapath``)."""
    forced = json.loads(json.dumps(table))
    for op in XLA_PATH_OPS:
        for sizes in forced["choices"].get(op, {}).values():
            for entry in sizes.values():
                entry["backend"] = "xla"
                entry.pop("distinct_backend", None)  # rows promised distinct too
    forced["note"] = "every set and add class forced to xla, to measure auto's XLA path"
    return forced


def xla_path_faster(full: list[dict], kernel: str, reads: dict | None,
                     materialized: list[dict] = ()) -> tuple[bool | None, str]:
    """Whether auto's XLA path beat the kernel by more than the noise in some case and
    lost by more than the noise in none (None: not measured in these cases; a tie
    within the noise says nothing of which is faster). The write-then-read rows
    (``reads``: the class's cases) count as cases of the class, both ways: a write that
    is fast alone can still lose once the step reads the rows back, and a win there is
    as much a win (a class whose every figure favours XLA's path does not flip on one
    written case that missed the margin). So do the ``materialized`` cases (the run with
    the step's inputs materialized, written and read back), whichever run measured the
    path itself."""
    if not full or not all("auto" in c for c in full):
        return None, ""
    read = [c for c in (reads or {}).values() if {"auto", kernel} <= set(c)]
    more = [c for c in materialized if {"auto", kernel} <= set(c)]
    cases = full + read + more
    def lost(some):
        return any(slower(c["auto"], c[kernel]) for c in some)

    won = any(faster(c["auto"], c[kernel]) for c in cases) and not lost(cases)
    words = []
    for what, some in (("read back", read), ("materialized inputs", more)):
        word = "unmeasured" if not some else "slower" if lost(some) else "not slower"
        words.append(f"{what}: {word}")
    return won, "; ".join(words)


def path_verdict(key: tuple, kernel: str, sources: dict,
                  materialized: tuple) -> tuple[bool | None, str]:
    """XLA's path for ``key`` (op, dtype, rows), judged in the first of ``sources`` (label
    -> ``choose_backends._class_times``) that measured it, against that run's kernel (``kernel``
    where it ran, else Pallas), with the cases of ``materialized`` beside it.

    Where that run or ``materialized`` left out a row of the class (auto's or the
    kernel's, written or read back) for no usable time, it decides a loss it measured but
    not a win: a win needs a loss in no case, and the row left out may be the loss. Such
    a run leaves the class to the next (none: the kernel stays), and the entry's text
    names the rows either way: the verdict never rests unsaid on rows it did not read.
    """
    op, dtype, rows = key
    read_key = (f"{op}_read", dtype, rows)
    notes = []
    for label, (run, left) in sources.items():
        cases = list(run.get(key, {}).values())
        own = kernel if any(kernel in c for c in cases) else "pallas"
        more = [*materialized[0].get(key, {}).values(),
                *materialized[0].get(read_key, {}).values()]
        verdict, read = xla_path_faster([c for c in cases if own in c], own,
                                         run.get(read_key), more)
        lacks = [[f"{where}: {why}" for k in (key, read_key) for name, why in got.get(k, ())
                  if name in ("auto", own)]
                 for where, got in ((label, left), ("materialized inputs", materialized[1]))]
        lacking = ", ".join(lacks[0] + lacks[1])
        if verdict is False or (verdict and not lacking):
            notes += [f"rows left out: {lacking}"] if lacking else []
            return verdict, (f"{'faster' if verdict else 'not faster'} than the kernel "
                             f"({label}; {read}{''.join(f'; {n}' for n in notes)})")
        if verdict or lacks[0]:
            notes.append(f"{label}: {'faster where measured, ' if verdict else ''}"
                         f"rows left out: {lacking}")
    return None, f"undecided ({'; '.join(notes)})" if notes else "unmeasured"
