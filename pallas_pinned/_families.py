"""The kernel families' launchers, imported on first use.

Importing the package imports no kernel module and not Triton: a family's
modules load when a call first runs one of its kernels.
"""

from __future__ import annotations

import functools
import importlib
import types

__all__ = ["import_kernel", "kernels"]

# The kernel modules of each family.
_FAMILIES = {
    "pallas": {
        "set": "scatter_pallas", "add": "scatter_add_pallas", "get": "gather_pallas",
        "order": "order_pallas",
    },
    "triton": {
        "set": "scatter_triton", "add": "scatter_add_triton", "get": "gather_triton",
    },
}


def import_kernel(name: str):
    return importlib.import_module(f"pallas_pinned.kernels.{name}")


def kernels(family: str, *, interpret: bool = False) -> types.SimpleNamespace:
    """The launchers of one kernel family, by op and path (None where the family has none).

    ``set``, ``set_fused``, ``add``, ``add_fused``, ``add_sorted``, ``order`` (a stable
    order of row numbers) and ``get``. ``interpret``: the Pallas family run by the Pallas
    interpreter (any platform). What each family has is also said to ``_registry``
    (``one_launch``, ``runs``), which plans the paths.
    """
    modules = {op: import_kernel(name) for op, name in _FAMILIES[family].items()}
    return _LAUNCHERS[family](modules, interpret)


def _triton(modules, interpret: bool) -> types.SimpleNamespace:
    del interpret  # Pallas's interpreter runs Pallas kernels only.
    add = modules["add"].scatter_add_rows_triton

    def add_without_atomics(*args, atomic_write: bool = False, **kwargs):
        assert not atomic_write, "the raw Triton add has no atomic write"
        return add(*args, **kwargs)

    return types.SimpleNamespace(
        set=modules["set"].scatter_rows_triton,
        set_fused=None,
        add=add_without_atomics,
        add_fused=None,
        add_sorted=None,
        order=None,
        get=modules["get"].gather_rows_triton,
    )


def _pallas(modules, interpret: bool) -> types.SimpleNamespace:
    interpret = {"interpret": interpret}
    return types.SimpleNamespace(
        set=functools.partial(modules["set"].scatter_rows, **interpret),
        set_fused=functools.partial(modules["set"].scatter_rows_fused, **interpret),
        add=functools.partial(modules["add"].scatter_add_rows, **interpret),
        add_fused=functools.partial(modules["add"].scatter_add_rows_fused, **interpret),
        add_sorted=functools.partial(modules["add"].scatter_add_sorted_runs, **interpret),
        order=functools.partial(modules["order"].stable_order, **interpret),
        get=functools.partial(modules["get"].gather_rows, **interpret),
    )


_LAUNCHERS = {"pallas": _pallas, "triton": _triton}
