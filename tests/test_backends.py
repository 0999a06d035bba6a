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
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from pallas_pinned import _backends


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
    assert any(t.startswith(_backends.PALLAS_TRITON_DEPRECATION) for t in texts), texts


def test_users_do_not_see_the_deprecation_warning():
    with warnings.catch_warnings(record=True) as caught:  # Keeps the active filters.
        _lower_for_cuda()
    texts = [str(w.message) for w in caught]
    assert not any(_backends.PALLAS_TRITON_DEPRECATION in t for t in texts), texts


_ACCELERATED = textwrap.dedent(
    """
    import json, warnings
    import jax, jax.numpy as jnp, numpy as np
    from jax._src import deprecations
    deprecations.accelerate("jax-pallas-triton")  # Upstream's "now an error".
    import pallas_pinned as pp
    from pallas_pinned import _backends
    dev = jax.devices()[0]
    host = jax.sharding.SingleDeviceSharding(dev, memory_kind="pinned_host")
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
        "usable": _backends.pallas_triton_usable(),
        "auto": _backends.auto_kernel_backend("set", "float32", 4),
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
        # Said once, with what to install.
        said = [w for w in report["warnings"] if "pallas-pinned[triton]" in w]
        assert len(said) == 1, report


@pytest.mark.gpu
def test_gpu_auto_takes_the_raw_triton_kernels_when_pallas_triton_is_gone():
    pytest.importorskip("jax_triton")
    env = dict(os.environ, XLA_PYTHON_CLIENT_PREALLOCATE="false")
    done = subprocess.run(
        [sys.executable, "-c", _ACCELERATED], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["auto"] == "triton", report
    assert report["buffer_ok"] and report["gather_ok"], report


def test_auto_follows_the_shipped_measured_table():
    # The table ships with the package and names the run it was derived from;
    # re-deriving it from that committed run gives the same table.
    import importlib.resources

    from benchmarks import choose_backends

    shipped = json.loads(
        importlib.resources.files("pallas_pinned").joinpath("backend_table.json").read_text()
    )
    assert shipped["source"] == "benchmarks/results/loop_h200.json"
    assert shipped["measured"]["gpu_name"] == "NVIDIA H200"
    run = json.loads((choose_backends.REPO / shipped["source"]).read_text())
    small_max = run["meta"]["thresholds"]["fused_max_updates"]
    assert choose_backends.choose(run["records"], small_max) == shipped["choices"]
    for op, dtypes in shipped["choices"].items():
        for dtype, sizes in dtypes.items():
            for size, entry in sizes.items():
                rows = 1 if size == "small" else shipped["small_max_rows"] + 1
                assert _backends.measured_choice(op, dtype, rows) == entry["backend"]
    assert _backends.measured_choice("gather", "float32", 10) == "pallas"  # Not measured.
