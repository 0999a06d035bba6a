"""A recommender's training with its embedding table pinned, cached and checkpointed.

An embedding table of ``--rows`` x ``--dim`` float32 lives in ``pinned_host`` memory,
with row-wise Adagrad accumulators ``(rows, 1)`` beside it (a companion table: same ids,
same cache slots). Each step takes ``--samples`` samples of ``--bag`` Zipf ids, sums
their rows, feeds a small dense model (one hidden layer) and trains a click label:
row-wise Adagrad on the rows the step touched, SGD on the dense weights.
``pallas_pinned.cached_table`` keeps the ``--cache-rows`` busiest rows in device memory;
each jitted ``cached_table.scan`` of ``--refresh-every`` steps runs with the prefetch
pipeline, then the cache is refreshed.

Half way through, the cache is flushed and the tables, dense weights and step are saved
with orbax; the run then restores them (into pinned memory) into a new cache and
finishes. Checks: the resumed run ends where an uninterrupted one does, both match the
same training on a device-resident table (within 1e-5: repeated ids sum their gradients in
another order), the loss fell, and the tables stayed in pinned memory. Exit status 0 only
when every check holds.

    python examples/cached_embedding.py                   # small, seconds on a CPU
    python examples/cached_embedding.py --rows 4000000 --dim 64 --samples 1024 \\
        --cache-rows 200000 --steps 400 --refresh-every 100   # a GPU-sized table (1 GiB)
"""

from __future__ import annotations

import argparse
import sys
import tempfile

import numpy as np
from _common import placements, print_checks, verdict  # examples/ is on sys.path when run

TOLERANCE = 1e-5


def training_parser(description: str, **defaults) -> argparse.ArgumentParser:
    """The arguments of the training (``defaults`` overrides the small CPU sizes)."""
    d = {"rows": 3000, "dim": 8, "samples": 32, "bag": 4, "hidden": 16, "cache_rows": 150,
         "steps": 24, "refresh_every": 4, **defaults}
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--rows", type=int, default=d["rows"], help="embedding rows")
    p.add_argument("--dim", type=int, default=d["dim"], help="embedding width")
    p.add_argument("--samples", type=int, default=d["samples"], help="samples per step")
    p.add_argument("--bag", type=int, default=d["bag"], help="ids per sample (summed)")
    p.add_argument("--hidden", type=int, default=d["hidden"],
                   help="hidden units of the dense model")
    p.add_argument("--cache-rows", type=int, default=d["cache_rows"],
                   help="rows cached on the device")
    p.add_argument("--steps", type=int, default=d["steps"], help="training steps")
    p.add_argument("--refresh-every", type=int, default=d["refresh_every"],
                   help="steps per scan and refresh")
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--seed", type=int, default=0)
    return p


def parse_args(argv=None):
    p = training_parser(__doc__.splitlines()[0])
    args = p.parse_args(argv)
    if args.steps % (2 * args.refresh_every):
        p.error("--steps must be a multiple of 2 * --refresh-every (the checkpoint is half way)")
    return args


def make_data(args):
    """Zipf ids ``(steps, samples * bag)``, labels from a hidden model, initial weights."""
    rng = np.random.default_rng(args.seed)
    ids = np.minimum(rng.zipf(1.2, (args.steps, args.samples * args.bag)) - 1,
                     args.rows - 1).astype(np.int32)
    ids = rng.permutation(args.rows).astype(np.int32)[ids]  # popular ids spread out
    truth = rng.standard_normal((args.rows, args.dim)).astype(np.float32)
    pooled = truth[ids].reshape(args.steps, args.samples, args.bag, args.dim).sum(2)
    labels = (pooled @ rng.standard_normal(args.dim) > 0).astype(np.float32)
    scale = np.float32(1 / np.sqrt(args.dim))
    table = (scale * rng.standard_normal((args.rows, args.dim))).astype(np.float32)
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


def adagrad(rows, acc, grad, lr):
    """Row-wise Adagrad: one accumulator per row, the mean of its squared gradient."""
    import jax.numpy as jnp

    g2 = jnp.mean(grad * grad, axis=-1, keepdims=True)
    return -lr * grad / (jnp.sqrt(acc + g2) + 1e-8), g2


def cached_step(args):
    import jax

    def step(dense, rows, labels):
        emb, acc = rows.values  # the batch's distinct rows and their accumulators
        loss, (g_dense, g_rows) = jax.value_and_grad(
            lambda d, e: loss_fn(d, e[rows.inverse], args, labels), argnums=(0, 1))(dense, emb)
        deltas = adagrad(emb, acc, g_rows, args.lr)
        dense = jax.tree.map(lambda w, g: w - args.lr * g, dense, g_dense)
        return dense, deltas, loss

    return step


def device_training(args, table, dense, ids, labels):
    """The same training on a device-resident table (dense gradients of the whole table)."""
    import jax
    import jax.numpy as jnp

    def step(state, xs):
        table, acc, dense = state
        i, y = xs
        loss, (g_dense, g_table) = jax.value_and_grad(
            lambda d, t: loss_fn(d, t[i], args, y), argnums=(0, 1))(dense, table)
        delta, g2 = adagrad(table, acc, g_table, args.lr)  # untouched rows: zero gradient
        dense = jax.tree.map(lambda w, g: w - args.lr * g, dense, g_dense)
        return (table + delta, acc + g2, dense), loss

    acc = jnp.zeros((args.rows, 1), jnp.float32)
    (table, _, _), losses = jax.jit(lambda s, x: jax.lax.scan(step, s, x))(
        (jnp.asarray(table), acc, dense), (ids, labels))
    return np.asarray(table), np.asarray(losses)


