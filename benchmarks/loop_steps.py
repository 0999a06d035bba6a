"""The loop benchmark's grid steps: what each provider does inside ``lax.scan``, and the replay.

Every provider runs the same scan: ``steps`` steps over a pinned buffer that is
the scan's carry and is donated to the jitted function, so the buffer is
updated in place and never copied. Step ``t`` makes its indices and updates on
the device, then writes (or, for the baseline, does not):

* indices: row ``t`` of an index table, each row a random sample *without
  replacement* of the buffer's rows, drawn with numpy before timing and kept
  on the device. Unique rows make the unique providers' promise true and every
  result independent of duplicate order, so every provider is checked exactly;
  the providers that are not told still pay for handling duplicates.
* updates: ``base + t`` in the buffer's dtype, ``base`` a random device array.
* the baseline makes both and carries them to the scan's output (so XLA cannot
  delete the work) but writes nothing: ``op_cost_us`` is a step's time minus
  the baseline's.
* ``floor_launch`` is the baseline's step with the buffer passed through one
  aliased Pallas kernel that takes the indices and updates but writes nothing:
  what any in-stream kernel adds to the step, the floor of our writes.
  ``kernel_floor_us`` adds the op's bytes over PCIe at :data:`PCIE_BYTES_PER_S`.
* the read-after-write providers (``*_add_read``, ``*_set_read``) write, then
  read the step's rows back and carry them, as a client that uses what it wrote
  must (a KV cache, a replay buffer).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

import pallas_pinned as pp
from benchmarks import checks
from pallas_pinned.testing import LoopCase, make_values, scatter_add_oracle, scatter_oracle


@dataclasses.dataclass(frozen=True)
class LoopProvider:
    name: str
    op: str  # "set", "add", "get", "add_read", "set_read", "floor" or "none" (the baseline)
    ours: bool  # takes a backend= (extra rows with --backends)


PROVIDERS = (
    LoopProvider("baseline", "none", False),
    LoopProvider("floor_launch", "floor", False),
    LoopProvider("xla_set", "set", False),
    LoopProvider("ours_set", "set", True),
    LoopProvider("ours_set_unique", "set", True),
    LoopProvider("xla_add", "add", False),
    LoopProvider("ours_add", "add", True),
    LoopProvider("ours_add_unique", "add", True),
    LoopProvider("xla_get", "get", False),
    LoopProvider("ours_get", "get", True),
    LoopProvider("xla_add_read", "add_read", False),
    LoopProvider("ours_add_read", "add_read", True),
    LoopProvider("xla_set_read", "set_read", False),
    LoopProvider("ours_set_read", "set_read", True),
)
# The read-after-write ops: the op written, then its rows read back.
READS_BACK = ("add_read", "set_read")
PROVIDER_NAMES = tuple(p.name for p in PROVIDERS)

# The H200's PCIe (gen 5 x16) rate for the floor: the copy engine's device->pinned copies
# of >= 64 MiB took 53.3-55.2 GB/s (benchmarks/results/scatter_full_h200.json, `ceiling`)
# and a kernel storing contiguously into pinned memory 52.6 GB/s; the low end, rounded down.
PCIE_BYTES_PER_S = 52e9
# Times the op's rows cross PCIe: a set writes each row, a gather reads it, an add reads
# then writes it; the *_read ops read the rows back after their write.
PCIE_PASSES = {"set": 1, "get": 1, "add": 2, "add_read": 3, "set_read": 2}
FLOOR_FIELDS = ("floor_launch_us", "pcie_us", "kernel_floor_us")
FLOOR_RULE = (
    "kernel_floor_us = floor_launch_us (the baseline step plus one aliased Pallas kernel that "
    "takes the step's indices and updates and writes nothing) + pcie_us (rows x row_bytes x "
    "passes / pcie_bytes_per_s; passes: "
    + ", ".join(f"{op} {n}" for op, n in PCIE_PASSES.items()) + ")")
FLOOR_NOTE = (f"floor (+pcie): the floor_launch step plus the rows' bytes at "
              f"{PCIE_BYTES_PER_S / 1e9:.0f} GB/s, the H200's PCIe rate measured in earlier "
              "runs (benchmarks/loop_steps.py), not in this one")


def _writes_nothing(indices_ref, updates_ref, x_ref, out_ref):
    del indices_ref, updates_ref, x_ref, out_ref


def floor_launch(x, indices, updates, *, interpret: bool | None = None):
    """``x`` passed through one aliased Pallas kernel that writes nothing.

    ``interpret`` None: the interpreter off a GPU, where XLA then removes the
    empty kernel (the floor is the baseline there: only a GPU run measures it).
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
    # The aliased result is the pinned buffer: said so, as the library's kernels do.
    return jax.device_put(out, jax.memory.Space.Host)


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


