"""The backend table ``auto`` follows: which implementation was measured fastest, and where.

``backend_table.json`` (written by ``python -m benchmarks.choose_backends`` from the loop
benchmark; the file names its sources) lists, per op and dtype, size classes and the
implementation measured fastest in each. It is trusted for XLA's own path only on the GPU
model and jax release it was measured on.
"""

from __future__ import annotations

import functools
import json
import os
import pathlib
import re
import warnings
from importlib import resources

import jax
import jax.numpy as jnp

from pallas_pinned import _rows

__all__ = ["TABLE_ENV", "measured_choice", "xla_host_path_trusted", "xla_path_serves"]


# Names a table to use instead of the shipped one: one that ``python -m
# benchmarks.choose_backends --out FILE`` wrote from a loop run on your own machine.
TABLE_ENV = "PALLAS_PINNED_BACKEND_TABLE"


@functools.cache
def _table() -> dict:
    """The table ``auto`` follows: ``$PALLAS_PINNED_BACKEND_TABLE``, else the shipped one.

    Read once per process, on the first ``auto`` call that consults it.
    """
    path = os.environ.get(TABLE_ENV)
    if not path:
        text = resources.files("pallas_pinned").joinpath("backend_table.json").read_text()
        return json.loads(text)
    try:
        table = json.loads(pathlib.Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise ValueError(
            f"${TABLE_ENV}={path!r} is not a readable backend table ({err}); write one with "
            f"python -m benchmarks.choose_backends --out FILE, or unset {TABLE_ENV}"
        ) from err
    if not isinstance(table, dict) or not isinstance(table.get("choices"), dict):
        raise ValueError(
            f"${TABLE_ENV}={path!r} has no 'choices': not a table written by "
            "python -m benchmarks.choose_backends"
        )
    return table


def measured_choice(op: str, dtype, num_entries: int, *, distinct: bool = False) -> str:
    """The implementation the table measured fastest: ``"pallas"``, ``"triton"`` or ``"xla"``.

    The table lists, per op and dtype, size classes by their largest entry
    count (``"size_classes"``); a call falls in the first class that holds it
    (the last one beyond, except that XLA's path is never taken beyond the
    measured classes). Where the table says nothing: ``"pallas"``. min,
    max and mul read and write rows as add does: they follow add's entries.
    ``distinct``: the rows are known distinct (``unique_indices=True``, or an index
    form that cannot repeat a row); an entry's ``"distinct_backend"`` then decides,
    where the table measured such rows apart (XLA's set path skips our
    de-duplication there, and its add is slow on rows that repeat).
    """
    table = _table()
    op = {"min": "add", "max": "add", "mul": "add", "get": "gather"}.get(op, op)
    entries = table["choices"].get(op, {}).get(str(jnp.dtype(dtype)), {})
    bounds = table.get("size_classes", [])
    bound = next((b for b in bounds if num_entries <= b), None)
    beyond = bound is None  # more entries than any measured class
    entry = entries.get(str(bounds[-1] if beyond and bounds else bound))
    if not entry:
        return "pallas"
    choice = entry.get("distinct_backend", entry["backend"]) if distinct else entry["backend"]
    if beyond and choice == "xla":
        # XLA's host path was measured up to the last class only, and beyond it XLA's
        # own one-shot add lost to the kernels (benchmarks/results/gather_add_h200.json):
        # the kernels serve beyond.
        return entry["backend"] if entry["backend"] != "xla" else "pallas"
    return choice


def xla_path_serves(op: str, dtype) -> bool:
    """Whether XLA's own formulation gives what the kernels give, for a table's xla entry.

    Set: the same bits (our de-duplication runs first, the last write wins), at a cost
    that does not grow with duplicate indices. Add: the same sums up to the rounding
    order of duplicates, where XLA adds in our accumulator's dtype (float32; bfloat16
    sums would round at every step). min, max and mul follow add's entries but have no
    XLA formulation here. The table takes XLA's path only where it was also measured
    with the rows read back (XLA's path lost there in some cases), and for add only
    where a real client measured it too: XLA's add slowed tenfold on ids that repeat
    (``benchmarks.choose_backends``).
    """
    if op == "set":
        return True
    return op == "add" and _rows.add_accumulator_dtype(dtype) == jnp.dtype(dtype)


@functools.cache
def xla_host_path_trusted() -> bool:
    """Whether ``auto`` may take XLA's own path for a host buffer where the table says so.

    Only on the GPU model and jax release the table was measured on: XLA's handling of
    dynamic indices into host memory changes between releases (older ones abort, 0.11
    tags it host compute), and its speed against the kernels between GPUs. Elsewhere
    the kernels serve, which are correct everywhere, and one warning says so. Never
    when XLA is told not to offload host compute
    (``--xla_disable_automatic_host_compute_offload``), which that path needs.
    """
    measured = _table().get("measured", {})
    release = str(measured.get("jax") or "")
    gpu = str(measured.get("gpu_name") or "")
    flags = os.environ.get("XLA_FLAGS", "")
    if re.search(r"xla_disable_automatic_host_compute_offload(=(true|1))?(\s|$)", flags):
        return False
    here = jax.devices()[0].device_kind
    if release.split(".")[:2] == jax.__version__.split(".")[:2] and gpu == here:
        return True
    warnings.warn(
        f"pallas_pinned's backend table was measured on {gpu or 'an unnamed GPU'} with jax "
        f"{release or '?'}, not on {here} with jax {jax.__version__}: backend='auto' runs "
        "the kernels where the table picked XLA's own path. python -m "
        "benchmarks.choose_backends writes a table for this machine "
        f"(${TABLE_ENV} names it)",
        RuntimeWarning,
        stacklevel=2,
    )
    return False
