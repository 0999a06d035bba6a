"""Lab probe of 2026-12-04 (session 12): where does XLA run a scatter into a pinned buffer?

Not a benchmark of the project (no CPU test, no report). On a GPU, from the repository root:

    PYTHONPATH=.:docs/lab python docs/lab/xla_scatter_hlo_probe.py [--out DIR]

Question. XLA's host-offload pass logs "Converting into host compute" for ``x.at[i].set(u)``
on a pinned buffer inside a jit. The README said XLA then ships the updates by DMA and applies
them on the CPU, overlapped with the next step. ``host_dedup_probe`` found two things that do not
fit: an explicit ``compute_on("device_host")`` of the same set cost ~650 us per step against
~61 us for the bare set (1 MiB buffer), and the bare set kept other than the last duplicate,
where the explicit host computation kept the last. The pass only tags the instruction
(``_xla_compute_type="host"``); this probe prints what the GPU compiler made of the tagged
scatter: the instruction that runs it and the computation it sits in.

Prediction (written before the run): the bare scatter is a GPU fusion (``kind=kInput`` or
``kLoop``) whose output is in ``S(5)``: the GPU writes the pinned buffer itself over PCIe, as
our kernels do; only the explicit ``compute_on`` yields a host computation.

Outcome (H200, jax 0.11.2, 2026-12-04 18:44 UTC, tree ``35b8bff``;
``xla_scatter_hlo_probe_h200_1844.log`` and the two compiled modules in
``xla_scatter_hlo_h200_1844/`` beside this file). The prediction held. The bare set and the
bare add each compile to one ``input_scatter_fusion`` (``kind=kInput``, a GPU kernel) whose
output layout is ``S(5)``. The fusion carries ``_xla_compute_type="host"``, but nothing in the
module acts on that tag: it contains no ``HostExecute`` call and no host computation. So XLA's
bare scatter is a GPU kernel that stores into the pinned buffer over PCIe, as our kernels do.
Only the explicit ``compute_on`` gave a ``HostExecute`` custom call; ``host_dedup_probe``
measured what that costs.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from host_dedup_probe import on_host
from jax import lax

HOST = jax.sharding.SingleDeviceSharding(jax.devices()[0], memory_kind="pinned_host")


def _scan(op):
    def run(x, ids, upd):
        return lax.scan(lambda x, xs: (op(x, *xs), None), x, (ids, upd))[0]

    return run


def where_scatters_run(text: str) -> list[str]:
    """For each scatter: its computation's header and the instruction that calls it."""
    lines = text.splitlines()
    found = []
    computation = None
    for line in lines:
        header = re.match(r"^(?:ENTRY )?%?([\w.\-]+) ", line)
        if header and line.rstrip().endswith("{"):
            computation = header.group(1)
        if " scatter(" in line:
            found.append(f"scatter in computation {computation}: {line.strip()[:200]}")
            callers = [c.strip() for c in lines
                       if re.search(rf"(calls|to_apply)=%{re.escape(computation)}\b", c)]
            found.extend(f"  called by: {c[:400]}" for c in callers)
    tags = sorted({m for m in re.findall(r"_xla_\w+=\"?[\w:]+", text)})
    found.append(f"frontend attributes: {tags}")
    kinds = sorted({m for m in re.findall(r"custom_call_target=\"[\w.\-]+\"", text)})
    found.append(f"custom-call targets: {kinds}")
    return found


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None, help="folder for the HLO texts")
    args = parser.parse_args()
    print(f"jax {jax.__version__}, {jax.devices()[0].device_kind}", flush=True)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
    steps, n, d, num_rows = 4, 64, 256, 1024
    ids = jnp.asarray(np.random.default_rng(0).integers(0, num_rows, (steps, n), np.int32))
    upd = jnp.ones((steps, n, d), jnp.float32)
    variants = {
        "bare_set": lambda x, r, u: x.at[r].set(u, mode="drop"),
        "bare_add": lambda x, r, u: x.at[r].add(u, mode="drop"),
        "compute_on_set": on_host(lambda x, r, u: x.at[r].set(u, mode="drop"),
                                  move_operands=False),
    }
    for name, op in variants.items():
        x = jax.device_put(np.zeros((num_rows, d), np.float32), HOST)
        text = jax.jit(_scan(op), donate_argnums=0).lower(x, ids, upd).compile().as_text()
        print(f"== {name}", flush=True)
        for line in where_scatters_run(text):
            print(line, flush=True)
        if args.out is not None:
            (args.out / f"{name}.hlo.txt").write_text(text)
        x.delete()


if __name__ == "__main__":
    main()
