"""Lab probe of 2026-12-04 (session 11): does one Pallas launch order a batch faster than XLA?

Not a benchmark of the project (no CPU test, no report). On a GPU, from the repository root:

    PYTHONPATH=. python docs/lab/rank_probe.py [--xla-option NAME=VALUE] [--quick]

The add orders its rows stably before its one launch (``_rows.stable_order``): up to 8192
entries by counting ranks in an ``n x n`` comparison that XLA fuses (19.9-22.7 us for the
sparse client's 4096 ids, 2026-12-03), beyond by XLA's sort (44-46 us at 4096). The sparse
client orders its 4096 ids once or twice a step, and the loop's unpromised adds of 1024-4096
rows order theirs: the ordering is ~20 us of the 58.5 us shared-order step.

Prediction (written before the first run): the comparison is ~17 M pairs at 4096, ~5 integer
operations each: ~5 us of the H200's integer throughput. One Pallas launch that counts each
block of entries against the batch in chunks (``kernels/rank_pallas.py``) should take ~5-8 us
at 4096 against the fused comparison's ~20, and ~2-4 against ~5-6 at 1024; the permutation
and the gather after it cost the same on both paths.

Outcome (H200, jax 0.11.2, 2026-12-04 17:38 UTC, graphed, tree ``158d6bb``;
``rank_probe_h200_1738.log`` beside this file; every order checked equal to numpy's), us per
step including the scan's own work, uniform keys: at 4096 the fused comparison 20.6, XLA's
sort 44.4, the kernel 21.5 at its best setting (8 entries a program, chunks of 1024, 2 warps)
and 23.9-82.6 at the others; at 8192 36.6 / 52.6 / 35.6; at 1024 14.1 / 19.6 / 13.6; at 256
12.1 / 12.1 / 11.8; keys with many repeats alike. The prediction was wrong: XLA's fused
comparison already counts as fast as a plain Triton kernel does (about 1.3 T pairs a second
at 4096), so the kernel buys nothing and the library keeps XLA's. The kernel lives here, not
in ``kernels/``.

Each variant orders every step's keys in one jitted ``lax.scan`` of ``STEPS`` steps (keys
made before timing: uniform over 8 Mi rows, and Zipf-like with many repeats), checked equal
to numpy's stable argsort, then timed interleaved in ``ROUNDS`` rounds: us per step.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from benchmarks import environment
from pallas_pinned import _rows

ROUNDS, STEPS = 5, 100


def stable_ranks_kernel(keys_ref, rank_ref, *, num_entries: int, block: int, chunk: int):
    """Counts, for one block of entries, the entries ordered before each of them."""
    i = pl.program_id(0) * block + jnp.arange(block)
    i_ok = i < num_entries
    mine = plgpu.load(keys_ref.at[i], mask=i_ok, other=0)

    def count_chunk(c, counts):
        j = c * chunk + jnp.arange(chunk)
        j_ok = j < num_entries
        theirs = plgpu.load(keys_ref.at[j], mask=j_ok, other=0)
        before = (theirs[None, :] < mine[:, None]) | (
            (theirs[None, :] == mine[:, None]) & (j[None, :] < i[:, None])
        )
        return counts + jnp.sum((before & j_ok[None, :]).astype(jnp.int32), axis=1)

    counts = lax.fori_loop(0, pl.cdiv(num_entries, chunk), count_chunk,
                           jnp.zeros((block,), jnp.int32))
    plgpu.store(rank_ref.at[i], counts, mask=i_ok)


def stable_ranks(keys: jax.Array, *, block: int = 32, chunk: int = 512, num_warps: int = 4,
                 interpret: bool = False) -> jax.Array:
    """``(n,)`` int32 ranks of ``keys`` ``(n,)`` (any integer type) in a stable ascending order."""
    (n,) = keys.shape
    chunk = min(chunk, max(16, 1 << max(0, (n - 1).bit_length())))
    any_spec = pl.BlockSpec(memory_space=pl.ANY)
    return pl.pallas_call(
        lambda k, r: stable_ranks_kernel(k, r, num_entries=n, block=block, chunk=chunk),
        out_shape=jax.ShapeDtypeStruct((n,), jnp.int32),
        grid=(pl.cdiv(n, block),),
        in_specs=[any_spec],
        out_specs=any_spec,
        compiler_params=plgpu.CompilerParams(num_warps=num_warps, num_stages=1),
        interpret=interpret,
        name="pallas_pinned_stable_ranks",
    )(keys)


def _pallas_order(rows, *, interpret, **settings):
    rank = stable_ranks(rows, interpret=interpret, **settings)
    positions = lax.iota(jnp.int32, rows.shape[0])
    perm = jnp.zeros_like(positions).at[rank].set(positions, unique_indices=True)
    return rows[perm], perm


def variants(n, gpu):
    out = {"xla ranks (n x n fused)": functools.partial(_rows.stable_order, small_max=n),
           "xla sort": functools.partial(_rows.stable_order, small_max=0)}
    for block, chunk, warps in ((32, 512, 4), (16, 1024, 4), (64, 256, 4), (128, 128, 8),
                                (32, 256, 2), (8, 1024, 2)):
        out[f"pallas b{block} c{chunk} w{warps}"] = functools.partial(
            _pallas_order, interpret=not gpu, block=block, chunk=chunk, num_warps=warps)
    return out


def _scan(order):
    def run(keys):
        def step(acc, k):
            rows, perm = order(k)
            return acc + jnp.sum(rows[:8]) + perm[0] + perm[-1], perm
        return lax.scan(step, jnp.zeros((), keys.dtype), keys)

    return jax.jit(run)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    environment.add_xla_option(parser)
    parser.add_argument("--quick", action="store_true", help="tiny sizes (a CPU smoke test)")
    args = parser.parse_args()
    gpu = jax.default_backend() == "gpu"
    steps = 3 if args.quick else STEPS
    sizes = (64, 300) if args.quick else (256, 1024, 4096, 8192)
    print(f"jax {jax.__version__}, {jax.devices()[0].device_kind}, options "
          f"{args.compiler_options}; {steps} steps a scan, {ROUNDS} rounds", flush=True)
    rng = np.random.default_rng(0)
    for n in sizes:
        for kind in ("uniform", "repeats"):
            high = 8 << 20 if kind == "uniform" else max(2, n // 4)
            keys_np = rng.integers(0, high, (steps, n)).astype(np.int32)
            keys = jnp.asarray(keys_np)
            want = np.argsort(keys_np, axis=1, kind="stable")
            compiled = {}
            for name, order in variants(n, gpu).items():
                fn = _scan(order).lower(keys).compile(args.compiler_options or None)
                perms = np.asarray(fn(keys)[1])
                ok = np.array_equal(perms, want)
                print(f"check n={n:5} {kind:8} {name:26} {'ok' if ok else 'WRONG'}", flush=True)
                compiled[name] = fn
            times = {name: [] for name in compiled}
            for _ in range(ROUNDS):
                for name, fn in compiled.items():
                    t0 = time.perf_counter()
                    jax.block_until_ready(fn(keys))
                    times[name].append((time.perf_counter() - t0) / steps * 1e6)
            for name, us in times.items():
                print(f"n={n:5} {kind:8} {name:26} {statistics.median(us):7.1f} us/step "
                      f"(min {min(us):.1f}, max {max(us):.1f})", flush=True)


if __name__ == "__main__":
    main()
