"""The public ops hand a buffer sharded along axis 0 to the sharded path.

Runs in a child process with 4 CPU devices (the suite's own process has 2):
the public functions on a ``NamedSharding(mesh, P("data"), "pinned_host")``
buffer agree bit for bit with the same calls on a one-device buffer.
"""

from __future__ import annotations

import functools
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import pallas_pinned as pp
from pallas_pinned import _sharded
from pallas_pinned.testing import scatter_oracle

_CHILD = textwrap.dedent(
    """
    import jax
    jax.config.update("jax_num_cpu_devices", 4)
    import jax.numpy as jnp, numpy as np
    import pallas_pinned as pp
    from jax.sharding import NamedSharding, PartitionSpec as P, make_single_device_sharding
    mesh = jax.make_mesh((4,), ("data",))
    sharded = NamedSharding(mesh, P("data"), memory_kind="pinned_host")
    single = make_single_device_sharding(jax.devices()[0], memory_kind="pinned_host")
    rng = np.random.default_rng(7)
    x0 = rng.standard_normal((64, 3)).astype(np.float32)
    idx = rng.integers(-70, 70, 40).astype(np.int32)  # duplicates across shards, out of range
    upd = rng.standard_normal((40, 3)).astype(np.float32)
    results = []
    for sharding in (sharded, single):
        x = jax.device_put(x0, sharding)
        x = pp.scatter_to_host(x, idx, upd)
        x = pp.scatter_add_to_host(x, idx, upd, mode="clip")
        got = pp.gather_from_host(x, idx, mode="fill")
        assert x.sharding.memory_kind == "pinned_host", x.sharding
        results.append((np.asarray(x), np.asarray(got), x.sharding))
    (a, ga, sa), (b, gb, _) = results
    assert sa.spec == P("data"), sa
    assert a.tobytes() == b.tobytes() and ga.tobytes() == gb.tobytes()

    # Every index form: a 3-D buffer sharded along axis 0, against jnp.
    y0 = rng.standard_normal((8, 6, 5)).astype(np.float32)
    sharded3 = NamedSharding(mesh, P("data"), memory_kind="pinned_host")
    forms = [
        (np.array([1, 7, 1]), np.array([0, 5, 2])),
        (slice(None), np.array([4, -1])),
        (jax.ds(3, 4), 2),
        (Ellipsis, np.array([[1], [3]])),
        (np.int32(-2), None, slice(1, 4)),
    ]
    for index in forms:
        for method in ("set", "add", "max"):
            ours = getattr(pp.at(jax.device_put(y0, sharded3))[index], method)(2.5)
            theirs = getattr(jnp.asarray(y0).at[index], method)(2.5)
            assert ours.sharding.spec == P("data"), ours.sharding
            assert np.asarray(ours).tobytes() == np.asarray(theirs).tobytes(), (index, method)
        got = pp.at(jax.device_put(y0, sharded3))[index].get()
        assert np.asarray(got).tobytes() == np.asarray(jnp.asarray(y0)[index]).tobytes(), index
    ring = pp.at(jax.device_put(y0, sharded3))[jax.ds(6, 4)].set(0.0, mode="wrap")
    expected = y0.copy(); expected[[6, 7, 0, 1]] = 0.0
    assert np.asarray(ring).tobytes() == expected.tobytes()

    # A replicated buffer: the same rule eagerly and under jit (each copy updated alike).
    replicated = NamedSharding(mesh, P(), memory_kind="pinned_host")
    expected = jnp.asarray(x0).at[idx].set(upd, mode="drop")
    eager = pp.scatter_to_host(jax.device_put(x0, replicated), idx, upd)
    traced = jax.jit(pp.scatter_to_host, donate_argnums=0)(jax.device_put(x0, replicated), idx, upd)
    for out in (eager, traced):
        assert out.sharding.is_fully_replicated and out.sharding.memory_kind == "pinned_host"
        for shard in out.addressable_shards:
            assert np.asarray(shard.data).tobytes() == np.asarray(expected).tobytes()
    # Its blocks (one update slice) and a rank-0 replicated buffer: the new part is
    # replicated over the mesh too (an update slice wants its operands alike).
    blocks = [(3, "set", {}), (slice(2, 5), "set", {}), (jax.ds(60, 8), "set",
              {"mode": "clip"}), (slice(2, 5), "add", {})]
    for index, method, kw in blocks:
        theirs = getattr(jnp.asarray(x0).at[index], method)(-1.5, **kw)
        for call in (lambda x: getattr(pp.at(x)[index], method)(-1.5, **kw),
                     jax.jit(lambda x: getattr(pp.at(x)[index], method)(-1.5, **kw),
                             donate_argnums=0)):
            out = call(jax.device_put(x0, replicated))
            assert out.sharding.is_fully_replicated, out.sharding
            assert out.sharding.memory_kind == "pinned_host", out.sharding
            assert np.asarray(out).tobytes() == np.asarray(theirs).tobytes(), (index, method)
    scalar = jax.jit(lambda x: pp.at(x)[()].add(2.0), donate_argnums=0)(
        jax.device_put(np.float32(1.5), replicated))
    assert float(scalar) == 3.5 and scalar.sharding.memory_kind == "pinned_host", scalar.sharding

    # Empty reads under jit: the result still lives on the mesh (jit would drop x).
    for sharding in (sharded, replicated):
        for index in (slice(2, 2), np.zeros((0,), np.int32)):
            got = jax.jit(lambda x: pp.at(x)[index].get())(jax.device_put(x0, sharding))
            assert got.shape == (0, 3) and len(got.sharding.device_set) == 4, got.sharding
        starts = jnp.int32(1)
        got = jax.jit(lambda x, s: pp.at(x)[jax.ds(s, 0)].get())(jax.device_put(x0, sharding),
                                                                 starts)
        assert got.shape == (0, 3) and len(got.sharding.device_set) == 4, got.sharding

    # A write that selects nothing takes updates of any shape, as jnp's does.
    for sharding in (sharded, replicated):
        for index in (slice(2, 2), np.zeros((0,), np.int32)):
            ones = np.ones((5, 2), np.float32)
            for call in (lambda x: pp.at(x)[index].add(ones),
                         jax.jit(lambda x: pp.at(x)[index].add(ones), donate_argnums=0)):
                out = call(jax.device_put(x0, sharding))
                assert np.asarray(out).tobytes() == x0.tobytes(), (sharding, index)
        with jax.set_mesh(mesh):  # Its gradient: zeros of the updates' shape, as jnp's.
            grad = jax.jit(jax.grad(lambda u, x: jax.device_put(
                pp.at(x)[np.zeros((0,), np.int32)].add(u), jax.memory.Space.Device).sum()))
            got = grad(np.ones(5, np.float32), jax.device_put(x0, sharding))
        assert np.asarray(got).tobytes() == np.zeros(5, np.float32).tobytes(), sharding

    # A mesh that mixes axis types: a block write into a replicated buffer.
    mixed = jax.make_mesh((2, 2), ("a", "b"), axis_types=(jax.sharding.AxisType.Explicit,
                                                          jax.sharding.AxisType.Auto))
    for kind in ("pinned_host", "device"):
        for index in (3, slice(2, 5)):
            theirs = jnp.asarray(x0).at[index].set(-1.5)
            out = jax.jit(lambda x: pp.at(x)[index].set(-1.5), donate_argnums=0)(
                jax.device_put(x0, NamedSharding(mixed, P(), memory_kind=kind)))
            assert np.asarray(out).tobytes() == np.asarray(theirs).tobytes(), (kind, index)

    # Mesh axes of size 1 in the spec (one GPU running code written for several):
    # the sharded layout with one shard, eagerly and under jit, the spec kept.
    tall = rng.standard_normal((8, 2, 3)).astype(np.float32)
    rows = np.array([1, 6, 1, -2], np.int32)
    for shape, names, spec in (((1,), ("a",), P("a")), ((1, 4), ("a", "b"), P("a")),
                               ((4, 1), ("a", "b"), P(None, "b"))):
        small = jax.make_mesh(shape, names)
        placed = NamedSharding(small, spec, memory_kind="pinned_host")
        for method in ("set", "add", "min"):
            theirs = getattr(jnp.asarray(tall).at[rows], method)(-1.5)
            for call in (lambda x: getattr(pp.at(x)[rows], method)(-1.5),
                         jax.jit(lambda x: getattr(pp.at(x)[rows], method)(-1.5),
                                 donate_argnums=0)):
                out = call(jax.device_put(tall, placed))
                assert out.sharding.is_equivalent_to(placed, tall.ndim), (shape, out.sharding)
                assert out.sharding.memory_kind == "pinned_host", (shape, out.sharding)
                assert np.asarray(out).tobytes() == np.asarray(theirs).tobytes(), (shape, method)
        got = jax.jit(lambda x: pp.at(x)[rows, 1].get())(jax.device_put(tall, placed))
        assert np.asarray(got).tobytes() == tall[rows, 1].tobytes(), shape

    # Indices and updates sharded over the mesh (a data-parallel batch): into a
    # replicated buffer, and on an inner axis of a sharded one.
    on_mesh = lambda a: jax.device_put(a, NamedSharding(mesh, P("data")))
    i4, u4 = on_mesh(np.array([6, 2, -12, 6], np.int32)), on_mesh(np.arange(4.0, dtype=np.float32))
    for kind, index, method, value in (("rows", i4, "set", u4), ("rows", i4, "min", -1.0),
                                       ("block", slice(0, 4), "multiply", u4)):
        theirs = getattr(jnp.asarray(x0[:, 0]).at[np.asarray(index) if kind == "rows" else index],
                         method)(np.asarray(value))
        for call in (lambda x: getattr(pp.at(x)[index], method)(value),
                     jax.jit(lambda x: getattr(pp.at(x)[index], method)(value),
                             donate_argnums=0)):
            out = call(jax.device_put(x0[:, 0], replicated))
            assert out.sharding.is_fully_replicated and out.sharding.memory_kind == "pinned_host"
            assert np.asarray(out).tobytes() == np.asarray(theirs).tobytes(), (kind, method)
    got = jax.jit(lambda x: pp.at(x)[i4].get())(jax.device_put(x0, replicated))
    assert np.asarray(got).tobytes() == x0[np.asarray(i4)].tobytes()
    inner = on_mesh(np.array([0, 2, 1, 0], np.int32))
    theirs = jnp.asarray(y0).at[:, 1, np.asarray(inner)].set(-1.0)  # jnp refuses it sharded.
    for call in (lambda y: pp.at(y)[:, 1, inner].set(-1.0),
                 jax.jit(lambda y: pp.at(y)[:, 1, inner].set(-1.0), donate_argnums=0)):
        out = call(jax.device_put(y0, sharded3))
        assert np.asarray(out).tobytes() == np.asarray(theirs).tobytes()
        assert out.sharding.is_equivalent_to(sharded3, y0.ndim), out.sharding
    got = pp.at(jax.device_put(y0, sharded3))[:, 1, inner].get()
    assert np.asarray(got).tobytes() == y0[:, 1, np.asarray(inner)].tobytes()

    # Updates sharded over the mesh, reshaped to the rows (they are gathered first);
    # sort_indices of sharded ids; the interpreted kernels on a replicated buffer.
    u_rows = on_mesh(rng.standard_normal((4, 6, 5)).astype(np.float32))
    distinct = on_mesh(np.array([6, 2, 4, 0], np.int32))
    theirs = jnp.asarray(y0).at[np.asarray(distinct)].add(np.asarray(u_rows))
    out = pp.at(jax.device_put(y0, sharded3))[distinct].add(u_rows)
    assert np.asarray(out).tobytes() == np.asarray(theirs).tobytes()
    ids_sorted, order = pp.sort_indices(on_mesh(np.array([3, 1, 3, 0], np.int32)), 64)
    assert np.asarray(ids_sorted).tolist() == [0, 1, 3, 3]
    assert np.asarray(order).tolist() == [3, 1, 0, 2]
    for index in (np.asarray(i4), jax.device_put(np.asarray(i4), NamedSharding(mesh, P())), i4):
        out = pp.at(jax.device_put(x0, replicated))[index].add(1.0, backend="interpret")
        assert np.asarray(out).tobytes() == np.asarray(
            jnp.asarray(x0).at[np.asarray(i4)].add(1.0)).tobytes()
    # An index sharded over another mesh of the same devices: refused, x intact.
    other = jax.make_mesh((4,), ("o",))
    for sharding in (replicated, sharded):
        x = jax.device_put(x0, sharding)
        try:
            pp.at(x)[jax.device_put(np.asarray(i4), NamedSharding(other, P("o")))].set(0.0)
        except ValueError as err:
            assert "another mesh than x" in str(err), err
        else:
            raise AssertionError("an index on another mesh was taken")
        assert not x.is_deleted() and np.asarray(x).tobytes() == x0.tobytes()

    # jax.grad with respect to the updates of a sharded buffer, as for one device (the
    # mesh set: jax.grad's own ones for the loss need it, for jnp's arrays as well).
    w = jnp.arange(64.0)[:, None] + jnp.ones(3)
    u3 = jnp.asarray(upd[:8])
    with jax.set_mesh(mesh):
        for method in ("set", "add"):
            for layout in (sharded, replicated):
                x = jax.device_put(x0, layout)
                ours = lambda u: jnp.sum(jax.device_put(getattr(pp.at(x)[idx[:8]], method)(
                    u, mode="drop"), jax.memory.Space.Device) * w)
                theirs = lambda u: jnp.sum(getattr(jnp.asarray(x0).at[idx[:8]], method)(
                    u, mode="drop") * w)
                # Updates sharded over the mesh too: their cotangent comes back so.
                for got in (jax.grad(ours)(u3), jax.jit(jax.grad(ours))(u3),
                            jax.jit(jax.grad(ours))(on_mesh(np.asarray(u3)))):
                    assert np.asarray(got).tobytes() == np.asarray(jax.grad(theirs)(u3)).tobytes()
                assert not x.is_deleted() and np.asarray(x).tobytes() == x0.tobytes()
        x = jax.device_put(x0, sharded)
        for call, what in ((lambda u: pp.at(x)[idx[:8]].min(u), "differentiable with respect"),
                           (lambda u: pp.at(u)[idx[:8]].set(1.0), "buffer x")):
            try:
                jax.grad(lambda u: jnp.sum(jax.device_put(call(u), jax.memory.Space.Device)))(
                    u3 if what != "buffer x" else x)
            except TypeError as err:
                assert what in str(err), err
            else:
                raise AssertionError(f"grad taken: {what}")

    # An Auto mesh, under jit: a write of the whole buffer keeps it sharded (one update
    # slice as large as x would come back with the update's sharding, replicated).
    auto = jax.make_mesh((4,), ("data",), axis_types=(jax.sharding.AxisType.Auto,))
    on_auto = NamedSharding(auto, P("data"), memory_kind="pinned_host")
    for index in (slice(None), Ellipsis, (slice(None), None)):
        for method in ("set", "add"):
            theirs = getattr(jnp.asarray(x0).at[index], method)(2.0)
            out = jax.jit(lambda x: getattr(pp.at(x)[index], method)(2.0), donate_argnums=0)(
                jax.device_put(x0, on_auto))
            assert out.sharding.is_equivalent_to(on_auto, x0.ndim), (index, out.sharding)
            assert np.asarray(out).tobytes() == np.asarray(theirs).tobytes(), (index, method)

    # A write of constants inside an eager grad: its result stays inside, so x stays.
    x = jax.device_put(x0, sharded)
    jax.grad(lambda u: (pp.at(x)[1].set(7.0), jnp.sum(u))[1])(jnp.ones(2))
    assert not x.is_deleted() and np.asarray(x).tobytes() == x0.tobytes()
    print("ok")
    """
)


