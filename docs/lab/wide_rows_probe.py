"""Lab probe of 2026-12-04 (session 11): where do 2 KiB rows lose 10 % of the copy ceiling?

Not a benchmark of the project (no CPU test, no report). On a GPU, from the repository root:

    PYTHONPATH=. python docs/lab/wide_rows_probe.py [--quick]

The full sweep (2026-12-03) wrote 64 Ki random 2 KiB float32 rows into a 4 GiB pinned buffer
at 42.9 GB/s, 0.80 of the copy engine's 53.5 (the target is 0.90); the zero-copy Triton peer
launched from PyTorch reached 49.1, jax.device_put of the same 128 MiB 43.7; the tuning sweep
had the Pallas kernel alone, on sorted rows, at 46-47 GB/s for every tile shape and warp count.
Untried: the store cache modifiers and eviction policies of the raw Triton kernel (settings of
``TritonTiling``), and one tile of a single row per program.

Predictions (written before the first run): the whole call ``scatter_to_host`` at ~43 GB/s, the
same call with every promise (sorted, unique, in bounds) at ~46, the kernels alone at 46-48
whatever the tile; a store modifier that skips L2 (``.cs``, ``.wt``, ``evict_first``) may buy
1-3 GB/s if L2 write-back stalls the PCIe writes, else nothing; the peer at ~49 and the
ceiling at ~53.

Outcome (H200, jax 0.11.2, triton 3.6.0, 2026-12-04 17:34 UTC, ``wide_rows_probe_h200_1734.log``
beside this file; the first version of the script at 17:32, ``_1732.log``, agrees): GB/s of one
synchronized call, then of calls dispatched back to back. The whole call (random rows: sort,
de-duplication, kernel) 41.9, back to back **49.8** (0.93 of the ceiling); with every promise
44.6 / 51.1; the Pallas kernel alone 44.9-45.4 at every tile, 51.4 back to back, 50.7 per launch
with 10 launches in one call; the raw Triton kernel 44.1-45.0 with every store modifier (none
helps); jax.device_put 42.8; the torch-launched peer 49.8; the ceiling 53.6. So the kernels
write 2 KiB rows at 0.95 of the copy engine and the default call at 0.93 when calls follow
each other; a single synchronized JAX call costs ~0.5 ms more than its GPU work (3.20 against
2.69 ms), as jax.device_put of the same bytes does, which is the 0.78-0.80 of the sweep. The
prediction was right about the tiles and wrong about the modifiers' possible gain; the
per-call latency it did not foresee.

One call per timing (device-synchronized), the buffer donated and chained, the variants
interleaved in ``ROUNDS`` rounds of ``REPS`` calls: median GB/s of the payload (min, max).
Each variant is checked once: the written rows read back equal the updates.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
from pallas_pinned.kernels import pallas_common, scatter_pallas, scatter_triton
from pallas_pinned.kernels.triton_tiling import TritonTiling, choose_tiling

import pallas_pinned as pp
from pallas_pinned import _placement

ROUNDS, REPS = 3, 10
LAUNCHES = 10
HOST = jax.sharding.SingleDeviceSharding(jax.devices()[0], memory_kind="pinned_host")


def _kernel_call(kernel):
    def call(x, rows, u):
        return _placement.place_result(kernel(x, rows, None, u, check_bounds=False), x)

    return jax.jit(call, donate_argnums=0)


def _repeated(fn):
    body = fn.__wrapped__ if hasattr(fn, "__wrapped__") else fn

    def call(x, rows, u):
        return jax.lax.fori_loop(0, LAUNCHES, lambda _, x: body(x, rows, u), x)

    return jax.jit(call, donate_argnums=0)


def variants(n, d, gpu: bool):
    promised = {"unique_indices": True, "indices_are_sorted": True, "mode": "promise_in_bounds"}
    out = {
        "ours (auto, unsorted rows)": ("random", jax.jit(pp.scatter_to_host, donate_argnums=0)),
        "ours, every promise": ("sorted", jax.jit(
            functools.partial(pp.scatter_to_host, **promised), donate_argnums=0)),
    }
    for rows, cols, warps in ((8, 512, 8), (1, 512, 4), (2, 512, 4), (4, 512, 4), (16, 512, 8),
                              (32, 512, 8)):
        tiling = pallas_common.RowTiling(rows, cols, warps)
        out[f"pallas {rows}x{cols} w{warps}"] = ("sorted", _kernel_call(
            functools.partial(scatter_pallas.scatter_rows, tiling=tiling, interpret=not gpu)))
    # The same writes, LAUNCHES to one jitted call: per launch, without a call's fixed cost.
    for name in ("ours, every promise", "pallas 8x512 w8"):
        order, fn = out[name]
        out[f"{name}, {LAUNCHES} in one call"] = (order, _repeated(fn))
    if not gpu:
        return out
    base = choose_tiling(n, d, 4)
    settings = [("", ""), (".cs", ""), (".wt", ""), (".cg", ""), ("", "evict_first")]
    for modifier, policy in settings:
        tiling = TritonTiling(base.block_rows, base.block_cols, base.num_warps, modifier, policy)
        name = (f"triton {base.block_rows}x{base.block_cols} w{base.num_warps} "
                f"{modifier or policy or 'default'}")
        out[name] = ("sorted", _kernel_call(
            functools.partial(scatter_triton.scatter_rows_triton, tiling=tiling)))
    return out


def copies(u, nbytes):
    """The ceiling (the copy engine, from torch) and jax.device_put, where they run."""
    out = {"jax.device_put to pinned": lambda: jax.block_until_ready(jax.device_put(u, HOST))}
    try:
        import torch
    except ImportError:
        return out
    if not torch.cuda.is_available():
        return out
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)

    def ceiling():
        dst.copy_(src, non_blocking=True)
        torch.cuda.synchronize()

    out["ceiling: torch copy_ to pinned"] = ceiling
    try:
        from benchmarks import triton_peer
    except ImportError:
        return out
    n, d = u.shape
    table = torch.zeros((1 << 31) // (d * 4) * 2, d, dtype=torch.float32, pin_memory=True)
    rows = torch.as_tensor(np.sort(np.random.default_rng(1).choice(table.shape[0], n, False)),
                           device="cuda")
    store = triton_peer.make_store_rows(torch, table, rows, torch.randn(n, d, device="cuda"))
    out["zero-copy Triton peer (torch)"] = lambda: store(None)
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes (a CPU smoke test)")
    args = parser.parse_args()
    n, d, buffer = (64, 512, 1 << 22) if args.quick else (1 << 16, 512, 1 << 32)
    num_rows = buffer // (d * 4)
    nbytes = n * d * 4
    print(f"jax {jax.__version__}, {jax.devices()[0].device_kind}; {n} rows x {d * 4} B into "
          f"{buffer >> 20} MiB pinned; {ROUNDS} rounds x {REPS} calls", flush=True)
    rng = np.random.default_rng(0)
    picked = rng.choice(num_rows, n, replace=False).astype(np.int32)
    rows = {"random": jnp.asarray(picked), "sorted": jnp.asarray(np.sort(picked))}
    u = jax.random.normal(jax.random.key(0), (n, d), jnp.float32)
    calls = variants(n, d, gpu=jax.default_backend() == "gpu")
    x = jax.device_put(np.zeros((num_rows, d), np.float32), HOST)
    for name, (order, fn) in calls.items():
        x = fn(x, rows[order], u)
        got = np.asarray(pp.gather_from_host(x, rows["sorted"]))
        expect = np.asarray(u)[np.argsort(picked)] if order == "random" else np.asarray(u)
        ok = np.array_equal(got, expect)
        print(f"check {name:38} {'ok' if ok else 'WRONG'}", flush=True)
    times = {name: [] for name in calls}
    timed_copies = copies(u, nbytes)
    times |= {name: [] for name in timed_copies}
    for _ in range(ROUNDS):
        for name, (order, fn) in calls.items():
            for _ in range(REPS):
                t0 = time.perf_counter()
                x = jax.block_until_ready(fn(x, rows[order], u))
                times[name].append(time.perf_counter() - t0)
        for name, fn in timed_copies.items():
            for _ in range(REPS):
                t0 = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - t0)
    # Back to back: REPS calls dispatched without waiting, one wait at the end.
    for name in ("ours (auto, unsorted rows)", "ours, every promise", "pallas 8x512 w8"):
        order, fn = calls[name]
        key = f"{name}, {REPS} calls back to back"
        times[key] = []
        for _ in range(ROUNDS):
            t0 = time.perf_counter()
            for _ in range(REPS):
                x = fn(x, rows[order], u)
            x = jax.block_until_ready(x)
            times[key] += [(time.perf_counter() - t0) / REPS]
    tiny = jnp.asarray(np.sort(picked[:5])), u[:5]
    small = calls["ours, every promise"][1]
    x = small(x, *tiny)
    tiny_ts = []
    for _ in range(ROUNDS * REPS):
        t0 = time.perf_counter()
        x = jax.block_until_ready(small(x, *tiny))
        tiny_ts.append(time.perf_counter() - t0)
    print(f"{'ours, every promise, 5 rows (a call)':40} {statistics.median(tiny_ts) * 1e3:.3f} ms "
          f"(min {min(tiny_ts) * 1e3:.3f}, max {max(tiny_ts) * 1e3:.3f})", flush=True)
    for name, ts in times.items():
        if name.endswith("in one call"):
            ts = [t / LAUNCHES for t in ts]  # per launch
        gbps = [nbytes / t / 1e9 for t in ts]
        print(f"{name:40} {statistics.median(gbps):6.1f} GB/s (min {min(gbps):.1f}, max "
              f"{max(gbps):.1f}); {statistics.median(ts) * 1e3:.3f} ms", flush=True)


if __name__ == "__main__":
    main()
