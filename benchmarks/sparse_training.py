"""Sparse training: SGD on an embedding table in pinned host memory, ours against XLA and device.

    python -m benchmarks.sparse_training          # 8 Mi x 64 float32 (2 GiB), ~1 min on an H200
    python -m benchmarks.sparse_training --quick  # a tiny table, on CPU too (CI)

The client this library is for: an embedding table too big for the GPU lives
in pinned host memory, and each step touches a few thousand of its rows. Step
``t`` takes ``--batch`` ids drawn from a Zipf distribution (fixed seed; the
popular ids are spread over the table by a fixed permutation), gathers their
rows, computes the gradient of ``0.5 * mean_b ||row_b - target_b||^2`` with
respect to the gathered rows on the GPU (``jax.grad``), and adds
``-lr * grad`` back into the rows (repeated ids add up, as in any sparse
SGD). ``--steps`` steps run in one jitted ``lax.scan`` whose carry is the
table, donated to the call. Providers, in the same run, from the same initial
table and the same ids and targets:

* ``ours``: ``gather_from_host`` and ``scatter_add_to_host`` on the pinned table
  (``backend="auto"``); ``ours_kernels``: the same with ``backend="pallas"``;
* ``ours_sorted``: the same ops sharing one order of the step's ids
  (``sort_indices``, then ``indices_are_sorted=True`` for both, the targets
  permuted alike): the gather reads in ascending address order, and the add
  does not order the ids again;
* ``ours_distinct``: the same training written to read each distinct row once
  and write it once (``sparse_steps.distinct_rows``; the rows gathered, ``jax.grad``
  through ``values[inverse]`` summing each row's gradients, the new rows
  written by ``scatter_to_host``, all promised sorted and unique): no add, so
  no second read of the rows; ``device_distinct``: that formulation on the
  device table (the 2x target is judged against the faster device step);
* ``ours_hot``, ``ours_hot_distinct``, ``ours_hot_merged`` and ``ours_hot_xla_add``: a
  client's cache, the ``--hot-rows`` ids most frequent in a profile window kept in device
  memory, the other ids through our gather and our writes, or XLA's own add for
  ``ours_hot_xla_add`` (``benchmarks/sparse_hot.py`` says how each writes them); their hot rows
  are written back (untimed) before the check;
* ``xla``: XLA's own path on the pinned table: ``table[ids]`` with the ids
  moved to host memory (jax refuses a gather whose operands live in different
  memory spaces) and the rows moved to the device, then ``table.at[ids].add``;
* ``device``: the same training with the table in device memory (``jnp.take``
  and ``.at[ids].add``): what the step costs when the table fits on the GPU;
* ``transfer``: the measured floor of moving the rows: each step's distinct rows,
  sorted before the scan (padded with out-of-range ids, which move nothing), read
  by ``gather_from_host`` and each written into the next one by ``scatter_to_host``
  (``sparse_steps.transfer_rows``; both promised sorted and unique): a read and a
  write of the distinct rows, nothing else, which changes the table as numpy replays it.

Correctness: after one scan from the same initial table (normal, scale ``1/sqrt(dim)``; targets
alike), every provider's table is compared with the device table (``transfer``'s, bit for bit,
with its steps replayed in numpy); the largest absolute difference is printed and recorded, and
above ``--tolerance`` (1e-5) times ``max(1, max |device table|)`` the run fails. The ~400
updates a popular row gets per step are summed in another order by each provider: float32
rounding, a few 1e-7 at this scale (a few 1e-6 with a unit-scale table), while one lost update
moves an element by ``lr * |row - target| / batch``, ~2e-5. Timing: a warm-up scan, then
``--repeats`` device-synchronized scans (``benchmarks.timing``); median, min and max per step.
Each warm-up and timed scan draws ids of its own, drawn alike (the same permutation and hot set;
the floor and cache figures printed are the checked scan's), as a training's steps do;
``--repeated-ids`` repeats the checked scan's ids in every scan instead, as every run before
2026-12-06 22:26 UTC did. That flatters the steps that touch pinned rows: on an H100 the cached
providers took 5-12.5 us a step less with repeated ids
(``benchmarks/results/sparse_fresh_h100_1206_2226/``). The nominal PCIe floor of a step is its
distinct rows read once and written once, ``2 * distinct * row_bytes``, at ``--pcie-gbps``, a
rate given, not measured in the run (the H200's copies in earlier runs: 55.0 GB/s
device->pinned, 49.3 pinned->device); a bound that scattered rows do not reach, which
``transfer`` measures. A CPU run gives no ratio to it. Writes ``sparse_training.json`` under
``--out``; exits 1 on an error or a difference over the tolerance. Where the ``device`` provider
errors there is no reference: every other table is recorded unchecked (``correct`` None, with a
note), the run fails, and the summary gives no ratio or verdict that would need one.
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import environment, report, sparse_hot, timing
from benchmarks.sparse_report import (  # noqa: F401 - tests call summarize here
    checked_us,
    exit_status,
    print_table,
    summarize,
    why_missing,
)
from benchmarks.sparse_steps import (  # noqa: F401 - tests and docs/lab probes import them here
    DEVICE_STEPS,
    _sgd_scan,
    _xla_read,
    distinct_padded,
    step_fns,
    transfer_replay,
    transfer_rows,
)
from pallas_pinned._registry import measured_choice

MIB = 1 << 20
# The device table first: the reference. "ours" is backend="auto" (what the
# shipped table picks); "ours_kernels" forces the Pallas kernels for both ops
# (their interpreter off the GPU); "transfer" moves the distinct rows and nothing else.
PROVIDERS = ("device", "device_distinct", "ours", "ours_sorted", "ours_distinct",
             *sparse_hot.PROVIDERS, "ours_kernels", "xla", "transfer")
REFERENCE = "device"  # its table is the one every other provider's is checked against
# The floor's rate as printed and recorded: --pcie-gbps is a number given, not a measurement.
NOMINAL_RATE = ("%g GB/s (nominal: --pcie-gbps, not measured in this run; the H200's copies "
                "in earlier runs: 55.0 D2H, 49.3 H2D GB/s)")
# hot_rows: the ids whose rows the ours_hot providers keep in device memory (2**18 of 8 Mi
# rows: 64 MiB, 3 % of the table).
FULL = {"rows": 8 << 20, "dim": 64, "batch": 4096, "steps": 40, "repeats": 5,
        "hot_rows": 1 << 18}
QUICK = {"rows": 1 << 14, "dim": 16, "batch": 256, "steps": 8, "repeats": 2, "hot_rows": 1 << 10}


def zipf_ranks(rng: np.random.Generator, rows: int, shape: tuple[int, ...], s: float) -> np.ndarray:
    """Ranks with ``P(rank k) ~ (k + 1) ** -s`` over ``rows`` ids."""
    weights = np.arange(1, rows + 1, dtype=np.float64) ** -s
    cdf = np.cumsum(weights)
    cdf /= cdf[-1]
    return np.minimum(np.searchsorted(cdf, rng.random(shape)), rows - 1)


def zipf_spread(rng: np.random.Generator, rows: int, shape: tuple[int, ...],
                s: float) -> tuple[np.ndarray, np.ndarray]:
    """:func:`zipf_ids`, and the permutation that spreads the ranks over the table (rank
    ``k`` is id ``spread[k]``)."""
    ranks = zipf_ranks(rng, rows, shape, s)
    spread = rng.permutation(rows).astype(np.int32)
    return spread[ranks], spread


def zipf_ids(rng: np.random.Generator, rows: int, shape: tuple[int, ...], s: float) -> np.ndarray:
    """Ids with ``P(rank k) ~ (k + 1) ** -s`` over ``rows`` ids, ranks spread by a permutation."""
    return zipf_spread(rng, rows, shape, s)[0]


# Looked up by name at run time (a test swaps in a broken one).
JITTED: dict = {}


def distinct_per_step(ids: np.ndarray) -> np.ndarray:
    return np.array([np.unique(row).size for row in ids])


def pcie_floor_us(distinct: np.ndarray, row_bytes: int, gbps: float) -> float:
    """Mean per step: each distinct row read once and written once at ``gbps``."""
    return float(np.mean(2 * distinct * row_bytes) / (gbps * 1e9) * 1e6)


def max_abs_diff(a: jax.Array, reference: jax.Array) -> float:
    """Largest ``|a - reference|`` in device memory. ``a`` moves by memory space: jax 0.12.1's
    CPU runtime refuses a jit's pinned_host output for a sharding of kind "device"."""
    a_dev = jax.device_put(a, jax.memory.Space.Device)
    diff = float(jnp.max(jnp.abs(a_dev.astype(jnp.float32) - reference.astype(jnp.float32))))
    if a_dev is not a:
        a_dev.delete()
    return diff


