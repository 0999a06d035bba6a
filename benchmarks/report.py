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


def format_seconds(s: float | None) -> str:
    if s is None:
        return "-"
    if s < 1e-3:
        return f"{s * 1e6:.1f} us"
    if s < 1:
        return f"{s * 1e3:.2f} ms"
    return f"{s:.2f} s"


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


SWEEP_HEADER = ["case", "provider", "median", "GB/s", "M upd/s", "of ceiling",
                "back to back", "correct", "note"]


def sweep_table_rows(records: Iterable[dict]) -> list[list[str]]:
    rows = []
    for r in records:
        frac, b2b = r.get("frac_of_ceiling"), r.get("b2b_frac_of_ceiling")
        rows.append([
            f"{r['pattern']} {r['dtype']} {r['row_bytes']}B n={format_count(r['n_updates'])}",
            r["provider"],
            format_seconds(r.get("median_s")),
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


def _us(r: dict | None) -> str:
    if not r or r["us_per_step"] is None:
        return "-" if not r else r["status"][:10]
    cost = "" if r["op_cost_us"] is None else f" ({r['op_cost_us']:.1f})"
    return f"{r['us_per_step']:.1f}{cost}"


def _floor(r: dict | None) -> str:
    if not r or r.get("kernel_floor_us") is None:
        return "-"
    return f"{r['kernel_floor_us']:.1f} (+{r['pcie_us']:.1f})"


def print_loop_table(records: list[dict], title: str) -> None:
    """One line per (case, op, backend): us/step (op cost), kernels/step, ours/xla.

    ``launch`` is the floor_launch step (one aliased kernel writing nothing),
    ``floor`` that plus the op's bytes over PCIe at the ceiling (in brackets):
    what an in-stream kernel can approach (``benchmarks/loop_floor.py``).
    """
    header = ["rows", "row B", "dtype", "op", "base us", "launch (op)", "xla us (op)",
              "ours us (op)", "floor (+pcie)", "unique", "unique+sorted", "kernels x/o",
              "ours/xla"]
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
        kernels = "/".join("-" if not k or k["kernels_per_step"] is None
                           else f"{k['kernels_per_step']:g}" for k in (xla, ours))
        rows.append([str(r["rows"]), str(r["row_bytes"]), r["dtype"],
                     r["op"] if auto else f"{r['op']}[{backend}]",
                     _us(base).split(" ")[0],
                     _us(by.get((r["case"], "floor_launch", "-"))) if auto else "",
                     _us(xla) if auto else "", _us(ours), _floor(ours),
                     _us(get(f"ours_{r['op']}_unique")),
                     _us(get("ours_set_unique_sorted")) if r["op"] == "set" else "",
                     kernels, ratio])
    print_table(header, rows, title, left=("dtype", "op"))


# ---------------------------------------------------------------------------
# The sweep's summary: the targets (a)-(e) as ratios from one run


def _timed(records, provider, pattern="random_unique", dtype="float32") -> list[dict]:
    return [r for r in records if r["provider"] == provider and r["pattern"] == pattern
            and r["dtype"] == dtype and r["median_s"]]


def _at(records, provider, row_bytes, n) -> dict | None:
    return next((r for r in _timed(records, provider)
                 if r["row_bytes"] == row_bytes and r["n_updates"] == n), None)


def _ratio(a: float | None, b: float | None) -> str:
    return "n/a" if not a or not b else f"{a / b:.2f}x"


def _mups(r: dict | None) -> str:
    return "n/a" if r is None else f"{r['updates_per_s'] / 1e6:.1f} M/s"


def _fmt_gbps(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.1f} GB/s"


def sweep_summary(records: list[dict], probes: list[dict], buffer_bytes: int) -> list[str]:
    """(a) and (d) use the narrowest rows timed (4 B in the GPU sweeps), (b) and
    (c) the largest count timed at each row size, (e) the memory probes.
    """
    ours = _timed(records, "ours")
    lines = []
    if ours:
        narrow = [r for r in ours if r["row_bytes"] == min(r["row_bytes"] for r in ours)]
        lines.append(_line_a(records, max(narrow, key=lambda r: r["n_updates"]), buffer_bytes))
        for label, rb in (("(b)", 512), ("(c)", 2048), ("(c)", 8192)):
            at_rb = [r for r in ours if r["row_bytes"] == rb]
            if at_rb:
                lines.append(_line_bc(label, max(at_rb, key=lambda r: r["n_updates"])))
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
    return (f"(a) {format_count(n)} random unique f32 {rb} B rows into "
            f"{format_bytes(buffer_bytes)}: ours {_mups(ours)}; {', '.join(parts) or 'no peers'}")


def _line_bc(label: str, r: dict) -> str:
    line = (f"{label} {r['row_bytes']} B random rows, n={format_count(r['n_updates'])}: "
            f"ours {r['gbps']:.1f} GB/s, ceiling {_fmt_gbps(r['ceiling_gbps'])}, "
            f"ours/ceiling {_ratio(r['gbps'], r['ceiling_gbps'])}")
    if r.get("b2b_gbps"):
        ceiling = r.get("b2b_ceiling_gbps")
        line += (f"; {r['b2b_calls']} calls back to back: ours {r['b2b_gbps']:.1f} GB/s, "
                 f"ceiling {_fmt_gbps(ceiling)}, ours/ceiling "
                 f"{_ratio(r['b2b_gbps'], ceiling)}")
    return line


def _untimed(records, label: str, row_bytes: int) -> list[str]:
    """A planned target whose ``ours`` has no timing says so, rather than vanishing."""
    planned = [r for r in records if r["provider"] == "ours" and r["row_bytes"] == row_bytes
               and r["pattern"] == "random_unique" and r["dtype"] == "float32"]
    return [f"{label} {row_bytes} B random rows, n={format_count(r['n_updates'])}: ours not "
            f"timed ({r['status']})" for r in planned[-1:]]


def _line_d(records, ours: dict) -> str:
    xla = _at(records, "xla", ours["row_bytes"], ours["n_updates"])
    xla_s = xla and xla["median_s"]
    return (f"(d) {ours['n_updates']} updates of {ours['row_bytes']} B: ours "
            f"{format_seconds(ours['median_s'])}, xla {format_seconds(xla_s)} "
            f"(xla/ours {_ratio(xla_s, ours['median_s'])})")


def _probe_line(p: dict) -> str:
    if "peak_growth_bytes" not in p:
        return f"(e) {p['buffer_gib']:g} GiB buffer: {p.get('skipped') or p.get('error')}"
    bound = "at most " if p["peak_growth_is_upper_bound"] else ""
    return (f"(e) {p['buffer_gib']:g} GiB buffer, {format_count(p['n_updates'])} updates: "
            f"device memory peak growth {bound}{p['peak_growth_bytes'] / MIB:.0f} MiB "
            f"(indices+updates {p['update_and_index_bytes'] / MIB:.0f} MiB already in use before; "
            f"compiled temp {(p['compiled_temp_bytes'] or 0) / MIB:.0f} MiB); result in "
            f"{p['memory_kind_after']}, same buffer: {p['same_buffer']}")
