"""What ``benchmarks.one_call`` times: the shared buffers, each case's data, and the providers.

Every provider of a case writes the same indices and updates into a buffer of the
same size; the data and the sample of rows checked are made once per case. A
provider's ``bind(data, updates)`` returns a :class:`Bound` call
``step(state, *args) -> state``: for providers that write the pinned JAX buffer,
``state`` is that buffer (donated, so it is threaded from call to call); for the
rest it is None and ``step`` waits for its own work.

A provider is left out as "unavailable" only when what it needs cannot be
imported (torch with CUDA, triton, jax-triton) or the machine has no GPU for it;
anything that goes wrong while it runs is an error.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import math
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import pallas_pinned as pp
from benchmarks import checks
from benchmarks.environment import optional_import
from benchmarks.one_call_cases import Case, layout_of
from pallas_pinned.testing import ScatterSpec, make_indices, make_values

MIB = 1 << 20
# Unwritten rows of the host buffer keep this byte, so a skipped write shows.
POISON_BYTE = 0x5A


def bits_dtype(itemsize: int):
    """Signed integer of the same width: host copies move bits, not numbers."""
    return {1: np.int8, 2: np.int16, 4: np.int32, 8: np.int64}[itemsize]


class HostTarget:
    """A host buffer of the same size for the host and PyTorch providers: a pinned
    PyTorch tensor when torch with CUDA is importable, else a numpy array."""

    def __init__(self, nbytes: int, torch_mod):
        self.torch = torch_mod
        if torch_mod is not None:
            self.tensor = torch_mod.empty(nbytes, dtype=torch_mod.uint8, pin_memory=True)
            self.tensor.fill_(POISON_BYTE)
            self.raw = self.tensor.numpy()
            self.kind = "pinned torch CPU tensor"
        else:
            self.tensor = None
            self.raw = np.full(nbytes, POISON_BYTE, np.uint8)
            self.kind = "numpy array (pageable)"

    def numpy_view(self, dtype, shape: tuple[int, ...]) -> np.ndarray:
        return self.raw[: math.prod(shape) * np.dtype(dtype).itemsize].view(dtype).reshape(shape)

    def torch_view(self, torch_dtype, shape: tuple[int, ...]):
        nbytes = math.prod(shape) * torch_dtype.itemsize
        return self.tensor[:nbytes].view(torch_dtype).view(shape)


@dataclasses.dataclass
class Bench:
    """Everything a run shares: devices, the pinned JAX buffer, the host buffer."""

    args: argparse.Namespace
    gpu: bool
    buffer_bytes: int
    rng: np.random.Generator
    torch: Any = None
    host: HostTarget | None = None
    x: jax.Array | None = None
    layout: tuple | None = None
    started: float = dataclasses.field(default_factory=time.monotonic)
    notes: dict = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        self.device = jax.devices()[0]
        self.pinned = jax.sharding.make_single_device_sharding(self.device,
                                                               memory_kind="pinned_host")
        self.on_device = jax.sharding.make_single_device_sharding(self.device, memory_kind="device")
        self._fills = 0

    def set_layout(self, dtype: str, shape: tuple[int, ...]) -> None:
        """Makes ``x`` a pinned buffer of this dtype and shape: random normals made on the
        device (never zeros), the old buffer freed first so that only one exists."""
        alive = self.x is not None and not self.x.is_deleted()
        if alive and self.layout == (dtype, shape):
            return
        if alive:
            self.x.delete()
        self._fills += 1
        fresh = jax.random.normal(jax.random.key(self.args.seed * 1000 + self._fills), shape,
                                  jnp.dtype(dtype))
        self.x = jax.block_until_ready(jax.device_put(fresh, self.pinned))
        fresh.delete()
        self.layout = (dtype, shape)

    def ensure_buffer(self) -> bool:
        """After a failed call the buffer may be donated or hold an error: rebuild it."""
        try:
            if self.x is not None and not self.x.is_deleted():
                self.x.block_until_ready()
                return False
        except Exception:  # noqa: BLE001 - the failed call's error surfaces here again
            pass
        dtype, shape = self.layout
        self.layout = None
        self.set_layout(dtype, shape)
        return True

    def elapsed(self) -> float:
        return time.monotonic() - self.started


@dataclasses.dataclass
class CaseData:
    """Indices, updates and the row sample of one case, on host and device."""

    case: Case
    shape: tuple[int, ...]
    idx: np.ndarray
    upd: np.ndarray
    idx_dev: jax.Array
    upd_dev: jax.Array
    sample: checks.RowSample
    before: dict = dataclasses.field(default_factory=dict)
    torch_tensors: tuple | None = None

    @property
    def row_elems(self) -> int:
        return math.prod(self.shape[1:])

    def release(self) -> None:
        for a in (self.idx_dev, self.upd_dev):
            a.delete()
        self.torch_tensors = None


def make_case_data(bench: Bench, case: Case) -> CaseData:
    num_rows, row_shape = layout_of(case, bench.buffer_bytes)
    spec = ScatterSpec(num_rows, row_shape, case.dtype, case.n_updates, case.pattern)
    idx = make_indices(bench.rng, spec).astype(np.int32)
    upd = make_values(bench.rng, (case.n_updates, *row_shape), case.dtype)
    # Up to 64 Ki written rows (32 MiB of them) and 4 Ki random others are read back.
    max_written = max(1, min(1 << 16, 32 * MIB // case.row_bytes))
    sample = checks.make_row_sample(bench.rng, idx, num_rows, max_written=max_written,
                                    n_others=4096)
    put = functools.partial(jax.device_put, device=bench.on_device)
    return CaseData(case, (num_rows, *row_shape), idx, upd, put(idx), put(upd), sample)


def torch_tensors(bench: Bench, data: CaseData):
    """``(rows int64, updates (n, row_elems))`` as CUDA tensors, made once per case."""
    if data.torch_tensors is None:
        torch = bench.torch
        rows = torch.from_numpy(data.idx.astype(np.int64)).cuda()
        bits = data.upd.reshape(data.case.n_updates, data.row_elems)
        bits = bits.view(bits_dtype(bits.dtype.itemsize))
        dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[data.case.dtype]
        upd = torch.from_numpy(np.ascontiguousarray(bits)).cuda().view(dtype)
        data.torch_tensors = (rows, upd)
    return data.torch_tensors


@dataclasses.dataclass(frozen=True)
class CheckUpdates:
    """Updates for a provider's checked run, different from every other run's.

    Provider k writes the case's updates rolled by k+1 rows, so a provider that
    writes nothing cannot pass on what the previous one left behind. A single
    update cannot be rolled; it gets fresh random values instead.
    """

    shift: int
    fresh: np.ndarray | None

    @classmethod
    def for_provider(cls, bench: Bench, data: CaseData, k: int) -> CheckUpdates:
        n = data.case.n_updates
        if n > 1:
            return cls(k % (n - 1) + 1, None)
        return cls(0, make_values(bench.rng, data.upd.shape, data.case.dtype))

    def host_hits(self, data: CaseData) -> np.ndarray:
        pos = data.sample.hit_positions
        if self.fresh is not None:
            return self.fresh[pos]
        return data.upd[(pos - self.shift) % data.case.n_updates]

    def as_kind(self, bench: Bench, data: CaseData, kind: str):
        if kind == "jax":
            if self.fresh is not None:
                return jax.device_put(self.fresh, bench.on_device)
            return jnp.roll(data.upd_dev, self.shift, axis=0)
        _, upd = torch_tensors(bench, data)
        if self.fresh is not None:
            bits = self.fresh.reshape(upd.shape).view(bits_dtype(self.fresh.dtype.itemsize))
            return bench.torch.from_numpy(np.ascontiguousarray(bits)).cuda().view(upd.dtype)
        return bench.torch.roll(upd, self.shift, 0)


def main_updates(bench: Bench, data: CaseData, kind: str):
    return data.upd_dev if kind == "jax" else torch_tensors(bench, data)[1]


def read_rows(bench: Bench, data: CaseData, target: str) -> np.ndarray:
    """The sampled rows of a target buffer (the pinned JAX one or the host one), as numpy."""
    if target == "jax":
        return checks.read_rows(bench.x, data.sample.rows)
    view = bench.host.numpy_view(np.dtype(jnp.dtype(data.case.dtype)), data.shape)
    return view[data.sample.rows].copy()


# ---------------------------------------------------------------------------
# Providers


@dataclasses.dataclass(frozen=True)
class Bound:
    """A provider bound to one case: ``step(state, *args)``, ``prepare()`` untimed.

    ``unsynced`` is the same step without its own wait and ``wait(state)`` waits
    for every step issued: given both, calls are also timed back to back.
    ``observed(fn)``, for a copy that releases what it made (target "none"), is the
    same step calling ``fn`` on that array before releasing it: how it is checked.
    """

    step: Callable
    args: tuple = ()
    prepare: Callable[[], tuple] | None = None
    unsynced: Callable | None = None
    wait: Callable[[Any], Any] | None = None
    observed: Callable[[Callable[[Any], None]], Bound] | None = None


@dataclasses.dataclass(frozen=True)
class Provider:
    """One way to put the updates into host memory. ``target``: the buffer it writes,
    ``"jax"`` (the pinned JAX buffer), ``"host"`` (:class:`HostTarget`) or ``"none"``
    (a copy, checked against the updates); ``updates``: "jax" or "torch"."""

    name: str
    impl: str
    target: str
    updates: str
    bind: Callable[[CaseData, object], Bound]
    duplicates: str = "last"  # how the check treats repeated rows: "last" or "any"


def _donating(fn):
    return jax.jit(fn, donate_argnums=0)


# The jitted calls, looked up by name at bind time (a test swaps in broken ones).
JITTED = {
    "ours": _donating(lambda x, i, u: pp.scatter_to_host(x, i, u)),
    "ours_triton": _donating(functools.partial(pp.scatter_to_host, backend="triton")),
    "xla": _donating(lambda x, i, u: x.at[i].set(u)),
}


def _bind_jitted(name: str, data: CaseData, updates) -> Bound:
    fn = JITTED[name]

    def step(x, i, u):
        return fn(x, i, u)

    return Bound(step, (data.idx_dev, updates), unsynced=step, wait=jax.block_until_ready)


def _bind_device_put(bench: Bench, data: CaseData, updates, observe=None) -> Bound:
    def copy(state):
        out = jax.block_until_ready(jax.device_put(updates, bench.pinned))
        if observe is not None:
            observe(out)
        out.delete()
        return state

    return Bound(copy, observed=lambda fn: _bind_device_put(bench, data, updates, fn))


@functools.cache
def _fresh_copy_fn():
    # A new buffer with the same bits, so that np.asarray really transfers.
    return jax.jit(lambda a: a * jnp.ones((), a.dtype))


def _bind_host_roundtrip(bench: Bench, data: CaseData, updates) -> Bound:
    """Indices and updates to numpy, then a CPU scatter into the host buffer."""
    fresh = _fresh_copy_fn()
    width = bits_dtype(data.upd.dtype.itemsize)
    dst = bench.host.numpy_view(width, (data.shape[0], data.row_elems))

    def prepare():
        return jax.block_until_ready((fresh(data.idx_dev), fresh(updates)))

    def scatter(state, i, u):
        dst[np.asarray(i)] = np.asarray(u).reshape(-1, data.row_elems).view(width)
        return state

    return Bound(scatter, prepare=prepare)


def _bind_torch_ceiling(bench: Bench, data: CaseData, updates) -> Bound:
    payload = updates.contiguous().view(bench.torch.uint8).view(-1)
    dst = bench.host.tensor[: payload.numel()]

    def copy_unsynced(state):
        dst.copy_(payload, non_blocking=True)
        return state

    def wait(state):
        bench.torch.cuda.synchronize()
        return state

    return Bound(lambda state: wait(copy_unsynced(state)), unsynced=copy_unsynced, wait=wait)


def _bind_torch_triton(bench: Bench, data: CaseData, updates) -> Bound:
    from benchmarks import triton_peer  # ours: an ImportError here is a bug, not absence

    rows, _ = torch_tensors(bench, data)
    dst = bench.host.torch_view(updates.dtype, (data.shape[0], updates.shape[1]))
    return Bound(triton_peer.make_store_rows(bench.torch, dst, rows, updates))


def build_providers(bench: Bench, names: tuple[str, ...]) -> list[Provider]:
    """The wanted providers that exist here (:func:`unavailable` names the rest), ceiling
    first: the torch ceiling writes the host buffer's head before its rows are sampled.

    ``ceiling`` is PyTorch's copy into preallocated pinned memory when torch has CUDA,
    else ``jax.device_put`` into pinned_host (which also allocates).
    """
    torch = bench.torch is not None and bench.host is not None
    every = {
        "ceiling": Provider("ceiling", "torch pinned[:bytes].copy_(cuda payload)", "none",
                            "torch", functools.partial(_bind_torch_ceiling, bench)) if torch
        else Provider("ceiling", "jax.device_put(updates, pinned_host) (allocates)", "none",
                      "jax", functools.partial(_bind_device_put, bench)),
        "ours": Provider("ours", "scatter_to_host auto under jit, donated", "jax", "jax",
                         functools.partial(_bind_jitted, "ours")),
        "ours_triton": Provider("ours_triton", "scatter_to_host backend='triton'", "jax", "jax",
                                functools.partial(_bind_jitted, "ours_triton")),
        "xla": Provider("xla", "x.at[i].set(u) on the pinned buffer under jit, donated", "jax",
                        "jax", functools.partial(_bind_jitted, "xla"), duplicates="any"),
        "host_roundtrip": Provider("host_roundtrip", "indices and updates to numpy, numpy "
                                   "assignment into a host buffer", "host", "jax",
                                   functools.partial(_bind_host_roundtrip, bench),
                                   duplicates="any"),
        "torch_triton_zerocopy": Provider(
            "torch_triton_zerocopy", "raw Triton kernel storing into the pinned tensor's "
            "data_ptr from PyTorch", "host", "torch",
            functools.partial(_bind_torch_triton, bench), duplicates="any"),
    }
    absent = unavailable(bench, names)
    order = sorted(dict.fromkeys(names), key=lambda n: n != "ceiling")
    return [every[n] for n in order if n not in absent]


def unavailable(bench: Bench, names: tuple[str, ...]) -> dict[str, str]:
    """Wanted providers that cannot exist in this process, with the reason: no GPU for a
    GPU-only one, or a package whose import fails. Nothing is tried and caught here."""
    reasons = {}
    for name in names:
        why = None
        if not bench.gpu and name in ("ours_triton", "torch_triton_zerocopy"):
            why = "needs a CUDA GPU"
        elif name == "torch_triton_zerocopy" and bench.torch is None:
            why = "unavailable: " + bench.notes.get("torch_unavailable", "no torch with CUDA")
        elif name == "torch_triton_zerocopy":
            why = optional_import("triton")[1]
            why = why and f"unavailable: {why}"
        elif name == "ours_triton":
            why = optional_import("jax_triton")[1]
            why = why and f"unavailable: {why}"
        if why:
            reasons[name] = why
    return reasons
