"""Lab probe of 2026-12-03 (sessions 5 and 6): small writes with in-step rows; the sparse step.

Not a benchmark of the project (no CPU test, no report): the script that produced the
figures docs/GPU_RUNS.md quotes for 14:46, 15:03, 16:11, 16:21 and 16:40 UTC (the 16:40 run
also timed a Pallas kernel that counted the ranks, since deleted: its rows cannot be
rerun). On a GPU, from the repository root:

    PYTHONPATH=. python docs/lab/step_probe.py small sparse   # ~2 min on an H200

* ``small``: per step of a donated ``lax.scan`` of 200 steps over a 1 GiB pinned buffer,
  rows and values drawn with ``jax.random`` inside the step (unlike the loop benchmark,
  whose rows are made before timing): XLA's own set and add, ours with ``auto``, the kernels
  forced, and the variants with ``unique_indices`` (the cost without de-duplication).
* ``sparse``: the parts of the sparse-training step (8 Mi x 64 float32 table, 4096 Zipf
  ids, 40 steps), each alone in its own scan: the gather, a gather that reads each distinct
  row once (sort, unique, gather, expand), the add, the add with the combining skipped
  (``unique_indices`` on repeated ids: racy, timing only), the combining alone, and the whole
  step with each gather, beside the device-resident table.
* ``runs`` (session 6): the add's ways of summing duplicates (runs of a stable order
  summed in the kernel, the segmented scan, the one-launch search), alone and in the
  sparse step, and on distinct random rows as the loop benchmark writes them.
* ``ranks`` (session 6): XLA's stable sort against counting ranks with an ``n x n``
  comparison, alone, in the sparse step and in the add of distinct rows.

Each line printed is a JSON record: median, min and max us per step over 5 timed scans
after one untimed, and the kernels a step launches (``benchmarks.hlo``). Writes
``step_probe.json`` under ``$OUT`` (default /tmp).
"""

from __future__ import annotations

import functools
import json
import os
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import pallas_pinned as pp
from benchmarks import hlo
from benchmarks.sparse_training import _loss, zipf_ids
from pallas_pinned import _rows

OUT = os.environ.get("OUT", "/tmp")
DEVICE = jax.devices()[0]
HOST = jax.sharding.SingleDeviceSharding(DEVICE, memory_kind="pinned_host")
ON_DEVICE = jax.sharding.SingleDeviceSharding(DEVICE, memory_kind="device")
RESULTS: list[dict] = []


def timed(name, fn, state, *args, steps, reps=5, extra=None):
    """Runs ``fn`` once untimed, then ``reps`` synchronized times; records us per step."""
    try:
        state = jax.block_until_ready(fn(state, *args))
        seconds = []
        for _ in range(reps):
            start = time.perf_counter()
            state = jax.block_until_ready(fn(state, *args))
            seconds.append(time.perf_counter() - start)
        try:
            compiled = fn.lower(state, *args).compile().as_text()
            kernels = hlo.describe(hlo.kernels_per_step(compiled, steps))
        except Exception as err:  # noqa: BLE001 - the count is optional
            kernels = f"? {type(err).__name__}"
        us = [s / steps * 1e6 for s in seconds]
        record = {"name": name, "us": round(statistics.median(us), 1),
                  "min": round(min(us), 1), "max": round(max(us), 1), "kernels": kernels}
    except Exception as err:  # noqa: BLE001 - a failing variant is recorded, not fatal
        record = {"name": name, "error": f"{type(err).__name__}: {str(err)[:300]}"}
    record.update(extra or {})
    print(json.dumps(record), flush=True)
    RESULTS.append(record)
    return state


def _unfused_add(x, i, y):
    with pp.tuning.override(fused_max_adds=0):
        return pp.scatter_add_to_host(x, i, y, backend="pallas")


SMALL_VARIANTS = {
    "xla_set": lambda x, i, y: x.at[i].set(y),
    "xla_add": lambda x, i, y: x.at[i].add(y),
    "auto_set": lambda x, i, y: pp.scatter_to_host(x, i, y),
    "auto_set_unique": lambda x, i, y: pp.scatter_to_host(x, i, y, unique_indices=True),
    "pallas_set": lambda x, i, y: pp.scatter_to_host(x, i, y, backend="pallas"),
    "pallas_add": lambda x, i, y: pp.scatter_add_to_host(x, i, y, backend="pallas"),
    "pallas_add_unfused": _unfused_add,
    "pallas_add_unique": lambda x, i, y: pp.scatter_add_to_host(
        x, i, y, backend="pallas", unique_indices=True),
    "pallas_set_unique_promise": lambda x, i, y: pp.scatter_to_host(
        x, i, y, backend="pallas", unique_indices=True, mode="promise_in_bounds"),
}