def _xla_get(x, i):
    # jax refuses a gather whose operands live in different memory spaces:
    # the indices go to host memory, the rows come back to the device. The barrier
    # keeps XLA from moving later ops back across the copy (a reshape after it became
    # a bitcast between memory spaces, which XLA refused).
    on_host = jax.device_put(i, jax.memory.Space.Host)
    return lax.optimization_barrier(jax.device_put(x[on_host], jax.memory.Space.Device))


def read_fn(name: str, backend: str) -> Callable:
    """``read(x, i) -> rows`` of a gather or read-after-write provider."""
    if name.startswith("ours_"):
        return functools.partial(pp.gather_from_host, backend=backend)
    return _xla_get


def write_fn(name: str, backend: str) -> Callable:
    """``write(x, i, u) -> x`` of one provider (not for the baseline or a gather).

    A read-after-write provider writes as its op's (``xla_add_read`` as ``xla_add``).
    ``floor_launch``'s backend "-" runs its kernel as the platform allows, any
    other than "interpret" forces the compiled kernel.
    """
    name = name.removesuffix("_read")
    set_ = functools.partial(pp.scatter_to_host, backend=backend)
    add = functools.partial(pp.scatter_add_to_host, backend=backend)
    return {
        "xla_set": lambda x, i, u: x.at[i].set(u),
        "ours_set": set_,
        "ours_set_unique": functools.partial(set_, unique_indices=True),
        "xla_add": lambda x, i, u: x.at[i].add(u),
        "ours_add": add,
        "ours_add_unique": functools.partial(add, unique_indices=True),
        "floor_launch": functools.partial(
            floor_launch, interpret=None if backend == "-" else backend == "interpret"),
    }[name]


def _step_inputs(table, base, t, materialized: bool):
    """Step ``t``'s indices and updates, made on the device.

    ``materialized``: both are computed into buffers before anything uses them
    (an optimization barrier), as a real step's are when they come from a matmul
    or arrive as arguments. Otherwise XLA may fuse their making into its own
    scatter kernel, which a custom call's operands never are.
    """
    inputs = table[t], base + t.astype(base.dtype)
    return lax.optimization_barrier(inputs) if materialized else inputs


def scan_fn(provider: LoopProvider, backend: str, *, materialized: bool = False) -> Callable:
    """The jitted scan ``(x, table, base) -> outputs``; outputs[0] is the buffer (donated).

    The baseline (and floor_launch) also returns the last step's indices and
    updates, so XLA keeps their making; a gather or read-after-write provider
    carries the rows it read (outputs[1]: the last step's), so every read is live.
    """
    steps_of = lambda table: jnp.arange(table.shape[0], dtype=jnp.int32)  # noqa: E731
    step_inputs = functools.partial(_step_inputs, materialized=materialized)
    if provider.op in ("none", "floor"):
        keep = (lambda x, i, u: x) if provider.op == "none" else write_fn(provider.name, backend)

        def run(x, table, base):
            def body(carry, t):
                i, u = step_inputs(table, base, t)
                return (keep(carry[0], i, u), i, u), None

            init = (x, jnp.zeros(table.shape[1:], table.dtype), jnp.zeros_like(base))
            return lax.scan(body, init, steps_of(table))[0]
    elif provider.op == "get":
        read = read_fn(provider.name, backend)

        def run(x, table, base):
            def body(carry, t):
                i, u = step_inputs(table, base, t)
                return (carry[0], read(carry[0], i) + u), None  # + u: depends on the step

            return lax.scan(body, (x, jnp.zeros_like(base)), steps_of(table))[0]
    elif provider.op in READS_BACK:
        write, read = write_fn(provider.name, backend), read_fn(provider.name, backend)

        def run(x, table, base):
            def body(carry, t):
                i, u = step_inputs(table, base, t)
                x = write(carry[0], i, u)
                return (x, read(x, i)), None

            return lax.scan(body, (x, jnp.zeros_like(base)), steps_of(table))[0]
    else:
        write = write_fn(provider.name, backend)

        def run(x, table, base):
            def body(x, t):
                return write(x, *step_inputs(table, base, t)), None

            return (lax.scan(body, x, steps_of(table))[0],)

    return jax.jit(run, donate_argnums=0)


