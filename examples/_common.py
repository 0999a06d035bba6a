"""What the examples share: where buffers live, and the timing of one write against XLA's own."""

from __future__ import annotations

import numpy as np


def placements():
    """(device, pinned_host sharding, device-memory sharding) of the first device."""
    import jax

    dev = jax.devices()[0]
    pinned = jax.sharding.make_single_device_sharding(dev, memory_kind="pinned_host")
    device = jax.sharding.make_single_device_sharding(dev, memory_kind="device")
    return dev, pinned, device


def time_providers(providers: dict, make_state, *args, repeats: int, unit: str) -> dict:
    """Median µs of ``state = fn(state, *args)`` (jitted, the state donated) per provider.

    Each provider starts from a fresh ``make_state()``: the timed calls donate
    it. A provider that fails (XLA's own path aborts or refuses on some jax
    versions) is reported as such, not raised.
    """
    import jax

    from pallas_pinned.testing import time_calls

    results = {}
    for name, fn in providers.items():
        try:
            _, seconds = time_calls(jax.jit(fn, donate_argnums=0), make_state(), *args,
                                    repeats=repeats)
            results[name] = f"{np.median(seconds) * 1e6:10.1f} µs/{unit}"
        except Exception as err:
            results[name] = f"failed: {type(err).__name__}: {str(err).splitlines()[0][:120]}"
    return results


def finish(checks: dict, timing_title: str | None = None, timings: dict | None = None) -> int:
    """Prints the checks and the timings; the exit status: 0 only when every check holds."""
    print_checks(checks)
    if timings is None:
        print("not timed on CPU (both paths are XLA's scatter there; --time times anyway)")
    else:
        print(timing_title)
        for name, line in timings.items():
            print(f"  {name:14s} {line}")
    return verdict(checks)


def print_checks(checks: dict) -> None:
    for name, ok in checks.items():
        print(f"  {name:30s} {'ok' if ok else 'MISMATCH'}")


def verdict(checks: dict) -> int:
    """Prints OK or MISMATCH; the exit status: 0 only when every check holds."""
    ok = all(checks.values())
    print("OK" if ok else "MISMATCH")
    return 0 if ok else 1
