"""Small helpers shared by the test modules (placement, reading back)."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from pallas_pinned.testing import assert_same, scatter_oracle


def gpu_available() -> bool:
    try:
        return bool(jax.devices("gpu"))
    except RuntimeError:
        return False


def default_device():
    """The GPU when there is one, else the first CPU device."""
    return jax.devices()[0]


def sharding(kind: str, device=None):
    return jax.sharding.SingleDeviceSharding(device or default_device(), memory_kind=kind)


def put(array, kind: str = "pinned_host", device=None) -> jax.Array:
    return jax.device_put(array, sharding(kind, device))


def read(array: jax.Array) -> np.ndarray:
    """Host copy of any array, whatever its memory kind."""
    return np.asarray(array)


def check_scatter(out, x0, indices, updates, mode=None, *, kind="pinned_host") -> None:
    """The result has the buffer's memory kind and equals the numpy oracle."""
    assert out.sharding.memory_kind == kind, out.sharding
    idx = np.asarray(indices)
    target = idx.shape + x0.shape[1:]
    upd = np.broadcast_to(np.asarray(updates), target).astype(x0.dtype)
    assert_same(read(out), scatter_oracle(x0, idx, upd, mode))


def triton_available() -> bool:
    try:
        import pallas_pinned.kernels.scatter_triton  # noqa: F401
    except ImportError:
        return False
    return True


# Every correctness case runs through each backend. "pallas" and "triton"
# compile Triton kernels, so they exist on a GPU only; "triton" also needs
# the optional jax-triton extra.
PALLAS = pytest.param("pallas", marks=pytest.mark.gpu)
TRITON = pytest.param(
    "triton",
    marks=[
        pytest.mark.gpu,
        pytest.mark.skipif(not triton_available(), reason="needs pallas-pinned[triton]"),
    ],
)
BACKENDS = ["xla", "interpret", "auto", PALLAS, TRITON]
KERNEL_BACKENDS = ["interpret", PALLAS, TRITON]
