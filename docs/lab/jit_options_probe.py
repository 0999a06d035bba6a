"""Lab probe of 2026-12-03 (session 7): the README's ``jax.jit(step, compiler_options=...)``.

Not a benchmark of the project: the script behind ``docs/lab/jit_options_probe_h200_1805.log``
(18:05 UTC; run then from outside the repository: the same code, without this docstring and
reformatted for ruff). On a GPU, from the repository root:

    PYTHONPATH=. python docs/lab/jit_options_probe.py   # ~10 s on an H200

Four loop-benchmark providers at 64 x 1 KiB on a 1 GiB pinned buffer, each wrapped in
``jax.jit(..., donate_argnums=0)`` with and without ``compiler_options={
"xla_gpu_graph_min_graph_size": 1}``: one untimed call, then 7 timed scans of 200 steps
(median and min, us per step; not interleaved), and the buffer's memory kind afterwards.
"""

import json
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import loop_steps

print(jax.__version__)
HOST = jax.sharding.SingleDeviceSharding(jax.devices()[0], memory_kind="pinned_host")
steps, rows, width = 200, 64, 256
num_rows = (1 << 30) // (width * 4)
table = jnp.asarray(np.stack([
    np.random.default_rng(t).choice(num_rows, rows, replace=False) for t in range(steps)
]).astype(np.int32))
base = jnp.ones((rows, width), jnp.float32)
x = jax.device_put(np.zeros((num_rows, width), np.float32), HOST)
for name in ("baseline", "floor_launch", "ours_set", "xla_set"):
    prov = next(p for p in loop_steps.PROVIDERS if p.name == name)
    backend = "-" if name in ("baseline", "floor_launch", "xla_set") else "auto"
    inner = loop_steps.scan_fn(prov, backend)
    options = {"xla_gpu_graph_min_graph_size": 1}
    for label, fn in (("jit", jax.jit(inner, donate_argnums=0)),
                      ("jit+compiler_options",
                       jax.jit(inner, donate_argnums=0, compiler_options=options))):
        x = jax.block_until_ready(fn(x, table, base))[0]
        ts = []
        for _ in range(7):
            t0 = time.perf_counter()
            x = jax.block_until_ready(fn(x, table, base))[0]
            ts.append((time.perf_counter() - t0) / steps * 1e6)
        print(json.dumps({"provider": name, "how": label, "us": round(statistics.median(ts), 1),
                          "min": round(min(ts), 1), "kind": x.sharding.memory_kind}))
