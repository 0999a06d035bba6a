"""Lab probe of 2026-12-04 (session 14): does an atomic write make the owner's add cheaper?

Not a benchmark of the project (no CPU test, no report). On a GPU, from the repository root:

    PYTHONPATH=.:docs/lab python docs/lab/atomic_add_probe.py [--xla-option NAME=VALUE]

Question. Every add kernel of ours ends with one owner per row doing a read-add-write: it
reads the row over PCIe, adds the combined total and stores the sum. In the graphed loop
(20:06 UTC) that made the add cost more over our set than XLA's add costs over XLA's set:
1024 x 1 KiB 40.8 against 27.5 us (XLA 36.2 against 23.8), 4096 x 512 B 91.8 against 50.8
(XLA 60.3 against 172.1). XLA's add into the pinned buffer is a GPU scatter
(``xla_scatter_hlo_probe``) whose emitter adds atomically when the indices are not declared
unique: no read of ours in the step's chain. An owner that adds
its total with one atomic instead writes the same bits (one rounding of ``x + total``, the
total still summed in entry order) and needs no read of its own.

Predictions (written before the run): the atomic owner-write ("red", relaxed) costs what
XLA's add costs at every size, 1-4 us under the read-add-write at 64-256 rows, 5-10 us at
1024 x 1 KiB and 20-30 us at 4096 x 512 B (reads there queue behind the step's writes).
Pallas's atomic is acquire-release (its lowering fixes the semantic): slower than the
relaxed one, perhaps slower than the read-add-write.

Outcome of the first part (H200, jax 0.11.2, 2026-12-04 20:49 UTC, graphed, tree ``8f6bf12``
plus this probe; ``atomic_add_probe_h200/kernels_2049.log``). Every variant checked against the
replay. us per step, XLA's add / Pallas read-add-write / Pallas atomic / Triton read-add-write /
Triton relaxed atomic / Triton acquire-release atomic (Pallas set, XLA's set):

| case | XLA add | P rw | P atomic | T rw | T relaxed | T acq_rel | P set | XLA set |
|---|---|---|---|---|---|---|---|---|
| 64 x 1 KiB | 9.0 | 14.4 | 17.9 | 17.6 | 13.6 | 20.0 | 10.2 | 6.8 |
| 256 x 1 KiB | 14.3 | 15.7 | 19.3 | 20.3 | 17.1 | 21.4 | 12.1 | 10.6 |
| 1024 x 1 KiB | 34.7 | 39.8 | 37.5 | 45.9 | 40.4 | 40.1 | 28.8 | 25.7 |
| 4096 x 512 B | 61.5 | 75.4 | 67.9 | 81.1 | 69.0 | 71.4 | 54.3 | 161.5 |
| 16384 x 256 B | 160.5 | 195.3 | 168.7 | 200.4 | 168.0 | 173.1 | 165.5 | 1282.7 |

The prediction held in direction from 1024 rows and failed in size and below: no atomic
reached XLA's add. The relaxed atomic beat Triton's own read-add-write at every size (3.2-32.4
us); Pallas's acquire-release atomic lost 3.5-3.6 us at 64 and 256 rows and won 2.3 / 7.5 /
26.6 us at 1024 / 4096 / 16384 rows, about what the relaxed one won there.

Second part, written after the first run (20:49 UTC), with the atomic wired into the library's
three Pallas add kernels behind ``tuning`` ``atomic_add_from``: ``auto`` on unpromised adds,
read-add-write (``atomic_add_from`` 10**9) against the atomic (0), interleaved in one process,
on the loop's grid and on the sparse client. Predictions: the atomic loses ~3 us below 1024
rows (acquire-release, as in the first part); at 1024 x 1 KiB (one-launch kernel) ~2 us off
40.8; at 4096 x 512 B (sorted runs) ~8 us off 92; at 16384 x 256 B 15-25 us off 172, near
XLA's 158; the sparse client (4096 Zipf ids, ~1895 owners) ~3-5 us off ~70.

Outcome of the second part (20:56 UTC, ``atomic_add_probe_h200/auto_2056.log``; GPU suite on
the same tree just before: 912 passed, 57 skipped, the atomic and read-add-write paths giving
the same bits on the GPU). ``auto`` unpromised, read-add-write / atomic, us per step: 5 x 4 B
10.3 / 9.6; 64 x 1 KiB 10.9 / 13.3; 256 x 4 B 11.4 / 13.4; 256 x 1 KiB 16.2 / 17.5; 1024 x
1 KiB 53.8 / 50.2; 4096 x 512 B 95.4 / 83.9; 16384 x 256 B 182.0 / 168.0 (XLA's add 7.2, 8.0,
9.3, 13.4, 37.6, 63.2, 156.0); sparse client 70.1 / 71.2. As predicted below 1024 rows (a
loss of 1.3-2.4 us, none at 5 x 4 B) and at 4096 and 16384 rows (11.5 and 14.0 us gained); the
client gained nothing (predicted 3-5 us). The library keeps the atomic from 1024 updates
(``tuning`` ``atomic_add_from``).

Third part, written after the second run (20:56 UTC): the one-launch add beyond 1024 rows
(``fused_max_adds`` 4096 and 16384; its search grows as n**2, but the one-launch set serves
4096 rows at 50.8 us), against the sorted runs, both with the atomic owner write. Predictions:
4096 x 512 B random rows ~84 -> ~68 us (the set's 51 plus the atomic's cost over it); at 16384
rows the search costs more than the ordering; the Zipf client gets slower (its hot ids make many
programs sum many chunks), which would rule it out whatever the loop says.

Outcome of the third part (21:00 UTC, ``atomic_add_probe_h200/fused_2100.log``). us per step,
XLA's add / sorted runs / one launch up to 4096 / up to 16384: 4096 x 512 B 63.0 / 83.3 / 99.0
/ 99.0; 16384 x 256 B 158.1 / 169.6 / 167.7 (the sorted runs again: the spread) / 194.8; the
sparse client, sorted runs / one launch up to 4096: 73.7 / 362.3. The search costs more than
the ordering from 4096 rows, and the client's hot ids make the one launch 4.9 times slower:
``fused_max_adds`` stays 1024.

Fourth part (``--part relaxed``), written in session 15 (2026-12-04 22:40 UTC) with no GPU lent,
so not yet run: ``tuning.relaxed_atomics`` (``kernels/relaxed_atomics.py``) makes the owner
write's atomics relaxed. On sm_90 (compiled on the CPU, ``tests/test_pallas_compile.py``) the
acquire-release atomic is ``MEMBAR.ALL.GPU``, ``ATOMG.E.ADD.F32x4`` and ``CCTL.IVALL``; the
relaxed one a lone ``REDG.E.ADD.F32x4``, what XLA's scatter-add issues. ``auto``'s unpromised
add with the read and store / acquire-release / relaxed atomics, all from the first update
(``atomic_add_from`` 10**9 / 0 / 0). Predictions: relaxed gains 1-3 us on acquire-release and
on the read and store at 5-256 rows (no PCIe read and no barrier in the owner's chain; the first
part's Triton kernels: relaxed 13.6 against read-add-write 17.6 at 64 x 1 KiB), which would put
64 x 1 KiB at ~8-9 us against XLA's ~8; 0-5 us at 1024-16384 rows, where the bus binds (the
first part's relaxed Triton kernel was no faster than Pallas's acquire-release there); the
sparse client within noise. If relaxed is at or under both others at every size, the library
turns it on with ``atomic_add_from`` 0.

The first part writes distinct random rows in each step, the others uniform random rows (a
repeat within a step is rare on these buffers), the updates and rows fed as the scan's inputs;
every variant runs inside a donated scan of ``steps`` steps, graphed with ``--xla-option
xla_gpu_graph_min_graph_size=1``; each is run once from zeros and checked against a numpy
replay, then timed in ``ROUNDS`` interleaved rounds (medians of the per-step time, min and max).
"""