@dataclasses.dataclass
class LoopData:
    """One case's index table, updates' base and row sample, on host and device."""

    case: LoopCase
    table: np.ndarray  # (steps, rows) int32, unique rows per step
    base: np.ndarray
    table_dev: jax.Array
    base_dev: jax.Array
    sample: np.ndarray  # sorted buffer rows read back for the check
    hits: list[tuple[np.ndarray, np.ndarray]]  # per step: (positions in the step, slots)
    # Each row's own updates' base on the device (scan_runner.own_updates).
    owned: list[jax.Array] = dataclasses.field(default_factory=list)

    def release(self) -> None:
        for a in (self.table_dev, self.base_dev, *self.owned):
            a.delete()


def buffer_shape(case: LoopCase, buffer_bytes: int) -> tuple[int, ...]:
    """Rows of one element make a 1-D buffer (the 4-byte float32 case)."""
    num_rows = buffer_bytes // case.row_bytes
    return (num_rows,) if case.row_elems == 1 else (num_rows, case.row_elems)


def make_loop_data(case: LoopCase, buffer_bytes: int, steps: int, rng: np.random.Generator,
                   *, check_written: int, check_others: int) -> LoopData:
    shape = buffer_shape(case, buffer_bytes)
    num_rows = shape[0]
    table = np.stack([_sample_rows(rng, num_rows, case.rows) for _ in range(steps)])
    base = make_values(rng, (case.rows, *shape[1:]), case.dtype)
    # Rows written at random (step, position) pairs, plus random rows anywhere
    # (nearly all untouched: they catch stray writes).
    flat = table.reshape(-1)
    picked = flat[rng.choice(flat.size, min(check_written, flat.size), replace=False)]
    others = rng.integers(0, num_rows, size=min(check_others, num_rows))
    sample = np.unique(np.concatenate([picked, others]).astype(np.int64))
    hits = [checks.hits_in(sample, table[t]) for t in range(steps)]
    on_device = jax.sharding.make_single_device_sharding(jax.devices()[0], memory_kind="device")
    put = functools.partial(jax.device_put, device=on_device)
    return LoopData(case, table, base, put(table), put(base), sample, hits)


