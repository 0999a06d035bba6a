"""A DLRM-style recommender trained with its embedding tables pinned, cached and checkpointed.

``--tables`` embedding tables of mixed sizes (a few rows to ``--max-rows``), ``--dim``
wide, live in ``pinned_host`` memory; ``pallas_pinned.cached_table`` keeps a
``--cache-fraction`` of each one's rows on the device. A step takes ``--samples`` samples:
dense features through a bottom MLP, and for each table a bag of ``--bag`` Zipf ids whose
rows are summed; the pairwise dot products of those vectors feed a top MLP that predicts a
click. The dense weights train with ``optax.adam``; the tables with the optimizer built
into each cache (FBGEMM's row-wise Adagrad, element-wise Adagrad for the last two): the
step hands back each entry's gradient (``cached_table.Grads``), the library sums them per
row and updates the touched rows. All tables go through one ``cached_table.scan`` per
``--refresh-every`` steps (one compiled program), then a refresh.

Checks (exit status 0 only when every one holds): a run saved half way with orbax,
restored into new caches and finished ends bit-identical to the uninterrupted run
(tables, optimizer state, losses); a run whose caches stay empty (every row read from and
written to pinned memory) is bit-identical too (tests/test_cached_training.py compares
cache sizes of one row, a few and all);
the same training on device-resident tables (``jax.grad`` through ``table[ids]``, optax's
Adagrad and a plain-jnp row-wise Adagrad) agrees within ``TOLERANCE`` (repeated ids sum
their gradients in another order there); the loss fell; the tables stayed in pinned memory.

    python examples/cached_embedding.py                    # small, seconds on a CPU
    python examples/cached_embedding.py --max-rows 4000000 --dim 64 --samples 2048 \\
        --steps 400 --refresh-every 100                    # GPU-sized tables
"""

from __future__ import annotations

import argparse
import sys
import tempfile

import numpy as np
from _common import placements, print_checks, verdict  # examples/ is on sys.path when run

TOLERANCE = 2e-5
DENSE_FEATURES = 4


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tables", type=int, default=8, help="embedding tables (>= 3)")
    p.add_argument("--max-rows", type=int, default=20000, help="rows of the largest table")
    p.add_argument("--dim", type=int, default=8, help="embedding width")
    p.add_argument("--samples", type=int, default=32, help="samples per step")
    p.add_argument("--bag", type=int, default=3, help="ids per sample and table (summed)")
    p.add_argument("--hidden", type=int, default=16, help="hidden units of the MLPs")
    p.add_argument("--cache-fraction", type=float, default=0.05,
                   help="share of each table's rows cached on the device")
    p.add_argument("--steps", type=int, default=12, help="training steps")
    p.add_argument("--refresh-every", type=int, default=3, help="steps per scan and refresh")
    p.add_argument("--lr", type=float, default=0.05, help="embedding learning rate")
    p.add_argument("--dense-lr", type=float, default=0.01, help="optax.adam's learning rate")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.tables < 3 or args.steps % (2 * args.refresh_every):
        p.error("--tables must be >= 3 and --steps a multiple of 2 * --refresh-every "
                "(the checkpoint is half way)")
    return args


def table_rows(args) -> list[int]:
    """Mixed sizes: from 3 rows up to ``--max-rows``, geometrically."""
    return [int(r) for r in np.geomspace(3, args.max_rows, args.tables).round()]


def optimizers(args):
    from pallas_pinned import cached_table

    n = args.tables
    return [cached_table.adagrad(args.lr) if t >= n - 2 else
            cached_table.rowwise_adagrad(args.lr) for t in range(n)]


