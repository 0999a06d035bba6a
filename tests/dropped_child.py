"""Child process of tests/test_dropped_results.py: dropped pinned arrays against the next one.

Run as ``python tests/dropped_child.py CASE [--unprotected]``. It queues one eager call of
ours behind ~20 ms of device work, drops one of the call's pinned arrays at once, copies a
new pinned array (fives) in from the CPU and checks, ten times, that the fives and the
call's result are intact. It prints ``{"wrong": k, "trials": 10}`` as JSON.

A plain script, not pytest: under pytest something else kept the pinned updates' memory
from going to the next array, and that case could not fail. ``--unprotected`` removes what
protects the arrays (each eager call waiting for its computation, while it still holds its
arguments), so the parent can show that the check sees the race without it.
"""

from __future__ import annotations

import functools
import json
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

import pallas_pinned as pp
from pallas_pinned import _placement

CASES = ("add's result", "gather's buffer", "add's pinned updates")


def _put(a):
    pinned = jax.sharding.make_single_device_sharding(jax.devices()[0], memory_kind="pinned_host")
    return jax.device_put(a, pinned)


def main(case: str, unprotected: bool) -> int:
    if unprotected:
        _placement.wait_for_result = lambda result: result
    rows, width = 1 << 16, 256
    idx = jnp.asarray(np.random.default_rng(0).permutation(rows).astype(np.int32))
    square = jnp.ones((4096, 4096), jnp.float32)
    busy = jax.jit(lambda a: jax.lax.fori_loop(0, 40, lambda _, b: b @ a / 4096.0, a))
    jax.block_until_ready(busy(square))
    delay = functools.partial(busy, square)
    zeros, threes, fives = (np.full((rows, width), v, np.float32) for v in (0.0, 3.0, 5.0))
    ones = jnp.ones((rows, width), jnp.float32)
    wrong = 0
    for _ in range(10):
        x = _put(threes if case == "gather's buffer" else zeros)
        delay()
        if case == "add's result":
            pp.scatter_add_to_host(x, idx, ones)
            result, want = None, None
        elif case == "gather's buffer":
            result, want = pp.gather_from_host(x, idx), threes
        else:
            result, want = pp.scatter_add_to_host(x, idx, _put(threes)), threes
        del x
        fresh = _put(fives)
        time.sleep(0.02)
        jax.block_until_ready((result, fresh, delay()))  # The call has run by now.
        bad = not np.array_equal(np.asarray(fresh), fives)
        bad |= result is not None and not np.array_equal(np.asarray(result), want)
        wrong += bool(bad)
    print(json.dumps({"wrong": wrong, "trials": 10}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], "--unprotected" in sys.argv[2:]))
