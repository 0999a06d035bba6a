"""Demo of the periodic-update scenario: ``python -m pallas_pinned``.

A replay buffer lives in pinned host memory; every step the device produces a
batch of new rows and writes them at random positions, inside one jitted
``fori_loop`` that carries (and donates) the buffer. The demo checks the final
buffer against a numpy replay of the same steps, then times one step of
``scatter_to_host`` against XLA's own ``x.at[i].set(y)`` on the same buffer.
Exit status 0 means the check passed.

On a machine without CUDA, ``scatter_to_host`` runs XLA's own scatter (the
kernel needs a GPU; XLA's CPU scatter already lets the last duplicate win), so
the timing compares XLA with itself and says nothing about the kernel.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import warnings

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import pallas_pinned as pp
from pallas_pinned.testing import assert_same, time_calls


def _parse_args(argv):
    on_gpu = jax.default_backend() == "gpu"
    parser = argparse.ArgumentParser(prog="python -m pallas_pinned", description=__doc__)
    parser.add_argument(
        "--rows",
        type=int,
        default=(1 << 21) if on_gpu else (1 << 14),
        help="rows in the buffer (default: 2 Mi on a GPU, 16 Ki on CPU)",
    )
    parser.add_argument("--width", type=int, default=128, help="float32 elements per row")
    parser.add_argument(
        "--batch", type=int, default=(1 << 16) if on_gpu else 512, help="rows written per step"
    )
    parser.add_argument("--steps", type=int, default=20, help="steps in the jitted loop")
    parser.add_argument("--repeats", type=int, default=10, help="timed repeats per method")
    return parser.parse_args(argv)


def _make_batches(rng, args):
    # Random positions with duplicates, as a replay buffer written by many
    # actors would see; the last write of a row in a step wins.
    idx = rng.integers(0, args.rows, size=(args.steps, args.batch), dtype=np.int32)
    return jnp.asarray(idx)


def _new_rows(step, width, batch):
    # Stand-in for data computed on the device (an environment step, say).
    key = jax.random.fold_in(jax.random.key(0), step)
    return jax.random.normal(key, (batch, width), jnp.float32)


def _run_loop(x, idx, width):
    steps, batch = idx.shape

    def body(t, x):
        return pp.scatter_to_host(x, idx[t], _new_rows(t, width, batch))

    return lax.fori_loop(0, steps, body, x)


def _expected(x0, idx, width):
    out = x0.copy()
    for t in range(idx.shape[0]):
        rows = np.asarray(_new_rows(t, width, idx.shape[1]))
        # The last write of a repeated row wins: take first hits of the reversal.
        backwards = np.asarray(idx[t])[::-1]
        targets, first = np.unique(backwards, return_index=True)
        out[targets] = rows[::-1][first]
    return out


def main(argv=None) -> int:
    args = _parse_args(argv)
    device = jax.devices()[0]
    host = jax.sharding.make_single_device_sharding(device, memory_kind="pinned_host")
    rng = np.random.default_rng(0)
    x0 = rng.standard_normal((args.rows, args.width), dtype=np.float32)
    print(
        f"device {device.device_kind} ({jax.default_backend()}), jax {jax.__version__}; "
        f"buffer {x0.nbytes / 2**20:.0f} MiB in pinned_host, "
        f"{args.steps} steps x {args.batch} rows of {args.width * 4} bytes"
    )
    on_gpu = jax.default_backend() == "gpu"
    if not on_gpu:
        print(
            "note: no CUDA GPU, so scatter_to_host runs XLA's own scatter here (the kernel "
            "needs a GPU): expect the two timings to match"
        )

    idx = _make_batches(rng, args)
    loop = jax.jit(_run_loop, static_argnums=2, donate_argnums=0)
    out = loop(jax.device_put(x0, host), idx, args.width)
    if out.sharding.memory_kind != "pinned_host":
        print(f"check FAILED: the result lives in {out.sharding.memory_kind}, not pinned_host")
        return 1
    try:
        assert_same(np.asarray(out), _expected(x0, idx, args.width), what="replay buffer")
    except AssertionError as err:
        print(f"check FAILED: the buffer differs from the numpy replay\n{err}")
        return 1
    print(f"check: {args.steps} steps of updates match the numpy replay")

    step_idx = idx[0]
    step_rows = _new_rows(0, args.width, args.batch)
    ours = jax.jit(lambda x, i, u: pp.scatter_to_host(x, i, u), donate_argnums=0)
    xla = jax.jit(lambda x, i, u: x.at[i].set(u), donate_argnums=0)
    results = []
    ours_name = "pallas_pinned.scatter_to_host" + ("" if on_gpu else " (XLA fallback)")
    for name, fn in ((ours_name, ours), ("XLA x.at[i].set", xla)):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # XLA's host-offload pass warns ("host compute").
            # One warm-up call (compilation, first touch), then the timed ones;
            # the donated buffer is threaded from call to call.
            out, times = time_calls(fn, out, step_idx, step_rows, repeats=args.repeats)
        results.append((name, statistics.median(times), min(times), max(times)))

    payload = args.batch * args.width * 4
    print(f"\none step ({args.batch} rows, {payload / 2**20:.1f} MiB), {args.repeats} repeats")
    print(f"{'method':47} {'median ms':>10} {'min ms':>8} {'max ms':>8} {'GB/s':>7}")
    for name, med, lo, hi in results:
        print(
            f"{name:47} {med * 1e3:10.3f} {lo * 1e3:8.3f} {hi * 1e3:8.3f} "
            f"{payload / med / 1e9:7.2f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
