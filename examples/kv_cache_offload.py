"""A decode loop whose KV cache lives in pinned host memory, written and read with ``at``.

The cache has shape (layers, batch, T, heads * head_dim), keys and values one
buffer each, in ``pinned_host`` memory. Every decode step, inside one jitted
``lax.fori_loop`` that carries (and donates) both caches:

* each layer computes the new token's key and value on the device;
* writes them at each sequence's own position, ``lengths[b]``:
  ``at(k_cache)[layer, arange(batch), lengths].set(k_new)`` — one row of
  heads * head_dim per sequence;
* reads back the last ``window`` positions of every sequence with ``.get`` (an
  index array per sequence; positions before the start are filled with zeros)
  and folds them into the next layer's input.

The result is checked against a plain-jnp replay of the same loop on
device-memory caches (``cache.at[...].set`` / ``.get``), bit for bit: the
arithmetic uses small integers in float32, so no rounding can differ. Exit
status 0 only on success.

    python examples/kv_cache_offload.py                  # small, seconds on a CPU
    python examples/kv_cache_offload.py --layers 16 --batch 8 --length 4096 \\
        --heads 8 --head-dim 128 --steps 64               # a GPU-sized cache

On a GPU it also times one decode step's cache writes (all layers) against
XLA's own ``cache.at[...].set`` on the same pinned buffer, in µs per step. On
a CPU nothing is timed (both run XLA's scatter there).
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
from _common import finish, placements, time_providers  # examples/ is on sys.path when run


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--batch", type=int, default=3, help="sequences decoded together")
    p.add_argument("--length", type=int, default=24, help="T: positions in the cache")
    p.add_argument("--heads", type=int, default=2)
    p.add_argument("--head-dim", type=int, default=4)
    p.add_argument("--steps", type=int, default=6, help="decode steps (tokens per sequence)")
    p.add_argument("--window", type=int, default=4, help="positions read back per step")
    p.add_argument("--repeats", type=int, default=20, help="timed calls on a GPU")
    p.add_argument("--time", action="store_true",
                   help="time on a CPU too (CPU numbers: both paths are XLA's scatter there)")
    return p.parse_args(argv)


def decode(k_cache, v_cache, lengths, hidden, *, steps, window, at, **kw):
    """The decode loop; ``at`` is ``pallas_pinned.at`` or jnp's ``lambda c: c.at``."""
    import jax.numpy as jnp
    from jax import lax

    layers, batch, length, width = k_cache.shape
    rows = jnp.arange(batch)

    def layer_step(layer, k_cache, v_cache, lengths, h):
        # The new token's key and value, from this layer's input (exact small integers).
        k_new = (h * (layer + 1) + 3) % 17 - 8
        v_new = (h * (layer + 2) + 5) % 13 - 6
        k_cache = at(k_cache)[layer, rows, lengths].set(k_new, **kw)
        v_cache = at(v_cache)[layer, rows, lengths].set(v_new, **kw)
        # The last `window` positions of each sequence (before position 0: zeros).
        positions = lengths[:, None] - jnp.arange(window)[None, :]
        positions = jnp.where(positions >= 0, positions, length)  # out of range: filled
        keys = at(k_cache)[layer, rows[:, None], positions].get(mode="fill", fill_value=0, **kw)
        vals = at(v_cache)[layer, rows[:, None], positions].get(mode="fill", fill_value=0, **kw)
        scores = jnp.sum(keys * h[:, None, :], axis=-1, keepdims=True) % 7  # (batch, window, 1)
        h = jnp.sum(scores * vals, axis=1) % 11  # (batch, width)
        return k_cache, v_cache, h

    def step(t, carry):
        k_cache, v_cache, lengths, h, outputs = carry
        for layer in range(layers):
            k_cache, v_cache, h = layer_step(layer, k_cache, v_cache, lengths, h)
        outputs = outputs.at[t].set(h)
        return k_cache, v_cache, jnp.minimum(lengths + 1, length - 1), h, outputs

    outputs = jnp.zeros((steps, batch, width), jnp.float32)
    carry = (k_cache, v_cache, lengths, hidden, outputs)
    k_cache, v_cache, lengths, _, outputs = lax.fori_loop(0, steps, step, carry)
    return k_cache, v_cache, lengths, outputs


def time_writes(args, make_cache, lengths, k_new):
    """µs per decode step of the cache writes (all layers): pallas_pinned vs XLA's own."""
    import jax.numpy as jnp

    import pallas_pinned

    rows = jnp.arange(args.batch)

    def writes(at):
        def step(cache, lengths, k_new):
            for layer in range(args.layers):
                cache = at(cache)[layer, rows, lengths].set(k_new)
            return cache
        return step

    providers = {"pallas_pinned": writes(pallas_pinned.at), "xla": writes(lambda c: c.at)}
    return time_providers(providers, make_cache, lengths, k_new, repeats=args.repeats,
                          unit="step")


def main(argv=None) -> int:
    args = parse_args(argv)
    import jax

    import pallas_pinned

    on_gpu = jax.default_backend() == "gpu"
    dev, pinned, device = placements()

    width = args.heads * args.head_dim
    shape = (args.layers, args.batch, args.length, width)
    rng = np.random.default_rng(0)
    k0 = rng.integers(-9, 9, size=shape).astype(np.float32)
    v0 = rng.integers(-9, 9, size=shape).astype(np.float32)
    # Sequences at different lengths; the last one starts at position 0.
    start = np.minimum(np.arange(args.batch)[::-1] * 5, args.length - 1).astype(np.int32)
    h0 = rng.integers(0, 11, size=(args.batch, width)).astype(np.float32)
    lengths = jax.device_put(start, device)
    hidden = jax.device_put(h0, device)

    kw = dict(steps=args.steps, window=args.window)
    ours = jax.jit(lambda k, v, n, h: decode(k, v, n, h, at=pallas_pinned.at, **kw),
                   donate_argnums=(0, 1))
    theirs = jax.jit(lambda k, v, n, h: decode(k, v, n, h, at=lambda c: c.at, **kw))

    k, v, n, out = ours(jax.device_put(k0, pinned), jax.device_put(v0, pinned), lengths, hidden)
    k_ref, v_ref, n_ref, out_ref = theirs(jax.device_put(k0, device),
                                          jax.device_put(v0, device), lengths, hidden)
    checks = {
        "k cache": np.array_equal(np.asarray(k), np.asarray(k_ref)),
        "v cache": np.array_equal(np.asarray(v), np.asarray(v_ref)),
        "lengths": np.array_equal(np.asarray(n), np.asarray(n_ref)),
        "outputs": np.array_equal(np.asarray(out), np.asarray(out_ref)),
        "caches stay in pinned_host": k.sharding.memory_kind == v.sharding.memory_kind
        == "pinned_host",
        "the loop wrote something": not np.array_equal(np.asarray(k), k0),
        "the outputs are not all zero": bool(np.any(np.asarray(out))),
    }
    mib = 2 * k0.nbytes / 2**20
    print(f"KV cache {shape} x2 (float32, {mib:.2f} MiB) in pinned_host on {dev.platform}; "
          f"{args.steps} decode steps, {args.layers} layers, window {args.window}")
    if not (on_gpu or args.time):
        return finish(checks)
    k_new = jax.device_put(rng.integers(-9, 9, (args.batch, width)).astype(np.float32), device)

    def make_cache():
        return jax.device_put(k0, pinned)

    title = f"cache writes of one decode step, all layers ({dev.platform.upper()}, median):"
    return finish(checks, title, time_writes(args, make_cache, lengths, k_new))


if __name__ == "__main__":
    sys.exit(main())
