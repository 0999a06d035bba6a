"""An eager call's result or pinned input, dropped at once, cannot free memory it still uses.

JAX frees a pinned_host array that Python drops while a computation still writes or reads
it, and the next pinned_host array may get that memory: a late write lands in the new
array, a late read returns its values. Each eager call of ours therefore returns only once
its computation is done, while it still holds its arguments
(``_placement.wait_for_result``). The GPU test runs the race in a child process
(tests/dropped_child.py), with that wait and without it: the check must see the race
without it, or it proves nothing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallas_pinned as pp
from pallas_pinned import _placement
from tests.helpers import put

CHILD = os.path.join(os.path.dirname(__file__), "dropped_child.py")
CALLS = {
    "set": lambda x, i, u: pp.scatter_to_host(x, i, u),
    "add": lambda x, i, u: pp.scatter_add_to_host(x, i, u),
    "at max": lambda x, i, u: pp.at(x)[i].max(u),
    "gather": lambda x, i, u: pp.gather_from_host(x, i),
    "sort_indices": lambda x, i, u: pp.sort_indices(i, x.shape[0]),
}


@pytest.mark.parametrize("name", sorted(CALLS))
def test_an_eager_call_waits_for_its_result_and_a_jitted_one_does_not(monkeypatch, name):
    waited = []
    real = _placement.wait_for_result
    monkeypatch.setattr(_placement, "wait_for_result",
                        lambda result: waited.append(result) or real(result))
    x = put(np.arange(24, dtype=np.float32).reshape(8, 3))
    idx, upd = put(np.array([1, 3], np.int32)), put(np.ones((2, 3), np.float32))
    out = CALLS[name](x, idx, upd)
    assert len(waited) == 1 and jax.tree.leaves(waited[0]) == jax.tree.leaves(out)
    waited.clear()
    jax.jit(CALLS[name])(put(np.zeros((8, 3), np.float32)), idx, upd)
    assert not waited, "under jit the caller's own program holds its arrays"


def test_a_write_of_nothing_returns_x_and_waits_for_nothing(monkeypatch):
    waited = []
    monkeypatch.setattr(_placement, "wait_for_result", lambda result: waited.append(result))
    x = put(np.zeros((8, 3), np.float32))
    assert pp.scatter_to_host(x, jnp.zeros((0,), jnp.int32), 1.0) is x
    assert not waited


def _child(case: str, *flags: str) -> dict:
    done = subprocess.run([sys.executable, CHILD, case, *flags], capture_output=True,
                          text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.gpu
@pytest.mark.parametrize("case", ["add's result", "gather's buffer", "add's pinned updates"])
def test_a_late_call_with_a_dropped_array_leaves_the_next_pinned_array_alone(case):
    protected = _child(case)
    assert protected["wrong"] == 0, protected
    unprotected = _child(case, "--unprotected")
    assert unprotected["wrong"] > 0, (
        f"without the wait the check saw no race in {unprotected['trials']} trials: it "
        "cannot tell the protection from its absence")
