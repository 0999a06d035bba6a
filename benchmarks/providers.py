"""The sweep's providers: every way to put a case's updates into host memory.

A provider's ``bind(data, updates)`` returns a :class:`Bound` call
``step(state, *args) -> state``: for providers that write the pinned JAX
buffer, ``state`` is that buffer (donated, so it is threaded from call to
call); for the rest it is None and ``step`` waits for its own work. See
benchmarks/README.md for what each provider measures.

A provider is left out as "unavailable" only when what it needs cannot be
imported (torch with CUDA, triton, jax-triton) or the machine has no GPU for
it; anything that goes wrong while it runs is an error.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import pallas_pinned
from benchmarks.environment import optional_import
from benchmarks.workspace import (
    Bench,
    CaseData,
    bits_dtype,
    torch_bits_dtype,
    torch_tensors,
)
from pallas_pinned import tuning

GIB = 1 << 30


@dataclasses.dataclass(frozen=True)
class Bound:
    """A provider bound to one case: ``step(state, *args)``, ``prepare()`` untimed.

    ``unsynced`` is the same step without its own wait and ``wait(state)`` waits
    for every step issued: given both, the sweep also times calls back to back,
    as a loop of calls runs (no wait between them). ``observed(fn)``, for a copy
    that releases what it made (target "none"), is the same step calling ``fn``
    on that array before releasing it: how the sweep checks the copy.
    """

    step: Callable
    args: tuple = ()
    prepare: Callable[[], tuple] | None = None
    unsynced: Callable | None = None
    wait: Callable[[Any], Any] | None = None
    observed: Callable[[Callable[[Any], None]], Bound] | None = None


@dataclasses.dataclass(frozen=True)
class Provider:
    """One way to put the updates into host memory.

    ``target`` is the buffer it writes: ``"jax"`` (the pinned JAX buffer),
    ``"host"`` (:class:`HostTarget`) or ``"none"`` (a copy, not a scatter:
    nothing to check). ``updates`` is the form of the updates bind takes.
    """

    name: str
    impl: str
    target: str
    updates: str  # "jax" or "torch"
    bind: Callable[[CaseData, object], Bound]
    skip: Callable[[CaseData], str | None] = lambda data: None
    duplicates: str = "last"  # how the check treats repeated rows: "last" or "any"


def _donating(fn):
    return jax.jit(fn, donate_argnums=0)


def _xla(x, i, u):
    return x.at[i].set(u)


def _device_roundtrip(x, i, u):
    on_device = jax.device_put(x, jax.memory.Space.Device)
    return jax.device_put(on_device.at[i].set(u), jax.memory.Space.Host)


# A threshold no batch reaches: the path it guards is never taken.
NEVER = 2**62


def _nocoalesce(backend: str):
    """The kernel without the locality sort: the unique promise and a sort threshold
    no batch reaches.

    The override sits inside the traced function, so whatever the caller's
    thresholds, this program is always traced (and cached) with it.
    """

    def scatter(x, i, u):
        with tuning.override(sort_from=NEVER):
            return pallas_pinned.scatter_to_host(x, i, u, unique_indices=True, backend=backend)

    return scatter


_set = pallas_pinned.scatter_to_host

# The jitted calls, looked up by name at bind time (a test swaps in broken ones).
JITTED = {
    "ours": _donating(lambda x, i, u: _set(x, i, u)),
    "ours_triton": _donating(functools.partial(_set, backend="triton")),
    "ours_interpret": _donating(functools.partial(_set, backend="interpret")),
    "ours_hinted_unique": _donating(functools.partial(_set, unique_indices=True)),
    "ours_hinted_sorted": _donating(
        functools.partial(_set, unique_indices=True, indices_are_sorted=True)),
    "ours_nocoalesce": _donating(_nocoalesce("auto")),
    "ours_nocoalesce_interpret": _donating(_nocoalesce("interpret")),
    "xla": _donating(_xla),
    "device_roundtrip": _donating(_device_roundtrip),
}


def _carry(pick: Callable[[CaseData], str]):
    """Binds a jitted call that threads the donated pinned buffer (the state)."""

    def bind(data: CaseData, updates) -> Bound:
        fn = JITTED[pick(data)]

        def step(x, i, u):
            return fn(x, i, u)

        return Bound(step, (data.idx_dev, updates), unsynced=step, wait=jax.block_until_ready)

    return bind


def _pick_hinted(data: CaseData) -> str:
    ascending = data.case.pattern in ("sorted", "contiguous")
    return "ours_hinted_sorted" if ascending else "ours_hinted_unique"


def jax_providers(bench: Bench) -> list[Provider]:
    kernel = "Pallas kernel" if bench.gpu else "XLA fallback (no CUDA)"
    nocoalesce = "ours_nocoalesce" if bench.gpu else "ours_nocoalesce_interpret"
    return [
        Provider("ours", f"scatter_to_host auto ({kernel}) under jit, donated", "jax", "jax",
                 _carry(lambda d: "ours")),
        Provider("ours_hinted", "scatter_to_host with truthful unique/sorted hints", "jax", "jax",
                 _carry(_pick_hinted)),
        Provider("ours_triton", "scatter_to_host backend='triton'", "jax", "jax",
                 _carry(lambda d: "ours_triton")),
        Provider("ours_interpret", "scatter_to_host backend='interpret' (Pallas interpreter)",
                 "jax", "jax", _carry(lambda d: "ours_interpret")),
        Provider("ours_nocoalesce", "scatter_to_host(unique_indices=True) under "
                 f"tuning.override(sort_from=NEVER) ({'auto' if bench.gpu else 'interpret'})",
                 "jax", "jax", _carry(lambda d: nocoalesce)),
        Provider("xla", "x.at[i].set(u) on the pinned buffer under jit, donated", "jax", "jax",
                 _carry(lambda d: "xla"), duplicates="any"),
        Provider("device_roundtrip", "whole buffer to device, XLA scatter, back to pinned",
                 "jax", "jax", _carry(lambda d: "device_roundtrip"),
                 skip=functools.partial(_skip_device_roundtrip, bench), duplicates="any"),
        Provider("ceiling_device_put", "jax.device_put(updates, pinned_host) (allocates)",
                 "none", "jax", functools.partial(_bind_device_put, bench)),
    ]


def _skip_device_roundtrip(bench: Bench, data: CaseData) -> str | None:
    stats = bench.device.memory_stats() or {}
    free = stats.get("bytes_limit", 0) - stats.get("bytes_in_use", 0)
    if stats and free < 2.2 * bench.buffer_bytes:
        return f"buffer does not fit in device memory ({free / GIB:.1f} GiB free)"
    return None


def _bind_device_put(bench: Bench, data: CaseData, updates, observe=None) -> Bound:
    def copy(state):
        out = jax.device_put(updates, bench.pinned)
        out.block_until_ready()
        if observe is not None:
            observe(out)
        out.delete()
        return state

    return Bound(copy, observed=lambda fn: _bind_device_put(bench, data, updates, fn))


@functools.cache
def _fresh_copy_fn():
    # A new buffer with the same bits (our data has no NaN or -0.0), so that
    # np.asarray really transfers instead of returning a cached host copy.
    return jax.jit(lambda a: a * jnp.ones((), a.dtype))


def _bind_host_roundtrip(bench: Bench, data: CaseData, updates) -> Bound:
    """Indices and updates to numpy, then a CPU scatter into the host buffer."""
    fresh = _fresh_copy_fn()
    width = bits_dtype(data.upd.dtype.itemsize)
    shape2d = (data.num_rows, data.row_elems)

    def prepare():
        return jax.block_until_ready((fresh(data.idx_dev), fresh(updates)))

    if bench.host.tensor is not None:
        torch = bench.torch
        dst = bench.host.torch_view(torch_bits_dtype(torch, width), shape2d)

        def scatter(state, i, u):
            i, u = np.asarray(i), np.asarray(u)
            bits = u.reshape(-1, data.row_elems).view(width)
            dst.index_copy_(0, torch.from_numpy(i.astype(np.int64)), torch.from_numpy(bits))
            return state
    else:
        dst = bench.host.numpy_view(width, shape2d)

        def scatter(state, i, u):
            i, u = np.asarray(i), np.asarray(u)
            dst[i] = u.reshape(-1, data.row_elems).view(width)
            return state

    return Bound(scatter, prepare=prepare)


def host_providers(bench: Bench) -> list[Provider]:
    if bench.host is None:
        return []
    how = "torch index_copy_" if bench.host.tensor is not None else "numpy fancy assignment"
    return [
        Provider("host_roundtrip", f"indices+updates to numpy, {how} into a {bench.host.kind}",
                 "host", "jax", functools.partial(_bind_host_roundtrip, bench), duplicates="any"),
    ]


# --- PyTorch peers (GPU only)


def torch_probe_notes(torch) -> dict[str, str]:
    """What PyTorch offers for writing CUDA data into pinned rows, tried once.

    A finding for the record, not a provider: whatever it raises is the answer.
    """
    notes = {}
    dst = torch.zeros(8, pin_memory=True)
    idx = torch.tensor([1, 3, 5])
    src = torch.arange(1.0, 4.0, device="cuda")
    try:
        dst[idx].copy_(src)  # copies into a temporary made by advanced indexing
        torch.cuda.synchronize()
        notes["pinned[idx].copy_(cuda)"] = f"ran; wrote {int((dst != 0).sum())} of 3 values"
    except Exception as err:  # noqa: BLE001 - the failure is the finding
        notes["pinned[idx].copy_(cuda)"] = f"raised {type(err).__name__}: {err}"[:200]
    try:
        dst.index_copy_(0, idx.cuda(), src)
        torch.cuda.synchronize()
        notes["pinned.index_copy_(0, cuda_idx, cuda_src)"] = f"ran; wrote {int((dst != 0).sum())}"
    except Exception as err:  # noqa: BLE001 - the failure is the finding
        notes["pinned.index_copy_(0, cuda_idx, cuda_src)"] = (
            f"raised {type(err).__name__}: {err}"[:200])
    return notes


def _bind_torch_index_copy(bench: Bench, data: CaseData, updates) -> Bound:
    rows, _ = torch_tensors(bench, data)
    dst = bench.host.torch_view(updates.dtype, (data.num_rows, data.row_elems))

    def index_copy(state):
        dst.index_copy_(0, rows.cpu(), updates.cpu())
        return state

    return Bound(index_copy)


def _bind_torch_ceiling(bench: Bench, data: CaseData, updates) -> Bound:
    payload = updates.contiguous().view(bench.torch.uint8).view(-1)
    dst = bench.host.tensor[: payload.numel()]

    def copy_unsynced(state):
        dst.copy_(payload, non_blocking=True)
        return state

    def wait(state):
        bench.torch.cuda.synchronize()
        return state

    def copy(state):
        return wait(copy_unsynced(state))

    return Bound(copy, unsynced=copy_unsynced, wait=wait)


def _bind_torch_triton(bench: Bench, peer, data: CaseData, updates) -> Bound:
    rows, _ = torch_tensors(bench, data)
    dst = bench.host.torch_view(updates.dtype, (data.num_rows, updates.shape[1]))
    return Bound(peer.make_store_rows(bench.torch, dst, rows, updates))


def torch_providers(bench: Bench) -> list[Provider]:
    if bench.torch is None or bench.host is None:
        return []
    providers = [
        Provider("ceiling", "torch pinned[:bytes].copy_(cuda payload) (cudaMemcpyAsync D2H into "
                 "preallocated pinned memory)", "none", "torch",
                 functools.partial(_bind_torch_ceiling, bench)),
        Provider("torch_index_copy", "torch: rows.cpu(), updates.cpu(), then "
                 "pinned.index_copy_ on the CPU (no CUDA path into a pinned tensor)", "host",
                 "torch", functools.partial(_bind_torch_index_copy, bench), duplicates="any"),
    ]
    triton, _ = optional_import("triton")
    if triton is not None:
        # Ours: an ImportError here is a bug to fail on, never the peer's absence.
        from benchmarks import triton_peer as peer

        providers.append(Provider(
            "torch_triton_zerocopy", f"raw Triton {peer.version()} kernel storing into the "
            "pinned tensor's data_ptr from PyTorch", "host", "torch",
            functools.partial(_bind_torch_triton, bench, peer), duplicates="any"))
    return providers


GPU_PROVIDERS = (
    "ceiling", "ceiling_device_put", "ours", "ours_hinted", "ours_triton", "ours_nocoalesce",
    "xla", "host_roundtrip", "device_roundtrip", "torch_index_copy", "torch_triton_zerocopy",
)
# The quick sweep leaves out the slow comparisons that no target reads.
QUICK_PROVIDERS = tuple(p for p in GPU_PROVIDERS if p not in (
    "ours_nocoalesce", "device_roundtrip", "torch_triton_zerocopy"))
CPU_PROVIDERS = (
    "ceiling", "ours", "ours_hinted", "ours_interpret", "ours_nocoalesce", "xla",
    "host_roundtrip", "device_roundtrip",
)
ALL_PROVIDERS = tuple(dict.fromkeys(GPU_PROVIDERS + CPU_PROVIDERS))
_GPU_ONLY = ("ours_triton", "torch_index_copy", "torch_triton_zerocopy")


def default_providers(gpu: bool, sweep: str) -> tuple[str, ...]:
    if not gpu:
        return CPU_PROVIDERS
    return QUICK_PROVIDERS if sweep == "quick" else GPU_PROVIDERS


def build_providers(bench: Bench, names: tuple[str, ...]) -> list[Provider]:
    """The wanted providers that exist here, ceilings first (see sweep.run_case).

    ``ceiling`` is PyTorch's copy into preallocated pinned memory when torch
    has CUDA, else ``jax.device_put`` into pinned_host (which also allocates).
    """
    available = {p.name: p for p in
                 jax_providers(bench) + host_providers(bench) + torch_providers(bench)}
    if "ceiling" not in available:
        available["ceiling"] = dataclasses.replace(available["ceiling_device_put"],
                                                   name="ceiling")
    for name in unavailable(bench, names):
        available.pop(name, None)
    wanted = [available[n] for n in names if n in available]
    return sorted(wanted, key=lambda p: not p.name.startswith("ceiling"))


def unavailable(bench: Bench, names: tuple[str, ...]) -> dict[str, str]:
    """Wanted providers that cannot exist in this process, with the reason.

    Only absence counts: no GPU for a GPU-only provider ("needs a CUDA GPU"),
    or a package whose import fails ("unavailable: ..."). Nothing is tried and
    caught here.
    """
    reasons = {}
    for name in names:
        why = None
        if not bench.gpu and name in _GPU_ONLY:
            reasons[name] = "needs a CUDA GPU"
            continue
        if name.startswith("torch") and bench.torch is None:
            why = bench.notes.get("torch_unavailable", "torch with CUDA is absent")
        elif name == "torch_triton_zerocopy":
            _, why = optional_import("triton")
        elif name == "ours_triton":
            _, why = optional_import("jax_triton")
        if why:
            reasons[name] = f"unavailable: {why}"
    return reasons