def small(steps: int = 200, buffer_bytes: int = 1 << 30) -> None:
    for n, row_bytes in ((5, 4), (64, 1024), (256, 4), (256, 1024), (1024, 1024)):
        width, num_rows = row_bytes // 4, buffer_bytes // row_bytes
        x = jax.device_put(jnp.zeros((num_rows, width), jnp.float32), HOST)
        key = jax.random.key(n)

        def scan_of(write, n=n, width=width, num_rows=num_rows):
            @functools.partial(jax.jit, donate_argnums=0)
            def run(buf, base_key):
                def body(carry, t):
                    k = jax.random.fold_in(base_key, t)
                    rows = jax.random.randint(k, (n,), 0, num_rows)
                    values = jax.random.normal(k, (n, width), jnp.float32)
                    return write(carry, rows, values), None

                return lax.scan(body, buf, jnp.arange(steps))[0]

            return run

        for name, write in SMALL_VARIANTS.items():
            x = timed(f"grid_{name}", scan_of(write), x, key, steps=steps,
                      extra={"n": n, "row_bytes": row_bytes})
        x.delete()


def _gather_distinct_once(table, ids):
    """Each distinct row read once: sort, gather the first of each run, expand back."""
    n, num_rows = ids.shape[0], table.shape[0]
    ordered, perm = lax.sort((ids, lax.iota(jnp.int32, n)), num_keys=1)
    first = jnp.concatenate([jnp.ones((1,), bool), ordered[1:] != ordered[:-1]])
    picked = pp.gather_from_host(table, jnp.where(first, ordered, num_rows), mode="fill",
                                 fill_value=0, backend="pallas")
    owner = lax.cummax(jnp.where(first, lax.iota(jnp.int32, n), 0))
    values = picked[owner]
    return jnp.zeros_like(values).at[perm].set(values, unique_indices=True)


def sparse(num_rows: int = 8 << 20, dim: int = 64, batch: int = 4096, steps: int = 40) -> None:
    rng = np.random.default_rng(0)
    ids = jnp.asarray(zipf_ids(rng, num_rows, (steps, batch), 1.1))
    targets = jnp.asarray(rng.standard_normal((steps, batch, dim), dtype=np.float32))
    updates = 1e-3 * targets
    table = jax.device_put(jnp.zeros((num_rows, dim), jnp.float32), HOST)

    def gather(t, i):
        return pp.gather_from_host(t, i, backend="pallas")

    def add(t, i, u):
        return pp.scatter_add_to_host(t, i, u, backend="pallas")

    def add_uncombined(t, i, u):
        return pp.scatter_add_to_host(t, i, u, backend="pallas", unique_indices=True)

    def reads(read):
        @jax.jit
        def run(total, t, ids):
            return lax.scan(lambda a, i: (a + jnp.sum(read(t, i)), None), total, ids)[0]

        return run

    def writes(write):
        @functools.partial(jax.jit, donate_argnums=0)
        def run(t, ids, u):
            return lax.scan(lambda t, xs: (write(t, *xs), None), t, (ids, u))[0]

        return run

    @jax.jit
    def combine_only(total, ids, u):
        def body(a, xs):
            rows, sums = _rows.combine_duplicates(*xs, num_rows, small_max=0, op="add")
            return a + jnp.sum(sums) + jnp.sum(rows), None

        return lax.scan(body, total, (ids, u))[0]

    def training(read, write):
        @functools.partial(jax.jit, donate_argnums=0)
        def run(t, ids, targets):
            def step(t, xs):
                i, g = xs
                return write(t, i, -0.1 * jax.grad(_loss)(read(t, i), g)), None

            return lax.scan(step, t, (ids, targets))[0]

        return run

    zero = jnp.zeros((), jnp.float32)
    timed("sparse_gather_pallas", reads(gather), zero, table, ids, steps=steps)
    timed("sparse_gather_unique", reads(_gather_distinct_once), zero, table, ids, steps=steps)
    table = timed("sparse_add_pallas", writes(add), table, ids, updates, steps=steps)
    table = timed("sparse_add_unique_promised(racy)", writes(add_uncombined), table, ids,
                  updates, steps=steps)
    timed("sparse_combine_only", combine_only, zero, ids, updates, steps=steps)
    table = timed("sparse_full_pallas", training(gather, add), table, ids, targets, steps=steps)
    table = timed("sparse_full_gather_unique", training(_gather_distinct_once, add), table, ids,
                  targets, steps=steps)
    table.delete()
    on_device = jax.device_put(jnp.zeros((num_rows, dim), jnp.float32), ON_DEVICE)
    device_step = training(lambda t, i: jnp.take(t, i, axis=0), lambda t, i, u: t.at[i].add(u))
    timed("sparse_full_device", device_step, on_device, ids, targets, steps=steps).delete()