def test_public_ops_take_sharded_buffers():
    done = subprocess.run(
        [sys.executable, "-c", _CHILD], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().endswith("ok")


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["auto", "pallas"])
def test_gpu_one_device_mesh_runs_the_kernel_inside_shard_map(backend):
    # The sharded path on a one-device mesh: shard_map around the kernel, the
    # buffer in pinned host memory, bit for bit the single-device result.
    mesh = jax.make_mesh((1,), ("data",))
    sharding = NamedSharding(mesh, P("data"), memory_kind="pinned_host")
    rng = np.random.default_rng(3)
    x0 = rng.standard_normal((512, 8)).astype(np.float32)
    # 2000 updates: a size class where the shipped table picks the kernels for auto.
    idx = rng.integers(-600, 600, 2000).astype(np.int32)
    upd = rng.standard_normal((2000, 8)).astype(np.float32)
    step = jax.jit(lambda x, i, u: _sharded.scatter(x, i, u, backend=backend), donate_argnums=0)
    hlo = step.lower(jax.device_put(x0, sharding), idx, upd).compile().as_text()
    assert "__gpu$xla.gpu.triton" in hlo
    out = _sharded.scatter(jax.device_put(x0, sharding), idx, upd, backend=backend)
    assert out.sharding.memory_kind == "pinned_host"
    assert np.asarray(out).tobytes() == scatter_oracle(x0, idx, upd).tobytes()
    got = _sharded.gather(out, idx, mode="fill", backend=backend)
    expected = pp.gather_from_host(jax.device_put(np.asarray(out), _single()), idx, mode="fill")
    assert np.asarray(got).tobytes() == np.asarray(expected).tobytes()


