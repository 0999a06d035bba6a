"""Session 24: eager writes at Python-int positions on the GPU (what ``32bae9b`` changed).

An eager loop ``cache = at(cache)[t].set(v)`` over ``t`` on a pinned buffer. With
in-range ints passed as values (the default since ``32bae9b``) one program serves
every ``t``; with them static (the earlier behaviour: ``_front._positions_as_values``
replaced by the identity) each new ``t`` compiles one. For each variant this times
every call (synchronized), counts XLA backend compiles during the loop, and checks
the buffer against a numpy replay. jnp's own eager loop on a device array is timed
beside it. Not part of the package; run from the repository root:

    python docs/lab/eager_positions_probe.py [--steps 48]
"""

from __future__ import annotations

import argparse
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax import monitoring

import pallas_pinned as pp
from pallas_pinned import _front

COMPILES = [0]


def _count(event: str, duration: float, **kwargs) -> None:
    if event == "/jax/core/compile/backend_compile_duration":
        COMPILES[0] += 1


def placed(array: np.ndarray, kind: str) -> jax.Array:
    device = jax.devices()[0]
    return jax.device_put(array, jax.sharding.SingleDeviceSharding(device, memory_kind=kind))


def run(label: str, write, start: np.ndarray, positions, updates, kind: str) -> bool:
    buffer, expected = placed(start, kind), start.copy()
    times, before = [], COMPILES[0]
    for step, t in enumerate(positions):
        began = time.perf_counter()
        buffer = write(buffer, t, updates[step])
        buffer.block_until_ready()
        times.append((time.perf_counter() - began) * 1e3)
        write_numpy(expected, t, updates[step])
    compiles = COMPILES[0] - before
    got = np.asarray(jax.device_get(buffer))
    ok = np.array_equal(got, expected) and buffer.sharding.memory_kind == kind
    later = times[3:]
    print(f"{label:<44} first {times[0]:8.1f} ms  later median {statistics.median(later):7.3f} ms "
          f"[{min(later):.3f}-{max(later):.3f}]  backend compiles {compiles:3d}  "
          f"{'ok' if ok else 'WRONG'} ({buffer.sharding.memory_kind})")
    return ok


def write_numpy(expected: np.ndarray, t, update) -> None:
    if isinstance(t, tuple):
        expected[t[0], t[1]] = update[t[1]]
    else:
        expected[t] = update


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=48)
    args = p.parse_args()
    monitoring.register_event_duration_secs_listener(_count)
    print(jax.devices()[0].device_kind, "jax", jax.__version__)
    rng = np.random.default_rng(0)
    ok = True
    for dtype in (np.float32, jnp.bfloat16):
        length, heads, width = 512, 8, 128
        start = rng.standard_normal((length, heads, width)).astype(dtype)
        rows = rng.standard_normal((args.steps, heads, width)).astype(dtype)
        positions = [int(t) for t in rng.permutation(length)[: args.steps]]
        name = np.dtype(dtype).name
        lifted = _front._positions_as_values

        def ours(buffer, t, v):
            return pp.at(buffer)[t].set(v)

        ok &= run(f"{name} at(cache)[t].set, ints as values", ours, start, positions, rows,
                  "pinned_host")
        _front._positions_as_values = lambda x, index, updates=None: index
        try:
            ok &= run(f"{name} at(cache)[t].set, ints static (before)", ours, start,
                      positions[:16], rows, "pinned_host")
        finally:
            _front._positions_as_values = lifted
        ok &= run(f"{name} jnp cache.at[t].set (device memory)",
                  lambda b, t, v: b.at[t].set(v), start, positions, rows, "device")
        # An int beside a unit-step slice: the int is lifted, the slice stays static.
        pairs = [(t, slice(2, 6)) for t in positions]
        ok &= run(f"{name} at(cache)[t, 2:6].set, ints as values",
                  lambda b, t, v: pp.at(b)[t[0], t[1]].set(v[t[1]]),
                  start, pairs, rows, "pinned_host")
    print("all ok" if ok else "SOME WRONG")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