from __future__ import annotations

import argparse
import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental.pallas import triton as plgpu
from pallas_pinned.kernels import pallas_common, scatter_add_pallas, scatter_pallas
from pallas_pinned.kernels import triton_common as tc
from pallas_pinned.kernels.triton_common import tl, triton
from xla_path_dedup_probe import HOST, _scan, compile_and_time, run_sparse

import pallas_pinned as pp
from benchmarks import environment
from benchmarks.sparse_training import _sgd_scan
from pallas_pinned import _placement, tuning

FULL = {"steps": 100, "buffer": 1 << 30,
        "cases": ((64, 1024), (256, 1024), (1024, 1024), (4096, 512), (16384, 256))}
QUICK = {"steps": 4, "buffer": 1 << 20, "cases": ((64, 1024),), "sparse": (1 << 12, 16, 256, 4)}


def _atomic_add_kernel(rows_ref, src_ref, updates_ref, x_in_ref, x_out_ref, *, grid,
                       check_bounds, acc_dtype):
    """``scatter_add_rows_kernel`` with the read and the store replaced by one atomic add."""
    del x_in_ref, acc_dtype
    tile = pallas_common.tile_lanes(rows_ref, src_ref, grid, check_bounds=check_bounds)
    dest = pallas_common.dest_rows(tile.rows, tile.row_ok, grid.num_rows)
    addend = plgpu.load(updates_ref.at[tile.order[:, None], tile.cols[None, :]],
                        mask=tile.mask, other=0)
    plgpu.atomic_add(x_out_ref, (dest[:, None], tile.cols[None, :]), addend, mask=tile.mask)