def make_data(args):
    """Per table: Zipf ids ``(steps, samples * bag)`` and an initial table; dense features,
    labels from a hidden model, and the dense weights."""
    rng = np.random.default_rng(args.seed)
    ids, tables, logit = [], [], 0.0
    shape = (args.steps, args.samples, DENSE_FEATURES)
    dense_x = rng.standard_normal(shape).astype(np.float32)
    for n in table_rows(args):
        rank = np.minimum(rng.zipf(1.2, (args.steps, args.samples * args.bag)) - 1, n - 1)
        i = rng.permutation(n).astype(np.int32)[rank]  # popular ids spread out
        ids.append(i)
        truth = rng.standard_normal(n).astype(np.float32)
        logit = logit + truth[i].reshape(args.steps, args.samples, args.bag).sum(-1)
        tables.append((rng.standard_normal((n, args.dim)) / np.sqrt(args.dim)).astype(
            np.float32))
    logit = logit / np.sqrt(args.tables * args.bag) + dense_x @ rng.standard_normal(
        DENSE_FEATURES)
    labels = (logit > 0).astype(np.float32)
    features = (args.tables + 1) * args.tables // 2 + args.dim

    def layer(m, n):
        return {"w": (rng.standard_normal((m, n)) / np.sqrt(m)).astype(np.float32),
                "b": np.zeros(n, np.float32)}

    dense = {"bottom": [layer(DENSE_FEATURES, args.hidden), layer(args.hidden, args.dim)],
             "top": [layer(features, args.hidden), layer(args.hidden, 1)]}
    return ids, tables, dense_x, labels, dense


def loss_fn(dense, embs, x, labels, args):
    """DLRM: bottom MLP, pooled bags, pairwise dot products, top MLP; the mean logistic
    loss. ``embs``: each table's per-entry rows ``(samples * bag, dim)``."""
    import jax
    import jax.numpy as jnp

    def mlp(layers, h):
        for k, lay in enumerate(layers):
            h = h @ lay["w"] + lay["b"]
            h = jax.nn.relu(h) if k < len(layers) - 1 else h
        return h

    bottom = mlp(dense["bottom"], x)
    pooled = [e.reshape(args.samples, args.bag, args.dim).sum(1) for e in embs]
    v = jnp.stack([bottom, *pooled], axis=1)  # (samples, tables + 1, dim)
    k = v.shape[1]
    # The upper triangle by a 0/1 matrix, exactly: indexing would differentiate into a
    # scatter-add, whose order a GPU does not fix, and the runs must agree bit for bit.
    upper = np.triu_indices(k, 1)
    pick = np.zeros((k * k, len(upper[0])), np.float32)
    pick[upper[0] * k + upper[1], np.arange(len(upper[0]))] = 1
    dots = jnp.einsum("sid,sjd->sij", v, v).reshape(-1, k * k) @ pick
    logits = mlp(dense["top"], jnp.concatenate([bottom, dots], axis=1))[:, 0]
    return jnp.mean(jax.nn.softplus(logits) - labels * logits)


def trainer(args, on_device):
    """``train(caches, dense, opt_state, data, start, stop)``: steps ``start..stop``, one
    pipelined scan of every table per refresh interval, then a refresh of all.
    ``on_device``: the dense state's sharding, of the tables' kind (one program serves)."""
    import jax
    import optax

    from pallas_pinned import cached_table

    tx = optax.adam(args.dense_lr)

    def step(carry, rows, xs):
        dense, opt_state = carry
        x, labels = xs
        embs = [r.per_entry() for r in rows]  # each entry's row: what the gradients are of
        loss, (g_dense, g_embs) = jax.value_and_grad(loss_fn, argnums=(0, 1))(
            dense, embs, x, labels, args)
        updates, opt_state = tx.update(g_dense, opt_state, dense)
        dense = optax.apply_updates(dense, updates)
        return (dense, opt_state), tuple(cached_table.Grads(g) for g in g_embs), loss

    run = jax.jit(lambda c, carry, i, xs: cached_table.scan(step, c, carry, i, xs),
                  donate_argnums=0)

    def train(caches, dense, opt_state, data, start, stop, refresh=True):
        ids, _, dense_x, labels, _ = data
        # Placed as the scan returns them: every call runs one program.
        dense, opt_state = jax.device_put((dense, opt_state), on_device)
        losses = []
        for s in range(start, stop, args.refresh_every):
            part = slice(s, s + args.refresh_every)
            caches, (dense, opt_state), loss = run(
                caches, (dense, opt_state), tuple(i[part] for i in ids),
                (dense_x[part], labels[part]))
            if refresh:
                caches = cached_table.refresh(caches)
            losses.append(np.asarray(loss))
        return caches, dense, opt_state, np.concatenate(losses)

    return tx, train