# Session 6: the add's ways of summing duplicates (tuning overrides), alone and in the step.
ADD_PATHS = {
    "sorted_runs": {},
    "segmented_scan": {"add_runs_in_kernel": False},
    # Since session 24 rows that may repeat need fused_max_unpromised_adds raised too.
    "one_launch": {"fused_max_adds": 1 << 20, "fused_max_unpromised_adds": 1 << 20},
}


# "interpret" tries the section on CPU (small sizes: runs(1 << 12, 8, 64, 3)).
RUNS_BACKEND = os.environ.get("PROBE_BACKEND", "pallas")


def _add_by(path):
    def add(t, i, u):
        with pp.tuning.override(**ADD_PATHS[path]):
            return pp.scatter_add_to_host(t, i, u, backend=RUNS_BACKEND)

    return add


def _kernel_training(write):
    """The sparse step with our gather and ``write`` as the add, in a donated scan."""
    @functools.partial(jax.jit, donate_argnums=0)
    def run(t, ids, targets):
        def step(t, xs):
            i, g = xs
            rows = pp.gather_from_host(t, i, backend=RUNS_BACKEND)
            return write(t, i, -0.1 * jax.grad(_loss)(rows, g)), None

        return lax.scan(step, t, (ids, targets))[0]

    return run


def runs(num_rows: int = 8 << 20, dim: int = 64, batch: int = 4096, steps: int = 40,
         grid=((256, 1024), (1024, 1024), (4096, 512), (16384, 256)), buffer_bytes=1 << 30):
    rng = np.random.default_rng(0)
    ids = jnp.asarray(zipf_ids(rng, num_rows, (steps, batch), 1.1))
    targets = jnp.asarray(rng.standard_normal((steps, batch, dim), dtype=np.float32))
    table = jax.device_put(jnp.zeros((num_rows, dim), jnp.float32), HOST)

    @jax.jit
    def sort_only(total, ids):
        def body(a, i):
            rows, perm = _rows.stable_order(i, small_max=0)
            return a + jnp.sum(rows) + jnp.sum(perm), None

        return lax.scan(body, total, ids)[0]

    def writes(write):
        @functools.partial(jax.jit, donate_argnums=0)
        def run(t, ids, u):
            return lax.scan(lambda t, xs: (write(t, *xs), None), t, (ids, u))[0]

        return run

    timed("runs_sort_only", sort_only, jnp.zeros((), jnp.int32), ids, steps=steps)
    for path in ADD_PATHS:
        table = timed(f"runs_add_{path}", writes(_add_by(path)), table, ids, 1e-3 * targets,
                      steps=steps)
        table = timed(f"runs_full_{path}", _kernel_training(_add_by(path)), table, ids, targets,
                      steps=steps)
    # Bits: the three paths from the same table agree to rounding.
    start = jax.device_put(jnp.asarray(rng.standard_normal((1 << 16, dim), np.float32)), HOST)
    few = jnp.asarray(zipf_ids(rng, 1 << 16, (batch,), 1.1))
    upd = jnp.asarray(rng.standard_normal((batch, dim), np.float32))
    expected = np.asarray(jax.device_put(start, ON_DEVICE).at[few].add(upd))
    for path in ADD_PATHS:
        got = jax.jit(_add_by(path))(jax.device_put(start, HOST, may_alias=False), few, upd)
        err = float(np.max(np.abs(np.asarray(got) - expected)))
        print(json.dumps({"name": f"runs_check_{path}", "max_abs_diff": err}), flush=True)
        RESULTS.append({"name": f"runs_check_{path}", "max_abs_diff": err})
    table.delete()
    # Distinct random rows (the loop grid's add): the sort is now the only combining cost.
    for n, row_bytes in grid:
        width, rows_total = row_bytes // 4, buffer_bytes // row_bytes
        x = jax.device_put(jnp.zeros((rows_total, width), jnp.float32), HOST)
        idx = jnp.asarray(np.stack([rng.permutation(rows_total)[:n] for _ in range(50)]))
        upd = jnp.asarray(rng.standard_normal((50, n, width), dtype=np.float32))
        for path in ADD_PATHS:
            if path == "one_launch" and n > 4096:
                continue
            x = timed(f"distinct_add_{path}", writes(_add_by(path)), x, idx, upd, steps=50,
                      extra={"n": n, "row_bytes": row_bytes})
        x = timed("distinct_add_unique", writes(lambda t, i, u: pp.scatter_add_to_host(
            t, i, u, backend=RUNS_BACKEND, unique_indices=True)), x, idx, upd, steps=50,
            extra={"n": n, "row_bytes": row_bytes})
        x = timed("distinct_add_xla", writes(lambda t, i, u: t.at[i].add(u)), x, idx, upd,
                  steps=50, extra={"n": n, "row_bytes": row_bytes})
        x.delete()


