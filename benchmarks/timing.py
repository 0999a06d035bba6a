"""The one way the benchmarks time things.

Every measurement goes through :func:`pallas_pinned.testing.time_calls`
(shared with the demo): warm-up calls first (compilation and first touch are
never timed), then calls that each end when the device work is finished, the
state (a donated buffer) threaded from call to call. This module adds the
summary (median, min, max) and the rule for how many repeats a case gets.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Callable
from typing import Any

from pallas_pinned.testing import time_calls


@dataclasses.dataclass(frozen=True)
class Timing:
    """Wall-clock seconds of ``reps`` device-synchronized calls."""

    median_s: float
    min_s: float
    max_s: float
    reps: int

    @classmethod
    def of(cls, seconds: list[float]) -> Timing:
        return cls(statistics.median(seconds), min(seconds), max(seconds), len(seconds))


def measure(
    fn: Callable[..., Any], state: Any, *args: Any, repeats: int, warmup: int = 1,
    prepare: Callable[[], tuple] | None = None,
) -> tuple[Any, Timing]:
    """``time_calls`` summarized: returns ``(state, Timing)``."""
    state, seconds = time_calls(fn, state, *args, repeats=repeats, warmup=warmup, prepare=prepare)
    return state, Timing.of(seconds)


def choose_reps(one_run_s: float, *, min_reps: int, max_reps: int, min_total_s: float) -> int:
    """At least ``min_reps``; more for fast runs, so that tiny cases are not noise."""
    wanted = math.ceil(min_total_s / max(one_run_s, 1e-7))
    return max(min_reps, min(max_reps, wanted))
