"""Contiguous blocks in a loop: our block write and read against XLA's own copy.

    python -m benchmarks.block_probe [--quick] [--rows 64,256,1024] [--row-bytes 1024]
        [--dtype bfloat16] [--xla-option NAME=VALUE] [--out DIR]

Per step of a donated ``lax.scan`` over a pinned_host buffer, a block of
``n`` rows is written at a moving position (or read from one). Variants, in
the same run:

* ``xla_dus``: XLA's best formulation, ``lax.dynamic_update_slice(x,
  device_put(y, Space.Host), (pos, 0))`` (the write) or ``dynamic_slice``
  then ``device_put`` to device (the read);
* ``ours_promise``: ``at(x)[jax.ds(pos, n)].set(y, mode="promise_in_bounds")``,
  what ``auto`` runs: a contiguous block of a host buffer is rows, known distinct
  and ascending (the kernel's, or XLA's own scatter where the backend table picks it);
* ``ours_rows``: ``backend="pallas"``: the block as kernel rows;
* ``ours_wrap``: ``mode="wrap"``, a ring insert (kernel rows);
* reads: ``xla_ds``, ``ours_get`` (the block copy, what ``auto`` runs),
  ``ours_get_rows`` (``backend="pallas"``).

Every variant's final buffer is checked against the ``xla_dus`` one, and every
reader's rows, step by step, against the block at each position (bit for bit, in
an untimed run; the timed one sums each step's rows). docs/PERFORMANCE.md gives
the committed runs (results/block_probe_*.json).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import pallas_pinned as pp
from benchmarks import environment, hlo, report
from pallas_pinned.testing import time_calls

_HOST = jax.memory.Space.Host


def _rows_backend():
    """The kernel rows: Pallas on the GPU, its interpreter elsewhere (--quick on CPU)."""
    return "pallas" if jax.default_backend() == "gpu" else "interpret"


def _writers(n):
    def xla_dus(x, pos, y):
        return lax.dynamic_update_slice(x, jax.device_put(y, _HOST), (pos, 0))

    def ours(mode, backend="auto"):
        return lambda x, pos, y: pp.at(x)[jax.ds(pos, n)].set(y, mode=mode, backend=backend)

    return {
        "xla_dus": xla_dus,
        "ours_promise": ours("promise_in_bounds"),
        "ours_rows": ours("promise_in_bounds", _rows_backend()),
        "ours_wrap": ours("wrap"),
    }


def _readers(n):
    def xla_ds(x, pos):
        return jax.device_put(lax.dynamic_slice_in_dim(x, pos, n), jax.memory.Space.Device)

    def ours(backend):
        return lambda x, pos: pp.at(x)[jax.ds(pos, n)].get(mode="promise_in_bounds",
                                                         backend=backend)

    return {"xla_ds": xla_ds, "ours_get": ours("auto"), "ours_get_rows": ours(_rows_backend())}


def _host(a):
    return jax.device_put(a, jax.sharding.make_single_device_sharding(jax.devices()[0],
                                                               memory_kind="pinned_host"))


def run_case(num_rows, n, width, steps, repeats, compiler_options=None, dtype="float32"):
    rng = np.random.default_rng(0)
    positions = jnp.asarray(rng.integers(0, num_rows - n, steps).astype(np.int32))
    ys = jnp.asarray(rng.standard_normal((steps, n, width)), dtype)
    x0 = np.zeros((num_rows, width), ys.dtype)
    results, finals, step_ops = {}, {}, {}
    for name, write in _writers(n).items():
        def loop(x, write=write):
            return lax.scan(lambda x, a: (write(x, *a), None), x, (positions, ys))[0]

        step = jax.jit(loop, donate_argnums=0).lower(_host(x0)).compile(compiler_options)
        x, seconds = time_calls(step, _host(x0), repeats=repeats, warmup=1)
        step_ops[name] = hlo.kernels_per_step(step.as_text(), steps).ops
        finals[name] = np.asarray(x)  # Host memory already: no device round trip.
        results[name] = [s / steps * 1e6 for s in seconds]
    for name, final in finals.items():
        if not np.array_equal(final, finals["xla_dus"]):
            raise AssertionError(f"{name} wrote a different buffer than xla_dus")
    source = np.asarray(jnp.asarray(rng.standard_normal((num_rows, width)), dtype))
    x = _host(source)
    # The rows each step must read, in order: a reader is checked on every row it
    # returned, bit for bit (a sum would pass rows read in the wrong order).
    expected = np.stack([source[p:p + n] for p in np.asarray(positions)])
    for name, read in _readers(n).items():
        def rows_read(x, read=read):
            return lax.scan(lambda c, p: (c, read(x, p)), 0, positions)[1]

        def loop(x, read=read):  # Timed: each step's rows summed, as in the committed runs.
            return lax.scan(lambda c, p: (c + read(x, p).sum(dtype=jnp.float32), None), 0.0,
                            positions)[0]

        if not np.array_equal(np.asarray(jax.jit(rows_read)(x)), expected):
            raise AssertionError(f"{name} read other rows than the block at each position")
        step = jax.jit(loop).lower(x).compile(compiler_options)
        out, seconds = time_calls(lambda s, x, f=step: f(x), None, x, repeats=repeats)
        # float32 sums in another order: within a bound set by the magnitudes summed.
        tolerance = 1e-5 * float(np.abs(expected.astype(np.float64)).sum())
        if abs(float(out) - float(expected.astype(np.float64).sum())) > tolerance:
            raise AssertionError(f"{name}'s timed program summed {float(out)}, not the rows'")
        results[name] = [s / steps * 1e6 for s in seconds]
    return results, step_ops


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes (CPU smoke test)")
    parser.add_argument("--rows", default=None, help="block sizes, e.g. 64,256,1024")
    parser.add_argument("--row-bytes", type=int, default=1024, help="with --rows")
    parser.add_argument("--dtype", default="float32", help="the buffer's dtype, e.g. bfloat16")
    parser.add_argument("--out", default=None)
    environment.add_xla_option(parser)
    args = parser.parse_args(argv)
    if args.quick:
        cases, steps, repeats, buffer_bytes = [(16, 64)], 4, 2, 1 << 20
    else:
        cases, steps, repeats, buffer_bytes = (
            [(64, 256), (1024, 256), (16384, 64)], 100, 5, 1 << 30
        )
    itemsize = np.dtype(jnp.dtype(args.dtype)).itemsize
    if args.rows:
        cases = [(int(n), args.row_bytes // itemsize) for n in args.rows.split(",")]
    records = []
    print(f"{'rows x bytes':>14} " + " ".join(f"{k:>22}" for k in
          list(_writers(1)) + list(_readers(1))) + "   (us per step, median [min–max])")
    for n, width in cases:
        num_rows = buffer_bytes // (width * itemsize)
        res, step_ops = run_case(num_rows, n, width, steps, repeats, args.compiler_options,
                                 args.dtype)
        med = {k: statistics.median(v) for k, v in res.items()}
        same = step_ops["ours_promise"] == step_ops["xla_dus"]
        records.append({"n": n, "row_bytes": width * itemsize, "dtype": args.dtype,
                        "us": res, "median_us": med,
                        "min_us": {k: min(v) for k, v in res.items()},
                        "max_us": {k: max(v) for k, v in res.items()},
                        "step_ops": step_ops, "promise_same_step_ops_as_xla_dus": same})
        print(f"{n:>7} x {width * itemsize:>4} " + " ".join(
            f"{f'{med[k]:.1f}' + report.span(min(res[k]), max(res[k]), '.1f'):>22}"
            for k in med))
        print(f"    ours_promise's compiled step launches what xla_dus's does: {same} "
              f"({step_ops['ours_promise']} / {step_ops['xla_dus']})")
    meta = {"jax": jax.__version__, "device": str(jax.devices()[0]), "steps": steps,
            "repeats": repeats, "buffer_bytes": buffer_bytes,
            "compiler_options": args.compiler_options}
    if args.out:
        out = pathlib.Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "block_probe.json").write_text(json.dumps({"meta": meta, "records": records},
                                                         indent=1))
    return records


if __name__ == "__main__":
    main()
