"""Helpers for the benchmarks: timing, environment tags, row checks and output files.

Nothing here knows about a particular provider; ``bench_scatter.py`` does. The
optional packages (tqdm, rich, matplotlib) are used when importable and the
helpers fall back to plain text (or no plots) otherwise.
"""

import contextlib
import csv
import dataclasses
import datetime
import json
import math
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np

from pallas_pinned.testing import assert_same, scatter_oracle

# ---------------------------------------------------------------------------
# Timing


@dataclasses.dataclass(frozen=True)
class Timing:
    """Wall-clock seconds of ``reps`` runs, each ending with a device sync."""

    median_s: float
    min_s: float
    max_s: float
    reps: int


def time_runs(run: Callable[[Any], None], prepare: Callable[[], Any] | None, reps: int) -> Timing:
    """Times ``run(prepare())`` ``reps`` times; ``prepare`` is not timed.

    ``run`` must return only once the device work it started has finished
    (``block_until_ready`` / ``torch.cuda.synchronize``), so each sample is a
    full round: dispatch, kernel, completion.
    """
    samples = []
    for _ in range(reps):
        arg = prepare() if prepare is not None else None
        start = time.perf_counter()
        run(arg)
        samples.append(time.perf_counter() - start)
    return Timing(statistics.median(samples), min(samples), max(samples), reps)


def choose_reps(one_run_s: float, *, min_reps: int, max_reps: int, min_total_s: float) -> int:
    """At least ``min_reps``; more for fast runs, so tiny cases are not noise."""
    wanted = math.ceil(min_total_s / max(one_run_s, 1e-7))
    return max(min_reps, min(max_reps, wanted))


# ---------------------------------------------------------------------------
# Capturing what a call prints


@contextlib.contextmanager
def captured_output():
    """Collects C++ log lines (fd 2) and Python warnings instead of showing them.

    XLA reports "converting to host compute" and similar through its C++
    logger, which Python's ``warnings`` never sees; redirecting the file
    descriptor catches both. Yields a dict whose ``"text"`` is filled on exit.
    """
    box = {"text": ""}
    sys.stderr.flush()
    saved_fd = os.dup(2)
    with tempfile.TemporaryFile() as sink, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        os.dup2(sink.fileno(), 2)
        try:
            yield box
        finally:
            sys.stderr.flush()
            os.dup2(saved_fd, 2)
            os.close(saved_fd)
            sink.seek(0)
            lines = [sink.read().decode(errors="replace").strip()]
            lines += [f"{w.category.__name__}: {w.message}" for w in caught]
            box["text"] = "\n".join(line for line in lines if line)


def first_lines(text: str, limit: int = 400) -> str:
    """A short, one-line excerpt of captured output for a record."""
    text = " | ".join(line.strip() for line in text.splitlines() if line.strip())
    return text if len(text) <= limit else text[: limit - 3] + "..."


# ---------------------------------------------------------------------------
# Environment tags


def _run_quietly(cmd: list[str]) -> str | None:
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


_SMI_FIELDS = (
    "name",
    "driver_version",
    "pcie.link.gen.current",
    "pcie.link.gen.max",
    "pcie.link.width.current",
    "pcie.link.width.max",
    "memory.total",
)


def nvidia_smi_info() -> dict[str, str]:
    """GPU name, driver and PCIe link of GPU 0 from ``nvidia-smi``, if present.

    The current PCIe generation drops when the GPU idles, so the maximum is
    recorded too.
    """
    if shutil.which("nvidia-smi") is None:
        return {}
    out = _run_quietly(
        ["nvidia-smi", "-i", "0", f"--query-gpu={','.join(_SMI_FIELDS)}",
         "--format=csv,noheader,nounits"]
    )
    if not out:
        return {"nvidia_smi": "query failed"}
    values = [v.strip() for v in out.splitlines()[0].split(",")]
    return {f"gpu_{k.replace('.', '_')}": v for k, v in zip(_SMI_FIELDS, values, strict=False)}


def git_revision(repo: Path) -> str | None:
    rev = _run_quietly(["git", "-C", str(repo), "rev-parse", "--short", "HEAD"])
    if rev is None:
        return None
    dirty = _run_quietly(["git", "-C", str(repo), "status", "--porcelain"])
    return rev + ("+dirty" if dirty else "")


def environment(repo: Path) -> dict[str, Any]:
    """Tags for a results file: when, where, which versions."""
    import jax
    import jaxlib

    device = jax.devices()[0]
    info: dict[str, Any] = {
        "date_utc": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "host_cpus": os.cpu_count(),
        "jax": jax.__version__,
        "jaxlib": jaxlib.__version__,
        "jax_backend": jax.default_backend(),
        "device_kind": device.device_kind,
        "git": git_revision(repo),
    }
    info.update(nvidia_smi_info())
    return info


# ---------------------------------------------------------------------------
# Checking a scatter on a sample of rows


@dataclasses.dataclass(frozen=True)
class RowSample:
    """Rows of the buffer read back to check one case.

    Reading a whole 4 GiB buffer back and comparing it in numpy for every
    (case, provider) would take longer than the measurements. A scatter can go
    wrong in two ways: a written row holds the wrong value (or is not written),
    or a row it should not touch changes. So the sample holds up to
    ``max_written`` of the rows written (all of them for small cases) plus
    ``n_others`` random rows anywhere in the buffer, which are nearly all
    untouched and catch stray writes. Every update aimed at a sampled row is
    replayed by the oracle, so duplicates among them resolve exactly.
    """

    rows: np.ndarray  # sorted unique buffer rows to read
    hit_positions: np.ndarray  # positions k in indices with indices[k] in rows
    hit_slots: np.ndarray  # for each of those, its position in ``rows``


