"""What one sweep run shares: the pinned JAX buffer, a host buffer, and each case's data.

Every provider of a case writes the same indices and updates into a buffer of
the same size; the data and the sample of rows checked are made once per case.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import math
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import checks
from benchmarks.cases import Case
from pallas_pinned.testing import ScatterSpec, make_indices, make_values

MIB = 1 << 20
# Unwritten rows of the host buffer keep this byte, so a skipped write shows.
POISON_BYTE = 0x5A


def layout_of(case: Case, buffer_bytes: int) -> tuple[int, tuple[int, ...]]:
    """``(num_rows, row_shape)``; one-element rows make a 1-D buffer."""
    row_elems = case.row_bytes // jnp.dtype(case.dtype).itemsize
    return buffer_bytes // case.row_bytes, (() if row_elems == 1 else (row_elems,))


def np_dtype(dtype: str) -> np.dtype:
    return np.dtype(jnp.dtype(dtype))  # bfloat16 through ml_dtypes


def bits_dtype(itemsize: int):
    """Signed integer of the same width: host copies move bits, not numbers."""
    return {1: np.int8, 2: np.int16, 4: np.int32, 8: np.int64}[itemsize]


class HostTarget:
    """A host buffer of the same size for the host and PyTorch providers.

    A pinned PyTorch tensor when torch with CUDA is importable (the PyTorch
    peers need one), else a plain numpy array. Viewed per case as the case's
    dtype and row shape, without copying.
    """

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
        nbytes = math.prod(shape) * np.dtype(dtype).itemsize
        return self.raw[:nbytes].view(dtype).reshape(shape)

    def torch_view(self, torch_dtype, shape: tuple[int, ...]):
        nbytes = math.prod(shape) * torch_dtype.itemsize
        return self.tensor[:nbytes].view(torch_dtype).view(shape)


@dataclasses.dataclass
class Bench:
    """Everything a run shares: devices, the pinned JAX buffer, the host buffer."""

    args: argparse.Namespace
    gpu: bool
    buffer_bytes: int
    max_payload: int
    rng: np.random.Generator
    torch: Any = None
    host: HostTarget | None = None
    x: jax.Array | None = None
    layout: tuple | None = None
    # Per row size, the largest planned count of random unique float32: the
    # summary's target cases (``cases.is_target``).
    largest: dict[int, int] = dataclasses.field(default_factory=dict)
    started: float = dataclasses.field(default_factory=time.monotonic)
    notes: dict = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        self.device = jax.devices()[0]
        self.pinned = jax.sharding.make_single_device_sharding(self.device,
                                                               memory_kind="pinned_host")
        self.on_device = jax.sharding.make_single_device_sharding(self.device, memory_kind="device")
        self._fills = 0

    def set_layout(self, dtype: str, shape: tuple[int, ...]) -> bool:
        """Makes ``x`` a pinned buffer of this dtype and shape; True if rebuilt.

        Filled with random normals made on the device, then moved to pinned
        memory (fast, and never zeros). The old buffer is freed first so that
        only one buffer of ``buffer_bytes`` exists at a time.
        """
        alive = self.x is not None and not self.x.is_deleted()
        if alive and self.layout == (dtype, shape):
            return False
        if alive:
            self.x.delete()
        self._fills += 1
        key = jax.random.key(self.args.seed * 1000 + self._fills)
        fresh = jax.random.normal(key, shape, jnp.dtype(dtype))
        self.x = jax.device_put(fresh, self.pinned)
        self.x.block_until_ready()
        fresh.delete()
        self.layout = (dtype, shape)
        return True

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
        return self.set_layout(dtype, shape)

    def elapsed(self) -> float:
        return time.monotonic() - self.started


@dataclasses.dataclass
class CaseData:
    """Indices, updates and the row sample of one case, on host and device."""

    case: Case
    spec: ScatterSpec
    shape: tuple[int, ...]
    idx: np.ndarray
    upd: np.ndarray
    idx_dev: jax.Array
    upd_dev: jax.Array
    sample: checks.RowSample
    before: dict = dataclasses.field(default_factory=dict)
    torch_tensors: tuple | None = None

    @property
    def num_rows(self) -> int:
        return self.shape[0]

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
    max_written = max(1, min(bench.args.check_rows, bench.args.check_mib * MIB // case.row_bytes))
    sample = checks.make_row_sample(
        bench.rng, idx, num_rows, max_written=max_written, n_others=bench.args.check_others
    )
    put = functools.partial(jax.device_put, device=bench.on_device)
    return CaseData(case, spec, (num_rows, *row_shape), idx, upd, put(idx), put(upd), sample)


def torch_tensors(bench: Bench, data: CaseData):
    """``(rows int64, updates (n, row_elems))`` as CUDA tensors, made once per case."""
    if data.torch_tensors is None:
        torch = bench.torch
        rows = torch.from_numpy(data.idx.astype(np.int64)).cuda()
        bits = data.upd.reshape(data.case.n_updates, data.row_elems)
        bits = bits.view(bits_dtype(bits.dtype.itemsize))
        upd = torch.from_numpy(np.ascontiguousarray(bits)).cuda().view(torch_dtype(torch, data))
        data.torch_tensors = (rows, upd)
    return data.torch_tensors


def torch_bits_dtype(torch, np_int):
    return {np.int8: torch.int8, np.int16: torch.int16, np.int32: torch.int32,
            np.int64: torch.int64}[np_int]


def torch_dtype(torch, data: CaseData):
    return {"float32": torch.float32, "bfloat16": torch.bfloat16}[data.case.dtype]


@dataclasses.dataclass(frozen=True)
class CheckUpdates:
    """Updates for a provider's checked run, different from every other run's.

    Provider k writes the case's updates rolled by k+1 rows, so a provider
    that writes nothing cannot pass on what the previous one left behind. A
    single update cannot be rolled; it gets fresh random values instead.
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
    view = bench.host.numpy_view(np_dtype(data.case.dtype), data.shape)
    return view[data.sample.rows].copy()
