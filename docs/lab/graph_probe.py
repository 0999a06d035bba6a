"""Lab probe of 2026-12-03 (session 7): does ``compiler_options`` graph a tiny loop step?

Not a benchmark of the project: the script behind ``docs/lab/graph_probe_h200_1740.log``
(17:40 UTC; run then from outside the repository: the same code, without this docstring and
reformatted for ruff). On a GPU, from the repository root:

    PYTHONPATH=. python docs/lab/graph_probe.py   # ~20 s on an H200

For three loop cases (5 x 4 B, 64 x 1 KiB, 256 x 1 KiB on a 1 GiB pinned buffer) it compiles
eight of the loop benchmark's providers (``benchmarks.loop_steps``) twice: at XLA's defaults
and with ``compiler_options={"xla_gpu_graph_min_graph_size": 1}`` handed to
``Lowered.compile``, then times 5 scans of 200 steps after one untimed (median and min, us per
step; not interleaved, unlike the loop benchmark). It showed that the per-compile option acts
as the ``XLA_FLAGS`` flag does, which ``benchmarks.loop --xla-option`` relies on.
"""

import json
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import loop_steps

DEV = jax.devices()[0]
HOST = jax.sharding.SingleDeviceSharding(DEV, memory_kind="pinned_host")
steps = 200
for rows, width in ((5, 1), (64, 256), (256, 256)):
    num_rows = (1 << 30) // (width * 4)
    shape = (num_rows, width) if width > 1 else (num_rows,)
    table = jnp.asarray(np.stack([
        np.random.default_rng(t).choice(num_rows, rows, replace=False) for t in range(steps)
    ]).astype(np.int32))
    base = jnp.ones((rows, width) if width > 1 else (rows,), jnp.float32)
    x = jax.device_put(np.zeros(shape, np.float32), HOST)
    for name in ("baseline", "floor_launch", "xla_set", "ours_set", "xla_add", "ours_add",
                 "xla_add_read", "ours_add_read"):
        prov = next(p for p in loop_steps.PROVIDERS if p.name == name)
        xla_side = name in ("baseline", "floor_launch") or name.startswith("xla")
        backend = "-" if xla_side else "auto"
        for opts in ({}, {"xla_gpu_graph_min_graph_size": 1}):
            fn = loop_steps.scan_fn(prov, backend)
            try:
                lowered = fn.lower(x, table, base)
                c = lowered.compile(compiler_options=opts) if opts else lowered.compile()
                out = jax.block_until_ready(c(x, table, base))
                x = out[0]
                ts = []
                for _ in range(5):
                    t0 = time.perf_counter()
                    out = jax.block_until_ready(c(x, table, base))
                    ts.append(time.perf_counter() - t0)
                    x = out[0]
                us = [t / steps * 1e6 for t in ts]
                print(json.dumps({"rows": rows, "row_bytes": width * 4, "provider": name,
                                  "opts": opts, "us": round(statistics.median(us), 1),
                                  "min": round(min(us), 1)}))
            except Exception as e:  # noqa: BLE001
                print(json.dumps({"rows": rows, "provider": name, "opts": opts,
                                  "error": f"{type(e).__name__}: {str(e)[:200]}"}))
    x.delete()