def make_row_sample(
    rng: np.random.Generator, indices: np.ndarray, num_rows: int, *,
    max_written: int, n_others: int,
) -> RowSample:
    n = indices.shape[0]
    picked = indices if n <= max_written else indices[rng.choice(n, max_written, replace=False)]
    others = rng.integers(0, num_rows, size=min(n_others, num_rows))
    rows = np.unique(np.concatenate([picked, others]).astype(np.int64))
    slots = np.minimum(np.searchsorted(rows, indices), rows.size - 1)
    hit_positions = np.flatnonzero(rows[slots] == indices)
    return RowSample(rows, hit_positions, slots[hit_positions])


def _equal_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.tobytes() == b.tobytes()


def check_rows(
    before: np.ndarray, after: np.ndarray, sample: RowSample, hit_updates: np.ndarray,
    *, duplicates: str,
) -> str | None:
    """Compares sampled rows with the oracle; returns None when they match.

    ``hit_updates[j]`` is the update for ``indices[sample.hit_positions[j]]``.
    ``duplicates="last"`` demands the promised last-occurrence-wins; ``"any"``
    (for XLA and the peers, whose duplicate order is unspecified) accepts any
    of the values aimed at a repeated row.
    """
    expected = scatter_oracle(before, sample.hit_slots, hit_updates)
    try:
        assert_same(after, expected, what="sampled rows")
        return None
    except AssertionError as err:
        if duplicates == "last":
            return str(err)
        message = str(err)
    # Group the updates by the row they aim at once, not once per row.
    order = np.argsort(sample.hit_slots, kind="stable")
    grouped = sample.hit_slots[order]
    for slot in _differing_slots(after, expected):
        lo, hi = np.searchsorted(grouped, [slot, slot + 1])
        if not any(_equal_bits(after[slot], c) for c in hit_updates[order[lo:hi]]):
            return message
    return None


def _differing_slots(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a2 = a.reshape(a.shape[0], -1).view(np.uint8)
    b2 = b.reshape(b.shape[0], -1).view(np.uint8)
    return np.flatnonzero((a2 != b2).any(axis=1))


# ---------------------------------------------------------------------------
# Progress


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


# ---------------------------------------------------------------------------
# Output


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


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def table_rows(records: Iterable[dict]) -> list[list[str]]:
    rows = []
    for r in records:
        frac = r.get("frac_of_ceiling")
        rows.append([
            f"{r['pattern']} {r['dtype']} {r['row_bytes']}B n={format_count(r['n_updates'])}",
            r["provider"],
            format_seconds(r.get("median_s")),
            _fmt(r.get("gbps"), ".2f"),
            _fmt(None if r.get("updates_per_s") is None else r["updates_per_s"] / 1e6, ".1f"),
            "-" if frac is None else f"{100 * frac:.0f}%",
            {True: "yes", False: "NO", None: "-"}[r.get("correct")],
            r["status"] if r["status"] != "ok" else "",
        ])
    return rows


TABLE_HEADER = ["case", "provider", "median", "GB/s", "M upd/s", "of ceiling", "correct", "note"]


def print_table(records: list[dict], title: str) -> None:
    rows = table_rows(records)
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        widths = [max(len(str(c)) for c in col) for col in zip(TABLE_HEADER, *rows, strict=False)]
        print(f"\n{title}")
        for row in [TABLE_HEADER, *rows]:
            print("  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)))
        return
    table = Table(title=title)
    for name in TABLE_HEADER:
        table.add_column(name, justify="left" if name in ("case", "provider", "note") else "right")
    for row in rows:
        table.add_row(*row)
    Console(width=160).print(table)


def write_json(path: Path, payload: dict) -> None:
    path.write_text(json.dumps(payload, indent=1, default=str) + "\n")


def write_csv(path: Path, records: list[dict], leading: list[str]) -> None:
    fields = list(leading)
    for r in records:
        fields += [k for k in r if k not in fields]
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        writer.writerows(records)


def plot_groups(records: list[dict], out_dir: Path, stem: str, ceiling: str) -> list[Path]:
    """One PNG per (pattern, dtype): GB/s and updates/s against row bytes.

    Columns are update counts; lines are providers; the ``ceiling`` provider
    is drawn as a dashed black line. Returns the files written (none when
    matplotlib is missing).
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    timed = [r for r in records if r.get("gbps")]
    written = []
    for pattern, dtype in sorted({(r["pattern"], r["dtype"]) for r in timed}):
        group = [r for r in timed if r["pattern"] == pattern and r["dtype"] == dtype]
        path = out_dir / f"{stem}_{pattern}_{dtype}.png"
        _plot_one(plt, group, ceiling, f"scatter_to_host: {pattern} {dtype}", path)
        written.append(path)
    return written


def _plot_one(plt, group: list[dict], ceiling: str, title: str, path: Path) -> None:
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
    handles = {}
    for ax in axes.flat:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            handles.setdefault(label, handle)
    fig.legend(handles.values(), handles.keys(), loc="upper right", fontsize=8)
    fig.suptitle(title)
    fig.tight_layout(rect=(0, 0, 0.9, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)
