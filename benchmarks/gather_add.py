"""Gather and add against their alternatives, in one run on one pinned buffer.

    python -m benchmarks.gather_add [--quick] [--out benchmarks/results]
    python -m benchmarks.gather_add --cpu      # tiny sizes on CPU (CI)

Cases: random unique rows of 4, 512 and 2048 bytes (float32) from/into a
4 GiB pinned buffer (4 MiB with --cpu). Providers:

* ``gather_ours``: ``gather_from_host`` (the kernel reads rows over PCIe);
* ``gather_xla``: ``x[i]`` on the pinned buffer under jit, the indices moved
  to host memory first (jax refuses a gather whose operands live in different
  memory spaces), the rows then moved to the device (XLA tags the gather host
  compute; we have not looked at what it compiles to);
* ``gather_ceiling``: pinned->device copy of a contiguous payload of the
  same bytes (the read-direction PCIe ceiling);
* ``set_ours`` / ``add_ours``: ``scatter_to_host`` and ``scatter_add_to_host``
  on the same case, for the add/set ratio;
* ``add_xla``: ``x.at[i].add(u)`` on the pinned buffer (a GPU scatter-add kernel
  that XLA tags host compute: ``docs/lab/xla_scatter_hlo_probe.py``).

Every provider is checked once per case on sampled rows against the numpy
oracles of ``pallas_pinned.testing`` (the ceiling against its source), then
timed with ``benchmarks.timing``: warm-up, device-synchronized runs, median,
min and max. Prints a table, the issue's two target ratios and ours against XLA
for gather and add (``n/a`` with the reason where a side errored or was wrong); writes
``gather_add.json`` under ``--out``. Exits 1 on any error or wrong result.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import jax
import numpy as np

import pallas_pinned as pp
from benchmarks import checks, environment, report, timing
from pallas_pinned.testing import ScatterSpec, assert_same, gather_oracle, make_indices, make_values

GIB, MIB = 1 << 30, 1 << 20


@dataclasses.dataclass
class Case:
    """One case: its buffer, indices, updates and the rows checked."""

    x: jax.Array
    idx: jax.Array
    upd: jax.Array
    idx_np: np.ndarray
    upd_np: np.ndarray
    sample: checks.RowSample
    label: str
    row_bytes: int
    n: int
    seed: int

    def refill(self) -> None:
        """A fresh buffer after a failed call consumed the donated one."""
        fresh = jax.random.normal(jax.random.key(self.seed + 1), self.x.shape, self.x.dtype)
        self.x = jax.block_until_ready(jax.device_put(fresh, self.x.sharding))


def cases(gpu: bool, quick: bool, cpu_small: bool):
    """``(buffer_bytes, row_bytes, n)`` of each case."""
    buffer_bytes = 4 * GIB if gpu else (4 * MIB if cpu_small else 64 * MIB)
    for row_bytes, n in ((4, 1 << 24), (512, 1 << 20), (2048, 1 << 18)):
        if not gpu:
            n = min(n, 1024 if cpu_small else 4096)
        if quick:
            n //= 4
        yield buffer_bytes, row_bytes, n


def make_case(buffer_bytes: int, row_bytes: int, n: int, seed: int) -> Case:
    device = jax.devices()[0]
    pinned = jax.sharding.make_single_device_sharding(device, memory_kind="pinned_host")
    on_device = jax.sharding.make_single_device_sharding(device, memory_kind="device")
    num_rows, width = buffer_bytes // row_bytes, row_bytes // 4
    # Seeded from plain numbers: the same data on every run and machine.
    rng = np.random.default_rng([seed, row_bytes, n])
    fresh = jax.random.normal(jax.random.key(seed * 7919 + row_bytes), (num_rows, width))
    x = jax.block_until_ready(jax.device_put(fresh, pinned))
    fresh.delete()
    idx = make_indices(rng, ScatterSpec(num_rows, (width,), "float32", n)).astype(np.int32)
    upd = make_values(rng, (n, width), "float32")
    sample = checks.make_row_sample(rng, idx, num_rows, max_written=4096, n_others=1024)
    return Case(x, jax.device_put(idx, on_device), jax.device_put(upd, on_device), idx, upd,
                sample, f"f32 {row_bytes}B n={n}", row_bytes, n, seed)


# ---------------------------------------------------------------------------
# Checks: each returns None when the result is right, else what is wrong


def check_gather(c: Case, got: jax.Array) -> str | None:
    rows = checks.read_rows(c.x, c.sample.rows)
    got_rows = np.asarray(got)[c.sample.hit_positions]
    try:
        assert_same(got_rows, gather_oracle(rows, c.sample.hit_slots), what="gathered rows")
    except AssertionError as err:
        return str(err)
    return None


def _jitted():
    to_device, to_host = jax.memory.Space.Device, jax.memory.Space.Host
    return {
        "gather_ours": jax.jit(lambda x, i: pp.gather_from_host(x, i)),
        "gather_xla": jax.jit(lambda x, i: jax.device_put(x[jax.device_put(i, to_host)],
                                                          to_device)),
        "set_ours": jax.jit(lambda x, i, u: pp.scatter_to_host(x, i, u), donate_argnums=0),
        "add_ours": jax.jit(lambda x, i, u: pp.scatter_add_to_host(x, i, u), donate_argnums=0),
        "add_xla": jax.jit(lambda x, i, u: x.at[i].add(u), donate_argnums=0),
    }


JITTED = _jitted()


def run_provider(c: Case, name: str, reps: int) -> dict:
    """Checks one provider once (compiling it), then times it; errors are recorded."""
    record = {"case": c.label, "provider": name, "row_bytes": c.row_bytes, "n_updates": c.n,
              "status": "ok", "median_s": None, "min_s": None, "max_s": None, "reps": 0,
              "gbps": None, "updates_per_s": None, "correct": None, "check": None, "notes": ""}
    try:
        with environment.captured_output() as out:
            mismatch, (step, state, args) = _check(c, name)
        record["notes"] = environment.first_lines(out["text"])
        state, measured = timing.measure(step, state, *args, repeats=reps, warmup=1)
        if name in ("set_ours", "add_ours", "add_xla"):
            c.x = state
    except Exception as err:  # noqa: BLE001 - recorded as an error; the run fails at the end
        record.update(status="error", error=f"{type(err).__name__}: {err}"[:600])
        if c.x.is_deleted():  # donated to the failed call: the next providers need one
            c.refill()
        return record
    payload = c.n * c.row_bytes
    record.update(correct=mismatch is None, check=mismatch or "sampled rows match the oracle",
                  median_s=measured.median_s, min_s=measured.min_s, max_s=measured.max_s,
                  reps=measured.reps, gbps=payload / measured.median_s / 1e9,
                  updates_per_s=c.n / measured.median_s)
    return record


def _check(c: Case, name: str):
    """One checked call; returns ``(mismatch, (step, state, args))`` for the timing."""
    if name == "gather_ceiling":
        block = jax.device_put(c.upd_np, c.x.sharding)
        to_device = jax.sharding.make_single_device_sharding(c.idx.devices().pop(),
                                                             memory_kind="device")
        copied = jax.device_put(block, to_device)
        mismatch = None if np.asarray(copied).tobytes() == c.upd_np.tobytes() else (
            "the copy differs from its source")
        return mismatch, (lambda s, b: jax.device_put(b, to_device), None, (block,))
    fn = JITTED[name]
    if name.startswith("gather"):
        mismatch = check_gather(c, fn(c.x, c.idx))
        return mismatch, (lambda s, x, i: fn(x, i), None, (c.x, c.idx))
    before = checks.read_rows(c.x, c.sample.rows)
    c.x = jax.block_until_ready(fn(c.x, c.idx, c.upd))
    after = checks.read_rows(c.x, c.sample.rows)
    hits = c.upd_np[c.sample.hit_positions]
    if name == "set_ours":
        mismatch = checks.check_rows(before, after, c.sample, hits, duplicates="last")
    else:
        mismatch = checks.check_added_rows(before, after, c.sample.hit_slots, hits)
    return mismatch, (lambda x, i, u: fn(x, i, u), c.x, (c.idx, c.upd))


PROVIDERS = ("gather_ours", "gather_xla", "gather_ceiling", "set_ours", "add_ours", "add_xla")


def print_results(records: list[dict]) -> None:
    header = ["case", "provider", "median us", "min", "max", "GB/s", "M rows/s", "correct"]
    rows = []
    for r in records:
        if r["status"] != "ok":
            rows.append([r["case"], r["provider"], r["status"], "", "", "", "", "-"])
            continue
        rows.append([r["case"], r["provider"], f"{r['median_s'] * 1e6:.1f}",
                     f"{r['min_s'] * 1e6:.1f}", f"{r['max_s'] * 1e6:.1f}", f"{r['gbps']:.2f}",
                     f"{r['updates_per_s'] / 1e6:.1f}", str(r["correct"])])
    report.print_table(header, rows, "gather and add", left=("case", "provider"))
    print("\ntargets (medians; ratios of checked results only):")
    for case in dict.fromkeys(r["case"] for r in records):
        for line in target_lines(records, case):
            print(f"  {case}: {line}")


def target_lines(records: list[dict], case: str) -> list[str]:
    """The issue's two targets and ours against XLA, each ``n/a (why)`` where a side
    errored, was wrong or did not run."""
    by = {r["provider"]: r for r in records if r["case"] == case}
    lines = []
    for label, num, den, key in (
            ("gather/ceiling", "gather_ours", "gather_ceiling", "gbps"),
            ("add/set throughput", "add_ours", "set_ours", "updates_per_s"),
            ("gather ours/xla throughput", "gather_ours", "gather_xla", "updates_per_s"),
            ("add ours/xla throughput", "add_ours", "add_xla", "updates_per_s")):
        a, b = by.get(num), by.get(den)
        why = "; ".join(f"{name} {w}" for name, r in ((num, a), (den, b))
                        if (w := report.why_unusable(r)))
        if why:
            lines.append(f"{label} n/a ({why})")
            continue
        unit = "GB/s" if key == "gbps" else "M rows/s"
        scale = 1 if key == "gbps" else 1e-6
        lines.append(f"{label} {a[key] / b[key]:.2f}x ({a[key] * scale:.1f} vs "
                     f"{b[key] * scale:.1f} {unit})")
    return lines


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.gather_add",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="a quarter of the rows per case")
    p.add_argument("--cpu", action="store_true", help="force CPU, tiny sizes")
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=environment.REPO / "benchmarks" / "results")
    args = p.parse_args(argv)
    if args.cpu:
        jax.config.update("jax_platforms", "cpu")
    gpu = not args.cpu and environment.has_gpu()
    if not gpu:
        print("note: without a GPU the *_ours providers run XLA's fallback")
    records = []
    for buffer_bytes, row_bytes, n in cases(gpu, args.quick, args.cpu):
        case = make_case(buffer_bytes, row_bytes, n, args.seed)
        try:
            for name in PROVIDERS:
                records.append(run_provider(case, name, args.reps))
        finally:
            if not case.x.is_deleted():
                case.x.delete()
    print_results(records)
    args.out.mkdir(parents=True, exist_ok=True)
    meta = {"quick": args.quick, "cpu": args.cpu, **environment.environment()}
    meta["device"] = meta["device_kind"]
    path = args.out / "gather_add.json"
    report.write_json(path, {"meta": meta, "records": records})
    print("wrote", path)
    failed = [r for r in records if r["status"] == "error" or r["correct"] is False]
    for r in failed:
        print(f"{'ERROR' if r['status'] == 'error' else 'INCORRECT'}: {r['provider']} on "
              f"{r['case']}: {(r.get('error') or r['check'])[:300]}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
