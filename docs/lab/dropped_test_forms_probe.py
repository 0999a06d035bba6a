"""Lab probe (session 32): which form of tests/test_dropped_results.py's GPU test shows the
add races with the holder off?

Session 31 found the test's two add cases passing with the holder replaced by a no-op, while
the probes (freed_result_race_probe.py, freed_input_race_probe.py) failed 100 of 100. The
probes make the buffer before the ~20 ms of queued device work and sleep 20 ms before they
block; the test made the buffer after it and blocked at once. Each form below runs 10 trials
with the holder off and counts the trials that went wrong.

Prediction: the forms that make ``x`` before the delay fail in most trials (their add is
dispatched at once, queued behind the delay); the test's form (``x`` made after the delay,
no sleep) in few or none. Why that form would be held back is not known.

Outcome (H100, jax 0.11.2, 13:47 UTC; the log beside this file): the pinned updates' case
went wrong in 10 of 10 trials in every form, the test's included; the result's case, with
scalar updates, in 0 of 10 in every form. So the form was not what kept the test's add cases
from failing. The test now makes the result's case with device updates (as the results probe
does); run under pytest with the holder off (dropped_test_holder_off.py, 13:49 UTC) its
result's and gather's cases fail and its updates' case still passes.

    python docs/lab/dropped_test_forms_probe.py
"""

import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

import pallas_pinned as pp
from pallas_pinned import _holder

GPU = jax.default_backend() == "gpu"
ROWS, WIDTH, TRIALS, N = (1 << 16, 256, 10, 4096) if GPU else (64, 8, 2, 8)
pinned = jax.sharding.make_single_device_sharding(jax.devices()[0], memory_kind="pinned_host")
idx = jnp.asarray(np.random.default_rng(0).permutation(ROWS).astype(np.int32))
square = jnp.ones((N, N), jnp.float32)
busy = jax.jit(lambda a: jax.lax.fori_loop(0, 40, lambda _, b: b @ a / N, a))
threes, fives, zeros = (np.full((ROWS, WIDTH), v, np.float32) for v in (3.0, 5.0, 0.0))


def put(a):
    return jax.device_put(a, pinned)


def result_dropped(x_first: bool, sleep: bool):
    x = put(zeros) if x_first else None
    busy(square)
    pp.scatter_add_to_host(x if x_first else put(zeros), idx, 3.0)
    fresh = put(fives)
    if sleep:
        time.sleep(0.02)
    jax.block_until_ready((fresh, busy(square)))
    return not np.array_equal(np.asarray(fresh), fives)


def updates_dropped(x_first: bool, sleep: bool):
    x = put(zeros) if x_first else None
    busy(square)
    out = pp.scatter_add_to_host(x if x_first else put(zeros), idx, put(threes))
    fresh = put(fives)
    if sleep:
        time.sleep(0.02)
    jax.block_until_ready((out, fresh, busy(square)))
    return not np.array_equal(np.asarray(out), threes)


def main() -> int:
    jax.block_until_ready(busy(square))
    print(f"jax {jax.__version__}, {jax.devices()[0].device_kind}, {TRIALS} trials a form, "
          "holder off", flush=True)
    _holder._HOLDER.hold = lambda result, inputs, devices=None: None
    for case in (result_dropped, updates_dropped):
        for x_first in (False, True):
            for sleep in (False, True):
                case(x_first, sleep)  # Compile and warm up.
                wrong = sum(case(x_first, sleep) for _ in range(TRIALS))
                print(f"{case.__name__:16s} x made {'before' if x_first else 'after '} the "
                      f"delay, {'sleep 20 ms' if sleep else 'no sleep   '}: wrong {wrong}/{TRIALS}",
                      flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
