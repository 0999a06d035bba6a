"""Output of the benchmarks: JSON and CSV files, tables, progress, the sweep's summary.

The optional packages (tqdm, rich) are used when importable; the output falls
back to plain text otherwise. Plots live in ``plots.py``.
"""

from __future__ import annotations

import csv
import json
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

GIB, MIB = 1 << 30, 1 << 20


# ---------------------------------------------------------------------------
# Formatting


def _seconds_unit(s: float) -> tuple[float, str, str]:
    """The scale, unit and format of a time of ``s`` seconds: us, ms or s."""
    if s < 1e-3:
        return 1e6, "us", ".1f"
    return (1e3, "ms", ".2f") if s < 1 else (1.0, "s", ".2f")


def span(lo: float | None, hi: float | None, spec: str, scale: float = 1.0) -> str:
    """`` [lo–hi]`` (the min and max beside a median), or "" where either is unknown."""
    if lo is None or hi is None:
        return ""
    return f" [{lo * scale:{spec}}–{hi * scale:{spec}}]"


def format_seconds_span(median: float | None, lo: float | None, hi: float | None) -> str:
    """``12.3 us [11.9–13.0]``: the median, then the min and max in the median's unit."""
    if median is None:
        return "-"
    scale, unit, spec = _seconds_unit(median)
    return f"{median * scale:{spec}} {unit}{span(lo, hi, spec, scale)}"


def format_count(n: int) -> str:
    for unit, size in (("M", 1 << 20), ("K", 1 << 10)):
        if n >= size and n % size == 0:
            return f"{n // size}{unit}"
    return str(n)


def format_bytes(n: int) -> str:
    return f"{n / GIB:g} GiB" if n >= GIB else f"{n / MIB:g} MiB"


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


# ---------------------------------------------------------------------------
# Files


def write_json(path: Path, payload: dict) -> None:
    path.write_text(json.dumps(payload, indent=1, default=str) + "\n")


def write_csv(path: Path, records: list[dict], leading: Sequence[str]) -> None:
    fields = list(leading)
    for r in records:
        fields += [k for k in r if k not in fields]
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        writer.writerows(records)


# ---------------------------------------------------------------------------
# Screen