def device_training(args, data):
    """The same training on device-resident tables: dense gradients of every table through
    ``table[ids]``; optax's Adagrad, and row-wise Adagrad in plain jnp (a zero gradient
    leaves a row and its accumulator as they are, so untouched rows stay)."""
    import jax
    import jax.numpy as jnp
    import optax

    ids, tables, dense_x, labels, dense = data
    tx = optax.adam(args.dense_lr)
    table_tx = [optax.adagrad(o.learning_rate) if o.name == "adagrad" else None
                for o in optimizers(args)]
    state = [jnp.zeros(t.shape[0]) if s is None else s.init(jnp.asarray(t))
             for s, t in zip(table_tx, tables, strict=True)]

    def step(carry, xs):
        tables, state, dense, opt_state = carry
        batch, x, y = xs
        loss, (g_dense, g_tables) = jax.value_and_grad(
            lambda d, ts: loss_fn(d, [t[i] for t, i in zip(ts, batch, strict=True)], x, y,
                                  args), argnums=(0, 1))(dense, tables)
        new_tables, new_state = [], []
        for t, g, s, t_tx in zip(tables, g_tables, state, table_tx, strict=True):
            if t_tx is None:  # FBGEMM's row-wise Adagrad
                s = s + jnp.mean(g * g, axis=1)
                t = t - (args.lr / (jnp.sqrt(s) + 1e-8))[:, None] * g
            else:
                u, s = t_tx.update(g, s, t)
                t = optax.apply_updates(t, u)
            new_tables.append(t)
            new_state.append(s)
        updates, opt_state = tx.update(g_dense, opt_state, dense)
        return (new_tables, new_state, optax.apply_updates(dense, updates), opt_state), loss

    carry = ([jnp.asarray(t) for t in tables], state, dense, tx.init(dense))
    (tables, _, _, _), losses = jax.jit(lambda c, xs: jax.lax.scan(step, c, xs))(
        carry, (tuple(ids), dense_x, labels))
    return [np.asarray(t) for t in tables], np.asarray(losses)


def new_caches(args, tables, pinned, state=None):
    import jax

    from pallas_pinned import cached_table

    return tuple(
        cached_table.create(jax.device_put(t, pinned) if isinstance(t, np.ndarray) else t,
                            max(1, int(args.cache_fraction * t.shape[0])),
                            optimizer=o, state=None if state is None else state[k])
        for k, (t, o) in enumerate(zip(tables, optimizers(args), strict=True)))


def snapshot(caches) -> list:
    """Each flushed cache's table and state tables, as host numpy arrays."""
    return [[np.asarray(t) for t in c.tables] for c in caches]


def save(path, caches, dense, opt_state, step):
    """Flushes the caches (the pinned tables then hold every update) and saves the tables,
    their optimizer state, the dense weights and optax's state; returns the caches and the
    checkpoint's abstract tree (what a restoring process would build from its config)."""
    import jax
    import orbax.checkpoint as ocp

    from pallas_pinned import cached_table

    caches = cached_table.flush(caches)
    tree = {"tables": [c.table for c in caches], "state": [list(c.state) for c in caches],
            "dense": dense, "opt_state": opt_state, "step": step}
    checkpointer = ocp.StandardCheckpointer()
    checkpointer.save(path, tree)
    checkpointer.wait_until_finished()
    abstract = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype,
                                                           sharding=a.sharding)
                            if hasattr(a, "sharding") else a, tree)
    return caches, abstract


