"""``backend="auto"`` and upstream's deprecation of Pallas's Triton backend.

The deprecation warning fires while XLA lowers a Pallas-Triton kernel, inside
the user's own jit, where the user cannot act on it: the package filters that
one message. One test still pins upstream's text, so that a change (or the
warning turning into an error) shows here first. Accelerating the deprecation
(upstream's way of turning it into an error) must leave every op working.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

import pallas_pinned as pp
from pallas_pinned import _availability, _registry
from tests.helpers import why_no_triton_launch


def _copy_kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...]


def _lower_for_cuda():
    """Lowers a trivial Pallas-Triton kernel for CUDA (works without a GPU up to the warning)."""

    def copy(x):
        return pl.pallas_call(
            _copy_kernel,
            out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
            compiler_params=plgpu.CompilerParams(),
        )(x)

    try:
        jax.jit(copy).trace(jax.ShapeDtypeStruct((8,), jnp.float32)).lower(
            lowering_platforms=("cuda",)
        )
    except RuntimeError as err:
        # A CPU-only jaxlib has no CUDA device to finish lowering for; the
        # warning has been issued by then.
        assert "GPU" in str(err), err


def test_upstream_deprecation_text_is_pinned():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")  # Ignore the package's own filter here.
        _lower_for_cuda()
    texts = [str(w.message) for w in caught if issubclass(w.category, DeprecationWarning)]
    assert any(t.startswith(_registry.PALLAS_TRITON_DEPRECATION) for t in texts), texts


def test_users_do_not_see_the_deprecation_warning():
    with warnings.catch_warnings(record=True) as caught:  # Keeps the active filters.
        _lower_for_cuda()
    texts = [str(w.message) for w in caught]
    assert not any(_registry.PALLAS_TRITON_DEPRECATION in t for t in texts), texts


def test_the_pallas_probe_leaves_other_threads_warnings_alone(monkeypatch):
    # warnings.catch_warnings swaps the filters of the whole process (Python 3.12), so
    # beside another thread a probe lowering inside one hid that thread's warnings
    # meanwhile. The probe's kernel is traced while it lowers: the filters it sees are
    # everyone's.
    import threading

    seen = []

    def copy_kernel(x_ref, o_ref):
        seen.append(list(warnings.filters))
        o_ref[...] = x_ref[...]

    monkeypatch.setattr(_availability, "_copy_kernel", copy_kernel)
    monkeypatch.setattr(threading, "active_count", lambda: 2)  # Another thread runs.
    before = list(warnings.filters)
    _availability.pallas_triton_usable.__wrapped__()
    assert seen == [before]


def test_the_pallas_probe_alone_hides_upstreams_deprecation(monkeypatch):
    # With no other thread it may swap the filters: even under a filter that shows every
    # warning (pytest's capture, simplefilter("always")), the probe says nothing.
    import threading

    monkeypatch.setattr(threading, "active_count", lambda: 1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _availability.pallas_triton_usable.__wrapped__()
    texts = [str(w.message) for w in caught]
    assert not any(_registry.PALLAS_TRITON_DEPRECATION in t for t in texts), texts


_ACCELERATED = textwrap.dedent(
    """
    import json, warnings
    import jax, jax.numpy as jnp, numpy as np
    from jax._src import deprecations
    deprecations.accelerate("jax-pallas-triton")  # Upstream's "now an error".
    import pallas_pinned as pp
    from tests.registry_support import auto_kernel_family
    dev = jax.devices()[0]
    host = jax.sharding.make_single_device_sharding(dev, memory_kind="pinned_host")
    rng = np.random.default_rng(0)
    x0 = rng.standard_normal((64, 3)).astype(np.float32)
    idx = np.array([5, 9, 5, 63], np.int32)
    upd = rng.standard_normal((4, 3)).astype(np.float32)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = pp.scatter_to_host(jax.device_put(x0, host), jnp.asarray(idx), jnp.asarray(upd))
        out = pp.scatter_add_to_host(out, jnp.asarray(idx), jnp.asarray(upd))
        got = pp.gather_from_host(out, jnp.asarray(idx))
    expected = x0.copy()
    expected[[9, 5, 63]] = upd[[1, 2, 3]]
    np.add.at(expected, idx, upd)
    print(json.dumps({
        "usable": pp._registry.pallas_triton_usable(),
        "auto": auto_kernel_family(),
        "platform": jax.default_backend(),
        "kind": out.sharding.memory_kind,
        "buffer_ok": bool(np.allclose(np.asarray(out), expected, rtol=1e-6)),
        "gather_ok": bool(np.allclose(np.asarray(got), expected[idx], rtol=1e-6)),
        "warnings": [str(w.message) for w in caught if w.category is RuntimeWarning],
    }))
    """
)


def test_auto_survives_an_accelerated_deprecation():
    env = dict(os.environ, XLA_PYTHON_CLIENT_PREALLOCATE="false")
    done = subprocess.run(
        [sys.executable, "-c", _ACCELERATED], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["usable"] is False
    assert report["buffer_ok"] and report["gather_ok"], report
    assert report["kind"] == "pinned_host"
    if report["platform"] == "gpu" and report["auto"] == "triton":
        assert any("raw Triton kernels" in w for w in report["warnings"]), report
    else:
        assert report["auto"] in (None, "triton"), report
    if report["auto"] is None:
        # Said once, with what to install, where the kernels would run (on CUDA); off CUDA
        # auto runs XLA whatever is installed, and says nothing.
        said = [w for w in report["warnings"] if "pip install -e \".[triton]\"" in w]
        assert len(said) == (1 if report["platform"] == "gpu" else 0), report


@pytest.mark.gpu
def test_gpu_auto_takes_the_raw_triton_kernels_when_pallas_triton_is_gone():
    if reason := why_no_triton_launch():  # Installed but unable to launch: it fails.
        pytest.skip(reason)
    env = dict(os.environ, XLA_PYTHON_CLIENT_PREALLOCATE="false")
    done = subprocess.run(
        [sys.executable, "-c", _ACCELERATED], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["auto"] == "triton", report
    assert report["buffer_ok"] and report["gather_ok"], report


# A child process in which Pallas's Triton backend cannot be imported at all
# (upstream removed it): a meta-path finder refuses the module before jax
# or the package is imported.
_BLOCKED = textwrap.dedent(
    """
    import importlib.abc, json, sys, warnings

    class Refuse(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == "jax.experimental.pallas.triton" or name.startswith(
                "jax.experimental.pallas.triton."
            ):
                raise ImportError(f"{name} was removed (blocked by the test)")
            return None

    sys.meta_path.insert(0, Refuse())
    import jax, jax.numpy as jnp, numpy as np
    import pallas_pinned as pp
    from tests.registry_support import auto_kernel_family
    dev = jax.devices()[0]
    host = jax.sharding.make_single_device_sharding(dev, memory_kind="pinned_host")
    x0 = np.arange(24, dtype=np.float32).reshape(8, 3)
    x = jax.device_put(x0, host)
    report = {"platform": jax.default_backend(), "import": True}
    try:
        pp.scatter_to_host(x, jnp.array([1]), 5.0, backend="pallas")
        report["pallas"] = "ran"
    except NotImplementedError as err:
        report["pallas"] = str(err)
    report["alive"] = not x.is_deleted() and bool((np.asarray(x) == x0).all())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        x = pp.at(x)[jnp.array([1, 6])].set(jnp.ones((2, 3)))
        x = pp.at(x)[jnp.array([2, 2])].add(jnp.ones((2, 3)))
        x = pp.at(x)[jnp.array([0, 5])].set(jnp.ones((2, 3)))
        got = pp.at(x)[jnp.array([6, 1])].get()
    # Row 2 took both ones of the add (no later write hides it).
    expected = x0.copy(); expected[[1, 6, 0, 5]] = 1.0; expected[2] += 2.0
    report["ok"] = bool((np.asarray(x) == expected).all()) and bool(
        (np.asarray(got) == expected[[6, 1]]).all())
    report["auto"] = auto_kernel_family()
    report["warnings"] = [str(w.message) for w in caught if w.category is RuntimeWarning]
    report["pallas_loaded"] = any(m.startswith("jax.experimental.pallas.tr") for m in sys.modules)
    print(json.dumps(report))
    """
)


def _run_blocked():
    env = dict(os.environ, XLA_PYTHON_CLIENT_PREALLOCATE="false")
    done = subprocess.run(
        [sys.executable, "-c", _BLOCKED], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_without_pallas_triton_the_package_imports_and_works():
    report = _run_blocked()
    assert report["import"] and report["ok"] and not report["pallas_loaded"], report
    assert "Pallas's Triton backend" in report["pallas"] and "removed" in report["pallas"], report
    assert report["alive"], report
    if report["platform"] != "gpu":
        return  # auto takes XLA off CUDA whatever is installed.
    if report["auto"] == "triton":
        assert any("raw Triton kernels" in w for w in report["warnings"]), report
    else:
        assert report["auto"] is None, report
        said = [w for w in report["warnings"] if "pip install -e \".[triton]\"" in w]
        assert len(said) == 1, report


@pytest.mark.gpu
def test_gpu_without_pallas_triton_auto_runs_raw_triton():
    if reason := why_no_triton_launch():  # Installed but unable to launch: it fails.
        pytest.skip(reason)
    report = _run_blocked()
    assert report["ok"] and report["auto"] == "triton", report


def test_auto_copies_strided_blocks_and_writes_contiguous_ones_as_rows(monkeypatch):
    # A strided block set (a KV cache's slot) that needs no run-time check is one copy; a
    # contiguous block of a host buffer is rows at every size (measured faster).
    seen = []
    real_choose = _registry.choose

    def spy(call, x, *args):
        chosen = real_choose(call, x, *args)
        seen.append((call.plan.num_entries, chosen.path == "block"))
        return chosen

    monkeypatch.setattr(_registry, "choose", spy)
    host = jax.sharding.make_single_device_sharding(jax.devices()[0], memory_kind="pinned_host")
    flat = np.arange(4099 * 3, dtype=np.float32).reshape(4099, 3)  # No other test's shapes.
    layered = np.arange(64 * 7 * 3, dtype=np.float32).reshape(64, 7, 3)
    cases = (
        (flat, lambda x: pp.at(x)[jax.ds(7, 64)], lambda x: x.at[jax.ds(7, 64)]),
        (flat, lambda x: pp.at(x)[jax.ds(7, 1024)], lambda x: x.at[jax.ds(7, 1024)]),
        (flat, lambda x: pp.at(x)[5, 1:3], lambda x: x.at[5, 1:3]),
        (layered, lambda x: pp.at(x)[:, 4], lambda x: x.at[:, 4]),
    )
    for x0, ours, theirs in cases:
        for jitted in (False, True):
            def write(x, ours=ours):
                return ours(x).set(-1.0, mode="clip")

            run = jax.jit(write, donate_argnums=0) if jitted else write
            out = run(jax.device_put(x0, host))
            expected = theirs(jnp.asarray(x0)).set(-1.0, mode="clip")
            np.testing.assert_array_equal(np.asarray(out), np.asarray(expected))
    # The jitted call reuses the op traced by the eager one where the index has no int; an
    # eager int in range is passed as a value (_front._positions_as_values), a second trace.
    assert seen == [(64, False), (1024, False), (2, False), (2, False), (64, True), (64, True)]
