"""What the benchmarks record and show: JSON files, tables, a progress bar, plots.

The optional packages (tqdm, rich, matplotlib) are used when importable; the
output falls back to plain text (and no plot) otherwise.
"""

from __future__ import annotations

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


# ---------------------------------------------------------------------------
# Files


def write_json(path: Path, payload: dict) -> None:
    path.write_text(json.dumps(payload, indent=1, default=str) + "\n")


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


# ---------------------------------------------------------------------------
# Plots


def _pyplot():
    """matplotlib's pyplot on the headless Agg backend, or None when not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def plot_sweep(records: list[dict], out_dir: Path, stem: str, ceiling: str) -> list[Path] | None:
    """One PNG per (pattern, dtype): GB/s and updates/s against row bytes.

    Columns are update counts; lines are providers; the ``ceiling`` provider
    is drawn as a dashed black line. Returns the files written, or None when
    matplotlib is missing.
    """
    plt = _pyplot()
    if plt is None:
        return None
    timed = [r for r in records if r.get("gbps")]
    written = []
    for pattern, dtype in sorted({(r["pattern"], r["dtype"]) for r in timed}):
        group = [r for r in timed if r["pattern"] == pattern and r["dtype"] == dtype]
        path = out_dir / f"{stem}_{pattern}_{dtype}.png"
        _plot_sweep_group(plt, group, ceiling, f"scatter_to_host: {pattern} {dtype}", path)
        written.append(path)
    return written


def _plot_sweep_group(plt, group: list[dict], ceiling: str, title: str, path: Path) -> None:
    counts = sorted({r["n_updates"] for r in group})
    fig, axes = plt.subplots(2, len(counts), figsize=(4.2 * len(counts), 7), squeeze=False)
    providers = sorted({r["provider"] for r in group}, key=lambda p: (p == ceiling, p))
    # One colour per provider for the whole figure: panels lack some
    # providers, and matplotlib's colour cycle would otherwise shift.
    palette = plt.get_cmap("tab20").colors
    colours = {p: palette[i % len(palette)] for i, p in enumerate(providers)}
    for col, n in enumerate(counts):
        for row, (metric, label) in enumerate((("gbps", "GB/s"), ("updates_per_s", "updates/s"))):
            ax = axes[row][col]
            for provider in providers:
                pts = sorted(
                    (r["row_bytes"], r[metric]) for r in group
                    if r["n_updates"] == n and r["provider"] == provider
                )
                if not pts:
                    continue
                xs, ys = zip(*pts, strict=True)
                style = {"color": "black", "linestyle": "--", "marker": "x"} if (
                    provider == ceiling) else {"marker": "o", "color": colours[provider],
                                               "linewidth": 1.2, "markersize": 4}
                if provider == "ours":  # The line the figure is about: on top.
                    style.update(color="black", linewidth=2.5, markersize=6, zorder=10)
                ax.plot(xs, ys, label=provider, **style)
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("row bytes")
            ax.set_ylabel(label)
            ax.set_title(f"n = {format_count(n)}")
            ax.grid(True, which="both", alpha=0.3)
    _legend_and_save(plt, fig, axes, title, path)


def _legend_and_save(plt, fig, axes, title: str, path: Path) -> None:
    handles = {}
    for ax in axes.flat:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            handles.setdefault(label, handle)
    fig.legend(handles.values(), handles.keys(), loc="upper right", fontsize=8)
    fig.suptitle(title)
    fig.tight_layout(rect=(0, 0, 0.86, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)


_LOOP_COLOURS = {"baseline": "grey", "floor_launch": "tab:orange", "xla": "tab:red",
                 "ours": "black", "ours_unique": "tab:blue", "ours_unique_sorted": "tab:green"}
# Steps that write nothing: a line in every panel, no panel of their own.
_REFERENCE_OPS = ("none", "floor")
_BACKEND_MARKERS = {"pallas": "s", "triton": "^", "interpret": "x"}


def plot_loop(records: list[dict], path: Path) -> Path | None:
    """us/step against rows per step, log-log: one panel per (op, dtype, row bytes).

    Lines: ours (solid) and XLA (dashed) for the op, the baseline (dotted) for
    what a step costs without any write, floor_launch (dotted, orange) for one
    with an aliased kernel that writes nothing. None when matplotlib is missing.
    """
    plt = _pyplot()
    if plt is None:
        return None
    timed = [r for r in records if r.get("us_per_step")]
    panels = sorted({(r["op"], r["dtype"], r["row_bytes"]) for r in timed
                     if r["op"] not in _REFERENCE_OPS})
    if not panels:
        return None
    cols = min(4, len(panels))
    nrows = -(-len(panels) // cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(4.4 * cols, 3.6 * nrows), squeeze=False)
    for ax, (op, dtype, row_bytes) in zip(axes.flat, panels, strict=False):
        case = [r for r in timed if r["dtype"] == dtype and r["row_bytes"] == row_bytes]
        lines = sorted({(r["provider"], r["backend"]) for r in case
                        if r["op"] in (op, *_REFERENCE_OPS)})
        for provider, backend in lines:
            pts = sorted((r["rows"], r["us_per_step"]) for r in case
                         if (r["provider"], r["backend"]) == (provider, backend))
            xs, ys = zip(*pts, strict=True)
            # The same colour for a provider in every panel (the ops share
            # them: ours black, the unique promise blue, XLA red).
            family = provider
            for op_part in ("_set", "_add", "_read", "_get"):
                family = family.replace(op_part, "")
            style = {"color": _LOOP_COLOURS.get(family, "tab:purple"),
                     "linestyle": ":" if family in ("baseline", "floor_launch") else
                     "--" if family == "xla" else "-",
                     "marker": _BACKEND_MARKERS.get(backend, "o"), "markersize": 4}
            label = provider if backend in ("auto", "-") else f"{provider}[{backend}]"
            ax.plot(xs, ys, label=label, **style)
        ax.set(xscale="log", yscale="log", xlabel="rows per step", ylabel="us / step",
               title=f"{op} {dtype} {row_bytes} B rows")
        ax.grid(True, which="both", alpha=0.3)
    for ax in list(axes.flat)[len(panels):]:
        ax.set_visible(False)
    _legend_and_save(plt, fig, axes, "per-step cost inside lax.scan (buffer donated)", path)
    return path
