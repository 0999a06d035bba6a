"""Lab probe of 2026-12-03 (session 7): is the add's 0.60x of set on 4-byte rows its summing path?

Not a benchmark of the project. On a GPU, from the repository root:

    PYTHONPATH=. python docs/lab/narrow_add_probe.py   # ~1 min on an H200

One call per step on the quick gather_add case of 4-byte rows (4 Mi random distinct rows of a
4 GiB pinned float32 buffer, no promise, so the add orders the rows and sums runs): the set,
the add (runs summed in the kernel, the default), the add with ``tuning.override(
add_runs_in_kernel=False)`` (the older segmented scan, then the add kernel), and the add with
``unique_indices=True`` (no ordering, no summing: the kernel alone). Each is compiled under its
own settings, checked once on 4096 sampled rows against numpy, then timed interleaved: 3
rounds of 1 untimed and 5 timed synchronized calls each; median, min and max in ms.
``--rows N`` and ``--row-bytes B`` change the case (CPU: ``--rows 1024 --buffer-mib 4``).
"""

import argparse
import json
import statistics
import time

import jax
import numpy as np

import pallas_pinned as pp
from pallas_pinned import tuning

p = argparse.ArgumentParser()
p.add_argument("--rows", type=int, default=1 << 22)
p.add_argument("--row-bytes", type=int, default=4)
p.add_argument("--buffer-mib", type=int, default=4096)
args = p.parse_args()
dev = jax.devices()[0]
pinned = jax.sharding.SingleDeviceSharding(dev, memory_kind="pinned_host")
num_rows, width = (args.buffer_mib << 20) // args.row_bytes, args.row_bytes // 4
rng = np.random.default_rng(0)
idx_np = rng.choice(num_rows, args.rows, replace=False).astype(np.int32)
upd_np = rng.standard_normal((args.rows, width)).astype(np.float32)
x = jax.device_put(np.zeros((num_rows, width), np.float32), pinned)
idx, upd = jax.device_put(idx_np, dev), jax.device_put(upd_np, dev)
probe = rng.choice(args.rows, min(4096, args.rows), replace=False)
probe_rows = jax.device_put(idx_np[probe], dev)

PROVIDERS = {
    "set": ({}, lambda x, i, u: pp.scatter_to_host(x, i, u)),
    "add_runs_in_kernel": ({}, lambda x, i, u: pp.scatter_add_to_host(x, i, u)),
    "add_segmented_scan": ({"add_runs_in_kernel": False},
                           lambda x, i, u: pp.scatter_add_to_host(x, i, u)),
    "add_unique_promised": ({}, lambda x, i, u: pp.scatter_add_to_host(
        x, i, u, unique_indices=True)),
}
compiled, results = {}, {name: [] for name in PROVIDERS}
for name, (settings, fn) in PROVIDERS.items():
    with tuning.override(**settings):
        compiled[name] = jax.jit(fn, donate_argnums=0).lower(x, idx, upd).compile()
    before = np.asarray(pp.gather_from_host(x, probe_rows))
    x = jax.block_until_ready(compiled[name](x, idx, upd))
    after = np.asarray(pp.gather_from_host(x, probe_rows))
    want = upd_np[probe] if name == "set" else before + upd_np[probe]
    print(json.dumps({"check": name, "ok": bool(np.allclose(after, want, rtol=1e-6, atol=1e-6))}))
for _ in range(3):
    for name in PROVIDERS:
        x = jax.block_until_ready(compiled[name](x, idx, upd))
        for _ in range(5):
            t0 = time.perf_counter()
            x = jax.block_until_ready(compiled[name](x, idx, upd))
            results[name].append((time.perf_counter() - t0) * 1e3)
set_ms = statistics.median(results["set"])
for name, ms in results.items():
    print(json.dumps({"provider": name, "rows": args.rows, "row_bytes": args.row_bytes,
                      "ms": round(statistics.median(ms), 3), "min": round(min(ms), 3),
                      "max": round(max(ms), 3),
                      "throughput_vs_set": round(set_ms / statistics.median(ms), 3)}))