def _single():
    return jax.sharding.make_single_device_sharding(jax.devices()[0], memory_kind="pinned_host")


@pytest.mark.parametrize("spec", ["data", None], ids=["sharded", "replicated"])
@pytest.mark.parametrize("method", ["set", "add", "max"])
def test_vmap_of_a_write_to_a_buffer_on_a_mesh_is_refused_and_x_survives(spec, method):
    # As for one device: vmap would return one copy of the whole buffer per batch entry.

    mesh = jax.make_mesh((2,), ("data",))
    x0 = np.arange(32, dtype=np.float32).reshape(8, 4)
    x = jax.device_put(x0, NamedSharding(mesh, P(spec), memory_kind="pinned_host"))

    def write(u):
        return getattr(pp.at(x)[np.array([1, 6], np.int32)], method)(u)

    for batched in (jax.vmap(write), jax.jit(jax.vmap(write))):
        with pytest.raises(NotImplementedError, match="does not support jax.vmap"):
            batched(jnp.ones((3, 2, 4)))
        assert not x.is_deleted() and np.asarray(x).tobytes() == x0.tobytes()


@pytest.mark.parametrize("spec", ["data", None], ids=["sharded", "replicated"])
def test_a_twin_of_a_buffer_on_a_mesh_is_refused_as_the_buffer_itself(spec):
    # Another Array object over the same device buffers: x would be donated and read at once.

    mesh = jax.make_mesh((2,), ("data",))
    x0 = np.arange(32, dtype=np.float32).reshape(8, 4)
    x = jax.device_put(x0, NamedSharding(mesh, P(spec), memory_kind="pinned_host"))
    twin = jax.make_array_from_single_device_arrays(
        x.shape, x.sharding, [shard.data for shard in x.addressable_shards])
    with pytest.raises(ValueError, match="updates is the buffer x itself"):
        pp.at(x)[:, :].set(twin)
    assert not x.is_deleted() and np.asarray(x).tobytes() == x0.tobytes()