class Progress:
    """tqdm when importable, else a line every few seconds."""

    def __init__(self, total: int, desc: str):
        self.total, self.done, self._last = total, 0, 0.0
        self._start = time.monotonic()
        try:
            from tqdm import tqdm
        except ImportError:
            self._bar = None
        else:
            self._bar = tqdm(total=total, desc=desc, unit="run", dynamic_ncols=True)

    def step(self, label: str) -> None:
        self.done += 1
        if self._bar is not None:
            self._bar.set_postfix_str(label[:60], refresh=False)
            self._bar.update(1)
            return
        now = time.monotonic()
        if now - self._last >= 5 or self.done == self.total:
            self._last = now
            print(f"  [{self.done}/{self.total}] {now - self._start:6.1f}s  {label}", flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


def print_table(header: Sequence[str], rows: list[list[str]], title: str,
                left: Iterable[str] = ()) -> None:
    """A table through rich when importable, else fixed-width text.

    Columns named in ``left`` are left-aligned, the rest (numbers) right-aligned.
    """
    left = set(left)
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        widths = [max(len(str(c)) for c in col) for col in zip(header, *rows, strict=False)]
        print(f"\n{title}")
        for row in [list(header), *rows]:
            cells = [str(c).ljust(w) if h in left else str(c).rjust(w)
                     for c, w, h in zip(row, widths, header, strict=True)]
            print("  ".join(cells))
        return
    table = Table(title=title)
    for name in header:
        table.add_column(name, justify="left" if name in left else "right")
    for row in rows:
        table.add_row(*row)
    Console(width=200).print(table)


SWEEP_HEADER = ["case", "provider", "median [min–max]", "GB/s", "M upd/s", "of ceiling",
                "back to back", "correct", "note"]


def sweep_table_rows(records: Iterable[dict]) -> list[list[str]]:
    rows = []
    for r in records:
        frac, b2b = r.get("frac_of_ceiling"), r.get("b2b_frac_of_ceiling")
        rows.append([
            f"{r['pattern']} {r['dtype']} {r['row_bytes']}B n={format_count(r['n_updates'])}",
            r["provider"],
            format_seconds_span(r.get("median_s"), r.get("min_s"), r.get("max_s")),
            _fmt(r.get("gbps"), ".2f"),
            _fmt(None if r.get("updates_per_s") is None else r["updates_per_s"] / 1e6, ".1f"),
            "-" if frac is None else f"{100 * frac:.0f}%",
            "-" if b2b is None else f"{100 * b2b:.0f}%",
            {True: "yes", False: "NO", None: "-"}[r.get("correct")],
            r["status"] if r["status"] != "ok" else "",
        ])
    return rows


def print_sweep_table(records: list[dict], title: str) -> None:
    print_table(SWEEP_HEADER, sweep_table_rows(records), title,
                left=("case", "provider", "note"))


# ---------------------------------------------------------------------------
# The loop benchmark's table


def _us(r: dict | None, cost: bool = True) -> str:
    """``us_per_step [min–max] (op cost)``, or the status where it was not timed."""
    if not r or r["us_per_step"] is None:
        return "-" if not r else r["status"][:10]
    extra = "" if not cost or r.get("op_cost_us") is None else f" ({r['op_cost_us']:.1f})"
    return f"{r['us_per_step']:.1f}{span(r.get('us_min'), r.get('us_max'), '.1f')}{extra}"


def _floor(r: dict | None) -> str:
    if not r or r.get("kernel_floor_us") is None:
        return "-"
    return f"{r['kernel_floor_us']:.1f} (+{r['pcie_us']:.1f})"


def print_loop_table(records: list[dict], title: str) -> None:
    """One line per (case, op, backend): us/step [min–max] (op cost), kernels/step, ours/xla.

    ``launch`` is the floor_launch step (one aliased kernel writing nothing),
    ``floor`` that plus the op's bytes over PCIe at the ceiling (in brackets):
    what an in-stream kernel can approach (``benchmarks/loop_floor.py``).
    """
    header = ["rows", "row B", "dtype", "op", "base us", "launch (op)", "xla us (op)",
              "ours us [min–max] (op)", "floor (+pcie)", "unique", "unique+sorted",
              "kernels x/o", "ours/xla"]
    by = {(r["case"], r["provider"], r["backend"]): r for r in records}
    rows, seen = [], set()
    for r in records:
        auto = r["backend"] in ("auto", "-")
        backend = "auto" if auto else r["backend"]
        if r["op"] in ("none", "floor") or (r["case"], r["op"], backend) in seen:
            continue
        seen.add((r["case"], r["op"], backend))
        get = lambda name, c=r["case"], b=backend: by.get((c, name, b))  # noqa: E731
        xla = by.get((r["case"], f"xla_{r['op']}", "-"))
        ours = get(f"ours_{r['op']}")
        if ours is None:
            continue
        base = by.get((r["case"], "baseline", "-"))
        ratio = (f"{ours['us_per_step'] / xla['us_per_step']:.2f}"
                 if xla and xla["us_per_step"] and ours["us_per_step"] else "-")
        if any(k and k.get("correct") is False for k in (xla, ours)):
            ratio = "n/a (incorrect)"  # no ratio against a wrong result
        kernels = "/".join("-" if not k or k["kernels_per_step"] is None
                           else f"{k['kernels_per_step']:g}" for k in (xla, ours))
        rows.append([str(r["rows"]), str(r["row_bytes"]), r["dtype"],
                     r["op"] if auto else f"{r['op']}[{backend}]",
                     _us(base, cost=False),
                     _us(by.get((r["case"], "floor_launch", "-"))) if auto else "",
                     _us(xla) if auto else "", _us(ours), _floor(ours),
                     _us(get(f"ours_{r['op']}_unique")),
                     _us(get("ours_set_unique_sorted")) if r["op"] == "set" else "",
                     kernels, ratio])
    print_table(header, rows, title, left=("dtype", "op"))


# ---------------------------------------------------------------------------
# The sweep's summary: the targets (a)-(e) as ratios from one run


def _timed(records, provider, pattern="random_unique", dtype="float32") -> list[dict]:
    """The provider's timed records, less those checked wrong: no ratio reads them."""
    return [r for r in records if r["provider"] == provider and r["pattern"] == pattern
            and r["dtype"] == dtype and r["median_s"] and r.get("correct") is not False]


def _at(records, provider, row_bytes, n) -> dict | None:
    return next((r for r in _timed(records, provider)
                 if r["row_bytes"] == row_bytes and r["n_updates"] == n), None)


def why_unusable(r: dict | None) -> str | None:
    """Why a record gives no ratio (None: it does): ``not run``, its status (``error``,
    ``skipped: ...``), or ``incorrect``."""
    if r is None:
        return "not run"
    if r["status"] != "ok":
        return r["status"]
    return "incorrect" if r.get("correct") is False else None


def _why_absent(records, provider, row_bytes, n) -> str | None:
    """Why the provider has no usable timing of the case: ``n/a (error)``, ``n/a
    (incorrect)``, ``n/a (skipped: ...)``; None where the run has no record of it."""
    r = next((r for r in records if r["provider"] == provider and r["row_bytes"] == row_bytes
              and r["n_updates"] == n and r["pattern"] == "random_unique"
              and r["dtype"] == "float32"), None)
    if r is None:
        return None
    return f"n/a ({why_unusable(r) or 'untimed'})"


def _ratio(a: float | None, b: float | None) -> str:
    return "n/a" if not a or not b else f"{a / b:.2f}x"


def _mups(r: dict | None) -> str:
    """Updates per second at the median, then at the slowest and fastest run."""
    if r is None:
        return "n/a"
    n = r["n_updates"] / 1e6
    lo, hi = r.get("max_s"), r.get("min_s")
    return (f"{r['updates_per_s'] / 1e6:.1f} M/s"
            f"{span(lo and n / lo, hi and n / hi, '.1f')}")


def _gbps(r: dict | None, prefix: str = "") -> str:
    """GB/s at the median, then at the slowest and fastest run (``prefix``: ``b2b_``)."""
    if r is None or r.get(f"{prefix}gbps") is None:
        return "n/a"
    gb = r["n_updates"] * r["row_bytes"] / 1e9
    lo, hi = r.get(f"{prefix}max_s"), r.get(f"{prefix}min_s")
    return f"{r[f'{prefix}gbps']:.1f} GB/s{span(lo and gb / lo, hi and gb / hi, '.1f')}"


def sweep_summary(records: list[dict], probes: list[dict], buffer_bytes: int) -> list[str]:
    """(a) and (d) use the narrowest rows timed (4 B in the GPU sweeps), (b) and
    (c) the largest count timed at each row size, (e) the memory probes. Medians
    with [min–max]; ratios of medians, only between results not checked wrong.
    """
    ours = _timed(records, "ours")
    lines = []
    if ours:
        narrow = [r for r in ours if r["row_bytes"] == min(r["row_bytes"] for r in ours)]
        lines.append(_line_a(records, max(narrow, key=lambda r: r["n_updates"]), buffer_bytes))
        for label, rb in (("(b)", 512), ("(c)", 2048), ("(c)", 8192)):
            at_rb = [r for r in ours if r["row_bytes"] == rb]
            if at_rb:
                lines.append(_line_bc(records, label, max(at_rb, key=lambda r: r["n_updates"])))
            else:
                lines += _untimed(records, label, rb)
        lines.append(_line_d(records, min(narrow, key=lambda r: r["n_updates"])))
    return lines + [_probe_line(p) for p in probes]


def _line_a(records, ours: dict, buffer_bytes: int) -> str:
    n, rb = ours["n_updates"], ours["row_bytes"]
    parts = []
    for peer in ("xla", "host_roundtrip", "torch_index_copy", "torch_triton_zerocopy"):
        r = _at(records, peer, rb, n)
        if r:
            parts.append(f"{peer} {_mups(r)} (ours/{peer} "
                         f"{_ratio(ours['updates_per_s'], r['updates_per_s'])})")
        elif why := _why_absent(records, peer, rb, n):
            parts.append(f"{peer} {why}")
    return (f"(a) {format_count(n)} random unique f32 {rb} B rows into "
            f"{format_bytes(buffer_bytes)}: ours {_mups(ours)}; {', '.join(parts) or 'no peers'}")


def _line_bc(records, label: str, r: dict) -> str:
    n, rb = r["n_updates"], r["row_bytes"]
    ceiling = _at(records, "ceiling", rb, n)
    ceiling_text = _gbps(ceiling) if ceiling else (_why_absent(records, "ceiling", rb, n)
                                                   or "n/a")
    line = (f"{label} {rb} B random rows, n={format_count(n)}: "
            f"ours {_gbps(r)}, ceiling {ceiling_text}, "
            f"ours/ceiling {_ratio(r['gbps'], ceiling and ceiling['gbps'])}")
    if r.get("b2b_gbps"):
        b2b = ceiling if ceiling and ceiling.get("b2b_gbps") else None
        line += (f"; {r['b2b_calls']} calls back to back: ours {_gbps(r, 'b2b_')}, "
                 f"ceiling {_gbps(b2b, 'b2b_')}, ours/ceiling "
                 f"{_ratio(r['b2b_gbps'], b2b and b2b['b2b_gbps'])}")
    return line


def _untimed(records, label: str, row_bytes: int) -> list[str]:
    """A planned target whose ``ours`` has no usable timing says why, rather than vanishing."""
    planned = [r for r in records if r["provider"] == "ours" and r["row_bytes"] == row_bytes
               and r["pattern"] == "random_unique" and r["dtype"] == "float32"]
    return [f"{label} {row_bytes} B random rows, n={format_count(r['n_updates'])}: ours not "
            f"timed ({'incorrect' if r.get('correct') is False else r['status']})"
            for r in planned[-1:]]


def _line_d(records, ours: dict) -> str:
    n, rb = ours["n_updates"], ours["row_bytes"]
    xla = _at(records, "xla", rb, n)
    xla_text = (format_seconds_span(xla["median_s"], xla.get("min_s"), xla.get("max_s"))
                if xla else _why_absent(records, "xla", rb, n) or "n/a")
    return (f"(d) {n} updates of {rb} B: ours "
            f"{format_seconds_span(ours['median_s'], ours.get('min_s'), ours.get('max_s'))}, "
            f"xla {xla_text} (xla/ours {_ratio(xla and xla['median_s'], ours['median_s'])})")


def _probe_line(p: dict) -> str:
    if "peak_growth_bytes" not in p:
        return f"(e) {p['buffer_gib']:g} GiB buffer: {p.get('skipped') or p.get('error')}"
    bound = "at most " if p["peak_growth_is_upper_bound"] else ""
    return (f"(e) {p['buffer_gib']:g} GiB buffer, {format_count(p['n_updates'])} updates: "
            f"device memory peak growth {bound}{p['peak_growth_bytes'] / MIB:.0f} MiB "
            f"(indices+updates {p['update_and_index_bytes'] / MIB:.0f} MiB already in use before; "
            f"compiled temp {(p['compiled_temp_bytes'] or 0) / MIB:.0f} MiB); result in "
            f"{p['memory_kind_after']}, same buffer: {p['same_buffer']}")
