"""Test setup shared by the CPU suite and the GPU marker.

Two CPU devices exist so that "inputs on different devices" is testable on a
laptop; GPU tests (``@pytest.mark.gpu``) are skipped unless a CUDA GPU is seen.
"""

import os

# Two host devices for the cross-device error tests. Must happen before jax
# initializes its backends.
os.environ.setdefault("XLA_FLAGS", "")
import jax  # noqa: E402
import pytest  # noqa: E402

jax.config.update("jax_num_cpu_devices", 2)


def has_gpu() -> bool:
    try:
        return bool(jax.devices("gpu"))
    except RuntimeError:
        return False


def pytest_collection_modifyitems(config, items):
    if has_gpu():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (marker 'gpu'); none found")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
