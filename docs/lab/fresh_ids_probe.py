"""Session 37's probe: which part of the cached client's step slows with fresh ids (GPU; lab).

On the H100 of 2026-12-06 22:26 UTC (``benchmarks/results/sparse_fresh_h100_1206_2226/``),
``benchmarks.sparse_training --fresh-ids`` took the cached providers 5-12.5 us a step slower
than the runs that repeat the checked scan's ids in every timed scan (``ours_hot_xla_add``
23.8 -> 34.6 at 2**18 hot rows, 23.1 -> 30.9 at 2**20), while the device table did not slow
and ``ours`` moved by 0.1-4.6. Here each part of ``ours_hot_xla_add``'s step runs alone in a
40-step scan, graphed, one timed scan per turn, repeated ids and fresh ids taking turns for
``--rounds`` rounds (fresh: each scan the next of ``--sets`` sets drawn alike):

* ``device``: the device-table step (the reference provider), and ``ours_hot_xla_add``: the
  whole cached step;
* ``cold read``: only ``gather_from_host`` of the cold ids (the hot entries out of range,
  filled), summed into a scalar;
* ``cold add, XLA``: only XLA's ``x.at[cold].add`` into the pinned table (as the step does),
  and ``cold add, ours``: ``scatter_add_to_host`` of the same (``ours_hot``'s);
* ``hot part``: only the device cache's side (slot lookup, hot rows gathered, added back).

The prediction, written before it ran: if the pinned rows' data or their address translations
stay warm from the last scan of the same ids, ``cold read`` (and perhaps the adds, which read
the rows too) carries the difference, and ``hot part`` and ``device`` do not.

    python docs/lab/fresh_ids_probe.py [--rounds 6] [--sets 6] [--hot-rows 262144] [--quick]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import pallas_pinned as pp  # noqa: E402
from benchmarks import sparse_hot, sparse_steps, sparse_training, timing  # noqa: E402
from docs.lab.step_kernels_probe import fresh_state  # noqa: E402

GRAPHS = {"xla_gpu_graph_min_graph_size": 1}


def scan_of(body, donate: bool):
    """``state = body(state, ids_t, *rest)`` over a scan's steps, jitted."""
    def run(state, ids, *rest):
        return lax.scan(lambda s, i: (body(s, i, *rest), None), state, ids)[0]
    return jax.jit(run, donate_argnums=0 if donate else ())


def parts(args, table_pinned, hot_ids):
    """name -> (state, jitted fn of (state, ids, *rest), rest, ids of a set -> its input)."""
    rows = args.rows
    entry = np.arange(args.batch, dtype=np.int64)
    hot_np = np.asarray(hot_ids)

    def cold_of(ids):  # the step's cold ids: hot entries sent out of range, distinct
        return np.where(np.isin(ids, hot_np), rows + entry, ids).astype(np.int32)

    fns = sparse_steps.step_fns(args.lr) | sparse_hot.step_fns(args.lr)
    update = jnp.full((args.batch, args.dim), 1e-6, jnp.float32)
    state = sparse_hot.start(table_pinned, hot_ids, "ours_hot_xla_add")
    slot, hot = state["slot"], state["hot"]

    def cold_read(acc, cold, table):
        got = pp.gather_from_host(table, cold, mode="fill", fill_value=0)
        return acc + jnp.sum(got[:, 0])

    def hot_part(cache, i, slot):
        s = slot[i]
        is_hot = s >= 0
        rows_ = cache[jnp.maximum(s, 0)]
        return sparse_hot._add_hot(cache, s, is_hot, 1e-6 * rows_)

    return {
        "device": (None, fns["device"], "targets", lambda ids: ids),
        "ours_hot_xla_add": (None, fns["ours_hot_xla_add"], "targets", lambda ids: ids),
        "cold read": (jnp.zeros((), jnp.float32), scan_of(cold_read, False), (table_pinned,),
                      cold_of),
        "cold add, XLA": ("table", scan_of(lambda x, c: x.at[c].add(update, mode="drop"), True),
                          (), cold_of),
        "cold add, ours": ("table", scan_of(
            lambda x, c: pp.scatter_add_to_host(x, c, update, mode="drop"), True), (), cold_of),
        "hot part": (hot, scan_of(hot_part, True), (slot,), lambda ids: ids),
    }


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--sets", type=int, default=6, help="fresh id sets, used in turn")
    p.add_argument("--hot-rows", type=int, default=1 << 18)
    p.add_argument("--quick", action="store_true", help="the client's --quick sizes (CPU smoke)")
    cli = p.parse_args()
    print(jax.devices()[0].device_kind, "jax", jax.__version__, flush=True)
    args = sparse_training.parse_args(
        ["--hot-rows", str(cli.hot_rows), "--fresh-ids", "--warmup", "0", "--repeats",
         str(cli.sets)] + ["--quick"] * cli.quick)
    table0, ids, targets, ids_np, hot_ids, fresh = sparse_training.make_inputs(args)
    pinned = jax.sharding.make_single_device_sharding(jax.devices()[0], memory_kind="pinned_host")
    print(f"{cli.hot_rows} hot rows; {args.steps} steps of {args.batch} ids; {cli.rounds} rounds "
          f"of one scan each, repeated ids then fresh (one of {len(fresh)} sets); us/step",
          flush=True)
    sharding = ids.sharding
    results = {}
    for name, (state0, fn, rest, input_of) in parts(
            args, jax.device_put(table0, pinned), hot_ids).items():
        if name in ("device", "ours_hot_xla_add"):
            state = fresh_state(name, table0, hot_ids)
        elif state0 == "table":
            state = jax.device_put(table0, pinned)
        else:
            state = state0
        extra = (targets,) if rest == "targets" else rest
        inputs = {"repeated": [jax.device_put(input_of(ids_np), sharding)],
                  "fresh": [jax.device_put(input_of(f), sharding) for f in fresh]}
        compiled = fn.lower(state, inputs["repeated"][0], *extra).compile(GRAPHS)
        state = jax.block_until_ready(compiled(state, inputs["repeated"][0], *extra))  # warm
        times = {"repeated": [], "fresh": []}
        for round_ in range(cli.rounds):
            for mode in ("repeated", "fresh"):
                chosen = inputs[mode][round_ % len(inputs[mode])]
                state, taken = timing.measure(compiled, state, chosen, *extra, repeats=1,
                                              warmup=0)
                times[mode].append(taken.median_s * 1e6 / args.steps)
        results[name] = times
        rep, fr = (statistics.median(times[m]) for m in ("repeated", "fresh"))
        print(f"  {name:18s} repeated {rep:7.1f} (min {min(times['repeated']):.1f}, max "
              f"{max(times['repeated']):.1f})   fresh {fr:7.1f} (min {min(times['fresh']):.1f}, "
              f"max {max(times['fresh']):.1f})   fresh - repeated {fr - rep:+6.1f}", flush=True)
        jax.tree.map(lambda a: a.delete() if isinstance(a, jax.Array) else None, state)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
