"""Child process of tests/test_provenance.py: buffer makers, each through every op, backend, mode.

Run as ``python tests/provenance_child.py MAKER[,MAKER...] BACKEND[,BACKEND...]``;
the makers run one after another. A buffer whose type disagrees with its
sharding can make jax abort the whole process (jax 0.12 on CPU), so every
provenance case runs here, away from pytest. The child prints one JSON object
per line and flushes each at once:

* ``{"begin": maker}`` before each maker's records;
* ``{"skip": reason}`` when the maker cannot exist here (orbax or torch
  missing, no CUDA, no such memory kind);
* ``{"maker": ..., "memory_kind": ..., ...}``: what the maker made, and what
  ``fix_memory_space`` did to it;
* ``{"start": case}`` before each case and ``{"case": case, "error": ...,
  "note": ...}`` after it (``error`` is None when it passed; ``note`` is
  "borrowed" when x was memory jax does not own, see below), so a process
  that dies names the case it died in;
* ``{"done": count}`` at the end of the maker's cases.

Every case uses fresh random data (multiples of 1/4, so sums are exact in any
order), indices with a duplicate, a negative and out-of-range rows, and checks
the result against the numpy oracles of :mod:`pallas_pinned.testing`.
"""

from __future__ import annotations

import json
import sys
import tempfile
import traceback
import zlib

import jax
import jax.numpy as jnp
import numpy as np

import pallas_pinned as pp
from pallas_pinned.testing import assert_same, gather_oracle, scatter_add_oracle, scatter_oracle

NUM_ROWS, WIDTH, NUM_INDICES = 16, 3, 7
# pp.at(x)[i].set/add/get make the very same calls (pallas_pinned/at.py).
OPS = ("set", "add", "gather")
MODES = ("eager", "jit")


def emit(**record) -> None:
    print(json.dumps(record), flush=True)


class Skip(Exception):
    """The maker cannot run in this environment."""


# --- the makers: each returns a buffer holding exactly the source's values -------
#
# On CPU, jax may wrap an aligned numpy array without copying it (device_put,
# make_array_from_callback), and a DLPack import always borrows the tensor's
# memory. jax cannot donate memory it does not own: an eager set/add then
# writes a copy (the result is right and x is still consumed). Each maker
# records the host memory it was given in BORROWABLE, so that a case can tell
# a borrowed buffer from one that failed to be updated in place.

BORROWABLE: list[tuple[int, int]] = []  # (address, size in bytes) of foreign memory.
# Makers that hand jax numpy memory of their own on CPU (orbax reads the
# checkpoint into numpy arrays), whose addresses the child cannot know.
MAY_BORROW_ON_CPU = ("orbax_restore",)


def _lend(source: np.ndarray) -> np.ndarray:
    BORROWABLE.append((source.ctypes.data, source.nbytes))
    return source


def borrows_foreign_memory(maker: str, buf) -> bool:
    if maker in MAY_BORROW_ON_CPU and _device().platform == "cpu":
        return True
    pointer = buf.unsafe_buffer_pointer()
    return any(start <= pointer < start + size for start, size in BORROWABLE)


def _device():
    return jax.devices()[0]


def _sharding(kind: str):
    return jax.sharding.make_single_device_sharding(_device(), memory_kind=kind)


def _named_pinned():
    mesh = jax.sharding.Mesh(np.asarray([_device()]), ("one",))
    return jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(), memory_kind="pinned_host")


# Jitted makers take the data as an argument (not a captured constant), so
# fresh data does not recompile them.
_JIT_SINGLE = jax.jit(lambda a: a * 1, out_shardings=_sharding("pinned_host"))
_JIT_NAMED = jax.jit(lambda a: a * 1, out_shardings=_named_pinned())
_JIT_SPACE = jax.jit(lambda a: jax.device_put(a * 1, jax.memory.Space.Host))
_USER_PLUS_ONE = jax.jit(lambda x: x + 1, out_shardings=_sharding("pinned_host"))