@pytest.mark.parametrize("fill_value", [None, 1000, -1])
def test_a_fill_read_of_an_empty_axis_converts_the_fill_as_on_one_device(fill_value):
    # jnp refuses such reads; ours fill them, converting the fill as jnp would (1000
    # wraps in int8), eagerly and under jit, sharded as on one device.

    mesh = jax.make_mesh((2,), ("data",))
    x0 = np.zeros((4, 0, 3), np.int8)
    one = jax.sharding.make_single_device_sharding(jax.devices()[0], memory_kind="pinned_host")
    sharded = NamedSharding(mesh, P("data"), memory_kind="pinned_host")

    def read(x):
        return pp.at(x)[:, jnp.array([0, 1])].get(mode="fill", fill_value=fill_value)

    expected = np.asarray(read(jax.device_put(x0, one)))
    assert expected.shape == (4, 2, 3) and len(set(expected.ravel().tolist())) == 1
    x = jax.device_put(x0, sharded)
    for call in (read, jax.jit(read)):
        assert np.asarray(call(x)).tobytes() == expected.tobytes()


@pytest.mark.parametrize("jitted", [True, False], ids=["jit", "eager"])
@pytest.mark.parametrize(
    "backend, check_vma",
    [("auto", True), ("xla", True), ("interpret", False)],
)
def test_the_ops_inside_a_users_shard_map_give_jnps_result(backend, check_vma, jitted):
    # The buffer's local shard inside the user's own shard_map, with shard_map's default
    # check_vma: the kernel's output type says along which mesh axes it varies (auto
    # traces the kernel on every platform). Pallas's interpreter itself cannot run under
    # check_vma (a gather in its evaluation mixes varying and invarying values).
    mesh = jax.make_mesh((2,), ("data",))
    x0 = np.arange(16, dtype=np.float32).reshape(8, 2)
    ids = jnp.array([1, 0, 1], jnp.int32)

    def ours(x, ids):
        rows = pp.at(x)[ids].get(backend=backend)
        return pp.at(x)[ids].add(rows + 1, backend=backend), rows[None]

    def theirs(x, ids):
        rows = x[ids]
        return x.at[ids].add(rows + 1), rows[None]

    specs = dict(mesh=mesh, in_specs=(P("data"), P()), out_specs=(P("data"), P("data")))
    want = jax.jit(jax.shard_map(theirs, **specs))(
        jax.device_put(x0, NamedSharding(mesh, P("data"))), ids
    )
    x = jax.device_put(x0, NamedSharding(mesh, P("data"), memory_kind="pinned_host"))
    step = jax.shard_map(ours, check_vma=check_vma, **specs)
    # Eagerly (no jit around the shard_map), JAX has no custom_vjp with symbolic zeros
    # there: the write is jitted inside.
    got = jax.jit(step, donate_argnums=0)(x, ids) if jitted else step(x, ids)
    # Run eagerly, shard_map itself returns device memory, even for lambda x: x.
    assert got[0].sharding.memory_kind == ("pinned_host" if jitted else "device")
    for mine, jnps in zip(got, want, strict=True):
        assert np.asarray(mine).tobytes() == np.asarray(jnps).tobytes()


