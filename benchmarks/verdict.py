"""Where ``auto`` is slower than XLA in a loop run: the count issue 20's done-when reads.

``benchmarks.loop`` prints these lines at the end of a run; on a committed result:

    python -m benchmarks.verdict benchmarks/results/loop_quick_graphs_h200_1206_2046.json

Each ``ours_*`` row run with backend ``auto`` is paired with XLA's formulation of the same op
in the same case, ``xla_<op>`` by the record's ``op`` as the loop's table pairs them
(``ours_set_unique`` with ``xla_set``: XLA's formulation takes no promise). A pair counts as
*slower* when ``auto``'s median is above XLA's, and as *apart* when even ``auto``'s fastest run
is slower than XLA's slowest. Identical HLO can land either side of a median
(docs/PERFORMANCE.md, "What `auto` runs"), so the second count is the one that one run's noise
does not decide.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import NamedTuple

from benchmarks.report import span


class Pair(NamedTuple):
    case: str
    provider: str
    auto: dict
    xla: dict

    @property
    def slower(self) -> bool:
        return self.auto["us_per_step"] > self.xla["us_per_step"]

    @property
    def apart(self) -> bool:
        return self.auto["us_min"] > self.xla["us_max"]


def xla_peer(record: dict) -> str | None:
    """XLA's formulation of an ``ours_*`` row's op (None for other providers)."""
    return f"xla_{record['op']}" if record["provider"].startswith("ours_") else None


def _timed(r: dict) -> bool:
    return r.get("status") == "ok" and all(
        r.get(key) is not None for key in ("us_per_step", "us_min", "us_max"))


def auto_xla_pairs(records: list[dict]) -> list[Pair]:
    """Every timed ``auto`` row with its timed XLA peer, in the records' order."""
    xla = {(r["case"], r["provider"]): r for r in records
           if r["provider"].startswith("xla_") and _timed(r)}
    pairs = []
    for r in records:
        peer = xla_peer(r)
        if r.get("backend") != "auto" or peer is None or not _timed(r):
            continue
        if (r["case"], peer) in xla:
            pairs.append(Pair(r["case"], r["provider"], r, xla[(r["case"], peer)]))
    return pairs


def _span(r: dict) -> str:
    return f"{r['us_per_step']:.1f}{span(r['us_min'], r['us_max'], '.1f')}"


def verdict_lines(records: list[dict]) -> list[str]:
    """The verdict: counts first, then each pair that is apart, auto / XLA in us per step."""
    pairs = auto_xla_pairs(records)
    if not pairs:
        return ["auto against XLA: no timed pair in this run"]
    slower = [p for p in pairs if p.slower]
    apart = [p for p in slower if p.apart]
    lines = [f"auto against XLA: slower by the median in {len(slower)} of {len(pairs)} pairs; "
             f"in {len(apart)} even auto's fastest run is slower than XLA's slowest"
             + (":" if apart else "")]
    lines += [f"  {p.case:36} {p.provider:26} auto {_span(p.auto):>24}  "
              f"xla {_span(p.xla):>24}" for p in apart]
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path, help="loop.json files")
    args = parser.parse_args(argv)
    for path in args.runs:
        print(path)
        print("\n".join(verdict_lines(json.loads(path.read_text())["records"])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
