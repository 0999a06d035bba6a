"""Lab probe of 2026-12-04 (session 12): resolve duplicates on the host, where XLA's path writes.

Not a benchmark of the project (no CPU test, no report). On a GPU, from the repository root:

    PYTHONPATH=.:docs/lab python docs/lab/host_dedup_probe.py [--xla-option NAME=VALUE]

Question. XLA compiles a scatter into a pinned buffer as host compute: the step ships rows and
updates by DMA and the CPU applies them, overlapped with the next step. Session 11's
``xla_path_dedup_probe`` put our duplicate work (``n x n`` check, sort) on the GPU in front of
that path and always lost: 1.9-26 us per step in the step's stream. Here the same work runs
inside the host computation (``compute_on("device_host")``), where it costs CPU time that
overlaps the next step instead of GPU time in this one.

Predictions (written before the first run):
- set: the host-side ``n x n`` check (64-256 rows) or stable sort (1024+) costs the CPU
  1-20 us, which the overlap hides while the CPU keeps up with the step: within 1 us of XLA's
  bare set (6.1 / 10.6 / 29.1 us at 64 / 256 / 1024 x 1 KiB), below ``auto`` (7.8 / 13.4 /
  36.4), and the last duplicate wins (check "ok" where the bare set says "DIFFERS").
- add: combining duplicates on the host by a sort costs the CPU more than the scatter-add
  itself; at 4096 rows the CPU is the bottleneck and it loses. On the Zipf client, where the
  bare host add took 699.5 us (repeats), host-side combining cures it only if the CPU sort of
  4096 ids is cheaper than the repeats' slowdown.
- the explicit ``compute_on`` may itself cost what session 11's explicit host operands cost
  (``host_add`` 20.7 against 7.5 us at 64 rows); a bare set under ``compute_on`` shows that.

Outcome (H200, jax 0.11.2, 2026-12-04; logs beside this file). The premise was wrong.
- The first full run (18:35 UTC, tree ``92d7a9a``, graphed, ``host_dedup_probe_h200_1835.log``)
  compiled and checked its first case, 5 x 4 B on the 1 GiB buffer, then ran out of its
  420 s before the first timing finished. Only XLA's bare set "DIFFERS" from ``auto``: every
  host computation kept the last duplicate.
- The explicit host computation costs in proportion to the buffer, not to the write. Set of
  64 x 1 KiB, us per step (18:44 UTC, tree ``35b8bff``, XLA's defaults, 4 steps a scan,
  ``host_dedup_probe_{1,16,128}mib_h200_1844.log``):

  | buffer | bare ``compute_on`` | with the ``n x n`` check | XLA's bare set |
  |---|---|---|---|
  | 1 MiB | 568.6 | 578.1 | 43.2 |
  | 16 MiB | 2494.1 | 2496.5 | 69.5 |
  | 128 MiB | 23693.9 | 23662.2 | 66.8 |

  That is about 0.18 ms per MiB of buffer (5.7 GB/s), as if each step's ``HostExecute``
  copied the whole buffer once; we did not trace what it does. Adds are the same (20844 us
  at 128 MiB).
- The duplicate work costs nothing measurable on the host (the ``n x n`` and sort variants
  are within the noise of the bare one), but the host computation itself is out of the question
  for a buffer larger than device memory.
- And XLA's bare scatter never was host compute. ``xla_scatter_hlo_probe.py`` shows a GPU
  scatter kernel storing over PCIe. So the overlap this probe set out to use does not exist.
  Nothing in the library changed.
"""

from __future__ import annotations

import argparse
import inspect

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental.compute_on import compute_on
from xla_path_dedup_probe import (
    HOST,
    _scan,
    add_variants,
    check_rows,
    combined_add,
    compile_and_time,
    run_sparse,
    set_variants,
)

import pallas_pinned as pp
from benchmarks import environment
from benchmarks.sparse_training import _sgd_scan

FULL = {"steps": 100, "buffer": 1 << 30,
        "cases": ((5, 4), (64, 1024), (256, 1024), (1024, 1024), (4096, 512)),
        "sparse": (8 << 20, 64, 4096, 40)}
QUICK = {"steps": 4, "buffer": 1 << 20, "cases": ((64, 1024),), "sparse": (1 << 12, 16, 256, 4)}


def _to_host(*arrays):
    return [jax.device_put(a, jax.memory.Space.Host) for a in arrays]


