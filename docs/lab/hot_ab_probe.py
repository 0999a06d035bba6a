"""Session 34's A/B of the sparse client's cached providers, interleaved (GPU; lab, not CI).

``benchmarks.sparse_training`` times each provider's five scans back to back, one provider
after another, and on the H100 of 16:38 UTC its cached providers moved by up to 7 µs between
runs. Here the device table, ``ours_hot_distinct``, ``ours_hot_merged`` and (session 35)
``ours_hot_xla_add`` take turns, one scan each per round, for ``--rounds`` rounds at each
cache size, graphed. At the end each table (hot rows flushed) is checked against the device
table's after the same scans.

Then the scatter-max's contention: ``ours_hot_merged`` scatters every entry's code, the hot
ones included (their codes never change, but each is an atomic max, and Zipf ids repeat on
the hottest rows), where ``ours_hot_distinct`` drops the hot entries as out-of-range ids.
Timed alone in a scan over a table-long int32 array: the step's real ids (merged's), the
hot ids sent out of range (distinct's), all ids out of range, and a gather of the ids for
scale. Session 34's second run alternates the providers' order round by round. Session 35
adds ``--turn N``: each provider's turn runs N scans, each timed apart. If only a turn's
first scan is slow, what costs is coming back to a table after the others' (each provider
has a 2 GiB pinned table of its own), not the step. The alternating order puts a round's
last provider first in the next round too; with ``--turn`` above 1 such a turn's first scan
does not come back after another provider, so it is left out of the first scans' figures
(the line says how many turns were kept).

    python docs/lab/hot_ab_probe.py [--rounds 9] [--hot-rows 262144 1048576 8388608]
        [--turn N] [--no-contention] [--quick]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
from jax import lax

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks import sparse_hot, sparse_steps, sparse_training, timing  # noqa: E402
from docs.lab.step_kernels_probe import fresh_state  # noqa: E402

GRAPHS = {"xla_gpu_graph_min_graph_size": 1}
CACHED = ("ours_hot_distinct", "ours_hot_merged", "ours_hot_xla_add")


def ab(table0, ids, targets, hot_ids, rounds: int, lr: float, turn: int = 1) -> dict:
    fns = sparse_steps.step_fns(lr) | sparse_hot.step_fns(lr)
    states = {name: fresh_state(name, table0, hot_ids) for name in ("device", *CACHED)}
    compiled = {name: fns[name].lower(state, ids, targets).compile(GRAPHS)
                for name, state in states.items()}
    # times[name][k]: the k-th scan of each turn (turn > 1: is a turn's first scan slower?)
    times = {name: [[] for _ in range(turn)] for name in states}
    for name in states:  # warm-up, untimed
        states[name] = jax.block_until_ready(compiled[name](states[name], ids, targets))
    last = None
    for round_ in range(rounds):
        # The order alternates (A B C, C B A, ...) so no provider always runs after another.
        for name in (list(states) if round_ % 2 == 0 else list(states)[::-1]):
            for k in range(turn):
                states[name], taken = timing.measure(
                    compiled[name], states[name], ids, targets, repeats=1, warmup=0)
                # With turns of several scans, a first scan that follows the provider's own
                # turn (the alternation's seam) is not a return after the others'.
                if not (turn > 1 and k == 0 and name == last):
                    times[name][k].append(taken.median_s * 1e6 / ids.shape[0])
            last = name
    want = states["device"]
    out = {}
    for name, by_scan in times.items():
        diff = 0.0
        if name != "device":
            got = sparse_hot.table_of(sparse_hot.flush(states[name]))
            diff = sparse_training.max_abs_diff(got, want)
        out[name] = {"median": statistics.median(by_scan[0]), "min": min(by_scan[0]),
                     "max": max(by_scan[0]), "max_abs_diff": diff, "kept": len(by_scan[0]),
                     "later_medians": [statistics.median(us) for us in by_scan[1:]]}
    return out


def contention(ids, hot_ids, num_rows: int, rounds: int) -> dict:
    """µs per step of a scatter-max of codes into a table-long int32 array, and a gather."""
    steps, batch = ids.shape
    entry = jnp.arange(batch, dtype=jnp.int32)
    cold = jnp.where(jnp.isin(ids, jnp.asarray(hot_ids)), ids + num_rows, ids)

    def scan(body):
        def run(code, ids, cold):
            return lax.scan(lambda c, xs: (body(c, *xs), None), code,
                            (ids, cold, jnp.arange(1, steps + 1, dtype=jnp.int32)))[0]
        return jax.jit(run, donate_argnums=0)

    bodies = {  # merged's scatter; distinct's (hot entries dropped); none of it
        "scatter-max, the step's ids": lambda c, i, k, s: c.at[i].max(s * batch + entry),
        "scatter-max, hot ids out of range": lambda c, i, k, s: c.at[k].max(
            s * batch + entry, mode="drop"),
        "scatter-max, all ids out of range": lambda c, i, k, s: c.at[i + num_rows].max(
            s * batch + entry, mode="drop"),
        "gather of the ids (into the code)": lambda c, i, k, s: c.at[i[0]].add(jnp.sum(c[i])),
    }
    out = {}
    for name, body in bodies.items():
        code = jnp.full((num_rows,), -1, jnp.int32)
        compiled = scan(body).lower(code, ids, cold).compile(GRAPHS)
        code, taken = timing.measure(compiled, code, ids, cold, repeats=rounds)
        out[name] = {key: getattr(taken, f"{key}_s") * 1e6 / steps
                     for key in ("median", "min", "max")}
    return out


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--hot-rows", type=int, nargs="+", default=[1 << 18, 1 << 20, 8 << 20])
    p.add_argument("--turn", type=int, default=1,
                   help="scans per provider's turn, each timed apart (session 35)")
    p.add_argument("--no-contention", action="store_true")
    p.add_argument("--quick", action="store_true", help="the client's --quick sizes (a CPU smoke)")
    cli = p.parse_args()
    if cli.turn < 1 or cli.rounds < 1:
        p.error("--turn and --rounds must be >= 1")
    print(jax.devices()[0].device_kind, "jax", jax.__version__, flush=True)
    worst = 0.0
    for hot_rows in cli.hot_rows:
        args = sparse_training.parse_args(["--hot-rows", str(hot_rows)]
                                          + ["--quick"] * cli.quick)
        table0, ids, targets, ids_np, hot_ids, _ = sparse_training.make_inputs(args)
        stats = sparse_hot.cold_stats(ids_np, hot_ids)
        print(f"\n{hot_rows} hot rows: {stats['hot_entry_fraction']:.1%} of the entries hot, "
              f"{stats['cold_distinct_mean']:.0f} distinct cold ids a step; {cli.rounds} "
              "rounds, graphed, us/step", flush=True)
        results = ab(table0, ids, targets, hot_ids, cli.rounds, args.lr, cli.turn)
        device = results["device"]["median"]
        for name, r in results.items():
            worst = max(worst, r["max_abs_diff"])
            first = f"scan 1 of {r['kept']} turns: " if cli.turn > 1 else ""
            print(f"  {name:20s} {r['median']:7.1f} ({first}min {r['min']:.1f}, max {r['max']:.1f})"
                  f"  {r['median'] / device:5.2f}x device  max|diff| {r['max_abs_diff']:.2e}"
                  + "".join(f"; scan {k + 2} of a turn {us:.1f}"
                            for k, us in enumerate(r["later_medians"])), flush=True)
        if hot_rows == cli.hot_rows[0] and not cli.no_contention:
            print("  contention, one op in a scan of the same ids:", flush=True)
            for name, r in contention(ids, hot_ids, args.rows, cli.rounds).items():
                print(f"  {name:36s} {r['median']:6.2f} (min {r['min']:.2f}, max "
                      f"{r['max']:.2f})", flush=True)
    ok = worst <= 1e-5
    print(f"\nchecked against the device table: max|diff| {worst:.2e}: "
          + ("ok" if ok else "FAILED"))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
