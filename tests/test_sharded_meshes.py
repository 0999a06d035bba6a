"""Buffers on meshes that mix ``Explicit`` and ``Auto`` axes, inputs typed on another mesh,
and inputs sharded over a mesh into a one-device buffer, with the suite's 2 CPU devices."""

from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import pallas_pinned as pp
from tests.helpers import put, read

_EXPLICIT, _AUTO = jax.sharding.AxisType.Explicit, jax.sharding.AxisType.Auto
X0 = np.arange(64, dtype=np.float32).reshape(16, 4)
COLUMNS = np.array([0, 3, 1, 3], np.int32)  # A duplicate column: add sums it.


def _calls(on_a):
    """Each call with an index or updates sharded over the mesh's Explicit axis, landing
    on the rows' inner axis, and jnp's result for it."""
    columns, ones = on_a(COLUMNS), on_a(np.ones(4, np.float32))
    base = jnp.asarray(X0)
    return {
        "add, index sharded": (lambda x: pp.at(x)[:, columns].add(1.0),
                               base.at[:, COLUMNS].add(1.0)),
        "set, index sharded": (lambda x: pp.at(x)[jax.ds(0, 8), columns].set(-2.0),
                               base.at[jax.ds(0, 8), COLUMNS].set(-2.0)),
        "add, updates sharded": (lambda x: pp.at(x)[:, COLUMNS].add(ones),
                                 base.at[:, COLUMNS].add(1.0)),
        "get, index sharded": (lambda x: pp.at(x)[:, columns].get(), base[:, COLUMNS]),
    }


@pytest.mark.parametrize("case", list(_calls(lambda a: a)))
@pytest.mark.parametrize("jitted", [False, True])
def test_an_index_or_updates_sharded_over_a_mixed_mesh_give_jnps_result(case, jitted):
    # The index or updates are gathered to every device first; on a mesh that mixes in
    # Auto axes only jax.reshard retypes them (a sharding constraint left them typed
    # sharded, and the rows' reshape raised JAX's ShardingTypeError).
    mesh = jax.make_mesh((2, 1), ("a", "b"), axis_types=(_EXPLICIT, _AUTO))
    call, theirs = _calls(lambda v: jax.device_put(v, NamedSharding(mesh, P("a"))))[case]
    placed = NamedSharding(mesh, P("a"), memory_kind="pinned_host")
    out = (jax.jit(call) if jitted else call)(jax.device_put(X0, placed))
    assert np.asarray(out).tobytes() == np.asarray(theirs).tobytes()
    if not case.startswith("get"):
        # Where jit itself leaves such a buffer: in device memory on this mesh (jax
        # 0.12.0.1, documented), even for the identity; eagerly in pinned_host.
        same = jax.jit(lambda x: x, donate_argnums=0)(jax.device_put(X0, placed))
        expected = same.sharding.memory_kind if jitted else "pinned_host"
        assert out.sharding.memory_kind == expected, out.sharding


@pytest.mark.parametrize("method", ["add", "subtract", "min", "max", "multiply", "set"])
def test_the_sign_of_a_zero_on_an_auto_mesh_is_the_one_the_readme_states(method):
    # Inside jit on an Auto mesh the ops see one array, and XLA partitions the read of the
    # rows they combine with as a sum of each device's part: -0.0 reads as +0.0, as jnp's
    # own x[i] does there. set reads nothing; outside jit the sharded layer keeps the sign.
    mesh = jax.make_mesh((2,), ("d",), axis_types=(_AUTO,))
    placed = NamedSharding(mesh, P("d"), memory_kind="pinned_host")
    x0, rows = np.full((8, 2), -0.0, np.float32), np.array([1, 6])
    update = {"add": -0.0, "subtract": 0.0, "min": 0.0, "max": -0.0, "multiply": 1.0,
              "set": -0.0}[method]
    theirs = getattr(jnp.asarray(x0).at[rows], method)(update)
    assert np.signbit(np.asarray(theirs)).all()

    def write(x):
        return getattr(pp.at(x)[rows], method)(update)

    eager = write(jax.device_put(x0, placed))
    assert np.asarray(eager).tobytes() == np.asarray(theirs).tobytes()
    jitted = np.asarray(jax.jit(write, donate_argnums=0)(jax.device_put(x0, placed)))
    read_there = jax.jit(lambda x: x[rows])(jax.device_put(x0, NamedSharding(mesh, P("d"))))
    assert not np.signbit(np.asarray(read_there)).any()  # XLA's partitioned read: +0.0.
    assert np.signbit(jitted[rows]).all() == (method == "set")
    untouched = np.delete(np.arange(8), rows)
    assert np.signbit(jitted[untouched]).all()  # Rows not written keep their -0.0.