def _orbax_restore(x0):
    try:
        import orbax.checkpoint as ocp
    except ImportError as err:
        # The [test] extra installs it: CI fails a run that skips for it.
        raise Skip(f"needs orbax-checkpoint ({err}; the [test] extra installs it)") from None
    with tempfile.TemporaryDirectory() as tmp:
        checkpointer = ocp.StandardCheckpointer()
        checkpointer.save(f"{tmp}/ckpt", {"x": jnp.asarray(x0)})
        checkpointer.wait_until_finished()
        target = {"x": jax.ShapeDtypeStruct(x0.shape, x0.dtype, sharding=_sharding("pinned_host"))}
        restored = checkpointer.restore(f"{tmp}/ckpt", target)["x"]
        return jax.block_until_ready(restored)


_TORCH_TENSORS = []  # The DLPack arrays borrow these tensors' memory: keep them alive.


def _dlpack_pinned_torch(x0):
    try:
        import torch
    except ImportError as err:
        raise Skip(f"needs torch ({err})") from None
    if not torch.cuda.is_available():
        raise Skip("needs torch with CUDA (for a pinned tensor)")
    tensor = torch.from_numpy(np.array(x0)).pin_memory()
    _TORCH_TENSORS.append(tensor)
    BORROWABLE.append((tensor.data_ptr(), tensor.numel() * tensor.element_size()))
    return jax.dlpack.from_dlpack(tensor)


def _unpinned_host(x0):
    kinds = {memory.kind for memory in _device().addressable_memories()}
    if "unpinned_host" not in kinds:
        raise Skip(f"{_device().platform} has no unpinned_host memory (has {sorted(kinds)})")
    return jax.device_put(_lend(x0), _sharding("unpinned_host"))


MAKERS = {
    "device_put_numpy": lambda x0: jax.device_put(_lend(x0), _sharding("pinned_host")),
    "device_put_device_array": lambda x0: jax.device_put(
        jax.device_put(_lend(x0), _device()), _sharding("pinned_host")
    ),
    "jit_out_single_device_sharding": lambda x0: _JIT_SINGLE(x0),
    "jit_out_named_sharding": lambda x0: _JIT_NAMED(x0),
    "jit_device_put_space_host": lambda x0: _JIT_SPACE(x0),
    "make_array_from_callback": lambda x0: jax.make_array_from_callback(
        x0.shape, _sharding("pinned_host"), lambda index: _lend(x0)[index]
    ),
    "make_array_from_single_device_arrays": lambda x0: jax.make_array_from_single_device_arrays(
        x0.shape, _sharding("pinned_host"), [jax.device_put(_lend(x0), _sharding("pinned_host"))]
    ),
    # Every row rewritten by an eager call of ours: its result is the buffer.
    "output_of_our_call": lambda x0: pp.scatter_to_host(
        jax.device_put(np.zeros_like(x0), _sharding("pinned_host")), slice(None), x0
    ),
    "output_of_user_jit": lambda x0: _USER_PLUS_ONE(
        jax.device_put(x0 - 1, _sharding("pinned_host"))
    ),
    "orbax_restore": _orbax_restore,
    "dlpack_pinned_torch": _dlpack_pinned_torch,
    "unpinned_host": _unpinned_host,
}


# --- the ops, as the user calls them ------------------------------------------


def _op(op: str, backend: str):
    def set_(x, i, u):
        return pp.scatter_to_host(x, i, u, backend=backend)

    def add(x, i, u):
        return pp.scatter_add_to_host(x, i, u, backend=backend)

    def gather(x, i):
        return pp.gather_from_host(x, i, mode="fill", backend=backend)

    return {"set": set_, "add": add, "gather": gather}[op]


def _quarters(rng, shape) -> np.ndarray:
    quarters = rng.integers(-64, 64, size=shape)
    quarters[quarters == 0] = 1  # Never zero: an untouched row shows.
    return (quarters / 4).astype(np.float32)


def _case_data(maker: str, case: str):
    rng = np.random.default_rng(zlib.crc32(f"{maker}/{case}".encode()))
    x0 = _quarters(rng, (NUM_ROWS, WIDTH))
    idx = rng.integers(-NUM_ROWS - 3, NUM_ROWS + 3, size=NUM_INDICES)
    idx[1], idx[2] = idx[0], -1  # A sure duplicate and a wrapped negative.
    upd = _quarters(rng, (NUM_INDICES, WIDTH))
    return x0, idx, upd


_USER_JITS: dict = {}


