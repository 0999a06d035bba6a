"""Session 34: what the sparse client's cached step runs on the GPU, kernel by kernel (lab).

With every row cached, ``ours_hot_distinct`` moves no row over PCIe, yet its step costs about
9 µs more than the device table's (PERFORMANCE.md, "A device cache of the hot rows"). This
probe traces a few scans of each provider with ``jax.profiler`` and lists the GPU's
activities per step from the trace (``jax.profiler.ProfileData``): how many kernels and
copies, their summed time, and the biggest by name, beside the step's wall time. Traced
with command buffers off (``xla_gpu_enable_command_buffer`` empty: each kernel launched by
itself), so each kernel shows; the wall times are also given graphed. Session 35 adds
``ours_hot_xla_add``.

    python docs/lab/step_kernels_probe.py [--hot-rows 8388608 262144] [--scans 3] [--providers ...]
"""

from __future__ import annotations

import argparse
import collections
import glob
import sys
import tempfile
from pathlib import Path

import jax
import jax.numpy as jnp

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks import sparse_hot, sparse_steps, sparse_training, timing  # noqa: E402

PROVIDERS = ("device", "ours_hot", "ours_hot_distinct", "ours_hot_merged", "ours_hot_xla_add")
GRAPHS = {"xla_gpu_graph_min_graph_size": 1}
PLAIN = {"xla_gpu_enable_command_buffer": ""}


def fresh_state(name, table0, hot_ids):
    if name == "device":
        return jnp.copy(table0)
    pinned = jax.sharding.make_single_device_sharding(jax.devices()[0], memory_kind="pinned_host")
    return sparse_hot.start(jax.device_put(table0, pinned), hot_ids, name)


def wall_us(compiled, state, ids, targets, scans: int):
    """The median µs per step of ``scans`` scans, after one untimed."""
    state, taken = timing.measure(compiled, state, ids, targets, repeats=scans)
    return state, taken.median_s * 1e6 / ids.shape[0]


def gpu_activities(trace_dir: str) -> tuple[list, list]:
    """The events of the GPU plane's stream lines, and every line name seen there."""
    path = sorted(glob.glob(f"{trace_dir}/**/*.xplane.pb", recursive=True))[-1]
    data = jax.profiler.ProfileData.from_file(path)
    events, names = [], []
    for plane in data.planes:
        if not plane.name.startswith("/device:GPU"):
            continue
        for line in plane.lines:
            names.append(f"{plane.name}|{line.name}")
            if "stream" in line.name.lower():
                events += [(e.name, e.duration_ns) for e in line.events]
    return events, names


def profile(name, table0, ids, targets, hot_ids, scans: int, lr: float) -> None:
    fn = (sparse_steps.step_fns(lr) | sparse_hot.step_fns(lr))[name]
    state = fresh_state(name, table0, hot_ids)
    try:  # no command buffers: each kernel launched alone (XLA's defaults graph 5+ kernels)
        plain = fn.lower(state, ids, targets).compile(PLAIN)
    except Exception as e:  # noqa: BLE001 - an XLA without the option: say so, use defaults
        print(f"    {PLAIN} refused ({type(e).__name__}): XLA's defaults instead", flush=True)
        plain = fn.lower(state, ids, targets).compile()
    state, plain_us = wall_us(plain, state, ids, targets, scans)
    graphed = fn.lower(state, ids, targets).compile(GRAPHS)
    state, graphed_us = wall_us(graphed, state, ids, targets, scans)
    with tempfile.TemporaryDirectory() as trace_dir:
        jax.profiler.start_trace(trace_dir)
        for _ in range(scans):
            state = jax.block_until_ready(plain(state, ids, targets))
        jax.profiler.stop_trace()
        events, lines = gpu_activities(trace_dir)
    steps = scans * ids.shape[0]
    by_name = collections.defaultdict(lambda: [0, 0])
    for kernel, ns in events:
        by_name[kernel][0] += 1
        by_name[kernel][1] += ns
    total_us = sum(ns for _, ns in events) / 1e3 / steps
    print(f"  {name}: wall {plain_us:.1f} us/step plain, {graphed_us:.1f} graphed; "
          f"{len(events) / steps:.1f} GPU activities a step, {total_us:.1f} us of them",
          flush=True)
    print(f"    the GPU plane's lines: {lines[:10]}", flush=True)
    for kernel, (count, ns) in sorted(by_name.items(), key=lambda kv: -kv[1][1])[:14]:
        print(f"    {count / steps:5.2f}/step {ns / 1e3 / steps:6.2f} us  {kernel[:90]}",
              flush=True)
    del state


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--hot-rows", type=int, nargs="+", default=[8 << 20, 1 << 18])
    p.add_argument("--scans", type=int, default=3)
    p.add_argument("--providers", nargs="+", default=list(PROVIDERS), choices=PROVIDERS)
    cli = p.parse_args()
    print(jax.devices()[0].device_kind, "jax", jax.__version__, flush=True)
    for hot_rows in cli.hot_rows:
        args = sparse_training.parse_args(["--hot-rows", str(hot_rows)])
        table0, ids, targets, ids_np, hot_ids, _ = sparse_training.make_inputs(args)
        stats = sparse_hot.cold_stats(ids_np, hot_ids)
        print(f"\n{hot_rows} hot rows ({stats['hot_entry_fraction']:.1%} of the entries, "
              f"{stats['cold_distinct_mean']:.0f} distinct cold ids a step)", flush=True)
        for name in cli.providers:
            if name == "device" and hot_rows != cli.hot_rows[0]:
                continue  # the device table's step does not depend on the cache
            profile(name, table0, ids, targets, hot_ids, cli.scans, args.lr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