def run_provider(name: str, table: jax.Array, ids, targets, args, reference, *,
                 tolerance: float | None = None, checked_against: str = "device table",
                 timed_inputs: list[tuple] | None = None) -> dict:
    """Compiles, runs once (checked against ``reference``), then times.

    ``timed_inputs`` (fresh ids, the default): one ``(ids, targets)`` per warm-up and timed scan, in
    turn, in place of the checked scan's.

    The :data:`REFERENCE` provider's table is the one the others are checked against
    (returned under ``"reference"``). Any other provider with no ``reference`` (the
    reference's provider errored) is recorded unchecked: ``correct`` None, with a note.
    ``tolerance`` defaults to ``--tolerance`` times the device table's scale.
    """
    is_reference = name == REFERENCE
    record = {"provider": name, "status": "ok", "us_per_step": None, "us_min": None,
              "us_max": None, "runs": 0, "compile_s": None, "first_run_s": None,
              "memory_kind": None, "max_abs_diff_vs_device": None, "correct": None,
              "is_reference": is_reference,
              "checked_against": None if reference is None else checked_against}
    if reference is None and not is_reference:
        record["note"] = "unchecked: no reference table (the device provider errored)"
    fn = JITTED.get(name) or (step_fns(args.lr) | sparse_hot.step_fns(args.lr))[name]
    kept = None
    hot = name in sparse_hot.PROVIDERS  # its state: the table and its device cache
    try:
        state = sparse_hot.start(table, args.hot_ids, name) if hot else table
        t0 = time.perf_counter()
        compiled = fn.lower(state, ids, targets).compile(args.compiler_options or None)
        record["compile_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        state = jax.block_until_ready(compiled(state, ids, targets))
        record["first_run_s"] = time.perf_counter() - t0
        if hot:  # the hot rows written back for the check, untimed (sparse_hot's doc)
            state = sparse_hot.flush(state)
        table = sparse_hot.table_of(state)
        record["memory_kind"] = table.sharding.memory_kind
        if is_reference:
            kept = jnp.copy(table)  # the reference the others are checked against
            args.reference_scale = float(jnp.max(jnp.abs(kept)))
        elif reference is not None:
            diff = max_abs_diff(table, reference)
            record["max_abs_diff_vs_device"] = diff
            record["tolerance"] = (args.tolerance * max(1.0, args.reference_scale)
                                   if tolerance is None else tolerance)
            # The table stays where the provider put it: device memory for the device
            # steps, pinned host memory for every other.
            record["expected_memory_kind"] = "device" if name in DEVICE_STEPS else "pinned_host"
            record["correct"] = bool(diff <= record["tolerance"]) and (
                record["memory_kind"] == record["expected_memory_kind"])
        slow = record["first_run_s"] > args.max_run_s
        state, measured = timing.measure(
            lambda x, i, t: compiled(x, i, t), state, ids, targets,
            repeats=1 if slow else args.repeats, warmup=0 if slow else args.warmup,
            prepare=itertools.cycle(timed_inputs).__next__ if timed_inputs else None)
        jax.tree.map(lambda a: a.delete(), state)
    except Exception as err:  # noqa: BLE001 - recorded as an error; the run fails at the end
        record["status"] = "error"
        record["error"] = f"{type(err).__name__}: {err}"[:600]
        if kept is not None:  # a reference that failed its timing checks nothing
            kept.delete()
        return record | {"reference": None}
    per_step = 1e6 / args.steps
    record.update(us_per_step=measured.median_s * per_step, us_min=measured.min_s * per_step,
                  us_max=measured.max_s * per_step, runs=measured.reps)
    return record | {"reference": kept}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.sparse_training",
                                description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--quick", "--smoke", action="store_true",
                   help=f"tiny sizes, on CPU too: {QUICK}")
    p.add_argument("--cpu", action="store_true", help="force the CPU (implies --quick sizes)")
    p.add_argument("--rows", type=int, default=None, help=f"table rows ({FULL['rows']})")
    p.add_argument("--dim", type=int, default=None, help=f"row width ({FULL['dim']})")
    p.add_argument("--batch", type=int, default=None, help=f"ids per step ({FULL['batch']})")
    p.add_argument("--steps", type=int, default=None, help=f"steps per scan ({FULL['steps']})")
    p.add_argument("--repeats", type=int, default=None, help=f"timed scans ({FULL['repeats']})")
    p.add_argument("--warmup", type=int, default=1, help="untimed scans after the checked one")
    p.add_argument("--zipf-s", type=float, default=1.1, help="Zipf exponent of the ids")
    ids = p.add_mutually_exclusive_group()
    ids.add_argument("--repeated-ids", action="store_true",
                     help="every warm-up and timed scan repeats the checked scan's ids (the runs "
                     "before 2026-12-06 22:26 UTC); by default each draws ids of its own (the same "
                     "distribution and hot set)")
    ids.add_argument("--fresh-ids", action="store_true",
                     help="each scan draws ids of its own: the default, named explicitly")
    p.add_argument("--hot-rows", type=int, default=None,
                   help=f"rows the ours_hot providers keep in device memory ({FULL['hot_rows']})")
    p.add_argument("--lr", type=float, default=0.5)
    p.add_argument("--tolerance", type=float, default=1e-5,
                   help="largest allowed |table - device table| after one scan, times "
                   "max(1, max |device table|)")
    p.add_argument("--pcie-gbps", type=float, default=53.0,
                   help="nominal PCIe rate for the floor, not measured in the run (H200 copies "
                   "in earlier runs: 55.0 D2H, 49.3 H2D GB/s)")
    p.add_argument("--max-run-s", type=float, default=20.0,
                   help="a provider whose scan is slower is timed once")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=environment.REPO / "benchmarks" / "results")
    environment.add_xla_option(p)
    args = p.parse_args(argv)
    args.fresh_ids = not args.repeated_ids
    if args.cpu:
        jax.config.update("jax_platforms", "cpu")
    args.gpu = not args.cpu and environment.has_gpu()
    sizes = QUICK if (args.quick or not args.gpu) else FULL
    for key, value in sizes.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if (min(args.rows, args.dim, args.batch, args.steps, args.repeats, args.hot_rows) < 1
            or args.warmup < 0):
        p.error("sizes, --steps, --repeats and --hot-rows must be >= 1, --warmup >= 0")
    return args


