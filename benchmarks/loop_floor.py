"""The loop benchmark's measured floor of an in-stream kernel write.

XLA's own set/add on a pinned buffer is a GPU scatter kernel storing into the
buffer over PCIe (``docs/lab/xla_scatter_hlo_probe.py``: XLA tags it host compute
but runs it on the GPU); our writes are kernels in the same stream (a Pallas or
Triton custom call aliasing the buffer) after our ordering and duplicate work.
Where a kernel stays slower than XLA, two measured parts bound what any
in-stream kernel write can cost per step:

* ``floor_launch`` (a provider of the grid): the baseline step plus ONE aliased
  Pallas kernel that writes nothing but takes the step's indices and updates
  as operands, so that it can be neither hoisted out of the loop nor removed.
  Its ``op_cost_us`` is what putting any aliased custom call into the step
  costs (launch, the stream dependency on the buffer, the lost overlap).
* ``pcie_us``: the op's bytes over PCIe at :data:`PCIE_BYTES_PER_S`.

``kernel_floor_us`` = the floor_launch step time + ``pcie_us``: the launch and
the transfer counted one after the other, so a floor only where the transfer
is negligible; larger writes overlap the two and come in under it (H200,
2026-12-03 16:50 UTC, results/loop_quick_h200_1650.json: a set of 1024 x 1 KiB took 29.1 us
against 38.9). Each grid record of a case gets the three (None where the case has no timed
floor_launch; ``pcie_us`` and ``kernel_floor_us`` None
for a step that moves no rows).
"""

from __future__ import annotations

import jax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from pallas_pinned import _placement

# The H200's PCIe (gen 5 x16) ceiling as this project measured it, 52-55 GB/s: the
# copy engine's device->pinned copies of >= 64 MiB took 53.3-55.2 GB/s
# (benchmarks/results/scatter_full_h200.json, the sweep's `ceiling` rows) and a kernel
# storing contiguously into pinned memory 52.6 GB/s (docs/PERFORMANCE.md, "One call"). The low
# end, rounded down: what SM stores reach, not the copy engine (55 GB/s would make
# pcie_us about 6 % smaller).
PCIE_BYTES_PER_S = 52e9
# The loop's printed word on its floor column: the rate is not measured in the run.
FLOOR_NOTE = (f"floor (+pcie): the floor_launch step plus the rows' bytes at "
              f"{PCIE_BYTES_PER_S / 1e9:.0f} GB/s, the H200's PCIe rate measured in earlier "
              "runs (benchmarks/loop_floor.py), not in this one")
# Times the op's rows cross PCIe: a set writes each row, a gather reads it, an add
# reads and then writes it (counted one after the other); add_read and set_read read
# the rows back after their write.
PCIE_PASSES = {"set": 1, "get": 1, "add": 2, "add_read": 3, "set_read": 2}
FLOOR_FIELDS = ("floor_launch_us", "pcie_us", "kernel_floor_us")
# The rule in one line, for the results file's metadata.
FLOOR_RULE = (
    "kernel_floor_us = floor_launch_us (the step time of floor_launch: the baseline step plus "
    "one aliased Pallas kernel that takes the step's indices and updates and writes nothing) "
    "+ pcie_us (rows x row_bytes x passes / pcie_bytes_per_s; passes: "
    + ", ".join(f"{op} {passes}" for op, passes in PCIE_PASSES.items()) + ")"
)


def _writes_nothing(indices_ref, updates_ref, x_ref, out_ref):
    del indices_ref, updates_ref, x_ref, out_ref


def floor_launch(x, indices, updates, *, interpret: bool | None = None):
    """``x`` passed through one aliased Pallas kernel that writes nothing.

    Any rank of ``x`` (every operand stays in its own memory space, ``pl.ANY``,
    as in ``kernels/pallas_common.py``). ``interpret`` None: the interpreter
    off a GPU, where XLA then removes the empty kernel (the floor is the
    baseline there: only a GPU run measures it).
    """
    if interpret is None:
        interpret = jax.default_backend() != "gpu"
    any_space = pl.BlockSpec(memory_space=pl.ANY)
    out = pl.pallas_call(
        _writes_nothing,
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        in_specs=[any_space] * 3,
        out_specs=any_space,
        input_output_aliases={2: 0},
        grid=(1,),
        compiler_params=plgpu.CompilerParams(num_warps=1, num_stages=1),
        interpret=interpret,
        name="pallas_pinned_floor_launch",
    )(indices, updates, x)
    # As the write kernels do: the aliased result is the host buffer, said so.
    return _placement.place_result(out, x)


def pcie_us(op: str, rows: int, row_bytes: int) -> float | None:
    """The op's bytes over PCIe at the ceiling, in us (None for a step that moves no rows)."""
    passes = PCIE_PASSES.get(op)
    return None if passes is None else 1e6 * passes * rows * row_bytes / PCIE_BYTES_PER_S


def fill_floors(records: list[dict]) -> None:
    """Fills :data:`FLOOR_FIELDS` of one case's records from its floor_launch record."""
    floor = next((r for r in records if r["provider"] == "floor_launch"
                  and r["us_per_step"] is not None), None)
    launch = floor["us_per_step"] if floor else None
    for r in records:
        transfer = pcie_us(r["op"], r["rows"], r["row_bytes"])
        r["floor_launch_us"] = launch
        r["pcie_us"] = transfer
        r["kernel_floor_us"] = None if launch is None or transfer is None else launch + transfer
