"""Gather and add against their alternatives, in one run on one pinned buffer.

    python benchmarks/bench_gather_add.py [--quick] [--out benchmarks/results]

Cases: random unique rows of 4, 512 and 2048 bytes (float32) from/into a
4 GiB pinned buffer (64 MiB on CPU). Providers:

* ``gather_ours`` — ``gather_from_host`` (kernel reads rows over PCIe);
* ``gather_xla`` — ``x[i]`` on the pinned buffer under jit (host compute);
* ``gather_ceiling`` — pinned->device copy of a contiguous payload of the
  same bytes (the read-direction PCIe ceiling);
* ``add_ours`` / ``set_ours`` — ``scatter_add_to_host`` and
  ``scatter_to_host`` on the same case, for the add/set ratio;
* ``add_xla`` — ``x.at[i].add(u)`` on the pinned buffer (host compute).

Method as bench_scatter.py: warm-up, device-synchronized wall-clock timing,
median/min/max of >= 10 runs, fresh random data, a sampled correctness check
of each provider once per case. Prints a table and the issue's two target
ratios; writes ``gather_add.json`` under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
import warnings

import jax
import numpy as np

import pallas_pinned as pp


def _time(fn, reps):
    fn()  # Warm-up: compile, first touch.
    samples = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples), min(samples), max(samples)


def _cases(on_gpu, quick):
    buffer_bytes = (4 << 30) if on_gpu else (64 << 20)
    for row_bytes, n in ((4, 1 << 24), (512, 1 << 20), (2048, 1 << 18)):
        if not on_gpu:
            n = min(n, 4096)
        if quick:
            n //= 4
        yield buffer_bytes // row_bytes, row_bytes // 4, n


def run_case(num_rows, width, n, host, device, reps, records):
    rng = np.random.default_rng(num_rows + width)
    x0 = rng.standard_normal((num_rows, width), dtype=np.float32)
    x = jax.device_put(x0, host)
    rows_np = rng.choice(num_rows, n, replace=False).astype(np.int32)
    rows = jax.device_put(rows_np, device)
    upd = jax.device_put(rng.standard_normal((n, width), dtype=np.float32), device)
    payload = n * width * 4
    sample = rng.choice(n, min(n, 4096), replace=False)

    def record(provider, timing, correct):
        med, lo, hi = timing
        records.append(
            dict(
                case=f"f32 {width * 4}B n={n}",
                provider=provider,
                row_bytes=width * 4,
                n_updates=n,
                median_s=med,
                min_s=lo,
                max_s=hi,
                gbps=payload / med / 1e9,
                updates_per_s=n / med,
                correct=correct,
            )
        )

    gather = jax.jit(lambda x, i: pp.gather_from_host(x, i))
    got = np.asarray(gather(x, rows))
    record(
        "gather_ours",
        _time(lambda: gather(x, rows).block_until_ready(), reps),
        bool(np.array_equal(got[sample], x0[rows_np[sample]])),
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        take = jax.jit(lambda x, i: jax.device_put(x[i], jax.memory.Space.Device))
        try:
            got = np.asarray(take(x, rows))
            record(
                "gather_xla",
                _time(lambda: take(x, rows).block_until_ready(), reps),
                bool(np.array_equal(got[sample], x0[rows_np[sample]])),
            )
        except Exception as err:  # XLA may refuse host compute; say so, go on.
            print(f"gather_xla failed: {type(err).__name__}: {str(err)[:200]}")
    block = jax.device_put(np.ones((n, width), np.float32), host)
    to_device = lambda: jax.device_put(block, device).block_until_ready()  # noqa: E731
    record("gather_ceiling", _time(to_device, reps), None)

    state = {"x": x}
    set_fn = jax.jit(lambda x, i, u: pp.scatter_to_host(x, i, u), donate_argnums=0)
    add_fn = jax.jit(lambda x, i, u: pp.scatter_add_to_host(x, i, u), donate_argnums=0)

    def step(fn):
        def run():
            state["x"] = fn(state["x"], rows, upd)
            state["x"].block_until_ready()

        return run

    record("set_ours", _time(step(set_fn), reps), None)
    before = np.asarray(state["x"])[rows_np[sample]]
    state["x"] = add_fn(state["x"], rows, upd)
    after = np.asarray(state["x"])[rows_np[sample]]
    added_right = bool(np.allclose(after, before + np.asarray(upd)[sample], rtol=1e-6))
    record("add_ours", _time(step(add_fn), reps), added_right)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        add_xla = jax.jit(lambda x, i, u: x.at[i].add(u), donate_argnums=0)
        try:
            record("add_xla", _time(step(add_xla), max(3, reps // 3)), None)
        except Exception as err:
            print(f"add_xla failed: {type(err).__name__}: {str(err)[:200]}")


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--out", default="benchmarks/results")
    args = parser.parse_args()
    device = jax.devices()[0]
    on_gpu = device.platform == "gpu"
    host = jax.sharding.SingleDeviceSharding(device, memory_kind="pinned_host")
    dev = jax.sharding.SingleDeviceSharding(device, memory_kind="device")
    records = []
    for num_rows, width, n in _cases(on_gpu, args.quick):
        run_case(num_rows, width, n, host, dev, args.reps, records)
    print(
        f"{'case':22} {'provider':15} {'median us':>11} {'min':>9} {'max':>9} "
        f"{'GB/s':>7} {'M rows/s':>9} correct"
    )
    for r in records:
        print(
            f"{r['case']:22} {r['provider']:15} {r['median_s'] * 1e6:11.1f} "
            f"{r['min_s'] * 1e6:9.1f} {r['max_s'] * 1e6:9.1f} {r['gbps']:7.2f} "
            f"{r['updates_per_s'] / 1e6:9.1f} {r['correct']}"
        )
    by = {(r["case"], r["provider"]): r for r in records}
    print("\ntargets:")
    for case in dict.fromkeys(r["case"] for r in records):
        g, c = by.get((case, "gather_ours")), by.get((case, "gather_ceiling"))
        a, s = by.get((case, "add_ours")), by.get((case, "set_ours"))
        if g and c:
            print(
                f"  {case}: gather/ceiling {g['gbps'] / c['gbps']:.2f}x "
                f"({g['gbps']:.1f} vs {c['gbps']:.1f} GB/s)"
            )
        if a and s:
            print(f"  {case}: add/set throughput {a['updates_per_s'] / s['updates_per_s']:.2f}x")
    os.makedirs(args.out, exist_ok=True)
    meta = dict(
        device=device.device_kind,
        jax=jax.__version__,
        date_utc=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        quick=args.quick,
    )
    path = os.path.join(args.out, "gather_add.json")
    with open(path, "w") as f:
        json.dump(dict(meta=meta, records=records), f, indent=1)
    print("wrote", path)
    if any(r["correct"] is False for r in records):
        raise SystemExit("INCORRECT results: see the table")


if __name__ == "__main__":
    main()
