"""The Pallas kernels lowered for the H200 and compiled to sm_90 code; CPU only.

The GPU suite runs these kernels; without a GPU, CI would otherwise never
build them. Each kernel is lowered for CUDA under an abstract H200 and its
Triton module compiled with the installed ``triton`` (tests/pallas_aot.py),
then read: it compiles, every write into the buffer is guarded by a mask, and
the add's owner writes with the instructions we expect (read and store, or a
16-byte float32 atomic with the store for the rows the atomic would flush).
Needs only ``triton`` (skipped only when ``import triton`` fails).
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import pytest

from tests.helpers import no_triton

_NO_TRITON = no_triton()
pytestmark = pytest.mark.skipif(_NO_TRITON is not None, reason=_NO_TRITON or "")

S = jax.ShapeDtypeStruct
BUFFER = S((1 << 16, 128), jnp.float32)


def _kernels():
    from pallas_pinned.kernels import gather_pallas as gp
    from pallas_pinned.kernels import scatter_add_pallas as ap
    from pallas_pinned.kernels import scatter_pallas as sp

    rows, updates = S((4096,), jnp.int32), S((4096, 128), jnp.float32)
    raw, raw_updates = S((256,), jnp.int32), S((256, 128), jnp.float32)
    cases = {
        "scatter_rows": (lambda x, r, u: sp.scatter_rows(x, r, None, u), rows, updates),
        "scatter_rows_fused": (
            lambda x, r, u: sp.scatter_rows_fused(x, r, u, mode=None, drop_superseded=True),
            raw, raw_updates,
        ),
        "gather_rows": (lambda x, r: gp.gather_rows(x, r), rows),
    }
    for atomic in (False, True):
        cases[f"add_rows{'_atomic' * atomic}"] = (
            lambda x, r, u, a=atomic: ap.scatter_add_rows(x, r, None, u, atomic_write=a),
            rows, updates,
        )
        cases[f"add_sorted_runs{'_atomic' * atomic}"] = (
            lambda x, r, u, a=atomic: ap.scatter_add_sorted_runs(x, r, None, u, atomic_write=a),
            rows, updates,
        )
        cases[f"add_fused{'_atomic' * atomic}"] = (
            lambda x, r, u, a=atomic: ap.scatter_add_rows_fused(
                x, r, u, mode=None, combine_duplicates=True, atomic_write=a
            ),
            raw, raw_updates,
        )
    return cases


_CASES = sorted(_kernels()) if _NO_TRITON is None else ["none"]
_compiled: dict[str, str] = {}


def _ptx(name: str) -> str:
    """The kernel's PTX for sm_90, compiled once per module run (down to the cubin)."""
    if name not in _compiled:
        from tests.pallas_aot import compile_module, triton_modules

        fn, *specs = _kernels()[name]
        [module] = triton_modules(fn, BUFFER, *specs)
        compiled = compile_module(module)
        assert compiled.asm["cubin"], name
        _compiled[name] = compiled.asm["ptx"]
    return _compiled[name]


def _instructions(ptx: str, pattern: str) -> list[str]:
    """The instructions matching ``pattern``, each with its guard (``@%p``) if any."""
    return [line.strip() for line in ptx.splitlines() if re.match(rf"\s*(@!?%p\d+\s+)?{pattern}",
                                                                   line)]


@pytest.mark.parametrize("name", _CASES)
def test_kernel_compiles_and_every_write_is_guarded(name):
    writes = _instructions(_ptx(name), r"(st|atom|red)\.global")
    assert writes, name
    unguarded = [w for w in writes if not w.startswith("@")]
    assert not unguarded, unguarded


@pytest.mark.parametrize("name", [n for n in _CASES if n.startswith("add_")])
def test_owner_write_instructions(name):
    ptx = _ptx(name)
    atomics = _instructions(ptx, r"(atom|red)\.global")
    stores = _instructions(ptx, r"st\.global")
    if name.endswith("_atomic"):
        # 16-byte float32 atomics (one choice per row keeps them whole), and
        # the store that writes the rows the atomic would flush.
        assert atomics and all(".add.v4.f32" in a for a in atomics), atomics
        assert stores, "no store for the rows the atomic leaves out"
    else:
        assert not atomics, atomics
        assert stores and all(".v4." in s for s in stores), stores
