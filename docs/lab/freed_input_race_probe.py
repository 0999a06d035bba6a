"""Lab probe (session 31): does a dropped pinned *input* go to a new array while a call reads it?

The sibling probe (freed_result_race_probe.py) showed jax 0.11.2 freeing a dropped pinned_host
*result* while the computation writing it ran. Here the arrays dropped are a call's inputs,
read late (about 20 ms of matmuls are queued ahead of the call): the buffer of an eager
``gather_from_host``, and the pinned updates of an eager ``scatter_add_to_host``. Right after
the call, the input is dropped and a new pinned array is copied in from numpy (fives); once
the stream has drained, the call's result is compared with what the input held.

Prediction (written before the run): if PJRT frees an input's host memory while a queued
computation still has to read it, the results hold fives in some trials; else in none.
Outcome (H100, jax 0.11.2; logs beside this file): 10:29 UTC, before the library held inputs,
the gather returned wrong rows in 98 of 100 trials (up to 33223 rows) and the add wrote the
new array's fives in 100 of 100 (up to 30406 rows). So the eager calls now hand their inputs
to ``_placement.hold_until_computed`` with their result: at 10:33 UTC, after the GPU suite
at that tree (`1099 passed, 57 skipped`), 0 of 100 in both.

    python docs/lab/freed_input_race_probe.py [trials]
"""

from __future__ import annotations

import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

import pallas_pinned as pp

# On a GPU a 64 MiB buffer and 64 Ki rows a call; a tiny case elsewhere.
ROWS, WIDTH = (1 << 16, 256) if jax.default_backend() == "gpu" else (64, 8)


def main(trials: int) -> int:
    pinned = jax.sharding.make_single_device_sharding(jax.devices()[0], memory_kind="pinned_host")
    idx = jnp.asarray(np.random.default_rng(0).permutation(ROWS).astype(np.int32))
    threes = np.full((ROWS, WIDTH), 3.0, np.float32)
    fives = np.full((ROWS, WIDTH), 5.0, np.float32)
    n = 4096 if jax.default_backend() == "gpu" else 8
    square = jnp.ones((n, n), jnp.float32)
    busy = jax.jit(lambda a: jax.lax.fori_loop(0, 40, lambda _, b: b @ a / n, a))

    def gather_with_buffer_dropped():
        busy(square)
        return pp.gather_from_host(jax.device_put(threes, pinned), idx), 3.0

    def add_with_updates_dropped():
        x = jax.device_put(np.zeros((ROWS, WIDTH), np.float32), pinned)
        busy(square)
        return pp.scatter_add_to_host(x, idx, jax.device_put(threes, pinned)), 3.0

    print(f"jax {jax.__version__}, {jax.devices()[0].device_kind}, {trials} trials a variant, "
          f"{ROWS} x {WIDTH} float32", flush=True)
    for name, call in {"gather, late, buffer dropped": gather_with_buffer_dropped,
                       "add, late, pinned updates dropped": add_with_updates_dropped}.items():
        jax.block_until_ready(call()[0])  # Compile.
        wrong, worst = 0, 0
        start = time.perf_counter()
        for _ in range(trials):
            result, expected = call()
            fresh = jax.device_put(fives, pinned)
            jax.block_until_ready((result, fresh, busy(square)))
            bad = int(np.count_nonzero((np.asarray(result) != expected).any(axis=1)))
            wrong += bad > 0
            worst = max(worst, bad)
            del result, fresh
        print(f"{name:36s} wrong results {wrong}/{trials}, most rows wrong in one {worst}, "
              f"{time.perf_counter() - start:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]) if len(sys.argv) > 1 else 50))
