"""The raw Triton backend's import guard and install checks; CPU only.

Each state of the guard in ``kernels/triton_common.py`` (no triton, no
jax-triton, a jax-triton that cannot launch here, one of an unknown series),
what launching says where it cannot run, and that CI installed what the
``[test]`` extra promises. Needs only ``triton`` (skipped only when
``import triton`` fails, which fails a CI run: see ``conftest.py``).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.metadata
import json
import os
import re
import subprocess
import sys
import types

import jax.numpy as jnp
import numpy as np
import pytest

import pallas_pinned
from tests.helpers import JAX_TRITON_MISSING, cuda_devices, no_triton

_NO_TRITON = no_triton()
if _NO_TRITON is None:
    # Not guarded: with triton present, failing to import these is a bug.
    from pallas_pinned.kernels import gather_triton as gt
    from pallas_pinned.kernels import scatter_add_triton as at
    from pallas_pinned.kernels import scatter_triton as st
    from pallas_pinned.kernels import triton_common as tc

needs_triton = pytest.mark.skipif(_NO_TRITON is not None, reason=_NO_TRITON or "")
_HINT = re.escape('pip install -e ".[triton]"')
_KERNEL_MODULES = (  # Those that import triton first; triton_tiling, which does not, last.
    "triton_common", "scatter_triton", "gather_triton", "scatter_add_triton", "triton_aot",
    "triton_tiling",
)


def _jax_triton_missing() -> bool:
    try:
        tc.check_installed()
    except ImportError:
        return True
    return False


def _fresh_import(monkeypatch, name: str):
    """Imports kernel module ``name`` anew; the old modules come back after the test."""
    import pallas_pinned.kernels as package

    for module in _KERNEL_MODULES:
        monkeypatch.delitem(sys.modules, f"pallas_pinned.kernels.{module}", raising=False)
        monkeypatch.delattr(package, module, raising=False)
    return importlib.import_module(f"pallas_pinned.kernels.{name}")


def _fresh_modules(monkeypatch):
    modules = [_fresh_import(monkeypatch, name) for name in _KERNEL_MODULES[1:4]]
    return (sys.modules["pallas_pinned.kernels.triton_common"], *modules)


def _small_calls(scatter, gather, add):
    """One valid call of each public kernel function, on CPU arrays."""
    x, rows, updates = jnp.ones((10, 4)), jnp.arange(3, dtype=jnp.int32), jnp.ones((3, 4))
    return {
        "scatter": lambda: scatter.scatter_rows_triton(x, rows, None, updates),
        "gather": lambda: gather.gather_rows_triton(x, rows),
        "add": lambda: add.scatter_add_rows_triton(x, rows, None, updates),
    }


@pytest.mark.parametrize("name", _KERNEL_MODULES[:5])
def test_import_without_triton_names_the_extra(monkeypatch, name):
    # A None entry in sys.modules makes `import triton` fail as if not installed.
    monkeypatch.setitem(sys.modules, "triton", None)
    with pytest.raises(ImportError, match=_HINT):
        _fresh_import(monkeypatch, name)


# With Pallas's Triton backend gone (a None entry makes its import fail), imports
# triton_common without jax-triton, then with it, in one fresh process; prints what it
# offers each time.
_WITHOUT_PALLAS_TRITON = """
import importlib, json, sys
sys.modules["jax.experimental.pallas.triton"] = None
sys.modules["jax_triton"] = None
without = importlib.import_module("pallas_pinned.kernels.triton_common").INSTALLED_SERIES
del sys.modules["jax_triton"], sys.modules["pallas_pinned.kernels.triton_common"]
common = importlib.import_module("pallas_pinned.kernels.triton_common")
print(json.dumps([without, common.INSTALLED_SERIES, callable(common.check_can_launch)]))
"""


def test_tiling_needs_no_triton(monkeypatch):
    # The tiling and operand checks import without the extra.
    monkeypatch.setitem(sys.modules, "triton", None)
    tiling = _fresh_import(monkeypatch, "triton_tiling")
    assert tiling.choose_tiling(300, 128, 4) == tiling.TritonTiling(32, 128, 8)


@needs_triton
def test_triton_common_needs_no_pallas_triton():
    # The raw Triton backend must work when Pallas's Triton backend is gone: triton_common
    # imports with it blocked, without jax-triton and with it. (The package itself imports
    # Pallas where it can, before any trace: pallas_pinned/__init__.py says why.)
    done = subprocess.run([sys.executable, "-c", _WITHOUT_PALLAS_TRITON], capture_output=True,
                          text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    # (jax-triton 0.3.1 refuses a CPU-only jaxlib at import: no series there either.)
    without, _series, can_check = json.loads(done.stdout.strip().splitlines()[-1])
    assert without is None and can_check, done.stdout


@needs_triton
def test_without_jax_triton_compiles_but_launching_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "jax_triton", None)
    common, scatter, gather, add = _fresh_modules(monkeypatch)
    assert common.jax_triton is None and common.INSTALLED_SERIES is None
    aot = _fresh_import(monkeypatch, "triton_aot")
    assert aot.compile_for_target(gather.plan_gather_rows((10, 4), jnp.float32, 3)).asm["ptx"]
    with pytest.raises(ImportError, match=_HINT):
        common.check_installed()
    for call in _small_calls(scatter, gather, add).values():
        with pytest.raises(ImportError, match=_HINT):
            call()


class _RefuseJaxTriton(importlib.abc.MetaPathFinder):
    """Makes ``import jax_triton`` fail the way 0.3.1 does on a jaxlib without CUDA."""

    def find_spec(self, name, path=None, target=None):
        if name == "jax_triton":
            raise ImportError("jax-triton requires JAX to be installed with GPU support.")
        return None


def _fake_jax_triton(version: str, *, plugin: bool = False) -> types.ModuleType:
    """A jax-triton of ``version``; ``plugin``: with jaxlib's CUDA launcher (0.4 checks it)."""
    fake = types.ModuleType("jax_triton")
    fake.__version__ = version
    fake.__version_info__ = tuple(int(part) for part in version.split("."))
    lib = types.SimpleNamespace(TritonKernelCall=object) if plugin else None
    fake.triton_lib = types.SimpleNamespace(triton_kernel_call_lib=lib)
    return fake