def make_inputs(args):
    """Initial table (device), ids and targets (device), ids as numpy, the hot ids (the most
    frequent of a profile window drawn apart, spread by the same permutation), and with
    fresh ids (the default) one more set of ids per warm-up and timed scan, drawn apart too."""
    rng = np.random.default_rng([args.seed, args.rows, args.dim, args.batch])
    ids, spread = zipf_spread(rng, args.rows, (args.steps, args.batch), args.zipf_s)
    profile = zipf_ranks(np.random.default_rng([args.seed, args.rows, 1]), args.rows,
                         (sparse_hot.PROFILE_STEPS, args.batch), args.zipf_s)
    hot_ids = sparse_hot.most_frequent(spread[profile], args.hot_rows, args.rows)
    fresh_rng = np.random.default_rng([args.seed, args.rows, 2])
    fresh = [spread[zipf_ranks(fresh_rng, args.rows, ids.shape, args.zipf_s)]
             for _ in range(args.warmup + args.repeats if args.fresh_ids else 0)]
    scale = np.float32(1 / np.sqrt(args.dim))  # the usual embedding initialization
    targets = (scale * rng.standard_normal((args.steps, args.batch, args.dim))).astype(np.float32)
    device = jax.devices()[0]
    on_device = jax.sharding.make_single_device_sharding(device, memory_kind="device")
    table = scale * jax.random.normal(jax.random.key(args.seed), (args.rows, args.dim),
                                      jnp.float32)
    return (jax.block_until_ready(table), jax.device_put(ids, on_device),
            jax.device_put(targets, on_device), ids, hot_ids, fresh)