def _vary_along_the_updates(devices: int, backend: str, method: str, jitted: bool):
    """``(ours, jnp's)``: a shard_map step writing updates that vary along the mesh into a
    buffer that does not (its copy on every device), each device's result its own."""
    mesh = jax.make_mesh((devices,), ("data",))
    x0 = np.arange(16, dtype=np.float32).reshape(8, 2)
    u = jax.device_put(np.arange(4 * devices, dtype=np.float32).reshape(2 * devices, 2) - 3,
                       NamedSharding(mesh, P("data")))
    specs = dict(mesh=mesh, in_specs=(P(), P("data")), out_specs=P("data"))

    def step(x, u, backend=backend):
        if backend is None:
            return getattr(x.at[jnp.array([1, 6])], method)(u)[None]
        return getattr(pp.at(x)[jnp.array([1, 6])], method)(u, backend=backend)[None]

    want = jax.jit(jax.shard_map(functools.partial(step, backend=None), **specs))(
        jax.device_put(x0, NamedSharding(mesh, P())), u)
    ours = jax.shard_map(step, **specs)
    x = jax.device_put(x0, NamedSharding(mesh, P(), memory_kind="pinned_host"))
    return (jax.jit(ours) if jitted else ours)(x, u), want


@pytest.mark.parametrize("jitted", [True, False], ids=["jit", "eager"])
@pytest.mark.parametrize("method", ["set", "add", "min"])
@pytest.mark.parametrize("backend", ["auto", "xla"])
def test_updates_varying_along_the_mesh_into_an_invarying_buffer_inside_shard_map(
        backend, method, jitted):
    # auto's two branches (the kernel, typed as x varies, and XLA's, as all its operands
    # vary) differed in type: "switch branches must have equal output types". The buffer
    # is now typed varying along the updates' axes first; no data moves.
    got, want = _vary_along_the_updates(2, backend, method, jitted)
    assert np.asarray(got).tobytes() == np.asarray(want).tobytes()
    assert len({np.asarray(s.data).tobytes() for s in got.addressable_shards}) == 2


