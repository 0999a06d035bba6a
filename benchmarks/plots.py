"""Figures of the sweep and the loop benchmark (skipped when matplotlib is missing)."""

from __future__ import annotations

from pathlib import Path

from benchmarks.report import format_count


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
