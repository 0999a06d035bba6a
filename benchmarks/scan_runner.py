"""Running one compiled ``lax.scan`` over the loop benchmark's pinned buffer: compile, check, time.

Shared by the grid (``benchmarks.loop``) and the write patterns
(``benchmarks.loop_patterns``): the one pinned buffer of a run, the programs
of a case compiled side by side, one checked run per program, then the timing
of all the case's programs interleaved in rounds (:func:`check_then_time`,
:func:`time_interleaved`). The one buffer is threaded through every program
in turn (each donates it to the next): each check compares against a replay
of that program's own steps from the rows read just before its run, so no
program needs a buffer of its own, and pinned memory stays one buffer. Each
program writes values of its own (:func:`own_updates`): with the same values
for all, a program that wrote nothing would find the rows its predecessor
wrote and pass its check.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import os
import time
import zlib
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import environment, hlo, timing
from pallas_pinned.testing import time_calls


class PinnedBuffer:
    """The one pinned buffer of the run, rebuilt when a case needs another dtype or shape."""

    def __init__(self, seed: int):
        device = jax.devices()[0]
        self.pinned = jax.sharding.make_single_device_sharding(device, memory_kind="pinned_host")
        self.x, self.layout, self.seed, self.fills = None, None, seed, 0

    def ensure(self, dtype: str, shape: tuple[int, ...]) -> None:
        """Random normals made on the device, moved to pinned memory; the old one freed first."""
        if self.layout == (dtype, shape) and self.x is not None and not self.x.is_deleted():
            return
        if self.x is not None and not self.x.is_deleted():
            self.x.delete()
        self.fills += 1
        fresh = jax.random.normal(jax.random.key(self.seed * 1000 + self.fills), shape,
                                  jnp.dtype(dtype))
        self.x = jax.block_until_ready(jax.device_put(fresh, self.pinned))
        fresh.delete()
        self.layout = (dtype, shape)

    def rebuild_if_lost(self) -> None:
        """After a failed call the buffer may have been donated: make a fresh one."""
        if self.x is None or self.x.is_deleted():
            dtype, shape = self.layout
            self.layout = None
            self.ensure(dtype, shape)


def own_updates(data, row: str):
    """``data`` (a case's data: ``base``, ``base_dev`` and an ``owned`` list) with a
    ``base`` of its own for the row ``row`` (``provider[backend]``).

    The programs of a case run one after the other on one buffer, and a step's
    values are ``base + t``: were ``base`` the case's for all, the rows a program
    should write would already hold those values when it runs, and a program that
    wrote nothing (or only some rows) would pass its check. Fresh values per row
    (seeded by its name) make every check see its own writes. They are drawn on the
    device (numpy took up to 1.4 s for the full grid's 64 MiB), then read back for the
    replay; the device copy joins ``data.owned``, which the case's ``release`` deletes.
    """
    key = jax.random.key(zlib.crc32(row.encode()))
    base_dev = jax.device_put(jax.random.normal(key, data.base.shape, data.base.dtype),
                              data.base_dev.sharding)
    data.owned.append(base_dev)
    return dataclasses.replace(data, base=np.asarray(base_dev), base_dev=base_dev)


def compile_all(lowerings: dict, compiler_options: dict | None = None) -> dict:
    """``{key: (compiled or the exception, compile seconds)}`` of ``{key: lower()}``.

    ``compiler_options`` (XLA's options by name, ``--xla-option``) go to every
    program of the case alike, XLA's own and ours.

    Compilation dominates a case's cost, and XLA compiles in C++ without the
    GIL, so the programs of a case are lowered one by one (tracing is Python)
    and compiled side by side.
    """
    lowered = {}
    for key, lower in lowerings.items():
        try:
            lowered[key] = lower()
        except Exception as err:  # noqa: BLE001 - recorded by check_scan as the pair's error
            lowered[key] = err

    def compile_one(item):
        if isinstance(item, Exception):
            return item, 0.0
        t0 = time.perf_counter()
        try:
            return item.compile(compiler_options or None), time.perf_counter() - t0
        except Exception as err:  # noqa: BLE001 - recorded by check_scan as the pair's error
            return err, time.perf_counter() - t0

    workers = max(1, min(len(lowered), os.cpu_count() or 1, 8))
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        return dict(zip(lowered, pool.map(compile_one, lowered.values()), strict=True))


@dataclasses.dataclass(eq=False)  # compared and hashed by identity
class CheckedScan:
    """A compiled scan that ran once and was judged (its ``record`` filled but the timing)."""

    record: dict
    call: Callable  # outputs = call(x): one scan over the buffer ``x``, which it donates
    timed_calls: int  # --runs, or 1 for a scan slower than --max-run-s
    warmup: int  # untimed calls before its first timed one (0 when slow)
    seconds: list[float] = dataclasses.field(default_factory=list)  # its timed calls so far
    rounds: int = 0  # rounds in which it got timed calls


def check_scan(args, buf: PinnedBuffer, record: dict, compiled_and_s, inputs: tuple,
               read_before, judge) -> CheckedScan | None:
    """Runs one compiled scan once and judges it; None (``record`` an error) if it failed.

    ``read_before(x)`` reads what the check needs from the buffer before the
    run; ``judge(before, outputs)`` returns None when the run was right, else
    what is wrong. Fills the record's kernel count, ``correct`` and ``check``.
    """
    compiled, record["compile_s"] = compiled_and_s
    try:
        if isinstance(compiled, Exception):
            raise compiled
        kernels = hlo.kernels_per_step(compiled.as_text(), args.steps)
        before = read_before(buf.x)
        with environment.captured_output() as out:
            t0 = time.perf_counter()
            outputs = jax.block_until_ready(compiled(buf.x, *inputs))
            first_run_s = time.perf_counter() - t0
        buf.x = outputs[0]
        mismatch = judge(before, outputs)
    except Exception as err:  # noqa: BLE001 - recorded as an error; the run fails at the end
        _record_error(buf, record, err)
        return None
    record.update(
        kernels_per_step=kernels.per_step, hlo_ops=kernels.ops, trip_count=kernels.trip_count,
        correct=mismatch is None, notes=environment.first_lines(out["text"]),
        check=mismatch or record.get("check"),
    )
    slow = first_run_s > args.max_run_s  # one more run only, after no warm-up
    if slow:
        record["notes"] = (f"one run took {first_run_s:.1f} s > --max-run-s: timed once; "
                           + record["notes"])
    return CheckedScan(record, lambda x: compiled(x, *inputs), 1 if slow else args.runs,
                       0 if slow else args.warmup)


def round_shares(calls: int, rounds: int) -> list[int]:
    """``calls`` split over at most ``rounds`` rounds as evenly as can be, no round empty."""
    used = max(1, min(rounds, calls))
    each, extra = divmod(calls, used)
    return [each + (k < extra) for k in range(used)]


def call_scan(buf: PinnedBuffer, scan: CheckedScan, repeats: int, warmup: int) -> list[float]:
    """Seconds of ``repeats`` timed calls of ``scan`` after ``warmup``, the buffer threaded."""
    outputs, seconds = time_calls(lambda state: scan.call(state[0]), (buf.x,),
                                  repeats=repeats, warmup=warmup)
    buf.x = outputs[0]
    return seconds


def time_interleaved(buf: PinnedBuffer, scans: list[CheckedScan], rounds: int) -> None:
    """Times ``scans`` round-robin in ``rounds`` rounds; fills their records' timing.

    Timing one program after the other lets drift of the machine (clocks,
    PCIe, the state of host memory) land on one of them only. So every scan
    first gets its warm-up calls, then each round gives each scan its share
    of its timed calls (:func:`round_shares`), the order rotated by one per
    round so that none always follows the same one. ``us_per_step`` is the
    median over all of a scan's timed calls, ``us_min``/``us_max`` their
    extremes, ``runs`` their number; ``scan.rounds`` and the record's
    ``rounds`` the rounds it was timed in.
    """
    live = list(scans)
    for scan in scans:
        if scan.warmup:
            _call_or_fail(buf, scan, live, 0, scan.warmup)
    shares = {scan: round_shares(scan.timed_calls, rounds) for scan in scans}
    for k in range(max((len(s) for s in shares.values()), default=0)):
        turn = k % len(scans)
        for scan in scans[turn:] + scans[:turn]:
            share = shares[scan]
            if scan in live and k < len(share) and _call_or_fail(buf, scan, live, share[k], 0):
                scan.rounds += 1
    for scan in scans:
        scan.record["rounds"] = scan.rounds
    for scan in live:
        measured = timing.Timing.of(scan.seconds)
        per_step = 1e6 / scan.record["steps"]
        scan.record.update(us_per_step=measured.median_s * per_step,
                           us_min=measured.min_s * per_step, us_max=measured.max_s * per_step,
                           runs=measured.reps)


def _call_or_fail(buf: PinnedBuffer, scan: CheckedScan, live: list, repeats: int,
                  warmup: int) -> bool:
    """Runs ``scan``'s calls; on an error records it and drops the scan from ``live``."""
    try:
        scan.seconds += call_scan(buf, scan, repeats, warmup)
    except Exception as err:  # noqa: BLE001 - recorded as an error; the run fails at the end
        _record_error(buf, scan.record, err)
        live.remove(scan)
        return False
    return True


def _record_error(buf: PinnedBuffer, record: dict, err: Exception) -> None:
    buf.rebuild_if_lost()  # a failed call may have consumed the donated buffer
    record["status"] = "error"
    record["error"] = f"{type(err).__name__}: {err}"[:600]


def check_then_time(buf: PinnedBuffer, todo: list, check_one, rounds: int, progress,
                    label: str) -> list[dict]:
    """Every row of a case checked, then the checked ones timed interleaved; their records.

    ``check_one(provider, backend)`` makes a row's record and runs
    :func:`check_scan` on it: ``(record, CheckedScan or None)``. No row is timed
    before every row has been checked; then :func:`time_interleaved` times
    them all in ``rounds`` rounds. Records come back in ``todo``'s order.
    """
    records, checked = [], []
    for provider, backend in todo:
        record, scan = check_one(provider, backend)
        records.append(record)
        if scan is not None:  # else the record holds the error
            checked.append(scan)
    time_interleaved(buf, checked, rounds)
    for provider, backend in todo:
        progress.step(f"{label} {getattr(provider, 'name', provider)}[{backend}]")
    return records


def backend_skip_reason(args, backend: str) -> str | None:
    """Why a kernel backend cannot run here (None: it can); never found by trying."""
    if backend in ("pallas", "triton") and not args.gpu:
        return "needs a CUDA GPU"
    if backend == "triton":
        _, why = environment.optional_import("jax_triton")
        return f"unavailable: {why}" if why else None
    return None


def fill_op_costs(records: list[dict]) -> None:
    """Step time and kernels over the same case's baseline."""
    base = next((r for r in records if r["provider"] == "baseline" and r["us_per_step"]), None)
    for r in records:
        if base and r["us_per_step"] is not None:
            r["op_cost_us"] = r["us_per_step"] - base["us_per_step"]
        if base and r["kernels_per_step"] is not None:
            r["op_kernels"] = r["kernels_per_step"] - base["kernels_per_step"]


def split_runnable(args, rows, over_budget: bool, make_record, progress, label: str):
    """``(todo, skipped records)`` of a case's (provider, backend) rows.

    A row is skipped when the time budget is used up or its backend cannot
    run here (:func:`backend_skip_reason`); ``make_record(provider, backend)``
    makes its record.
    """
    todo, records = [], []
    for provider, backend in rows:
        reason = (f"time budget of {args.time_budget_s:.0f} s used up" if over_budget
                  else backend_skip_reason(args, backend))
        if reason:
            record = make_record(provider, backend)
            record["status"] = "skipped: " + reason
            records.append(record)
            progress.step(f"{label} {getattr(provider, 'name', provider)}[{backend}]")
        else:
            todo.append((provider, backend))
    return todo, records