def pallas_atomic_add(x, rows, updates):
    tiling = pallas_common.choose_row_tiling(rows.shape[0], x.shape[1], x.dtype.itemsize)
    return pallas_common.launch_row_kernel(
        _atomic_add_kernel, (rows, None, updates, x), tiling=tiling, in_place=True,
        interpret=False, name="probe_atomic_add", check_bounds=True, acc_dtype=x.dtype)


@triton.jit
def _triton_add_kernel(
    rows_ptr, src_ptr, updates_ptr, x_in_ptr, x_ptr,
    NUM_ENTRIES: tl.constexpr, NUM_ROWS: tl.constexpr, ROW_WIDTH: tl.constexpr,
    BLOCK_ROWS: tl.constexpr, BLOCK_COLS: tl.constexpr, HAS_PARTNER: tl.constexpr,
    CACHE_MODIFIER: tl.constexpr, EVICTION_POLICY: tl.constexpr,
    AS_BYTES: tl.constexpr, WRITE: tl.constexpr,
):
    _, rows, src, row_ok, cols = tc.tile_entries(
        rows_ptr, src_ptr, NUM_ENTRIES, NUM_ROWS, ROW_WIDTH, BLOCK_ROWS, BLOCK_COLS,
        HAS_PARTNER, True,
    )
    mask = tc.tile_mask(row_ok, cols, ROW_WIDTH, BLOCK_COLS)
    offsets = rows[:, None] * ROW_WIDTH + cols[None, :]
    values = tl.load(updates_ptr + src[:, None] * ROW_WIDTH + cols[None, :], mask=mask)
    if WRITE == 0:
        current = tl.load(x_ptr + offsets, mask=mask)
        tl.store(x_ptr + offsets, current + values, mask=mask)
    elif WRITE == 1:
        tl.atomic_add(x_ptr + offsets, values, mask=mask, sem="relaxed")
    else:
        tl.atomic_add(x_ptr + offsets, values, mask=mask)


def triton_add(write, x, rows, updates):
    plan = tc.plan_rows(
        _triton_add_kernel, f"probe_add_{write}", x.shape, x.dtype, rows.shape[0],
        rows_dtype=rows.dtype, has_partner=False, data_dtypes=(x.dtype, x.dtype),
        in_place=True, cache_modifiers=tc.STORE_CACHE_MODIFIERS, tiling=None, WRITE=write,
    )
    return tc.launch(plan, rows, None, updates, x)


def _placed(kernel):
    """``kernel``'s aliased result declared back in the buffer's memory space."""
    return lambda x, r, u: _placement.place_result(kernel(x, r, u), x)


def variants():
    kernels = {
        "pallas_set": lambda x, r, u: scatter_pallas.scatter_rows(x, r, None, u),
        "pallas_rw": lambda x, r, u: scatter_add_pallas.scatter_add_rows(x, r, None, u),
        "pallas_atom": pallas_atomic_add,
        "triton_rw": functools.partial(triton_add, 0),
        "triton_red": functools.partial(triton_add, 1),
        "triton_atom": functools.partial(triton_add, 2),
    }
    return {
        "xla_add": lambda x, r, u: x.at[r].add(u, mode="drop"),
        "xla_set": lambda x, r, u: x.at[r].set(u, mode="drop"),
        "auto_add": pp.scatter_add_to_host,
        **{name: _placed(kernel) for name, kernel in kernels.items()},
    }