def test_a_zero_multiplied_by_a_negative_on_an_auto_mesh_takes_the_sign_the_readme_states():
    # The same partitioned read, +0.0 for -0.0, the other way round: times -1 it ends -0.0
    # where jnp's product is +0.0. Outside jit the sign is jnp's.
    mesh = jax.make_mesh((2,), ("d",), axis_types=(_AUTO,))
    placed = NamedSharding(mesh, P("d"), memory_kind="pinned_host")
    x0, rows = np.full((8, 2), -0.0, np.float32), np.array([1, 6])
    theirs = np.asarray(jnp.asarray(x0).at[rows].multiply(-1.0))
    assert not np.signbit(theirs[rows]).any()

    def write(x):
        return pp.at(x)[rows].multiply(-1.0)

    assert np.asarray(write(jax.device_put(x0, placed))).tobytes() == theirs.tobytes()
    jitted = np.asarray(jax.jit(write, donate_argnums=0)(jax.device_put(x0, placed)))
    assert np.signbit(jitted[rows]).all()


def test_an_eager_shard_map_write_reuses_its_jit_wrapper():
    # Eagerly, shard_map has no custom_vjp with symbolic zeros, so the write is jitted
    # inside it: once per call, not a new jax.jit wrapper (and trace) on every step.
    from pallas_pinned import _local_write

    mesh = jax.make_mesh((2,), ("data",))
    pinned = NamedSharding(mesh, P("data"), memory_kind="pinned_host")
    step = jax.shard_map(
        lambda x, ids: pp.at(x)[ids].add(1.0, backend="xla"),
        mesh=mesh, in_specs=(P("data"), P()), out_specs=P("data"),
    )
    ids = jnp.array([1, 0, 1], jnp.int32)
    before = _local_write._jitted_rules.cache_info()
    step(jax.device_put(X0, pinned), ids)
    first = _local_write._jitted_rules.cache_info()
    assert first.misses == before.misses + 1  # The first call took that path.
    got = step(jax.device_put(X0, pinned), ids)
    again = _local_write._jitted_rules.cache_info()
    assert (again.misses, again.hits) == (first.misses, first.hits + 1)
    want = jax.jit(jax.shard_map(
        lambda x, ids: x.at[ids].add(1.0), mesh=mesh, in_specs=(P("data"), P()),
        out_specs=P("data"),
    ))(jax.device_put(X0, NamedSharding(mesh, P("data"))), ids)
    assert np.asarray(got).tobytes() == np.asarray(want).tobytes()


# Four CPU devices (the suite's process has two): a (2, 2) mesh, Auto axis "a" and Explicit
# axis "b", both split. Prints each mode's result: equal to numpy's, and replicated.
_MIXED_READ = """
import json, os
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
import jax, numpy as np
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P
import pallas_pinned as pp
mesh = jax.make_mesh((2, 2), ("a", "b"), axis_types=(AxisType.Auto, AxisType.Explicit))
x0 = np.arange(24, dtype=np.float32).reshape(8, 3)
rows = np.array([1, 7, 2, 4], np.int32)
index = jax.device_put(rows, NamedSharding(mesh, P("a")))
seen = {}
for mode in (None, "clip", "fill", "drop"):
    x = jax.device_put(x0, NamedSharding(mesh, P("a"), memory_kind="pinned_host"))
    out = pp.gather_from_host(x, index, mode=mode)
    seen[str(mode)] = [np.asarray(out).tobytes() == x0[rows].tobytes(),
                       out.sharding.is_fully_replicated, out.sharding.memory_kind]
print(json.dumps(seen))
"""


