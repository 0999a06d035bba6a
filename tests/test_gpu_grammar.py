"""The index grammar on a pinned_host buffer: every form and method against jnp.

jnp on a device-memory copy is the oracle. Each case runs eagerly and inside
a donating jit, through ``auto`` (block copies for blocks, kernels for rows)
and each kernel backend explicitly; the result must stay in pinned_host
memory. The ``pallas`` and ``triton`` cases and the HLO check need a CUDA GPU
(marker ``gpu``); the rest run on CPU too, and with a GPU they are marked
``gpu`` as well, so that the GPU suite (``-m gpu``) still runs them there.
"""

from __future__ import annotations

import re
import zlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallas_pinned as pp
from tests.helpers import AUTO_REPEATS_XLA, PALLAS, TRITON, has_gpu

# Where a GPU is seen the whole module is the GPU suite's (-m gpu), as it always
# was; without one only what is marked gpu below (it needs a GPU) is skipped.
pytestmark = [pytest.mark.gpu] if has_gpu() else []

SHAPE = (12, 10, 6)
FORMS = {
    "kv layer+positions": (3, np.array([1, 4, 7])),
    "inner ring": (slice(None), np.array([9, 0, 1])),
    "advanced apart": (np.array([0, 11]), slice(2, 5), np.array([5, 0])),
    "ds block": (jax.ds(4, 5),),
    "ds on axis 1": (2, jax.ds(3, 4)),
    "ellipsis": (Ellipsis, np.array([1, -1])),
    "newaxis int": (None, -2, slice(1, 9, 3)),
    "int": (7,),
    "axis0 duplicates": (np.array([3, 3, -1, 40]),),
}
METHODS = ("set", "add", "min", "max", "multiply")


# pallas and triton as parameters marked gpu: without a GPU (or the extra) they
# show as skips, never vanish. Off CUDA, auto on a host buffer writes a block as rows
# where xla copies the block: those forms keep their auto case on CPU (it meets jit and
# donation here). Every other form's auto case lowers to the xla case's program there
# (tests/helpers.py, AUTO_REPEATS_XLA): a skip off CUDA.
BLOCK_FORMS = ("ds block", "ds on axis 1", "int")
BACKENDS = ["auto", PALLAS, "xla", TRITON]


def _cases():
    for form in FORMS:
        for backend in BACKENDS:
            name, marks = (backend, ()) if isinstance(backend, str) else (backend.values[0],
                                                                           backend.marks)
            if name == "auto" and form not in BLOCK_FORMS:
                marks = (pytest.mark.skipif(not has_gpu(), reason=AUTO_REPEATS_XLA),)
            yield pytest.param(form, name, marks=marks, id=f"{form}-{name}")


def _oracle(a):
    """``a`` on the CPU: jnp's scatter there applies duplicates in order (last wins)."""
    return jax.device_put(a, jax.devices("cpu")[0])


def _host(a):
    sharding = jax.sharding.make_single_device_sharding(jax.devices()[0], memory_kind="pinned_host")
    return jax.device_put(a, sharding)


@pytest.mark.parametrize("form,backend", list(_cases()))
def test_every_form_and_method_matches_jnp(form, backend):
    rng = np.random.default_rng(zlib.crc32(form.encode()))
    x0 = rng.integers(-8, 8, SHAPE).astype(np.float32)
    index = FORMS[form]
    shape = jnp.asarray(x0)[index].shape
    values = rng.integers(1, 4, shape).astype(np.float32)
    for method in METHODS:
        expected = np.asarray(getattr(_oracle(x0).at[index], method)(values, mode="drop"))
        eager = getattr(pp.at(_host(x0))[index], method)(values, mode="drop", backend=backend)

        def step(x, v, method=method):
            return getattr(pp.at(x)[index], method)(v, mode="drop", backend=backend)

        jitted = jax.jit(step, donate_argnums=0)(_host(x0), values)
        for got in (eager, jitted):
            assert got.sharding.memory_kind == "pinned_host", (method, got.sharding)
            np.testing.assert_array_equal(np.asarray(got), expected, err_msg=f"{method}")
    for mode in (None, "fill", "clip"):
        got = pp.at(_host(x0))[index].get(mode=mode, fill_value=-99, backend=backend)
        expected = _oracle(x0).at[index].get(mode=mode, fill_value=-99)
        np.testing.assert_array_equal(np.asarray(got), np.asarray(expected), err_msg=str(mode))


@pytest.mark.parametrize("backend", ["xla", "auto"])
@pytest.mark.parametrize("mode", [None, "clip", "promise_in_bounds", "wrap"])
def test_traced_block_in_a_scan_matches_jnp(mode, backend):
    # A ring insert at a moving position inside lax.scan, as activation
    # offload and replay buffers write it; with the block copy (backend="xla" takes it
    # for a block) and as rows (auto, for a contiguous block of a host buffer).
    rows, n, steps = 64, 24, 9
    x0 = np.arange(rows * 8, dtype=np.float32).reshape(rows, 8)
    ys = np.arange(steps * n * 8, dtype=np.float32).reshape(steps, n, 8) + 1000
    starts = np.array([0, 5, 40, 50, 63, -3, 70, 17, 1], np.int32)
    if mode == "promise_in_bounds":  # Out-of-range windows are undefined under the promise.
        starts = np.clip(starts, 0, rows - n)

    def body(write):
        def step(x, inputs):
            start, y = inputs
            return write(x, start, y), None

        return step

    def ours(x, start, y):
        return pp.at(x)[jax.ds(start, n)].set(y, mode=mode, backend=backend)

    def theirs(x, start, y):
        if mode == "wrap":
            return x.at[(start + jnp.arange(n)) % rows].set(y)
        return x.at[jax.ds(start, n)].set(y, mode=mode)

    run = jax.jit(lambda x: jax.lax.scan(body(ours), x, (starts, ys))[0], donate_argnums=0)
    got = run(_host(x0))
    expected = jax.lax.scan(body(theirs), _oracle(x0), (starts, ys))[0]
    assert got.sharding.memory_kind == "pinned_host"
    np.testing.assert_array_equal(np.asarray(got), np.asarray(expected))


@pytest.mark.gpu
def test_block_write_in_jit_does_not_copy_the_buffer():
    # XLA's copy of a block into an aliased host buffer: the compiled program
    # keeps the buffer in host memory (S(5)) and copies no more than the block.
    x = _host(np.zeros((1 << 16, 256), np.float32))  # 64 MiB
    step = jax.jit(lambda x, s, y: pp.at(x)[jax.ds(s, 64)].set(y), donate_argnums=0)
    hlo = step.lower(x, 3, np.ones((64, 256), np.float32)).compile().as_text()
    assert "S(5)" in hlo
    # Neither a copy nor an asynchronous copy (copy-start) of the whole buffer.
    big = [line for line in hlo.splitlines()
           if re.search(r" copy(-start)?\(", line) and "65536,256" in line]
    assert not big, big
    out = step(x, 3, np.ones((64, 256), np.float32))
    assert np.asarray(out)[3:67].min() == 1.0 and np.asarray(out)[67:].max() == 0.0
