"""Lab probe (session 31): what the eager calls' holder costs an eager write, on this machine.

A blocked one-shot ``scatter_to_host`` of 5 rows into a 1 MiB pinned buffer, the median of
1000 calls, with the holder as shipped and with its ``hold`` replaced by a no-op, three
times each, interleaved. On the project's CPU machine (2 cores, jax 0.12.0.1, 2026-12-06):
holder 83.2 / 80.3 / 79.5 us, no-op 44.1 / 44.2 / 43.9 us (tree before 10d6dd8); at 5863c0f,
two runs at 11:51 UTC (the log beside this file): holder 150.3 / 142.2 / 117.6 and
156.8 / 82.1 / 113.4 us, no-op 44.2-48.1 us. That holder's cost moved from run to run, about
35-110 us a call: its thread's wake-up on every call and the GIL, not a copy. Session 32's
holder (each call drops the computed front; the thread polls every 2 ms and sleeps only after
a quiet interval), two runs at 12:20 UTC: holder 55.6 / 55.7 / 54.2 and 53.9 / 57.6 / 55.8 us,
no-op 44.9-49.2 us (holder_overhead_probe_cpu_1206_1220.log); before the log, 50.4-61.0
against 42.1-45.8.

Second part (session 32): an eager loop ``x = scatter_add_to_host(x, ...)`` of 300 calls that
never blocks, the most entries the holder held during it and how many it held at the end.
Every result is donated on to the next call, mostly before it is computed, so that holder
kept all 300 (and with them every call's arrays) until the loop ended; the thread now waits
for the newest result when 16 pile up. Prediction: far fewer than 300 held at any time.
Outcome at 12:31 UTC (holder_overhead_probe_cpu_1206_1231.log): most held 65, 37 at the end;
the blocked one-shot then took 58.1-60.6 us with the holder, 49.4-54.1 with the no-op. (The
holder of 12:20, without the wait, held all 500 calls of such a loop in a scratch run.)
The holder with lanes and fences (0339b4e), at 13:28 UTC on CPU
(holder_overhead_probe_cpu_1206_1328.log): 54.4-56.0 against 45.1-46.0 us; the loop held at
most 67, 32 at its end (no fence off the GPU). On an H100 at 13:25 UTC
(holder_gpu_check_h100_1206_1325/summary.txt): 99.1-99.5 against 104.3-104.6 us, no cost
seen; the loop held at most 8, 1 at its end, 113.7 us a call.

    python docs/lab/holder_overhead_probe.py
"""

import time

import jax
import jax.numpy as jnp
import numpy as np

import pallas_pinned as pp
from pallas_pinned import _holder

pinned = jax.sharding.make_single_device_sharding(jax.devices()[0], memory_kind="pinned_host")
x = jax.device_put(np.zeros((4096, 64), np.float32), pinned)
idx, u = jnp.array([1, 5, 9, 13, 17], jnp.int32), jnp.ones((5, 64), jnp.float32)


def median_us(n: int) -> float:
    global x
    times = []
    for _ in range(n):
        start = time.perf_counter()
        x = pp.scatter_to_host(x, idx, u)
        x.block_until_ready()
        times.append(time.perf_counter() - start)
    return float(np.median(times)) * 1e6


median_us(100)
shipped = _holder._HOLDER.hold
for _ in range(3):
    _holder._HOLDER.hold = shipped
    held = median_us(1000)
    _holder._HOLDER.hold = lambda result, inputs, devices=None: None
    print(f"blocked one-shot median: holder {held:.1f} us, no-op {median_us(1000):.1f} us")

_holder._HOLDER.hold = shipped
rows = jnp.arange(0, 4096, 7, dtype=jnp.int32)
ones = jnp.ones((rows.shape[0], 64), jnp.float32)
x = pp.scatter_add_to_host(x, rows, ones).block_until_ready()
most, start = 0, time.perf_counter()
for _ in range(300):
    x = pp.scatter_add_to_host(x, rows, ones)
    most = max(most, _holder._HOLDER.held())
print(f"eager loop of 300 unblocked adds: most held {most}, "
      f"held at its end {_holder._HOLDER.held()}, "
      f"{(time.perf_counter() - start) * 1e6 / 300:.1f} us a call")
