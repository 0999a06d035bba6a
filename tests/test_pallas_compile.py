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
    from pallas_pinned.kernels import order_pallas as op
    from pallas_pinned.kernels import scatter_add_pallas as ap
    from pallas_pinned.kernels import scatter_pallas as sp

    rows, updates = S((4096,), jnp.int32), S((4096, 128), jnp.float32)
    raw, raw_updates = S((256,), jnp.int32), S((256, 128), jnp.float32)
    cases = {
        "scatter_rows": (lambda x, r, u: sp.scatter_rows(x, r, None, u), rows, updates),
        "scatter_rows_fused": (
            lambda x, r, u: sp.scatter_rows_fused(x, r, u, mode=None),
            raw, raw_updates,
        ),
        # Promised distinct as written: the duplicate search behind a check for negatives.
        "scatter_rows_fused_unless_negative": (
            lambda x, r, u: sp.scatter_rows_fused(x, r, u, mode=None,
                                                  distinct="unless_negative"),
            raw, raw_updates,
        ),
        "gather_rows": (lambda x, r: gp.gather_rows(x, r), rows),
        "stable_order": (lambda x, r: op.stable_order(r), rows),  # the chunk loop
        "stable_order_one_chunk": (lambda x, r: op.stable_order(r), S((1024,), jnp.int32)),
    }
    owner_writes = {"": {}, "_atomic": {"atomic_write": True}}
    for suffix, kw in owner_writes.items():
        cases[f"add_rows{suffix}"] = (
            lambda x, r, u, kw=kw: ap.scatter_add_rows(x, r, None, u, **kw), rows, updates,
        )
        cases[f"add_sorted_runs{suffix}"] = (
            lambda x, r, u, kw=kw: ap.scatter_add_sorted_runs(x, r, None, u, **kw),
            rows, updates,
        )
        cases[f"add_fused{suffix}"] = (
            lambda x, r, u, kw=kw: ap.scatter_add_rows_fused(
                x, r, u, mode=None, **kw
            ),
            raw, raw_updates,
        )
    cases["add_fused_unless_negative"] = (
        lambda x, r, u: ap.scatter_add_rows_fused(x, r, u, mode=None, distinct="unless_negative"),
        raw, raw_updates,
    )
    return cases


_CASES = sorted(_kernels()) if _NO_TRITON is None else ["none"]
_compiled: dict = {}


def _compile(name: str):
    """The kernel compiled for sm_90 (down to the cubin), once per module run."""
    if name not in _compiled:
        from tests.pallas_aot import compile_module, triton_modules

        fn, *specs = _kernels()[name]
        [module] = triton_modules(fn, BUFFER, *specs)
        _compiled[name] = compile_module(module)
        assert _compiled[name].asm["cubin"], name
    return _compiled[name]


def _ptx(name: str) -> str:
    return _compile(name).asm["ptx"]


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
        assert all(".acq_rel." in a for a in atomics), atomics
    else:
        assert not atomics, atomics
        assert stores and all(".v4." in s for s in stores), stores


