"""Tune: where sorting the indices starts to pay, measured through ``pallas_pinned.tuning``.

    python -m benchmarks.tune [--only crossover] [--out DIR]   # on the GPU (~2 min)
    python -m benchmarks.tune --cpu                              # tiny, in the interpreter (CI)

The thresholds of ``pallas_pinned.tuning.Thresholds`` are set from these
studies. Each study times the same op on the same unique random rows with a
path forced on and off by ``tuning.override`` (inside the traced function, so
each setting is its own program), over batch sizes:

* ``crossover`` (scatter_to_host, ``sort_from``): sorted (``sort_from=0``)
  against unsorted (a ``sort_from`` no batch reaches);
* ``crossover_add`` (scatter_add_to_host), likewise;
* ``crossover_gather`` (gather_from_host), likewise;
* ``fused_set`` (scatter_to_host with a quarter of the rows repeated,
  ``fused_max_updates``): the one launch (``fused_max_updates=n``) against the
  sort and the row kernel (``fused_max_updates=0``).

Every variant's result is checked on sampled rows against the numpy oracles
of ``pallas_pinned.testing`` before it is timed; an error or a wrong result
makes the exit status 1. The kernel's tile shapes are not tuned here: the
library exposes no public setting for them.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import jax
import numpy as np

import pallas_pinned as pp
from benchmarks import checks, environment, report, timing
from pallas_pinned import tuning
from pallas_pinned.testing import ScatterSpec, assert_same, gather_oracle, make_indices, make_values

GIB, MIB = 1 << 30, 1 << 20
STUDIES = ("crossover", "crossover_add", "crossover_gather", "fused_set")
_OP = {"crossover": "set", "crossover_add": "add", "crossover_gather": "gather",
       "fused_set": "set"}
_THRESHOLD = {"crossover": "sort_from", "crossover_add": "sort_from",
              "crossover_gather": "sort_from", "fused_set": "fused_max_updates"}
# A threshold no batch reaches: the path it guards is never taken.
NEVER = 2**62


def variants(study: str, n: int) -> list[tuple[str, bool, dict]]:
    """``(flag name, flag, tuning overrides)`` of the two paths a study compares."""
    if study == "fused_set":
        return [("fused", True, {"fused_max_updates": n}),
                ("fused", False, {"fused_max_updates": 0})]
    return [("sorted", True, {"sort_from": 0}), ("sorted", False, {"sort_from": NEVER})]


def op_fn(op: str, backend: str, unique: bool, overrides: dict):
    """The op under ``tuning.override(**overrides)``, jitted (scatters donate the buffer)."""

    def call(x, i, *u):
        with tuning.override(**overrides):
            if op == "gather":
                return pp.gather_from_host(x, i, unique_indices=unique, backend=backend)
            scatter = pp.scatter_to_host if op == "set" else pp.scatter_add_to_host
            return scatter(x, i, *u, unique_indices=unique, backend=backend)

    return jax.jit(call, donate_argnums=() if op == "gather" else 0)


def check(op: str, before, after, sample, hits) -> str | None:
    if op == "set":
        return checks.check_rows(before, after, sample, hits, duplicates="last")
    if op == "add":
        return checks.check_added_rows(before, after, sample.hit_slots, hits)
    try:  # gather: ``after`` holds the gathered rows at the sampled positions
        assert_same(after, gather_oracle(before, sample.hit_slots), what="gathered rows")
    except AssertionError as err:
        return str(err)
    return None


def measure_variant(x, idx, upd, sample, upd_np, study, n, backend, repeats, flag_name, flag,
                    overrides):
    """Checks one variant once, then times it; returns ``(x, record)``."""
    op = _OP[study]
    fn = op_fn(op, backend, unique=study != "fused_set", overrides=overrides)
    row_bytes = int(np.prod(x.shape[1:], dtype=np.int64)) * x.dtype.itemsize
    record = {"study": study, "op": op, "row_bytes": row_bytes, "n_updates": n,
              flag_name: flag, "overrides": overrides, "threshold": _THRESHOLD[study],
              "backend": backend, "status": "ok", "correct": None}
    try:
        before = checks.read_rows(x, sample.rows)
        if op == "gather":
            after = np.asarray(fn(x, idx))[sample.hit_positions]
            # The state carries the rows gathered, so each timed call waits for them.
            (x, _), measured = timing.measure(lambda s, i: (s[0], fn(s[0], i)), (x, None), idx,
                                              repeats=repeats)
        else:
            x = jax.block_until_ready(fn(x, idx, upd))
            after = checks.read_rows(x, sample.rows)
            x, measured = timing.measure(fn, x, idx, upd, repeats=repeats)
    except Exception as err:  # noqa: BLE001 - recorded as an error; the run fails at the end
        record.update(status="error", error=f"{type(err).__name__}: {err}"[:600])
        return x, record
    mismatch = check(op, before, after, sample, upd_np[sample.hit_positions])
    record.update(correct=mismatch is None, check=mismatch or "sampled rows match the oracle",
                  median_s=measured.median_s, min_s=measured.min_s, max_s=measured.max_s,
                  reps=measured.reps, updates_per_s=n / measured.median_s)
    return x, record


def run_study(study: str, args, records: list[dict]) -> None:
    device = jax.devices()[0]
    pinned = jax.sharding.make_single_device_sharding(device, memory_kind="pinned_host")
    on_device = jax.sharding.make_single_device_sharding(device, memory_kind="device")
    counts = args.dedupe_counts if study == "fused_set" else args.counts
    pattern = "random_dup25" if study == "fused_set" else "random_unique"
    for row_bytes in args.row_bytes:
        width = row_bytes // 4
        num_rows = args.buffer_bytes // row_bytes
        # Seeded from plain numbers: the same data on every run and machine.
        rng = np.random.default_rng([args.seed, STUDIES.index(study), row_bytes])
        fresh = jax.random.normal(jax.random.key(args.seed), (num_rows, width))
        x = jax.block_until_ready(jax.device_put(fresh, pinned))
        fresh.delete()
        for n in counts:
            spec = ScatterSpec(num_rows, (width,), "float32", n, pattern)
            idx_np = make_indices(rng, spec).astype(np.int32)
            upd_np = make_values(rng, (n, width), "float32")
            sample = checks.make_row_sample(rng, idx_np, num_rows, max_written=4096,
                                            n_others=1024)
            idx, upd = jax.device_put(idx_np, on_device), jax.device_put(upd_np, on_device)
            for flag_name, flag, overrides in variants(study, n):
                x, rec = measure_variant(x, idx, upd, sample, upd_np, study, n, args.backend,
                                         args.repeats, flag_name, flag, overrides)
                records.append(rec)
                if x.is_deleted():  # a failed call consumed the donated buffer
                    fresh = jax.random.normal(jax.random.key(args.seed + 1), (num_rows, width))
                    x = jax.block_until_ready(jax.device_put(fresh, pinned))
                print(_line(rec), flush=True)
        x.delete()


def _line(r: dict) -> str:
    name = "sorted" if "sorted" in r else "fused"
    head = f"{r['study']:16} row={r['row_bytes']:5d}B n={r['n_updates']:8d} {name}={r[name]!s:5}"
    if r["status"] != "ok":
        return f"{head}: {r['error']}"
    return (f"{head}: "
            f"{r['median_s'] * 1e6:9.1f} us (min {r['min_s'] * 1e6:.1f}, max "
            f"{r['max_s'] * 1e6:.1f}) {r['updates_per_s'] / 1e6:8.1f} M/s correct={r['correct']}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.tune",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--cpu", action="store_true",
                   help="force CPU: a 4 MiB buffer, 8-byte rows, two batch sizes, backend "
                   "'interpret'")
    p.add_argument("--buffer-gib", type=float, default=None, help="default 4 (GPU)")
    p.add_argument("--only", choices=STUDIES, default=None)
    p.add_argument("--backend", choices=("pallas", "triton", "interpret"), default=None,
                   help="default pallas on GPU, interpret on CPU")
    p.add_argument("--repeats", type=int, default=None, help="timed runs (20; 3 on CPU)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=environment.REPO / "benchmarks" / "results")
    args = p.parse_args(argv)
    if args.cpu:
        jax.config.update("jax_platforms", "cpu")
    gpu = not args.cpu and environment.has_gpu()
    if not gpu and not args.cpu:
        print("no GPU found: running the tiny CPU studies (as with --cpu)")
    args.backend = args.backend or ("pallas" if gpu else "interpret")
    args.buffer_bytes = int((args.buffer_gib or (4.0 if gpu else 1 / 256)) * GIB)
    args.repeats = args.repeats or (20 if gpu else 3)
    args.row_bytes = (4, 512) if gpu else (8,)
    args.counts = (16, 256, 1024, 4096, 16384, 65536, 1 << 20) if gpu else (16, 64)
    args.dedupe_counts = (8, 16, 32, 64, 128, 256) if gpu else (16,)
    records: list[dict] = []
    for study in [args.only] if args.only else STUDIES:
        run_study(study, args, records)
    meta = {"buffer_bytes": args.buffer_bytes, "backend": args.backend,
            "repeats": args.repeats, **environment.environment()}
    meta["device"], meta["date"] = meta["device_kind"], meta["date_utc"][:10]
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "tune_scatter.json"
    report.write_json(path, {"meta": meta, "records": records})
    print(f"wrote {path} ({len(records)} records)")
    failed = [r for r in records if r["status"] == "error" or r["correct"] is False]
    for r in failed:
        print(f"{'ERROR' if r['status'] == 'error' else 'INCORRECT'}: {_line(r)} "
              f"{r.get('check') or ''}"[:400])
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