@pytest.mark.gpu
@pytest.mark.parametrize("method", ["set", "add", "min"])
@pytest.mark.parametrize("backend", ["auto", "pallas"])
def test_gpu_updates_varying_along_the_mesh_into_an_invarying_buffer(backend, method):
    # The same on the GPU's one-device mesh, where the kernels run.
    got, want = _vary_along_the_updates(1, backend, method, jitted=True)
    assert np.asarray(got).tobytes() == np.asarray(want).tobytes()


@pytest.mark.parametrize("read", [True, False], ids=["get", "add"])
def test_the_interpreter_on_inputs_varying_along_a_users_shard_map_is_refused_by_name(read):
    # Pallas's interpreter failed inside JAX there ("Primitive gather requires varying
    # manual axes to match ... open an issue"); with check_vma=False it runs (above).
    mesh = jax.make_mesh((2,), ("data",))
    x0 = np.arange(16, dtype=np.float32).reshape(8, 2)
    x = jax.device_put(x0, NamedSharding(mesh, P("data"), memory_kind="pinned_host"))

    def ours(x):
        ref = pp.at(x)[jnp.array([1, 2])]
        out = ref.get(backend="interpret") if read else ref.add(1.0, backend="interpret")
        return out

    specs = dict(mesh=mesh, in_specs=P("data"), out_specs=P("data"))
    with pytest.raises(NotImplementedError, match=r"interpret.*\['data'\].*check_vma=False"):
        jax.jit(jax.shard_map(ours, **specs))(x)
    assert not x.is_deleted() and np.asarray(x).tobytes() == x0.tobytes()