def trainer(args):
    """``train(cache, dense, ids, labels, start, stop)``: steps ``start..stop``, a pipelined
    scan per refresh interval, then a refresh (one compiled scan for every call)."""
    import jax

    from pallas_pinned import cached_table

    step = cached_step(args)
    run = jax.jit(lambda c, d, i, y: cached_table.scan(step, c, d, i, y), donate_argnums=0)
    return lambda *a: train(args, run, *a)


def train(args, run, cache, dense, ids, labels, start: int, stop: int):
    from pallas_pinned import cached_table

    losses = []
    for s in range(start, stop, args.refresh_every):
        part = slice(s, s + args.refresh_every)
        cache, dense, loss = run(cache, dense, ids[part], labels[part])
        cache = cached_table.refresh(cache)
        losses.append(np.asarray(loss))
    return cache, dense, np.concatenate(losses)


def save(path, cache, dense, step):
    import orbax.checkpoint as ocp

    from pallas_pinned import cached_table

    cache = cached_table.flush(cache)  # the pinned tables hold every update now
    checkpointer = ocp.StandardCheckpointer()
    checkpointer.save(path, {"table": cache.table, "acc": cache.companions[0],
                             "dense": dense, "step": step})
    checkpointer.wait_until_finished()
    return cache


def restore(path, args, pinned):
    import jax
    import orbax.checkpoint as ocp

    import pallas_pinned
    from pallas_pinned import cached_table

    def host(shape):
        return jax.ShapeDtypeStruct(shape, np.float32, sharding=pinned)

    target = {"table": host((args.rows, args.dim)), "acc": host((args.rows, 1)),
              "dense": {"w1": jax.ShapeDtypeStruct((args.dim, args.hidden), np.float32),
                        "w2": jax.ShapeDtypeStruct((args.hidden,), np.float32)},
              "step": 0}
    state = ocp.StandardCheckpointer().restore(path, target)
    # A restored buffer's type can say device memory: fix_memory_space re-describes it.
    table, acc = (pallas_pinned.fix_memory_space(state[k]) for k in ("table", "acc"))
    cache = cached_table.create(table, args.cache_rows, companions=(acc,))
    return cache, state["dense"], int(state["step"])


def main(argv=None) -> int:
    args = parse_args(argv)
    import jax

    from pallas_pinned import cached_table

    dev, pinned, _ = placements()
    ids, labels, table0, dense0 = make_data(args)
    acc0 = np.zeros((args.rows, 1), np.float32)

    def fresh_cache():
        return cached_table.create(jax.device_put(table0, pinned), args.cache_rows,
                                   companions=(jax.device_put(acc0, pinned),))

    half = args.steps // 2
    train_steps = trainer(args)
    # Uninterrupted.
    cache, _, losses = train_steps(fresh_cache(), dense0, ids, labels, 0, args.steps)
    cache = cached_table.flush(cache)
    straight = np.asarray(jax.device_put(cache.table, jax.memory.Space.Device))
    hit_rate = cached_table.stats(cache)["hit_rate"]
    # Saved half way, restored, finished.
    cache, dense, _ = train_steps(fresh_cache(), dense0, ids, labels, 0, half)
    with tempfile.TemporaryDirectory() as tmp:
        cache = save(f"{tmp}/ckpt", cache, dense, half)
        jax.tree.map(lambda a: a.delete(), cache)  # the run stops here: nothing survives
        cache, dense, step = restore(f"{tmp}/ckpt", args, pinned)
    cache, dense, _ = train_steps(cache, dense, ids, labels, step, args.steps)
    cache = cached_table.flush(cache)
    resumed = np.asarray(jax.device_put(cache.table, jax.memory.Space.Device))
    reference, ref_losses = device_training(args, table0, dense0, ids, labels)
    first, last = losses[:args.refresh_every].mean(), losses[-args.refresh_every:].mean()
    checks = {
        "resumed = uninterrupted": bool(np.allclose(resumed, straight, atol=TOLERANCE)),
        "cached = device table": bool(np.allclose(straight, reference, atol=TOLERANCE)),
        "losses = device table's": bool(np.allclose(losses, ref_losses, atol=TOLERANCE)),
        "loss fell": bool(last < first),
        "tables stay in pinned_host": all(t.sharding.memory_kind == "pinned_host"
                                          for t in cache.tables),
    }
    print(f"table {args.rows} x {args.dim} float32 + accumulators in pinned_host on "
          f"{dev.platform}; cache of {args.cache_rows} rows; {args.steps} steps of "
          f"{args.samples} x {args.bag} ids; checkpoint at step {half}; hit rate "
          f"{hit_rate:.0%}; loss {first:.3f} -> {last:.3f}")
    print_checks(checks)
    return verdict(checks)


if __name__ == "__main__":
    sys.exit(main())
