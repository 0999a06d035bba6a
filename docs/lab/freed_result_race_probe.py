"""Lab probe (session 31): does a dropped write's host memory go to a new array mid-write?

The GPU suite of 2026-12-06 10:07 UTC (H100) failed once in
``test_add_eager_call_consumes_x_and_jit_without_donation_keeps_it[pallas]``: an eager add
consumed ``x`` and its result was dropped at once; the next ``put(x0)`` then read back with
the first add's ``+2`` in it. Hypothesis: the dropped result's pinned host memory is freed
(and handed to the next pinned allocation, whose copy from numpy the CPU does at once) before
the GPU kernel writing it has finished. Device memory is safe from that (its allocator is
stream-ordered); a CPU copy into pinned memory is not ordered behind the stream.

Each trial: a write into a fresh pinned buffer whose result is dropped (or kept, the
control), then a new pinned buffer ``put`` from a numpy source, a pause for the stream to
drain, and a comparison of the new buffer with its source. Variants: ours (eager
``scatter_add_to_host``), plain JAX (a donating ``jit`` of ``x.at[i].add(u)``), ours with the
result kept until the check. Prediction (written before the run): corruption in some trials
of both dropped variants and in none of the kept one.
First run (H100, jax 0.11.2, 10:11 UTC, 200 trials each; logs beside this file): ours
dropped 0/200, plain JAX dropped 200/200 (up to 3214 rows changed), ours kept 0/200.
The second run adds the ``late`` variants: about 20 ms of matmuls queued ahead of our
write, so that it runs well after the new buffer's copy, as it may under a loaded GPU.
Prediction: the late dropped variant corrupts if our result's memory is freed before its
kernel ends; the late kept one does not.
Second run (10:18 UTC, 100 trials each): ours dropped 0, plain JAX dropped 100 (up to 2106
rows), ours kept 0, ours late dropped 100 (up to 41356 rows: every row the write touched),
ours late kept 0. So our eager writes now hold their results until computed
(``_placement.hold_until_computed``), and tests/test_dropped_results.py repeats the late
dropped case on a GPU. Third run, with the holder (about 10:24 UTC, after the GPU suite at
that tree, `1097 passed, 57 skipped`): ours late dropped 0/100; plain JAX dropped still
100/100 (up to 6095 rows); every other variant 0/100. Again at 10:34 UTC, with the inputs
held too (50 trials): plain JAX dropped 49/50, every variant of ours 0/50.

    python docs/lab/freed_result_race_probe.py [trials]
"""

from __future__ import annotations

import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

import pallas_pinned as pp

# On a GPU a 64 MiB buffer, each write moving 64 MiB; a tiny one elsewhere.
ROWS, WIDTH, UPDATES = (1 << 16, 256, 1 << 16) if jax.default_backend() == "gpu" else (64, 8, 64)


def main(trials: int) -> int:
    pinned = jax.sharding.make_single_device_sharding(jax.devices()[0], memory_kind="pinned_host")
    rng = np.random.default_rng(0)
    x0 = np.zeros((ROWS, WIDTH), np.float32)
    source = np.full((ROWS, WIDTH), 5.0, np.float32)
    idx = jnp.asarray(rng.integers(0, ROWS, UPDATES).astype(np.int32))
    upd = jnp.ones((UPDATES, WIDTH), jnp.float32)
    xla_add = jax.jit(lambda x, i, u: x.at[i].add(u), donate_argnums=0)
    # About 20 ms of device work queued ahead of a write: the write then runs late, as
    # under the GPU suite's 8 processes sharing one GPU.
    square = jnp.ones((4096, 4096), jnp.float32)
    busy = jax.jit(lambda a: jax.lax.fori_loop(0, 40, lambda _, b: b @ a / 4096.0, a))
    variants = {
        "ours, result dropped": lambda x: (pp.scatter_add_to_host(x, idx, upd), None)[1],
        "plain jax, result dropped": lambda x: (xla_add(x, idx, upd), None)[1],
        "ours, result kept": lambda x: pp.scatter_add_to_host(x, idx, upd),
        "ours, late, result dropped": lambda x: (
            busy(square), pp.scatter_add_to_host(x, idx, upd), None)[2],
        "ours, late, result kept": lambda x: (
            busy(square), pp.scatter_add_to_host(x, idx, upd))[1],
    }
    print(f"jax {jax.__version__}, {jax.devices()[0].device_kind}, {trials} trials a variant, "
          f"{ROWS} x {WIDTH} float32 buffer, {UPDATES} updates a write", flush=True)
    for name, write in variants.items():
        for _ in range(2):  # Compile and warm up; checked like the rest.
            jax.block_until_ready(write(jax.device_put(x0, pinned)))
        corrupt, worst = 0, 0
        start = time.perf_counter()
        for _ in range(trials):
            kept = write(jax.device_put(x0, pinned))
            fresh = jax.device_put(source, pinned)
            time.sleep(0.02)
            jax.block_until_ready((kept, busy(square)))  # The write's kernel has finished.
            got = np.asarray(fresh)
            bad = int(np.count_nonzero((got != source).any(axis=1)))
            corrupt += bad > 0
            worst = max(worst, bad)
            del kept, fresh
        print(f"{name:28s} corrupt trials {corrupt}/{trials}, most rows changed in one "
              f"{worst}, {time.perf_counter() - start:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]) if len(sys.argv) > 1 else 50))