def restore(path, abstract, args, pinned):
    import orbax.checkpoint as ocp

    import pallas_pinned

    tree = ocp.StandardCheckpointer().restore(path, abstract)
    # A restored buffer's type can say device memory: fix_memory_space re-describes it.
    fix = pallas_pinned.fix_memory_space
    caches = new_caches(args, [fix(t) for t in tree["tables"]], pinned,
                        state=[tuple(fix(s) for s in st) for st in tree["state"]])
    return caches, tree["dense"], tree["opt_state"], int(tree["step"])


def main(argv=None) -> int:
    args = parse_args(argv)
    import jax

    from pallas_pinned import cached_table

    dev, _, _ = placements()
    # One sharding for the pinned tables, fresh or restored: orbax restores into it with the
    # pinned memory in the arrays' type, so a resumed run reuses the programs compiled.
    mesh = jax.sharding.Mesh(np.array([dev]), ("tables",))
    pinned, on_device = (jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(),
                                                    memory_kind=kind)
                         for kind in ("pinned_host", "device"))
    data = make_data(args)
    _, tables0, _, _, dense0 = data
    tx, train = trainer(args, on_device)
    half = args.steps // 2

    # Uninterrupted.
    caches, _, _, losses = train(new_caches(args, tables0, pinned), dense0, tx.init(dense0),
                                 data, 0, args.steps)
    hit_rate = np.mean([s.hit_rate for s in cached_table.stats(caches)])
    straight = snapshot(cached_table.flush(caches))
    # The caches left empty (never refreshed): every row read from and written to pinned
    # memory, by the same compiled program.
    caches, _, _, cold_losses = train(new_caches(args, tables0, pinned), dense0,
                                      tx.init(dense0), data, 0, args.steps, refresh=False)
    cold = snapshot(cached_table.flush(caches))
    # Saved half way, restored, finished.
    caches, dense, opt_state, first = train(new_caches(args, tables0, pinned), dense0,
                                            tx.init(dense0), data, 0, half)
    with tempfile.TemporaryDirectory() as tmp:
        caches, abstract = save(f"{tmp}/ckpt", caches, dense, opt_state, half)
        jax.tree.map(lambda a: a.delete(), (caches, dense, opt_state))  # nothing survives
        caches, dense, opt_state, step = restore(f"{tmp}/ckpt", abstract, args, pinned)
    caches, _, _, second = train(caches, dense, opt_state, data, step, args.steps)
    resumed = snapshot(cached_table.flush(caches))
    reference, ref_losses = device_training(args, data)

    def same(a, b):  # bit for bit
        a, b = jax.tree.leaves(a), jax.tree.leaves(b)
        return len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))

    checks = {
        "resumed = uninterrupted": same((resumed, np.concatenate([first, second])),
                                        (straight, losses)),
        "empty caches = uninterrupted": same((cold, cold_losses), (straight, losses)),
        "tables = device tables'": all(np.allclose(s[0], r, atol=TOLERANCE)
                                       for s, r in zip(straight, reference, strict=True)),
        "losses = device tables'": bool(np.allclose(losses, ref_losses, atol=TOLERANCE)),
        "loss fell": bool(losses[-args.refresh_every:].mean() < losses[:args.refresh_every]
                          .mean()),
        "tables stay in pinned_host": all(t.sharding.memory_kind == "pinned_host"
                                          for c in caches for t in c.tables),
    }
    print(f"{args.tables} tables of {table_rows(args)} rows x {args.dim} float32 in "
          f"pinned_host on {dev.platform}, {args.cache_fraction:.0%} cached; {args.steps} "
          f"steps of {args.samples} samples; checkpoint at step {half}; mean hit rate "
          f"{hit_rate:.0%}; loss {losses[:args.refresh_every].mean():.3f} -> "
          f"{losses[-args.refresh_every:].mean():.3f}")
    print_checks(checks)
    return verdict(checks)


if __name__ == "__main__":
    sys.exit(main())
