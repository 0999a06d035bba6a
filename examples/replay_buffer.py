"""A ring replay buffer in pinned host memory: wrapping inserts and random sampling with ``at``.

The buffer holds ``capacity`` transitions of ``width`` float32 each, in
``pinned_host`` memory. One jitted ``lax.scan`` (the buffer carried and
donated) runs ``steps`` rounds of:

* insert: a batch of ``insert`` new transitions, computed on the device, at the
  write head ``pos``: ``at(buf)[jax.ds(pos, insert)].set(batch, mode="wrap")``
  — a window that runs past the end continues at row 0, as a ring does;
  then ``pos = (pos + insert) % capacity``;
* sample: ``sample`` rows drawn uniformly from the rows filled so far
  (``jax.random.randint``), read with ``at(buf)[rows].get()``, into device memory.

The result is checked against a plain-jnp replay of the same loop on a
device-memory buffer (``buf.at[(pos + arange(n)) % capacity].set(batch)`` and
``buf[rows]``), bit for bit. Exit status 0 only on success.

    python examples/replay_buffer.py                      # small, seconds on a CPU
    python examples/replay_buffer.py --capacity 1000000 --width 256 \\
        --insert 4096 --sample 4096 --steps 32             # a GPU-sized buffer (1 GiB)

On a GPU it also times one insert against XLA's own ``buf.at[ring_rows].set``
on the same pinned buffer, in µs per step. On a CPU nothing is timed.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
from _common import finish, placements, time_providers  # examples/ is on sys.path when run


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--capacity", type=int, default=50, help="rows in the ring")
    p.add_argument("--width", type=int, default=6, help="float32 values per transition")
    p.add_argument("--insert", type=int, default=8, help="rows inserted per step")
    p.add_argument("--sample", type=int, default=5, help="rows sampled per step")
    p.add_argument("--steps", type=int, default=9, help="insert+sample rounds (the ring wraps)")
    p.add_argument("--repeats", type=int, default=20, help="timed calls on a GPU")
    p.add_argument("--time", action="store_true",
                   help="time on a CPU too (CPU numbers: both paths are XLA's scatter there)")
    return p.parse_args(argv)


def new_batch(t, insert: int, width: int):
    """Transitions of step ``t`` as the device would compute them (exact small integers)."""
    import jax.numpy as jnp

    k = jnp.arange(insert)[:, None] * width + jnp.arange(width)[None, :]
    return ((t * 7919 + k) % 1021).astype(jnp.float32) + 1.0


def run_loop(buf, key, *, args, insert_rows, read_rows):
    """``steps`` rounds of insert and sample; the two callables are the only difference."""
    import jax
    import jax.numpy as jnp
    from jax import lax

    def step(carry, t):
        buf, pos, filled, key = carry
        buf = insert_rows(buf, pos, new_batch(t, args.insert, args.width))
        pos = (pos + args.insert) % args.capacity
        filled = jnp.minimum(filled + args.insert, args.capacity)
        key, sub = jax.random.split(key)
        rows = jax.random.randint(sub, (args.sample,), 0, filled)
        return (buf, pos, filled, key), read_rows(buf, rows)

    carry = (buf, jnp.int32(0), jnp.int32(0), key)
    (buf, pos, _, _), samples = lax.scan(step, carry, jnp.arange(args.steps))
    return buf, pos, samples


def time_inserts(args, make_buffer, pos, batch):
    """µs per insert: pallas_pinned's wrapping window vs XLA's own scatter of ring rows."""
    import jax
    import jax.numpy as jnp

    import pallas_pinned

    def ours(buf, pos, batch):
        return pallas_pinned.at(buf)[jax.ds(pos, args.insert)].set(batch, mode="wrap")

    def xla(buf, pos, batch):
        return buf.at[(pos + jnp.arange(args.insert)) % args.capacity].set(batch)

    return time_providers({"pallas_pinned": ours, "xla": xla}, make_buffer, pos, batch,
                          repeats=args.repeats, unit="insert")


def main(argv=None) -> int:
    args = parse_args(argv)
    import jax
    import jax.numpy as jnp

    import pallas_pinned

    on_gpu = jax.default_backend() == "gpu"
    dev, pinned, device = placements()

    buf0 = np.zeros((args.capacity, args.width), np.float32)
    key = jax.random.key(0)

    def ours(buf, key):
        return run_loop(
            buf, key, args=args,
            insert_rows=lambda b, p, y: pallas_pinned.at(b)[jax.ds(p, args.insert)].set(
                y, mode="wrap"),
            read_rows=lambda b, rows: pallas_pinned.at(b)[rows].get(),
        )

    def theirs(buf, key):
        return run_loop(
            buf, key, args=args,
            insert_rows=lambda b, p, y: b.at[(p + jnp.arange(args.insert)) % args.capacity].set(y),
            read_rows=lambda b, rows: b[rows],
        )

    buf, pos, samples = jax.jit(ours, donate_argnums=0)(jax.device_put(buf0, pinned), key)
    buf_ref, pos_ref, samples_ref = jax.jit(theirs)(jax.device_put(buf0, device), key)
    wraps = args.steps * args.insert // args.capacity
    checks = {
        "buffer": np.array_equal(np.asarray(buf), np.asarray(buf_ref)),
        "samples": np.array_equal(np.asarray(samples), np.asarray(samples_ref)),
        "write head": int(pos) == int(pos_ref) == args.steps * args.insert % args.capacity,
        "buffer stays in pinned_host": buf.sharding.memory_kind == "pinned_host",
        "samples are in device memory": samples.sharding.memory_kind == "device",
        "samples read written rows": bool(np.all(np.asarray(samples) > 0)),
    }
    print(f"ring of {args.capacity} x {args.width} float32 in pinned_host on {dev.platform}; "
          f"{args.steps} steps of {args.insert} inserts (the ring wrapped {wraps}x) "
          f"and {args.sample} samples")
    if not (on_gpu or args.time):
        return finish(checks)
    batch = jax.device_put(np.ones((args.insert, args.width), np.float32), device)
    head = jnp.int32(args.capacity - args.insert // 2)  # near the end: the timed insert wraps

    def make_buffer():
        return jax.device_put(buf0, pinned)

    title = f"one insert ({dev.platform.upper()}, median):"
    return finish(checks, title, time_inserts(args, make_buffer, head, batch))


if __name__ == "__main__":
    sys.exit(main())
