"""Tuning sweep for the scatter kernel: tile shapes and the sort crossover.

Not the benchmark suite (that is bench_scatter.py): this script answers two
design questions with measurements on the GPU, and its output is what the
heuristics in kernels/scatter_pallas.py and SORT_MIN_UPDATES are set from.

1. Tiling: for sorted unique rows of each width, GB/s of the kernel alone for
   several (tile bytes, warps) choices, against a same-run device->pinned copy.
2. Crossover: for unique random rows, end-to-end time with and without the
   on-device sort, over update counts, to find where sorting starts to pay.

    python benchmarks/tune_scatter.py [--buffer-gib 4] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
from pallas_pinned.kernels import scatter_pallas as sp

from pallas_pinned import _scatter

ROW_BYTES = (4, 16, 128, 512, 2048, 8192)
TILE_BYTES = (4096, 16384, 65536)
WARPS = (4, 8)


def _median_time(fn, x, *args, repeats=10):
    x = fn(x, *args)
    x.block_until_ready()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        x = fn(x, *args)
        x.block_until_ready()
        times.append(time.perf_counter() - start)
    return x, statistics.median(times), min(times), max(times)


def _tiling(n, width, tile_bytes, warps):
    block_cols = min(sp._next_pow2(width), 1024)
    block_rows = min(sp._next_pow2(n), sp._next_pow2(max(1, tile_bytes // (block_cols * 4))))
    return sp.ScatterTiling(block_rows, block_cols, warps)


def _ceiling(payload_bytes, host):
    src = jnp.ones((payload_bytes // 4,), jnp.float32)
    src.block_until_ready()
    times = []
    for _ in range(10):
        start = time.perf_counter()
        jax.device_put(src, host).block_until_ready()
        times.append(time.perf_counter() - start)
    return payload_bytes / statistics.median(times) / 1e9


def tune_tiling(buffer_bytes, host, records):
    rng = np.random.default_rng(0)
    for row_bytes in ROW_BYTES:
        width = row_bytes // 4
        num_rows = buffer_bytes // row_bytes
        n = min(16 << 20, (256 << 20) // row_bytes, num_rows)
        rows = jnp.asarray(np.sort(rng.choice(num_rows, n, replace=False)).astype(np.int32))
        upd = jnp.asarray(rng.standard_normal((n, width), dtype=np.float32))
        x = jax.device_put(np.ones((num_rows, width), np.float32), host)
        ceiling = _ceiling(n * row_bytes, host)
        for tile_bytes in TILE_BYTES:
            for warps in WARPS:
                tiling = _tiling(n, width, tile_bytes, warps)

                def run(x, r, u, tiling=tiling):
                    out = sp.scatter_rows(x, r, None, u, tiling=tiling)
                    return jax.device_put(out, jax.memory.Space.Host)

                fn = jax.jit(run, donate_argnums=0)
                x, med, lo, hi = _median_time(fn, x, rows, upd)
                gbps = n * row_bytes / med / 1e9
                rec = dict(
                    study="tiling",
                    row_bytes=row_bytes,
                    n_updates=n,
                    tile_bytes=tile_bytes,
                    num_warps=warps,
                    block_rows=tiling.block_rows,
                    block_cols=tiling.block_cols,
                    median_s=med,
                    min_s=lo,
                    max_s=hi,
                    gbps=gbps,
                    updates_per_s=n / med,
                    ceiling_gbps=ceiling,
                )
                records.append(rec)
                print(
                    f"tiling row={row_bytes:5d}B n={n:9d} tile={tile_bytes:6d} "
                    f"warps={warps} blk={tiling.block_rows}x{tiling.block_cols}: "
                    f"{gbps:6.2f} GB/s {n / med / 1e6:8.1f} M/s "
                    f"({gbps / ceiling:5.1%} of {ceiling:.1f})",
                    flush=True,
                )
        del x


def tune_crossover(buffer_bytes, host, records):
    rng = np.random.default_rng(1)
    for row_bytes in (4, 512):
        width = row_bytes // 4
        num_rows = buffer_bytes // row_bytes
        x = jax.device_put(np.ones((num_rows, width), np.float32), host)
        for n in (16, 256, 1024, 4096, 16384, 65536, 1 << 20):
            rows = jnp.asarray(rng.choice(num_rows, n, replace=False).astype(np.int32))
            upd = jnp.asarray(rng.standard_normal((n, width), dtype=np.float32))
            for coalesce in (True, False):
                cfg = _scatter._Config(
                    index_shape=(n,),
                    mode=None,
                    unique=True,
                    ascending=False,
                    backend="pallas",
                    coalesce=coalesce,
                )
                saved = _scatter.SORT_MIN_UPDATES
                _scatter.SORT_MIN_UPDATES = 0  # Sort whenever coalescing is on.
                try:
                    fn = jax.jit(
                        lambda x, r, u, cfg=cfg: _scatter._scatter_traced(x, r, u, cfg),
                        donate_argnums=0,
                    )
                    x, med, lo, hi = _median_time(fn, x, rows, upd, repeats=20)
                finally:
                    _scatter.SORT_MIN_UPDATES = saved
                records.append(
                    dict(
                        study="crossover",
                        row_bytes=row_bytes,
                        n_updates=n,
                        sorted=coalesce,
                        median_s=med,
                        min_s=lo,
                        max_s=hi,
                        updates_per_s=n / med,
                    )
                )
                print(
                    f"crossover row={row_bytes:4d}B n={n:8d} sort={coalesce!s:5}: "
                    f"{med * 1e6:9.1f} us (min {lo * 1e6:.1f}, max {hi * 1e6:.1f}) "
                    f"{n / med / 1e6:8.1f} M/s",
                    flush=True,
                )
        del x


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--buffer-gib", type=float, default=4.0)
    parser.add_argument("--out", default="benchmarks/results")
    parser.add_argument("--only", choices=("tiling", "crossover"), default=None)
    args = parser.parse_args()
    device = jax.devices()[0]
    host = jax.sharding.SingleDeviceSharding(device, memory_kind="pinned_host")
    buffer_bytes = int(args.buffer_gib * 2**30)
    records = []
    if args.only in (None, "tiling"):
        tune_tiling(buffer_bytes, host, records)
    if args.only in (None, "crossover"):
        tune_crossover(buffer_bytes, host, records)
    meta = dict(
        device=device.device_kind,
        jax=jax.__version__,
        date=time.strftime("%Y-%m-%d"),
        buffer_bytes=buffer_bytes,
    )
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "tune_scatter.json")
    with open(path, "w") as f:
        json.dump(dict(meta=meta, records=records), f, indent=1)
    print(f"wrote {path} ({len(records)} records)")


if __name__ == "__main__":
    main()