def run_case(options, rng, sizes, n, row_bytes, fns, *, distinct):
    """One case: every variant compiled, run once from zeros, checked, timed interleaved."""
    steps = sizes["steps"]
    d, num_rows = max(1, row_bytes // 4), sizes["buffer"] // row_bytes
    if distinct:
        ids_np = np.stack([rng.choice(num_rows, n, replace=False) for _ in range(steps)])
    else:
        ids_np = rng.integers(0, num_rows, (steps, n))
    ids = jnp.asarray(ids_np.astype(np.int32))
    upd_np = rng.standard_normal((steps, n, d), dtype=np.float32)
    upd = jnp.asarray(upd_np)
    zeros = np.zeros((num_rows, d), np.float32)
    touched = np.unique(ids_np)
    want_add = np.zeros((num_rows, d), np.float32)
    want_set = np.zeros((num_rows, d), np.float32)
    for t in range(steps):
        np.add.at(want_add, ids_np[t], upd_np[t])
        want_set[ids_np[t]] = upd_np[t]

    def make_args(fresh):
        return (jax.device_put(zeros, HOST) if fresh else None), ids, upd

    def check(outs):
        for name, out in outs.items():
            want = want_set if name.endswith("_set") else want_add
            got = np.asarray(out)
            err = float(np.max(np.abs(got[touched] - want[touched])))
            stray = int(np.count_nonzero(got)) - int(np.count_nonzero(want))
            ok = err <= 1e-4 and stray == 0
            print(f"  check {name:12} max |diff| {err:.3g}, extra nonzeros {stray} "
                  f"{'ok' if ok else 'DIFFERS'}", flush=True)

    label = f"add {n} x {row_bytes} B{'' if distinct else ' (repeats allowed)'}"
    compile_and_time({k: _scan(f) for k, f in fns.items()}, make_args, steps, check, options,
                     None, label)


def _with_limits(op, **limits):
    """``op`` traced under ``tuning.override(**limits)`` (the setting is read at trace time)."""
    def run(x, r, u):
        with tuning.override(**limits):
            return op(x, r, u)

    return run


AUTO_CASES = ((5, 4), (64, 1024), (256, 4), (256, 1024), (1024, 1024), (4096, 512),
              (16384, 256))


def _adds(options, rng, sizes, adds, *, cases=AUTO_CASES, ours="auto_rw", not_sparse=()):
    """``adds`` (XLA's first) on a grid of unpromised adds (``cases``, full sizes only), then
    on the sparse client (``ours`` named as the client's ``ours_auto``)."""
    for n, row_bytes in cases if sizes is FULL else sizes["cases"]:
        run_case(options, rng, sizes, n, row_bytes, adds, distinct=False)
    fns = {name.replace(ours, "ours_auto"): _sgd_scan(pp.gather_from_host, add, 0.5)
           for name, add in adds.items() if name not in ("xla_add", *not_sparse)}
    run_sparse(options, rng, sizes if sizes is not FULL else {**FULL, **SPARSE}, fns)


def _rw_and_atomic(atomic: str = "auto_atomic"):
    """XLA's add and ``auto``'s unpromised add with the read and store, or the atomic."""
    return {"xla_add": lambda x, r, u: x.at[r].add(u, mode="drop"),
            "auto_rw": _with_limits(pp.scatter_add_to_host, atomic_add_from=10**9),
            atomic: _with_limits(pp.scatter_add_to_host, atomic_add_from=0)}


def auto_part(options, rng, sizes):
    """``auto``'s unpromised add, read-add-write against the atomic owner write."""
    _adds(options, rng, sizes, _rw_and_atomic())


def fused_part(options, rng, sizes):
    """The one-launch add past 1024 rows against the sorted runs (both atomic)."""
    _adds(options, rng, sizes, {
        "xla_add": lambda x, r, u: x.at[r].add(u, mode="drop"),
        "runs": pp.scatter_add_to_host,
        # Since session 24 rows that may repeat need fused_max_unpromised_adds raised too.
        "fused_4k": _with_limits(pp.scatter_add_to_host, fused_max_adds=4096,
                                 fused_max_unpromised_adds=4096),
        "fused_16k": _with_limits(pp.scatter_add_to_host, fused_max_adds=16384,
                                  fused_max_unpromised_adds=16384),
    }, cases=((4096, 512), (16384, 256)), ours="runs", not_sparse=("fused_16k",))


def relaxed_part(options, rng, sizes):
    """``auto``'s unpromised add: read and store, acquire-release, relaxed atomics."""
    _adds(options, rng, sizes, {
        **_rw_and_atomic("auto_acq_rel"),
        "auto_relaxed": _with_limits(pp.scatter_add_to_host, atomic_add_from=0,
                                     relaxed_atomics=True),
    })


SPARSE = {"steps": 40, "sparse": (8 << 20, 64, 4096, 40)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    environment.add_xla_option(parser)
    parser.add_argument("--quick", action="store_true", help="tiny sizes")
    parser.add_argument("--part", choices=("kernels", "auto", "fused", "relaxed", "both"),
                        default="both")
    args = parser.parse_args()
    sizes = QUICK if args.quick else FULL
    options = args.compiler_options or None
    print(f"jax {jax.__version__}, {jax.devices()[0].device_kind}, options {options}, {sizes}",
          flush=True)
    rng = np.random.default_rng(0)
    if args.part in ("kernels", "both"):
        for n, row_bytes in sizes["cases"]:
            run_case(options, rng, sizes, n, row_bytes, variants(), distinct=True)
    if args.part in ("auto", "both"):
        auto_part(options, rng, sizes)
    if args.part == "fused":
        fused_part(options, rng, sizes)
    if args.part == "relaxed":
        relaxed_part(options, rng, sizes)


if __name__ == "__main__":
    main()