def ranks(num_rows: int = 8 << 20, dim: int = 64, batch: int = 4096, steps: int = 40) -> None:
    """XLA's stable sort against counting ranks (n x n), alone and in the add."""
    rng = np.random.default_rng(1)

    def order_only(small_max):
        @jax.jit
        def run(total, ids):
            def body(a, i):
                rows, perm = _rows.stable_order(i, small_max=small_max)
                return a + jnp.sum(rows) + jnp.sum(perm), None

            return lax.scan(body, total, ids)[0]

        return run

    zero = jnp.zeros((), jnp.int32)
    for n in (1024, 4096, 8192, 16384, 65536):
        ids = jnp.asarray(zipf_ids(rng, num_rows, (steps, n), 1.1))
        for how, small_max in (("sort", 0), ("ranks", n)):
            if how == "ranks" and n > 8192:
                continue
            timed(f"order_{how}", order_only(small_max), zero, ids, steps=steps, extra={"n": n})
    ids = jnp.asarray(zipf_ids(rng, num_rows, (steps, batch), 1.1))
    targets = jnp.asarray(rng.standard_normal((steps, batch, dim), dtype=np.float32))
    table = jax.device_put(jnp.zeros((num_rows, dim), jnp.float32), HOST)

    def add_with(small_max):
        def add(t, i, u):
            with pp.tuning.override(runs_rank_max=small_max):
                return pp.scatter_add_to_host(t, i, u, backend=RUNS_BACKEND)

        return add

    for how, small_max in (("sort", 0), ("ranks", 1 << 20)):
        table = timed(f"ranks_full_{how}", _kernel_training(add_with(small_max)), table, ids,
                      targets, steps=steps)
    table.delete()
    for n, row_bytes in ((4096, 512), (16384, 256)):
        width, rows_total = row_bytes // 4, (1 << 30) // row_bytes
        x = jax.device_put(jnp.zeros((rows_total, width), jnp.float32), HOST)
        idx = jnp.asarray(np.stack([rng.permutation(rows_total)[:n] for _ in range(50)]))
        upd = jnp.asarray(rng.standard_normal((50, n, width), dtype=np.float32))
        for how, small_max in (("sort", 0), ("ranks", 1 << 20)):
            @functools.partial(jax.jit, donate_argnums=0)
            def run(t, ids, u, small_max=small_max):
                return lax.scan(lambda t, xs: (add_with(small_max)(t, *xs), None), t, (ids, u))[0]

            x = timed(f"ranks_distinct_add_{how}", run, x, idx, upd, steps=50,
                      extra={"n": n, "row_bytes": row_bytes})
        x.delete()


if __name__ == "__main__":
    for part in sys.argv[1:] or ["small", "sparse"]:
        {"small": small, "sparse": sparse, "runs": runs, "ranks": ranks}[part]()
    with open(os.path.join(OUT, "step_probe.json"), "w") as f:
        json.dump(RESULTS, f, indent=1)