def on_host(body, move_operands=True):
    """``body(x, r, u)`` run as one host computation; ``r, u`` moved to the host first."""
    if "out_memory_spaces" in inspect.signature(compute_on).parameters:  # jax >= 0.12
        hosted = compute_on(jax.jit(body), compute_type="device_host",
                            out_memory_spaces=jax.memory.Space.Host)
    else:  # the context manager of earlier releases
        def hosted(*args):
            with compute_on("device_host"):
                return jax.jit(body)(*args)

    def step(x, r, u):
        if move_operands:
            r, u = _to_host(r, u)
        return hosted(x, r, u)

    return step


def host_set_bodies(num_rows):
    """The session-11 probe's set bodies, to run inside the host computation instead."""
    on_device = set_variants(num_rows)
    return {"bare": on_device["xla_raw"], "nxn": on_device["nxn"],
            "sortmask": on_device["sortmask"]}


def host_add_bodies():
    return {"bare": add_variants()["xla_raw"], "comb_sort": combined_add(0, True)}


def variants(op, num_rows, n):
    bodies = host_set_bodies(num_rows) if op == "set" else host_add_bodies()
    ours = pp.scatter_to_host if op == "set" else pp.scatter_add_to_host
    fns = {"ours_auto": ours,
           "xla_raw": (lambda x, r, u: x.at[r].set(u, mode="drop")) if op == "set"
           else (lambda x, r, u: x.at[r].add(u, mode="drop"))}
    for name, body in bodies.items():
        if name == "nxn" and n > 1024:
            continue
        # jax 0.12 types memory spaces: the duplicate work's iotas and constants are device
        # values, so only the bare op takes host operands; XLA moves the rest itself.
        fns[f"host_{name}"] = on_host(body, move_operands=False)
        if name == "bare":
            fns["host_bare_put"] = on_host(body)
    return fns


def loop_cases(options, rng, sizes):
    steps = sizes["steps"]
    for n, row_bytes in sizes["cases"]:
        d = row_bytes // 4
        num_rows = sizes["buffer"] // row_bytes
        # A few guaranteed repeats per step, so the check sees which duplicate won.
        ids = rng.integers(0, num_rows, (steps, n), dtype=np.int32)
        ids[:, n // 2:n // 2 + max(1, n // 16)] = ids[:, :max(1, n // 16)]
        ids = jnp.asarray(ids)
        upd = jnp.asarray(rng.standard_normal((steps, n, d), dtype=np.float32))
        zeros = np.zeros((num_rows, d), np.float32)

        def make_args(fresh, ids=ids, upd=upd, zeros=zeros):
            return (jax.device_put(zeros, HOST) if fresh else None), ids, upd

        flat = ids.reshape(-1)
        for op, tol in (("set", 0.0), ("add", 1e-4)):
            fns = variants(op, num_rows, n)
            compile_and_time({k: _scan(f) for k, f in fns.items()}, make_args, steps,
                             lambda outs, flat=flat, tol=tol: check_rows(outs, flat, tol=tol),
                             options, None, f"{op} {n} x {row_bytes} B")


def sparse(options, rng, sizes):
    adds = {"ours_auto": pp.scatter_add_to_host,
            "xla_raw": lambda x, r, u: x.at[r].add(u)}
    adds.update({f"host_{k}": on_host(b, move_operands=False)
                 for k, b in host_add_bodies().items()})
    run_sparse(options, rng, sizes,
               {name: _sgd_scan(pp.gather_from_host, add, 0.5) for name, add in adds.items()})


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    environment.add_xla_option(parser)
    parser.add_argument("--quick", action="store_true", help="tiny sizes (a CPU smoke test)")
    parser.add_argument("--buffer-mib", type=int, default=None,
                        help="the quick cases on a buffer of this size (does the cost scale?)")
    args = parser.parse_args()
    sizes = QUICK if args.quick else FULL
    if args.buffer_mib is not None:
        sizes = {**QUICK, "buffer": args.buffer_mib << 20, "sparse": None}
    print(f"jax {jax.__version__}, {jax.devices()[0].device_kind}, options "
          f"{args.compiler_options}, {sizes}", flush=True)
    rng = np.random.default_rng(0)
    options = args.compiler_options or None
    loop_cases(options, rng, sizes)
    if sizes["sparse"] is not None:
        sparse(options, rng, sizes)


if __name__ == "__main__":
    main()