_UNUSABLE = {
    "no_gpu_jaxlib": (None, "requires JAX to be installed with GPU support"),
    # 0.4 imports on any jaxlib; it cannot launch without the CUDA plugin.
    "jax_triton_0.4_cpu": ("0.4.1", "requires JAX to be installed with GPU support"),
    "jax_triton_0.5": ("0.5.0", r"jax-triton 0\.5\.0 is installed, but .* 0\.3\.x or 0\.4\.x"),
}


@needs_triton
@pytest.mark.parametrize("state", list(_UNUSABLE))
def test_unusable_jax_triton_compiles_but_refuses_to_launch(monkeypatch, state):
    version, reason = _UNUSABLE[state]
    if version is None:
        monkeypatch.delitem(sys.modules, "jax_triton", raising=False)
        monkeypatch.setattr(sys, "meta_path", [_RefuseJaxTriton(), *sys.meta_path])
    else:
        monkeypatch.setitem(sys.modules, "jax_triton", _fake_jax_triton(version))
    common, scatter, gather, add = _fresh_modules(monkeypatch)
    assert common.jax_triton is None
    common.check_installed()  # Installed: not an ImportError.
    plan = add.plan_scatter_add_rows((10, 4), "float32", 3)
    assert _fresh_import(monkeypatch, "triton_aot").compile_for_target(plan).asm["ptx"]
    for call in _small_calls(scatter, gather, add).values():
        with pytest.raises(NotImplementedError, match=f"jax-triton cannot launch.*{reason}"):
            call()