def _sample_rows(rng: np.random.Generator, num_rows: int, n: int) -> np.ndarray:
    """``n`` distinct rows of ``num_rows``, in random order."""
    if n * 8 < num_rows:  # sparse: draw, drop repeats, top up
        rows = np.unique(rng.integers(0, num_rows, size=n + n // 8 + 8))
        while rows.size < n:
            rows = np.unique(np.concatenate([rows, rng.integers(0, num_rows, size=n)]))
        return rng.permutation(rows)[:n].astype(np.int32)
    return rng.permutation(num_rows)[:n].astype(np.int32)


# Steps that must leave the buffer as it was, by what the message calls them.
_UNCHANGED = {"none": "baseline", "get": "gather", "floor": "floor_launch"}


def check_replay(data: LoopData, provider: LoopProvider, before: np.ndarray,
                 after: np.ndarray) -> str | None:
    """The sampled rows after one scan against a numpy replay of its steps; None if they match.

    Indices are unique within a step, so sets are checked bit for bit, and so
    are sums: a step adds one update to each of its rows, one sum rounded once,
    so there is no order to differ in, and a rounding bound would let a lost
    update smaller than the row pass (bfloat16). The baseline, floor_launch and
    a gather must leave every sampled row as it was.
    """
    op = provider.op.removesuffix("_read")  # the buffer as after the write alone
    if op in _UNCHANGED:
        return None if before.tobytes() == after.tobytes() else (
            f"the {_UNCHANGED[op]} changed the buffer: "
            f"{_changed_rows(before, after)} sampled rows differ")
    if op == "set":
        expected = _replay(data, op, before, data.hits)
        return None if expected.tobytes() == after.tobytes() else (
            f"{_changed_rows(expected, after)} of {after.shape[0]} sampled rows differ "
            "from the numpy replay")
    return _sums_mismatch(data, before, data.hits, after)


def _sums_mismatch(data: LoopData, before: np.ndarray, hits: list, after: np.ndarray):
    """``after`` against the add's replay, bit for bit (None when equal).

    A 16-bit step's update ``base + t`` may reach the add rounded to the buffer's
    dtype or not (XLA on CPU keeps the float32 sum where it feeds our add's float32
    accumulator): each element may match either replay; a lost update matches neither.
    """
    expected = _replay(data, "add", before, hits)
    if expected.tobytes() == after.tobytes():
        return None
    if data.base.dtype.itemsize == 2:
        wide = _replay(data, "add", before, hits, rounded_updates=False)
        bits = after.view(np.uint16)
        if ((bits == expected.view(np.uint16)) | (bits == wide.view(np.uint16))).all():
            return None
    return (f"{_changed_rows(expected, after)} of {after.shape[0]} sampled rows differ "
            "from the numpy replay")


def _replay(data: LoopData, op: str, before: np.ndarray, hits: list, *,
            rounded_updates: bool = True) -> np.ndarray:
    """``before`` after every step's writes at ``hits`` (``hits[t]``: step ``t``'s
    positions in the step and slots in ``before``)."""
    expected = before.copy()
    for t, (positions, slots) in enumerate(hits):
        if positions.size == 0:
            continue
        updates = data.base[positions] + np.asarray(t, data.base.dtype)
        if not rounded_updates:
            updates = data.base[positions].astype(np.float32) + np.float32(t)
        oracle = scatter_oracle if op == "set" else scatter_add_oracle
        expected = oracle(expected, slots, updates)
    return expected


def check_read_back(data: LoopData, op: str, before_last: np.ndarray,
                    carried: np.ndarray) -> str | None:
    """The rows a read-after-write scan read after its last write, against the oracle:
    ``set_read`` the last step's updates; ``add_read`` the rows at the last step's
    indices before the run (``before_last``) with every step's adds replayed. Bit for bit.
    """
    if op == "set_read":
        expected = _last_updates(data)
        if expected.tobytes() == carried.tobytes():
            return None
        return (f"rows read after the last set: {_changed_rows(expected, carried)} of "
                f"{carried.shape[0]} differ from the last step's updates")
    last = data.table[-1]
    order = np.argsort(last, kind="stable")  # distinct rows: sorted, as hits_in wants
    hits = [checks.hits_in(last[order], step) for step in data.table]
    mismatch = _sums_mismatch(data, before_last[order], hits, carried[order])
    return None if mismatch is None else f"rows read after the last add: {mismatch}"


def check_gathered(data: LoopData, last_rows: np.ndarray, x_rows: np.ndarray) -> str | None:
    """A gather scan's output (the last step's rows + updates) against the buffer's rows
    at the last step's indices, read back after the scan. Exact."""
    expected = (x_rows + _last_updates(data)).astype(data.base.dtype)
    if expected.tobytes() == last_rows.tobytes():
        return None
    return (f"gathered rows: {_changed_rows(expected, last_rows)} of {last_rows.shape[0]} rows "
            "of the last step differ from the buffer's")


def _last_updates(data: LoopData) -> np.ndarray:
    """The last step's updates, as the device makes them: ``base + t``."""
    return data.base + np.asarray(data.table.shape[0] - 1, data.base.dtype)


def _changed_rows(a: np.ndarray, b: np.ndarray) -> int:
    a2 = a.reshape(a.shape[0], -1).view(np.uint8)
    b2 = b.reshape(b.shape[0], -1).view(np.uint8)
    return int((a2 != b2).any(axis=1).sum())
