"""Lab probe, session 9 (2026-12-03): does reading each distinct row once per training step pay?

Not a benchmark of the project (no CPU test beyond ``--quick``, no report). On a GPU, from
the repository root:

    PYTHONPATH=. python docs/lab/fused_step_probe.py [--xla-option NAME=VALUE]

The sparse client (``benchmarks.sparse_training``) reads every id's row with
``gather_from_host`` and then adds the update with ``scatter_add_to_host``, whose kernel
reads each distinct row over PCIe a second time to add to it. A step that de-duplicates
its ids once can instead

1. read the distinct rows once (``gather_from_host`` on the sorted distinct ids, padded
   with out-of-range ids that read nothing);
2. expand them to every id on the device (``rows = distinct_rows[inverse]``);
3. compute the gradient as before, and sum it per distinct id (``segment_sum``);
4. write ``distinct_rows + summed`` back with ``scatter_to_host`` (sorted, unique: one
   write per distinct row, no read).

Same arithmetic as ``scatter_add_to_host``: the duplicates' updates are summed first and
added to the row once. Expected, by reading (session 8's figures): the step loses the add
kernel's PCIe read of ~1900 rows (~15-25 us of 70) and the gather's repeats (0 to 20 us,
which ``docs/lab/gather_compaction_probe.py`` decides): ~35-55 us per step, against the
device table's 23.

Providers: ``device`` (reference), ``ours`` (the client's current formulation, ``auto``),
``fused`` (the above, ``auto``). Each is checked against the device table after one scan,
as the benchmark does, then timed.

Result (H200, 2026-12-03 19:59 UTC, tree ``6d70bd1`` + this probe;
``fused_step_probe_h200_1959.log`` and ``..._graphs_h200_1959.log``), us per step, defaults /
graphed: device 14.5 / 12.4, ours 64.8 / 76.2, fused 94.0 / 93.8 (both checked against the
device table). Slower: ``jnp.unique`` sorts the ids (XLA's sort of 4096 ids alone took ~45 us
in session 6's probes), which costs more than the add's read saves. Not pursued.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

import pallas_pinned as pp
from benchmarks import sparse_training as st


def fused_scan(lr: float):
    def train(table, ids, targets):
        num_rows = table.shape[0]

        def step(table, xs):
            i, t = xs
            batch = i.shape[0]
            distinct, inverse = jnp.unique(i, size=batch, fill_value=num_rows,
                                           return_inverse=True)
            inverse = inverse.reshape(batch)
            read = pp.gather_from_host(table, distinct, mode="fill", fill_value=0,
                                       indices_are_sorted=True, unique_indices=True)
            grad = jax.grad(st._loss)(read[inverse], t)
            summed = jax.ops.segment_sum((-lr * grad).astype(table.dtype), inverse,
                                         num_segments=batch)
            table = pp.scatter_to_host(table, distinct, read + summed, mode="drop",
                                       indices_are_sorted=True, unique_indices=True)
            return table, None

        return lax.scan(step, table, (ids, targets))[0]

    return train


def main() -> int:
    args = st.parse_args()
    args.reference_scale = 1.0
    st.JITTED["fused"] = jax.jit(fused_scan(args.lr), donate_argnums=0)
    table0, ids, targets, ids_np = st.make_inputs(args)
    distinct = st.distinct_per_step(ids_np)
    floor_us = st.pcie_floor_us(distinct, args.dim * 4, args.pcie_gbps)
    print(f"jax {jax.__version__}, {jax.devices()[0].device_kind}, options "
          f"{args.compiler_options}; table {args.rows} x {args.dim}, batch {args.batch}, "
          f"distinct mean {distinct.mean():.0f}; floor {floor_us:.1f} us/step", flush=True)
    pinned = jax.sharding.SingleDeviceSharding(jax.devices()[0], memory_kind="pinned_host")
    records, reference = [], None
    for name in ("device", "ours", "fused"):
        table = jnp.copy(table0) if name == "device" else jax.device_put(table0, pinned)
        result = st.run_provider(name, table, ids, targets, args, reference)
        if name == "device":
            reference = result["reference"]
        del result["reference"]
        records.append(result)
    st.print_table(records, floor_us)
    return st.exit_status(records)


if __name__ == "__main__":
    raise SystemExit(main())
