"""Training with an embedding table larger than the GPU's free memory.

The table (``--rows`` x ``--dim`` float32, with the row-wise Adagrad accumulators its
optimizer keeps beside it) lives in ``pinned_host`` memory; ``pallas_pinned.cached_table``
keeps ``--cache-rows`` of its rows on the device, and ``cached_table.scan`` trains with the
prefetch pipeline: each step sums bags of ``--bag`` Zipf ids per sample, a hidden layer
predicts a label, the step hands back each entry's gradient and the table's optimizer
updates the touched rows. With ``--fill-gpu`` (on a GPU) the script first takes
the GPU's memory with ballast arrays until less is free than the table's size, and says
how much was free.

Checks: the rows the training touched equal the same training on a device-resident table
of just those rows (ids renumbered; within ``TOLERANCE``: repeated ids sum their gradients
in another order there), every
other row kept its initial value bit for bit, the tables stayed in pinned memory, and (with
``--fill-gpu``) the table was larger than the free GPU memory. Exit status 0 only when
every check holds.

    python examples/larger_than_device.py                      # small, seconds on a CPU
    XLA_PYTHON_CLIENT_MEM_FRACTION=0.95 python examples/larger_than_device.py \\
        --rows 67108864 --dim 64 --cache-rows 3355443 --samples 1024 --steps 200 \\
        --refresh-every 50 --fill-gpu      # a 16 GiB table on a GPU left with less free
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time

import numpy as np
from _common import placements, print_checks, verdict  # examples/ is on sys.path when run

GIB = 2**30
TOLERANCE = 2e-5


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=20000, help="embedding rows")
    p.add_argument("--dim", type=int, default=8, help="embedding width")
    p.add_argument("--samples", type=int, default=32, help="samples per step")
    p.add_argument("--bag", type=int, default=4, help="ids per sample (summed)")
    p.add_argument("--hidden", type=int, default=16, help="hidden units of the dense model")
    p.add_argument("--cache-rows", type=int, default=1000, help="rows cached on the device")
    p.add_argument("--steps", type=int, default=16, help="training steps")
    p.add_argument("--refresh-every", type=int, default=4, help="steps per scan and refresh")
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--fill-gpu", action="store_true",
                   help="first leave the GPU less free memory than the table's size")
    args = p.parse_args(argv)
    if args.steps % args.refresh_every:
        p.error("--steps must be a multiple of --refresh-every")
    return args


def make_data(args):
    """Zipf ids ``(steps, samples * bag)``, labels, the initial table and dense weights."""
    rng = np.random.default_rng(args.seed)
    ids = np.minimum(rng.zipf(1.2, (args.steps, args.samples * args.bag)) - 1,
                     args.rows - 1)
    ids = (ids * 2654435761 % args.rows).astype(np.int32)  # popular ids spread out
    labels = (rng.random((args.steps, args.samples)) < 0.5).astype(np.float32)
    # One random block, shifted for each block of rows: a table of many GiB is made at the
    # speed of a copy, and with no second table-sized temporary.
    chunk = max(1, min(args.rows, 2**24 // args.dim))
    block = (rng.random((chunk, args.dim), np.float32) - np.float32(0.5)) * np.float32(
        2 / np.sqrt(args.dim))
    table = np.empty((args.rows, args.dim), np.float32)
    for k, start in enumerate(range(0, args.rows, chunk)):
        part = table[start:start + chunk]
        np.add(block[:len(part)], np.float32(k % 64 / 256), out=part)
    scale = np.float32(1 / np.sqrt(args.dim))
    dense = {"w1": (scale * rng.standard_normal((args.dim, args.hidden))).astype(np.float32),
             "w2": (rng.standard_normal((args.hidden,)) / np.sqrt(args.hidden)).astype(
                 np.float32)}
    return ids, labels, table, dense


def loss_fn(dense, emb, args, labels):
    """Mean logistic loss of the samples, ``emb`` each entry's row ``(samples * bag, dim)``."""
    import jax
    import jax.numpy as jnp

    pooled = emb.reshape(args.samples, args.bag, args.dim).sum(1)
    logits = jax.nn.relu(pooled @ dense["w1"]) @ dense["w2"]
    return jnp.mean(jnp.logaddexp(0.0, logits) - labels * logits)


def train(args, cache, dense, ids, labels):
    """A pipelined scan per refresh interval (one compiled program), then a refresh; SGD on
    the dense weights, the table's row-wise Adagrad on its rows."""
    import jax

    from pallas_pinned import cached_table

    def step(dense, rows, labels):
        loss, (g_dense, g_emb) = jax.value_and_grad(loss_fn, argnums=(0, 1))(
            dense, rows.per_entry(), args, labels)
        dense = jax.tree.map(lambda w, g: w - args.lr * g, dense, g_dense)
        return dense, cached_table.Grads(g_emb), loss

    run = jax.jit(lambda c, d, i, y: cached_table.scan(step, c, d, i, y), donate_argnums=0)
    dense = jax.device_put(dense, jax.devices()[0])  # committed, as the scan returns it
    losses = []
    for s in range(0, args.steps, args.refresh_every):
        part = slice(s, s + args.refresh_every)
        cache, dense, loss = run(cache, dense, ids[part], labels[part])
        cache = cached_table.refresh(cache)
        losses.append(np.asarray(loss))
    return cache, np.concatenate(losses)