def _user_jit(op: str, backend: str, out_sharding):
    """The user's own jit around one op: donating for set/add, not for gather."""
    key = (op, backend, out_sharding)
    if key not in _USER_JITS:
        kwargs = {} if out_sharding is None else {"out_shardings": out_sharding}
        if op.endswith(("set", "add")):
            kwargs["donate_argnums"] = 0
        _USER_JITS[key] = jax.jit(_op(op, backend), **kwargs)
    return _USER_JITS[key]


def run_case(maker: str, op: str, backend: str, mode: str) -> str | None:
    """Runs one case; returns "borrowed" when x could not be updated in place (see above)."""
    x0, idx, upd = _case_data(maker, f"{op}/{backend}/{mode}")
    BORROWABLE.clear()  # Only this case's sources: freed addresses get reused.
    source = x0.copy()  # x0 stays pristine for the oracle; source lives as long as buf.
    buf = MAKERS[maker](source)
    kind = buf.sharding.memory_kind
    writes = op.endswith(("set", "add"))
    args = (jnp.asarray(idx), jnp.asarray(upd)) if writes else (jnp.asarray(idx),)
    if mode == "eager":
        arg = buf
        pointer = buf.unsafe_buffer_pointer()
        borrowed = borrows_foreign_memory(maker, buf)
        out = _op(op, backend)(buf, *args)
    else:
        # The documented way into the user's own jit: the type must say where
        # the buffer lives; an unpinned_host buffer (whose type always says
        # device) also needs its result placed where it was.
        arg = pp.fix_memory_space(buf)
        out_sharding = buf.sharding if writes and kind == "unpinned_host" else None
        out = _user_jit(op, backend, out_sharding)(arg, *args)
    if op == "set":
        expected = scatter_oracle(x0, idx, upd)
    elif op == "add":
        expected = scatter_add_oracle(x0, idx, upd)
    else:
        expected = gather_oracle(x0, idx, "fill")
    assert_same(np.asarray(out), expected, what=f"{op} result")
    if writes:
        assert out.sharding.memory_kind == kind, (out.sharding, kind)
        if mode == "eager":
            assert buf.is_deleted(), "the eager call did not consume x"
            if borrowed:
                return "borrowed"
            assert out.unsafe_buffer_pointer() == pointer, "not updated in place"
    else:
        assert out.sharding.memory_kind == "device", out.sharding
        assert not buf.is_deleted() and not arg.is_deleted(), "the gather consumed x"
        assert_same(np.asarray(buf), x0, what="x after the gather")
    return None


def describe_maker(maker: str) -> dict:
    """What the maker made, and what fix_memory_space does to it."""
    x0 = _quarters(np.random.default_rng(zlib.crc32(maker.encode())), (NUM_ROWS, WIDTH))
    buf = MAKERS[maker](x0.copy())
    fixed = pp.fix_memory_space(buf)
    return {
        "maker": maker,
        "platform": _device().platform,
        "memory_kind": buf.sharding.memory_kind,
        "sharding": type(buf.sharding).__name__,
        "type_space": str(jax.typeof(buf).memory_space),
        "fixed_kind": fixed.sharding.memory_kind,
        "fixed_type_space": str(jax.typeof(fixed).memory_space),
        "fixed_same_pointer": fixed.unsafe_buffer_pointer() == buf.unsafe_buffer_pointer(),
        "fixed_is_same_object": fixed is buf,
        "buf_alive_after_fix": not buf.is_deleted(),
        "fixed_contents_ok": bool(np.array_equal(np.asarray(fixed), x0)),
    }


def main(maker: str, backends: list[str]) -> None:
    try:
        emit(**describe_maker(maker))
    except Skip as skip:
        emit(skip=str(skip))
        return
    count = 0
    for op in OPS:
        for backend in backends:
            for mode in MODES:
                case = f"{op}/{backend}/{mode}"
                emit(start=case)
                note = error = None
                try:
                    note = run_case(maker, op, backend, mode)
                except Exception as err:  # Recorded; the parent fails the test.
                    error = f"{type(err).__name__}: {err}\n{traceback.format_exc(limit=-3)}"
                emit(case=case, error=error, note=note)
                count += 1
    emit(done=count)


if __name__ == "__main__":
    for name in sys.argv[1].split(","):
        emit(begin=name)
        main(name, sys.argv[2].split(","))