def test_a_read_over_a_mixed_mesh_comes_back_replicated_whatever_its_index():
    # The README: a gather from a sharded buffer is replicated in device memory. With the
    # index sharded over the Auto axis of a mixed mesh, jax.reshard alone left the fill
    # modes' result sharded like the index (the values were right).
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    done = subprocess.run([sys.executable, "-c", _MIXED_READ], capture_output=True, text=True,
                          env=env, cwd=pathlib.Path(__file__).resolve().parents[1])
    assert done.returncode == 0, done.stderr[-2000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen == {mode: [True, True, "device"] for mode in ("None", "clip", "fill", "drop")}


def test_a_traced_input_sharded_over_a_mesh_into_a_one_device_buffer_is_refused_by_name():
    # Was a TypeError from inside Pallas ("sharded ref ... can only be indexed by slices");
    # jnp refuses it too. The advice, run outside the jit, makes the call work.
    if len(jax.devices()) < 2:
        pytest.skip("needs two devices")
    x0 = np.arange(12, dtype=np.float32).reshape(6, 2)
    mesh = jax.make_mesh((2,), ("data",), axis_types=(jax.sharding.AxisType.Explicit,))
    indices = jax.device_put(np.array([1, 4], np.int32), NamedSharding(mesh, P("data")))
    x = put(x0)
    call = jax.jit(lambda x, i: pp.scatter_add_to_host(x, i, 1.0), donate_argnums=0)
    pattern = r"indices is sharded over the mesh .*on one device.*\((jax\.device_put\(.*\)), "
    with pytest.raises(ValueError, match=pattern) as err:
        call(x, indices)
    assert not x.is_deleted()
    with pytest.raises(ValueError, match=pattern):  # x closed over: concrete in the trace.
        jax.jit(lambda i: pp.scatter_add_to_host(x, i, 1.0))(indices)
    assert not x.is_deleted()
    advice = re.search(pattern, str(err.value)).group(1)
    moved = eval(advice, {"jax": jax, "indices": indices, "x": x})
    np.testing.assert_array_equal(read(call(x, moved))[[1, 4]], x0[[1, 4]] + 1)


@pytest.mark.parametrize("jitted", [False, True])
@pytest.mark.parametrize("spec", [P(), P("data")])
@pytest.mark.parametrize("which", ["indices", "updates"])
def test_an_input_typed_on_an_explicit_mesh_into_a_buffer_on_an_auto_one_is_refused(
        which, spec, jitted):
    # x replicated over an Auto mesh runs the one-device ops on each copy; an input typed
    # on an Explicit mesh of the same devices failed inside JAX ("Mesh for all inputs
    # should be equal") or Pallas ("sharded ref ... can only be indexed by slices").
    # jnp refuses it too. The advice, run outside the jit, makes the call work.
    if len(jax.devices()) < 2:
        pytest.skip("needs two devices")
    auto = jax.make_mesh((2,), ("data",), axis_types=(_AUTO,))
    explicit = jax.make_mesh((2,), ("data",), axis_types=(_EXPLICIT,))
    inputs = {"indices": np.array([1, 4], np.int32), "updates": np.ones((2, 4), np.float32)}
    inputs[which] = jax.device_put(inputs[which], NamedSharding(explicit, spec))
    x = jax.device_put(X0, NamedSharding(auto, P(), memory_kind="pinned_host"))
    call = lambda x, i, u: pp.scatter_add_to_host(x, i, u)  # noqa: E731
    call = jax.jit(call, donate_argnums=0) if jitted else call
    pattern = (rf"{which} is typed on the mesh .*\(Explicit\) but x on .*\(Auto\); .*"
               rf"\((jax\.device_put\({which}, .*\)\)\))(, outside the jit)?\) or x on")
    with pytest.raises(ValueError, match=pattern) as err:
        call(x, inputs["indices"], inputs["updates"])
    assert not x.is_deleted()
    np.testing.assert_array_equal(read(x), X0)
    advice = re.search(pattern, str(err.value)).group(1)
    inputs[which] = eval(advice, {"jax": jax, "NamedSharding": NamedSharding, "P": P,
                                  which: inputs[which], "x": x})
    out = call(x, inputs["indices"], inputs["updates"])
    np.testing.assert_array_equal(read(out), jnp.asarray(X0).at[np.array([1, 4])].add(1.0))


@pytest.mark.parametrize("jitted", [False, True])
@pytest.mark.parametrize("method", ["add", "subtract", "min", "max", "multiply", "set", "get"])
@pytest.mark.parametrize("shape", [(2, 1), (1, 2)])
def test_a_replicated_buffer_on_a_mixed_mesh_runs_the_kernels_with_inputs_on_the_mesh(
        shape, method, jitted):
    # Pallas's interpreter failed there ("dynamic_update_slice operand sharding must be
    # equal to update sharding") for the combining methods: the kernels ran on the whole
    # array, typed on a mesh with an Explicit axis. They run on each copy now, in a
    # shard_map manual over the Explicit axes only, as on an all-Explicit mesh.
    if len(jax.devices()) < 2:
        pytest.skip("needs two devices")
    mesh = jax.make_mesh(shape, ("a", "b"), axis_types=(_EXPLICIT, _AUTO))
    rows = jax.device_put(np.array([1, 5, 1], np.int32), NamedSharding(mesh, P()))
    values = jax.device_put(np.array([[2.0], [-3.0], [0.5]], np.float32), NamedSharding(mesh, P()))
    placed = NamedSharding(mesh, P(), memory_kind="pinned_host")

    def call(x, rows, values):
        ref = pp.at(x)[rows]
        if method == "get":
            return ref.get(backend="interpret")
        return getattr(ref, method)(values, backend="interpret")

    base = jnp.asarray(X0)
    want = (base[np.asarray(rows)] if method == "get"
            else getattr(base.at[np.asarray(rows)], method)(np.asarray(values)))
    out_shardings = None if method == "get" else placed
    run = jax.jit(call, out_shardings=out_shardings) if jitted else call
    got = run(jax.device_put(X0, placed), rows, values)
    assert np.asarray(got).tobytes() == np.asarray(want).tobytes()
    if method != "get":
        assert got.sharding.memory_kind == "pinned_host" and got.sharding.is_fully_replicated


def test_inputs_typed_on_a_mixed_mesh_into_a_buffer_with_explicit_axes_still_run():
    # The refusal above is for a buffer whose mesh is all Auto. A buffer with Explicit axes
    # runs on each copy and gathers such inputs first; jnp refuses this, ours took it before
    # that refusal existed and still does. Inside a shard_map body (Manual axes) JAX's own
    # message names the fix: pass the input as an argument of the shard_map.
    if len(jax.devices()) < 2:
        pytest.skip("needs two devices")
    explicit = jax.make_mesh((2, 1), ("a", "b"), axis_types=(_EXPLICIT, _EXPLICIT))
    mixed = jax.make_mesh((2, 1), ("a", "b"), axis_types=(_EXPLICIT, _AUTO))
    rows = np.array([1, 4, 1], np.int32)
    on_mixed = jax.device_put(rows, NamedSharding(mixed, P()))
    x = jax.device_put(X0, NamedSharding(explicit, P(), memory_kind="pinned_host"))
    out = pp.at(x)[on_mixed].add(1.0)
    assert np.asarray(out).tobytes() == np.asarray(jnp.asarray(X0).at[rows].add(1.0)).tobytes()
    mesh = jax.make_mesh((2,), ("d",), axis_types=(_EXPLICIT,))
    closed_over = jax.device_put(rows, NamedSharding(mesh, P()))
    body = jax.shard_map(lambda x: pp.at(x)[closed_over].add(1.0), mesh=mesh, in_specs=P(),
                         out_specs=P(), check_vma=False)
    x = jax.device_put(X0, NamedSharding(mesh, P(), memory_kind="pinned_host"))
    with pytest.raises(NotImplementedError, match="pass those inputs as an argument"):
        jax.jit(body)(x)
