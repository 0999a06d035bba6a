"""The device-memory probe (the sweep's target e): how much device memory ``ours`` needs.

    python -m benchmarks.memory --gib 4 --updates 16M

The sweep runs each probe in a fresh process (``run_memory_probes``), before it
takes the GPU itself, so that the peak measured is the probe's own and a crash
stays there. The buffer is filled from the host, so the device never holds
it; the peak of ``bytes_in_use`` over its value before the call is then what
the call itself used.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import jax
import numpy as np

import pallas_pinned
from benchmarks.cases import parse_count
from benchmarks.environment import REPO
from pallas_pinned.testing import ScatterSpec, make_indices, make_values

GIB = 1 << 30
INT32_MAX = np.iinfo(np.int32).max
PROBE_TIMEOUT_S = 300


def memory_probe(buffer_gib: float, n_updates: int, seed: int, require_gpu: bool = True) -> dict:
    """Peak device memory growth while ``scatter_to_host`` writes into a pinned buffer."""
    device = jax.devices()[0]
    if require_gpu and device.platform != "gpu":
        return {"buffer_gib": buffer_gib, "skipped": f"needs a GPU, found {device.platform}"}
    num_elems = int(buffer_gib * GIB) // 4
    row_elems = 1
    while num_elems // row_elems > INT32_MAX:  # keep row numbers within int32
        row_elems *= 2
    num_rows, row_shape = num_elems // row_elems, (() if row_elems == 1 else (row_elems,))
    pinned = jax.sharding.make_single_device_sharding(device, memory_kind="pinned_host")
    on_device = jax.sharding.make_single_device_sharding(device, memory_kind="device")
    x = jax.device_put(np.full((num_rows, *row_shape), 1.5, np.float32), pinned)
    rng = np.random.default_rng(seed)
    spec = ScatterSpec(num_rows, row_shape, "float32", n_updates, "random_unique")
    idx = jax.device_put(make_indices(rng, spec).astype(np.int32), on_device)
    upd = jax.device_put(make_values(rng, (n_updates, *row_shape), "float32"), on_device)
    jax.block_until_ready((x, idx, upd))
    ours = jax.jit(pallas_pinned.scatter_to_host, donate_argnums=0)
    compiled = ours.lower(x, idx, upd).compile()
    analysis = compiled.memory_analysis()
    pointer = _pointer(x)
    before = _memory_stats(device)
    y = compiled(x, idx, upd)
    y.block_until_ready()
    after = _memory_stats(device)
    grew = after["peak_bytes_in_use"] > before["peak_bytes_in_use"]
    return {
        "buffer_gib": buffer_gib, "buffer_shape": [num_rows, *row_shape],
        "n_updates": n_updates, "memory_kind_after": y.sharding.memory_kind,
        "same_buffer": pointer is not None and pointer == _pointer(y),
        "bytes_in_use_before": before["bytes_in_use"], "bytes_in_use_after": after["bytes_in_use"],
        "peak_before": before["peak_bytes_in_use"], "peak_after": after["peak_bytes_in_use"],
        # Without a new peak the call stayed under an earlier one: growth is
        # then at most that earlier peak over bytes_in_use_before.
        "peak_growth_bytes": after["peak_bytes_in_use"] - before["bytes_in_use"],
        "peak_growth_is_upper_bound": not grew,
        "compiled_temp_bytes": getattr(analysis, "temp_size_in_bytes", None),
        "update_and_index_bytes": idx.nbytes + upd.nbytes,
    }


def _memory_stats(device) -> dict[str, int]:
    """``bytes_in_use`` and its peak; zeros where the backend keeps none (CPU)."""
    stats = device.memory_stats() or {}
    return {k: stats.get(k, 0) for k in ("bytes_in_use", "peak_bytes_in_use")}


def _pointer(a: jax.Array) -> int | None:
    try:
        return a.unsafe_buffer_pointer()
    except Exception:  # noqa: BLE001 - not every memory kind exposes one; only a tag
        return None


def run_memory_probes(sizes_gib: list[float], n_updates: int, seed: int) -> list[dict]:
    """Each probe in its own process: a clean peak, and a crash stays there."""
    results = []
    for gib in sizes_gib:
        cmd = [sys.executable, "-m", "benchmarks.memory", "--gib", str(gib),
               "--updates", str(n_updates), "--seed", str(seed)]
        print(f"memory probe: {gib:g} GiB pinned buffer, {n_updates} updates ...", flush=True)
        results.append(_probe_subprocess(cmd, gib))
    return results


def _probe_subprocess(cmd: list[str], gib: float) -> dict:
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=PROBE_TIMEOUT_S,
                              check=False, cwd=REPO)
    except subprocess.TimeoutExpired:
        return {"buffer_gib": gib, "error": f"timed out after {PROBE_TIMEOUT_S} s"}
    for line in done.stdout.splitlines():
        if line.startswith("MEMPROBE "):
            return json.loads(line[len("MEMPROBE "):])
    tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
    return {"buffer_gib": gib, "error": f"exit {done.returncode}: {' | '.join(tail)}"[:600]}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--gib", type=float, required=True, help="size of the pinned buffer")
    p.add_argument("--updates", type=parse_count, default=1 << 24, help="e.g. 16M")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--allow-cpu", action="store_true", help="probe even without a GPU")
    args = p.parse_args(argv)
    result = memory_probe(args.gib, args.updates, args.seed, require_gpu=not args.allow_cpu)
    print("MEMPROBE " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
