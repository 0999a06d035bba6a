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
import time
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


def measure_back_to_back(
    step: Callable[..., Any], wait: Callable[[Any], Any], state: Any, *args: Any,
    calls: int, rounds: int,
) -> tuple[Any, Timing]:
    """Per-call seconds of ``calls`` calls issued with no wait between them, then one wait.

    A loop of calls runs this way: the next call is dispatched while the last one
    still runs, so a call's fixed cost (dispatch, launch, completion) overlaps its
    neighbours'. Each of ``rounds`` rounds gives one sample, its time over ``calls``.
    Run it after a synchronized measurement of the same step (compilation and
    first touch done). Returns ``(state, Timing)``.
    """
    per_call = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            state = step(state, *args)
        state = wait(state)
        per_call.append((time.perf_counter() - start) / calls)
    return state, Timing.of(per_call)


def choose_reps(one_run_s: float, *, min_reps: int, max_reps: int, min_total_s: float) -> int:
    """At least ``min_reps``; more for fast runs, so that tiny cases are not noise."""
    wanted = math.ceil(min_total_s / max(one_run_s, 1e-7))
    return max(min_reps, min(max_reps, wanted))