@pytest.mark.gpu
@pytest.mark.parametrize("jitted", [True, False], ids=["jit", "eager"])
@pytest.mark.parametrize("backend", ["auto", "pallas"])
def test_gpu_the_kernels_inside_a_users_shard_map_with_check_vma(backend, jitted):
    # The same on the GPU's one-device mesh: the Pallas kernel's output type names the
    # mesh axes it varies along (shard_map's default check_vma), eagerly and under jit.
    mesh = jax.make_mesh((1,), ("data",))
    rng = np.random.default_rng(5)
    x0 = rng.standard_normal((4096, 16)).astype(np.float32)
    ids = jnp.asarray(rng.integers(-4096, 4096, 300).astype(np.int32))
    u = jnp.asarray(rng.standard_normal((300, 16)).astype(np.float32))
    # Distinct rows for the set: jnp's winner among duplicates is unspecified on a GPU.
    distinct = jnp.asarray(rng.permutation(4096)[:50].astype(np.int32))

    def ours(x, ids, u):
        x = pp.at(x)[ids].add(u, backend=backend)
        x = pp.at(x)[distinct].set(u[:50], backend=backend)
        return x, pp.at(x)[ids].get(backend=backend)[None]

    def theirs(x, ids, u):
        x = x.at[ids].add(u).at[distinct].set(u[:50])
        return x, x[ids][None]

    specs = dict(mesh=mesh, in_specs=(P("data"), P(), P()), out_specs=(P("data"), P("data")))
    want = jax.jit(jax.shard_map(theirs, **specs))(
        jax.device_put(x0, NamedSharding(mesh, P("data"))), ids, u
    )
    x = jax.device_put(x0, NamedSharding(mesh, P("data"), memory_kind="pinned_host"))
    step = jax.shard_map(ours, **specs)
    got = jax.jit(step, donate_argnums=0)(x, ids, u) if jitted else step(x, ids, u)
    if jitted:
        assert got[0].sharding.memory_kind == "pinned_host"
    # Duplicate ids: the kernels sum them in another order than jnp (the README's rule).
    for mine, jnps in zip(got, want, strict=True):
        np.testing.assert_allclose(np.asarray(mine), np.asarray(jnps), rtol=1e-5, atol=1e-5)
