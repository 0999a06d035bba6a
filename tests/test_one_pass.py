"""One pass of checks: from a public op, the buffer ``x`` enters each module at most once.

The facts about ``x`` (concrete, alive, memory, mesh, sharding) are read once
(``_placement.facts``), ``_validation`` checks them with the operands in one pass
(in full, or a kept plan's recheck), and the run takes the facts instead of asking
again. A profiler follows ``x`` through the package: every function entered with
``x`` among its locals, in order. A module left and entered again is a re-entry.
"""

from __future__ import annotations

import inspect
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallas_pinned as pp
from pallas_pinned import _front, _local_write, _placement
from tests.helpers import put

IDX = jnp.array([1, 5, 7], jnp.int32)
UPD = jnp.ones((3, 4), jnp.float32)
OPS = {
    "write": lambda x: pp.scatter_to_host(x, IDX, UPD),
    "read": lambda x: pp.gather_from_host(x, IDX),
    # An explicit kernel backend: whether it can run is asked of the facts too.
    "write_interpret": lambda x: pp.scatter_to_host(x, IDX, UPD, backend="interpret"),
    "read_interpret": lambda x: pp.gather_from_host(x, IDX, backend="interpret"),
}


def _stops(op, x) -> list[tuple[str, str]]:
    """``(module, function)`` of each pallas_pinned function entered with ``x`` as a local."""
    stops = []

    def profile(frame, event, arg):
        module = frame.f_globals.get("__name__", "")
        if event == "call" and module.startswith("pallas_pinned"):
            if any(value is x for value in frame.f_locals.values()):
                stops.append((module.removeprefix("pallas_pinned."), frame.f_code.co_name))

    sys.setprofile(profile)
    try:
        op(x)
    finally:
        sys.setprofile(None)
    return stops


def _reentries(stops) -> int:
    """How many times ``x`` comes back to a module it left."""
    modules = [module for module, _ in stops]
    runs = [m for k, m in enumerate(modules) if k == 0 or modules[k - 1] != m]
    return len(runs) - len(set(runs))


def _buffer():
    return put(np.zeros((8, 4), np.float32))


@pytest.mark.parametrize("path", ["fresh", "kept", "jit"])
@pytest.mark.parametrize("name", list(OPS))
def test_x_enters_each_module_once(monkeypatch, name, path):
    for front in ("read", "write"):  # Without the suite's check that "interpret" stages a
        # kernel (tests/conftest.py): it runs each such call twice, once under make_jaxpr.
        monkeypatch.setattr(_front, front, inspect.unwrap(getattr(_front, front)))
    op = OPS[name]
    op(_buffer())  # Compiled, and the signature's plan kept.
    if path == "fresh":
        _front._PLANS.clear()
    if path == "jit":
        seen = []
        jax.jit(lambda x: seen.append(_stops(op, x)) or op(x))(_buffer())
        (stops,) = seen
    else:
        stops = _stops(op, _buffer())
    assert _reentries(stops) == 0, "\n".join(map(str, stops))
    assert stops.count(("_placement", "facts")) == 1, stops  # Its facts: read once.
    check = "check_kept" if path == "kept" else f"check_{name.split('_')[0]}"
    assert ("_validation", check) in stops, stops  # And checked, by the path named.


def test_a_second_question_about_x_is_a_reentry(monkeypatch):
    # The test's own check: asking _placement about x again, after the checks, is caught.
    real = _local_write.write

    def asking_again(x, *args):
        _placement.is_concrete(x)
        return real(x, *args)

    monkeypatch.setattr(_local_write, "write", asking_again)
    stops = _stops(OPS["write"], _buffer())
    assert _reentries(stops) == 1
    assert stops[-2:] == [("_placement", "is_concrete"), ("_local_write", "write")]
