"""Running one compiled ``lax.scan`` over the loop benchmark's pinned buffer: compile, check, time.

Shared by the grid (``benchmarks.loop``) and the write patterns
(``benchmarks.loop_patterns``): the one pinned buffer of a run, the programs
of a case compiled side by side, and one (check, then time) per program.
"""

from __future__ import annotations

import concurrent.futures
import os
import time

import jax
import jax.numpy as jnp

from benchmarks import environment, hlo, timing


class PinnedBuffer:
    """The one pinned buffer of the run, rebuilt when a case needs another dtype or shape."""

    def __init__(self, seed: int):
        device = jax.devices()[0]
        self.pinned = jax.sharding.SingleDeviceSharding(device, memory_kind="pinned_host")
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


def compile_all(lowerings: dict) -> dict:
    """``{key: (compiled or the exception, compile seconds)}`` of ``{key: lower()}``.

    Compilation dominates a case's cost, and XLA compiles in C++ without the
    GIL, so the programs of a case are lowered one by one (tracing is Python)
    and compiled side by side.
    """
    lowered = {}
    for key, lower in lowerings.items():
        try:
            lowered[key] = lower()
        except Exception as err:  # noqa: BLE001 - recorded by run_scan as the pair's error
            lowered[key] = err

    def compile_one(item):
        if isinstance(item, Exception):
            return item, 0.0
        t0 = time.perf_counter()
        try:
            return item.compile(), time.perf_counter() - t0
        except Exception as err:  # noqa: BLE001 - recorded by run_scan as the pair's error
            return err, time.perf_counter() - t0

    workers = max(1, min(len(lowered), os.cpu_count() or 1, 8))
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        return dict(zip(lowered, pool.map(compile_one, lowered.values()), strict=True))


def run_scan(args, buf: PinnedBuffer, record: dict, compiled_and_s, inputs: tuple,
             read_before, judge) -> dict:
    """Runs one compiled scan once and judges it, then times it; fills ``record``.

    ``read_before(x)`` reads what the check needs from the buffer before the
    run; ``judge(before, outputs)`` returns None when the run was right, else
    what is wrong.
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
        slow = first_run_s > args.max_run_s  # one more run only, after no warm-up
        outputs, measured = timing.measure(
            lambda state, *rest: compiled(state[0], *rest), outputs, *inputs,
            repeats=1 if slow else args.runs, warmup=0 if slow else args.warmup)
        buf.x = outputs[0]
    except Exception as err:  # noqa: BLE001 - recorded as an error; the run fails at the end
        buf.rebuild_if_lost()
        record["status"] = "error"
        record["error"] = f"{type(err).__name__}: {err}"[:600]
        return record
    per_step = 1e6 / args.steps
    record.update(
        us_per_step=measured.median_s * per_step, us_min=measured.min_s * per_step,
        us_max=measured.max_s * per_step, runs=measured.reps,
        kernels_per_step=kernels.per_step, hlo_ops=kernels.ops, trip_count=kernels.trip_count,
        correct=mismatch is None, notes=environment.first_lines(out["text"]),
        check=mismatch or record.get("check"),
    )
    if slow:
        record["notes"] = (f"one run took {first_run_s:.1f} s > --max-run-s: timed once; "
                           + record["notes"])
    return record


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