def device_training(args, table, dense, ids, labels):
    """The same training on a device-resident table: dense gradients of the whole table,
    row-wise Adagrad in plain jnp (a zero gradient leaves a row and its accumulator)."""
    import jax
    import jax.numpy as jnp

    def step(state, xs):
        table, acc, dense = state
        i, y = xs
        loss, (g_dense, g) = jax.value_and_grad(
            lambda d, t: loss_fn(d, t[i], args, y), argnums=(0, 1))(dense, table)
        acc = acc + jnp.mean(g * g, axis=1)
        table = table - (args.lr / (jnp.sqrt(acc) + 1e-8))[:, None] * g
        dense = jax.tree.map(lambda w, g: w - args.lr * g, dense, g_dense)
        return (table, acc, dense), loss

    state = (jnp.asarray(table), jnp.zeros(table.shape[0], jnp.float32), dense)
    (table, _, _), losses = jax.jit(lambda s, x: jax.lax.scan(step, s, x))(state,
                                                                           (ids, labels))
    return np.asarray(table), np.asarray(losses)


def driver_free_bytes() -> int | None:
    """Free memory of GPU 0 as the driver reports it (outside JAX's pool), if it can say."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.free", "--format=csv,noheader,"
                              "nounits", "-i", "0"], capture_output=True, text=True, timeout=30)
        return int(out.stdout.split()[0]) * 2**20
    except (OSError, ValueError, IndexError, subprocess.SubprocessError):
        return None


def fill_gpu(dev, keep_free: int) -> list:
    """Device arrays taking all but ``keep_free`` bytes of what JAX may still allocate."""
    import jax
    import jax.numpy as jnp

    stats = dev.memory_stats()
    left = max(0, stats["bytes_limit"] - stats["bytes_in_use"] - keep_free) // 4
    ballast = []
    while left > 0:  # arrays of at most 2**30 entries: no 64-bit shapes needed
        n = min(left, 2**30)
        ballast.append(jax.device_put(jnp.zeros((n,), jnp.float32), dev))
        left -= n
    return jax.block_until_ready(ballast)


def main(argv=None) -> int:
    args = parse_args(argv)
    import jax

    from pallas_pinned import cached_table

    dev, pinned, _ = placements()
    t0 = time.perf_counter()
    ids, labels, table0, dense0 = make_data(args)
    table_bytes = table0.nbytes + 4 * args.rows  # the table and its accumulators
    cache = cached_table.create(jax.device_put(table0, pinned), args.cache_rows,
                                optimizer=cached_table.rowwise_adagrad(args.lr))
    print(f"table {args.rows} x {args.dim} float32 + accumulators: {table_bytes / GIB:.2f} GiB "
          f"in pinned_host on {dev.platform} (made in {time.perf_counter() - t0:.0f} s)")

    checks = {}
    ballast = None
    if args.fill_gpu:
        if dev.platform != "gpu":
            print("--fill-gpu needs a GPU", file=sys.stderr)
            return 2
        ballast = fill_gpu(dev, keep_free=table_bytes // 4)
        stats = dev.memory_stats()
        jax_free = stats["bytes_limit"] - stats["bytes_in_use"]
        outside = driver_free_bytes()
        free = jax_free + (outside or 0)
        print(f"GPU free memory now: {jax_free / GIB:.2f} GiB in JAX's pool + "
              f"{'?' if outside is None else f'{outside / GIB:.2f}'} GiB outside it "
              f"(ballast {sum(b.nbytes for b in ballast) / GIB:.1f} GiB); table "
              f"{table_bytes / GIB:.2f} GiB")
        checks["table > free GPU memory"] = outside is not None and table_bytes > free

    t0 = time.perf_counter()
    cache, losses = train(args, cache, dense0, ids, labels)
    cache = cached_table.flush(cache)
    jax.block_until_ready(cache)
    hit_rate = cached_table.stats(cache).hit_rate
    print(f"{args.steps} steps of {args.samples} x {args.bag} ids, cache of {args.cache_rows} "
          f"rows: {time.perf_counter() - t0:.1f} s, compiles included; hit rate "
          f"{hit_rate:.0%}; loss {losses[:args.refresh_every].mean():.3f} -> "
          f"{losses[-args.refresh_every:].mean():.3f}")

    # The oracle: the same steps on a device table of only the touched rows.
    touched, compact_ids = np.unique(ids, return_inverse=True)
    compact_ids = compact_ids.reshape(ids.shape).astype(np.int32)
    small = argparse.Namespace(**{**vars(args), "rows": len(touched)})
    reference, ref_losses = device_training(small, table0[touched], dense0, compact_ids,
                                            labels)
    del ballast

    final = np.asarray(cache.table)  # host to host: the table never enters device memory
    untouched = np.ones(args.rows, bool)
    untouched[touched] = False
    checks["touched rows = device table"] = bool(
        np.allclose(final[touched], reference, atol=TOLERANCE))
    checks["losses = device table's"] = bool(np.allclose(losses, ref_losses, atol=TOLERANCE))
    checks["other rows unchanged"] = all(  # in chunks, as the table was made
        np.array_equal(final[s][untouched[s]], table0[s][untouched[s]])
        for s in (slice(i, i + 2**20) for i in range(0, args.rows, 2**20)))
    checks["tables stay in pinned_host"] = all(t.sharding.memory_kind == "pinned_host"
                                              for t in cache.tables)
    print(f"{len(touched)} rows touched")
    print_checks(checks)
    return verdict(checks)


if __name__ == "__main__":
    sys.exit(main())