def main(argv=None) -> int:
    args = parse_args(argv)
    args.reference_scale = 1.0
    if not args.gpu and not args.quick:
        print("no GPU found: on CPU, with the quick sizes where none is given")
    started = time.monotonic()
    table0, ids, targets, ids_np, args.hot_ids, fresh = make_inputs(args)
    row_bytes = args.dim * 4
    distinct = distinct_per_step(ids_np)
    floor_us = pcie_floor_us(distinct, row_bytes, args.pcie_gbps)
    pinned = jax.sharding.make_single_device_sharding(jax.devices()[0], memory_kind="pinned_host")
    print(f"sparse training: table {args.rows} x {args.dim} float32 "
          f"({report.format_bytes(args.rows * row_bytes)}) in pinned host memory; {args.steps} "
          f"steps of {args.batch} Zipf(s={args.zipf_s}) ids in one lax.scan; {args.repeats} "
          f"timed scans", flush=True)
    print(f"distinct ids per step: mean {distinct.mean():.0f}, min {distinct.min()}, max "
          f"{distinct.max()} of {args.batch}; nominal PCIe floor {floor_us:.1f} us/step: "
          f"distinct rows read + written, {row_bytes} B each, at {NOMINAL_RATE % args.pcie_gbps}"
          + ("" if args.gpu else "; a GPU figure: no ratio to it on CPU"), flush=True)
    cache = sparse_hot.cold_stats(ids_np, args.hot_ids) | {
        "hot_rows": int(args.hot_ids.size), "hot_bytes": int(args.hot_ids.size) * row_bytes,
        "profile_steps": sparse_hot.PROFILE_STEPS}
    print(f"ours_hot*: the {cache['hot_rows']} ids most frequent in a profile window of "
          f"{cache['profile_steps']} steps keep their rows in device memory "
          f"({report.format_bytes(cache['hot_bytes'])}): {cache['hot_entry_fraction']:.1%} of "
          f"the entries; distinct cold ids per step: mean {cache['cold_distinct_mean']:.0f}",
          flush=True)
    if fresh:
        print(f"fresh ids: each of the {len(fresh)} warm-up and timed scans draws ids of its "
              f"own; the checked scan's ids above", flush=True)
    else:
        print("--repeated-ids: every warm-up and timed scan repeats the checked scan's ids",
              flush=True)
    records, reference = [], None
    # One shape for every set's transfer rows: the widest step of the checked or a fresh set.
    width = max(int(d.max()) for d in [distinct, *map(distinct_per_step, fresh)])
    moves = transfer_rows(ids_np, args.rows, width)
    timed = [(jax.device_put(f, ids.sharding), targets) for f in fresh] or None
    timed_moves = [(jax.device_put(transfer_rows(f, args.rows, width), ids.sharding), targets)
                   for f in fresh] or None
    for name in PROVIDERS:
        table = jnp.copy(table0) if name in DEVICE_STEPS else jax.device_put(table0, pinned)
        if name == "transfer":  # rows shifted by one, bit for bit as numpy replays them
            replayed = transfer_replay(table0, moves)
            result = run_provider(name, table, jax.device_put(moves, ids.sharding), targets,
                                  args, replayed, tolerance=0.0, checked_against="numpy replay",
                                  timed_inputs=timed_moves)
            replayed.delete()
        else:
            result = run_provider(name, table, ids, targets, args, reference,
                                  timed_inputs=timed)
        if name == REFERENCE:
            reference = result["reference"]
        del result["reference"]
        records.append(result)
    if reference is not None:
        reference.delete()
    summary = summarize(records, floor_us, on_gpu=args.gpu,
                        cache_holds_table=args.hot_ids.size >= args.rows)
    meta = {"benchmark": "sparse_training", "argv": sys.argv[1:], "rows": args.rows,
            "dim": args.dim, "batch": args.batch, "steps": args.steps, "repeats": args.repeats,
            "warmup": args.warmup, "fresh_ids": args.fresh_ids, "zipf_s": args.zipf_s,
            "lr": args.lr, "seed": args.seed,
            "tolerance": args.tolerance, "table_bytes": args.rows * row_bytes,
            "compiler_options": args.compiler_options,
            # What ``ours`` ran: choose_backends reads a run under a table with XLA's add
            # path as the client's verdict on that path.
            "backend_table": environment.backend_table(),
            "auto_choices": {op: measured_choice(op, jnp.float32, args.batch)
                             for op in ("gather", "add")},
            "distinct_ids_per_step": {"mean": float(distinct.mean()), "min": int(distinct.min()),
                                      "max": int(distinct.max())},
            "hot_cache": cache, "pcie_gbps": args.pcie_gbps, "pcie_floor_us_per_step": floor_us,
            "pcie_floor_basis": NOMINAL_RATE % args.pcie_gbps,
            "loss": "0.5 * mean_b ||row_b - target_b||^2, grad w.r.t. the gathered rows",
            **environment.environment()}
    args.out.mkdir(parents=True, exist_ok=True)
    out = args.out / "sparse_training.json"
    report.write_json(out, {"meta": meta, "records": records, "summary": summary})
    print_table(records, floor_us if args.gpu else None)
    print("\n".join(summary["lines"]))
    print(f"wrote {out} in {time.monotonic() - started:.0f} s")
    return exit_status(records)


if __name__ == "__main__":
    sys.exit(main())