@needs_triton
@pytest.mark.parametrize("version", ["0.3.1", "0.4.1"])
def test_each_known_series_is_launchable(monkeypatch, version):
    # With jaxlib's CUDA plugin present, 0.3 and 0.4 both pass the guard (a
    # jax whose dead-code rules 0.4 does not fit is refused: see the next test).
    fake = _fake_jax_triton(version, plugin=True)
    monkeypatch.setitem(sys.modules, "jax_triton", fake)
    common = _fresh_import(monkeypatch, "triton_common")
    assert common.JAX_TRITON_UNUSABLE is None and common.jax_triton is fake
    assert common.INSTALLED_SERIES == fake.__version_info__[:2]
    common.check_can_launch()


def _installed_jax_triton() -> str | None:
    try:
        return importlib.metadata.version("jax-triton")
    except importlib.metadata.PackageNotFoundError:
        return None


@pytest.mark.jax_triton_04  # Runs in dev.sh's jax-triton 0.4 environment.
@needs_triton
def test_jax_triton_04_that_does_not_fit_this_jax_is_refused(monkeypatch):
    version = _installed_jax_triton()
    if not (version or "").startswith("0.4."):
        pytest.skip(f"checks jax-triton 0.4; {version} is installed")
    import jax_triton
    from jax._src.interpreters import partial_eval as pe

    primitive = jax_triton.triton_lib.triton_kernel_call_p
    plugin = types.SimpleNamespace(TritonKernelCall=object)
    monkeypatch.setattr(jax_triton.triton_lib, "triton_kernel_call_lib", plugin)
    # A rule of the wrong arity, whatever the installed pair does.
    monkeypatch.setitem(pe.dce_rules, primitive, lambda used_outs: None)
    common = _fresh_import(monkeypatch, "triton_common")
    assert re.search(r"dead-code rule does not fit jax", common.JAX_TRITON_UNUSABLE or "")
    with pytest.raises(NotImplementedError, match="dead-code rule"):
        common.check_can_launch()


@needs_triton
def test_launch_here_says_why():
    if cuda_devices() and not tc.JAX_TRITON_UNUSABLE:
        pytest.skip("jax-triton can launch here; nothing to refuse")
    expected = ImportError if _jax_triton_missing() else NotImplementedError
    for call in _small_calls(st, gt, at).values():
        with pytest.raises(expected, match="jax-triton"):
            call()


def test_public_backend_triton_refused_without_cuda():
    if cuda_devices():
        pytest.skip("a CUDA GPU is present; the refusal is for other platforms")
    x = jnp.ones((10, 3))
    # Without triton the ImportError names the extra and the platform (installing the
    # extra alone would not do); with jax-triton, the platform is refused.
    expected, message = (NotImplementedError, "CUDA")
    if _NO_TRITON is not None or _jax_triton_missing():
        expected, message = ImportError, f"{_HINT}.*also needs a CUDA GPU, but x is on 'cpu'"
    calls = {
        "scatter": lambda: pallas_pinned.scatter_to_host(
            x, np.array([1, 2]), jnp.zeros((2, 3)), backend="triton"),
        "gather": lambda: pallas_pinned.gather_from_host(x, np.array([1, 2]), backend="triton"),
        "add": lambda: pallas_pinned.scatter_add_to_host(
            x, np.array([1, 2]), jnp.zeros((2, 3)), backend="triton"),
    }
    for op, call in calls.items():
        with pytest.raises(expected, match=message):
            call()
        assert not x.is_deleted(), op  # Refused before anything ran.


@pytest.mark.skipif(os.environ.get("CI") != "true", reason="checks what CI installed")
def test_ci_installed_the_triton_extra():
    # The [test] extra pulls in [triton]: in CI the CPU-runnable Triton tests
    # must run, not skip (conftest also fails a CI run that skipped them).
    assert _NO_TRITON is None, _NO_TRITON
    assert not _jax_triton_missing(), JAX_TRITON_MISSING
    version = _installed_jax_triton()  # 0.3.1 does not import without CUDA.
    series = tuple(int(part) for part in version.split(".")[:2])
    assert series in tc.JAX_TRITON_SERIES, version
