"""Child processes of tests/test_sharded.py: the ops on a buffer sharded along axis 0.

The suite's conftest fixes two CPU devices in its own process, so every
multi-device case runs here. ``python tests/sharded_child.py --mesh D[,D...]``
runs all cases on a mesh of the first D of 8 devices, for each D in turn, and
prints a JSON report for each; ``--process K N PORT OUT`` is process K of N in
a loopback ``jax.distributed`` run (2 CPU devices each, gloo collectives) and
saves its shards. Every result is compared bit for bit with the single-device
op on the same data. Until the public ops route sharded buffers themselves,
the cases call ``pallas_pinned._sharded`` directly.
"""

from __future__ import annotations

import json
import os
import re
import sys
import traceback

import numpy as np

COLLECTIVE = re.compile(r"= (\S+) (all-gather|all-reduce|all-to-all|collective-permute|"
                        r"reduce-scatter)(?:-start)?\(")


def bits(a) -> np.ndarray:
    """The bit patterns of ``a`` (NaN payloads and -0.0 included)."""
    a = np.asarray(a)
    return a.view(f"u{a.dtype.itemsize}") if a.dtype != bool else a.view(np.uint8)


def scenario(ops, x, n_rows: int):
    """The multi-process run's updates (also its single-process reference)."""
    import jax
    import jax.numpy as jnp
    from jax import lax

    scatter, scatter_add, gather = ops
    rng = np.random.default_rng(7)
    idx = rng.integers(-n_rows - 2, n_rows + 2, 24)
    x = scatter(x, idx, rng.standard_normal((24, 5)).astype(np.float32))
    x = scatter_add(x, idx[::-1], np.float32(0.25))
    got = gather(x, idx, mode="fill")

    def step(x, t):
        rows = (jnp.arange(6) * 5 + t * 3) % n_rows - t  # Crosses shards, negatives.
        x = scatter(x, rows, jnp.full((6, 5), t, jnp.float32))
        x = scatter_add(x, jnp.concatenate([rows, rows]), jnp.float32(1.5))
        return x, gather(x, rows[::-1])

    x, seen = jax.jit(lambda x: lax.scan(step, x, jnp.arange(3)), donate_argnums=0)(x)
    return x, got, seen


# --- the child process: all cases of one mesh size -----------------------------------


def run_mesh(size: int) -> dict:
    import time

    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding, make_single_device_sharding
    from jax.sharding import PartitionSpec as P

    import pallas_pinned as pp
    from pallas_pinned import _sharded, _validation
    from pallas_pinned._validation import GATHER_MODES

    devices = jax.devices()
    mesh = jax.make_mesh((size,), ("data",), devices=devices[:size])
    on_mesh = NamedSharding(mesh, P("data"), memory_kind="pinned_host")
    one = make_single_device_sharding(devices[0], memory_kind="pinned_host")
    n_rows = 8 * size + 8 * (size == 1)  # 16 rows on one device: never 13 or 2*13.
    rng = np.random.default_rng(size)
    report: dict[str, str] = {}

    def case(name, fn, *args):
        start = time.perf_counter()
        try:
            fn(*args)
            report[name] = "ok"
        except Exception:  # noqa: BLE001 - reported, the parent shows the traceback.
            report[name] = traceback.format_exc(limit=6)
        print(f"{name}: {time.perf_counter() - start:.1f} s", file=sys.stderr)

    def same(actual, expected):
        np.testing.assert_array_equal(bits(actual), bits(expected))

    def placed(out, sharding=on_mesh):
        return out.sharding.memory_kind == "pinned_host" and out.sharding.is_equivalent_to(
            sharding, out.ndim)

    pairs = {"set": (pp.scatter_to_host, _sharded.scatter),
             "add": (pp.scatter_add_to_host, _sharded.scatter_add),
             "get": (pp.gather_from_host, _sharded.gather)}

    def agree(op, x0, *args, sharding=on_mesh, **kw):
        """The sharded op and the single-device op on the same data give the same bits."""
        single, sharded = pairs[op]
        out = sharded(jax.device_put(x0, sharding), *args, **kw)
        if op == "get":
            assert out.sharding.memory_kind == "device" and out.sharding.is_fully_replicated
        else:
            assert placed(out, sharding), out.sharding
        same(out, single(jax.device_put(x0, one), *args, **kw))
        return out

    def buffer(dtype):
        x0 = rng.standard_normal((n_rows, 3)).astype(np.float32)
        if dtype == "float32":  # Values a sum or a bit-combine could change.
            x0[1, 0], x0[2, 1], x0[4, 0] = -0.0, np.nan, np.inf
            x0.view(np.uint32)[3, 2] = 0x7FC01234  # A NaN with a payload.
        if dtype == "bool":
            return x0 > 0
        return (x0 * 100).astype(np.int8) if dtype == "int8" else x0.astype(jnp.dtype(dtype))

    # Duplicates across shards, negatives that alias rows, out-of-range rows.
    wild = np.array([0, n_rows - 1, -1, 5, n_rows + 3, 5, -n_rows - 1, n_rows // 2, 0, 9, -3, 9, 2])

    def modes(dtype):
        # Every mode for float32; the other types' bits through two of them.
        full = dtype == "float32"
        x0, upd = buffer(dtype), buffer(dtype)[: len(wild)].copy()
        upd[0] = upd[0] * 0  # -0.0 for float32 (and 0 for the rest)
        for op in ("set", "add") if dtype != "bool" else ("set",):
            for mode in _validation.MODES if full else (None, "clip"):
                in_bounds = np.clip(wild, -n_rows, n_rows - 1)
                agree(op, x0, in_bounds if mode == "promise_in_bounds" else wild, upd, mode=mode)
        for mode in GATHER_MODES if full else ("clip",):
            agree("get", x0, wild, mode=mode)
        agree("get", x0, wild, mode="fill", fill_value=7)

    def index_forms():
        x0 = buffer("float32")
        agree("add", x0, wild[:12].reshape(3, 4), np.ones((3, 4, 3), np.float32))
        for idx, upd in [
            (wild[:12].reshape(3, 4), np.ones((3, 4, 3), np.float32)),  # 2-D indices
            (n_rows - 2, np.float32(4.0)),  # an int, a broadcast scalar
            (slice(1, n_rows, 3), np.float32(-2.0)),
            ([3, -4, 3], np.arange(3, dtype=np.float32)[:, None]),
            (np.array([2**40, 1], np.int64), np.float32(5.0)),  # saturates: dropped
            (jnp.array([1, 2]), jnp.ones((2, 3))),  # jax arrays on device 0
        ]:
            agree("set", x0, idx, upd)
            agree("get", x0, idx)
        x = jax.device_put(x0, on_mesh)
        assert _sharded.scatter(x, np.zeros((0,), int), 1.0) is x  # Nothing to do: not consumed.

    def promises(backend="auto"):
        x0, kw = buffer("float32"), {"backend": backend}
        # Ascending once normalized (out-of-range rows sort last), duplicates across shards.
        ordered = np.sort(rng.integers(0, n_rows + 2, 20))
        unique = rng.permutation(n_rows)[:7]
        upd = rng.standard_normal((20, 3)).astype(np.float32)
        for idx, promise in ((ordered, "indices_are_sorted"), (unique, "unique_indices")):
            for op in ("set", "add"):
                agree(op, x0, idx, upd[: len(idx)], **{promise: True}, **kw)
            agree("get", x0, idx, mode="fill", **{promise: True}, **kw)

    def jit_donated():
        # Indices and updates computed per device (sharded), the buffer donated.
        x0, n = buffer("float32"), 3 * size  # Never a buffer's row count, global or local.
        idx_np = rng.integers(-n_rows, n_rows, n)
        upd_np = rng.standard_normal((n, 3)).astype(np.float32)
        idx = jax.device_put(idx_np.astype(np.int32), NamedSharding(mesh, P("data")))
        upd = jax.device_put(upd_np, NamedSharding(mesh, P("data")))

        def f(x, i, u):
            x = _sharded.scatter_add(_sharded.scatter(x, i, u), i, u)
            return x, _sharded.gather(x, i)

        fn = jax.jit(f, donate_argnums=0)
        x = jax.device_put(x0, on_mesh)
        hlo = fn.lower(x, idx, upd).compile().as_text()
        assert "input_output_alias" in hlo and "may-alias" in hlo, "buffer not aliased"
        found = [(kind, shape.split("{")[0]) for shape, kind in COLLECTIVE.findall(hlo)]
        assert not {shape for _, shape in found} & {f"f32[{n_rows},3]", f"f32[{n_rows // size},3]"}
        if size > 1:  # The cost model: n*(4+12) bytes gathered per write, n*12 all-reduced.
            # The index array is gathered before its rows are computed, so XLA gathers
            # it once for the three calls, as it does the updates for the two writes.
            want = [("all-gather", f"s32[{n}]"), ("all-gather", f"f32[{n},3]")]
            assert sorted(found) == sorted(want + [("all-reduce", f"u32[{n},3]")]), found
        out, got = fn(x, idx, upd)
        assert x.is_deleted() and placed(out), out.sharding
        ref = pp.scatter_to_host(jax.device_put(x0, one), idx_np, upd_np)
        ref = pp.scatter_add_to_host(ref, idx_np, upd_np)
        same(out, ref)
        same(got, pp.gather_from_host(ref, idx_np))

    def in_scan():
        single_ops = (pp.scatter_to_host, pp.scatter_add_to_host, pp.gather_from_host)
        sharded_ops = (_sharded.scatter, _sharded.scatter_add, _sharded.gather)
        x0 = rng.standard_normal((n_rows, 5)).astype(np.float32)
        out = scenario(sharded_ops, jax.device_put(x0, on_mesh), n_rows)
        ref = scenario(single_ops, jax.device_put(x0, one), n_rows)
        assert placed(out[0]), out[0].sharding
        for a, b in zip(out, ref, strict=True):
            same(a, b)

    def auto_mesh():
        auto = jax.make_mesh((size,), ("data",), devices=devices[:size],
                             axis_types=(jax.sharding.AxisType.Auto,))
        out = agree("set", buffer("float32"), wild, 1.0,
                    sharding=NamedSharding(auto, P("data"), memory_kind="pinned_host"))
        refused(lambda: jax.jit(lambda x: _sharded.scatter(x, 1, 2.0))(out), "Explicit")

    def two_axes():
        grid = jax.make_mesh((size // 2, 2), ("data", "model"), devices=devices[:size])
        for spec in (P("data"), P(("data", "model"))):
            sharding = NamedSharding(grid, spec, memory_kind="pinned_host")
            out = agree("add", buffer("float32"), wild, 2.5, sharding=sharding)
            for shard in out.addressable_shards:  # Replicas along "model" agree.
                same(shard.data, np.asarray(out)[shard.index])
            agree("get", np.asarray(out), wild, sharding=sharding)

    def bad_input():
        x0 = buffer("float32")
        other = jax.make_mesh((size,), ("data",), devices=devices[:size][::-1])
        bad = [
            (np.zeros((n_rows, 2 * size), np.float32), P(None, "data"), 1, 0.0, "axis 0 only"),
            (x0, P("data"), np.arange(size), jax.device_put(np.ones((size, 3), np.float32),
             NamedSharding(other, P("data"))), "another mesh"),
            (x0, P("data"), np.array([1.0]), 0.0, "float"),
            (x0, P("data"), np.array([1]), np.ones((2, 3)), r"\(2, 3\)"),
            (x0, P("data"), 1, 0.0, "unknown mode"),
        ]
        if size < len(devices):
            bad.append((x0, P("data"), jax.device_put(np.array([1]), devices[-1]), 0.0,
                        "outside x's mesh"))
        if size > 1:  # Committed to one device of the mesh: jnp refuses it too.
            one, text = devices[0], "but x is on its mesh"
            bad += [(x0, P("data"), jax.device_put(np.array([1]), one), 0.0, text),
                    (x0, P("data"), np.array([1]), jax.device_put(np.ones(3, np.float32), one),
                     text)]
        for data, spec, idx, upd, text in bad:
            x = jax.device_put(data, NamedSharding(mesh, spec, memory_kind="pinned_host"))
            kw = {"mode": "wrapped"} if text == "unknown mode" else {}
            for op in (_sharded.scatter, _sharded.scatter_add):
                refused(lambda: op(x, idx, upd, **kw), text)  # noqa: B023 - called at once.
                assert not x.is_deleted()
                same(x, data)
        x = jax.device_put(x0, on_mesh)
        refused(lambda: _sharded.gather(x, 1, fill_value=[1]), "scalar")
        refused(lambda: _sharded.scatter_add(x.astype(bool), 1, True), "bool")
        _sharded.scatter(x, 1, 0.0)
        refused(lambda: _sharded.scatter(x, 1, 0.0), "deleted")

    def refused(call, text):
        try:
            call()
        except (TypeError, ValueError) as err:
            assert re.search(text, str(err)), (text, err)
        else:
            raise AssertionError(f"accepted: {text}")

    def predicate():
        x = jax.device_put(buffer("float32"), on_mesh)
        # A named mesh axis makes it the sharded layout, even of one shard.
        assert _sharded.is_sharded_buffer(x)
        assert not _sharded.is_sharded_buffer(jax.device_put(np.zeros(4), one))
        seen = []
        jax.jit(lambda x: seen.append(_sharded.is_sharded_buffer(x)) or x)(x)
        jax.shard_map(lambda xl: seen.append(_sharded.is_sharded_buffer(xl)) or xl, mesh=mesh,
                      in_specs=P("data"), out_specs=P("data"))(x)
        assert seen == [True, False], seen

    # Every size: every mode, jit with donation, the layout checks. The rest does
    # not depend on the number of shards, only on there being several: one size.
    case("modes/float32", modes, "float32")
    case("jit_donated", jit_donated)
    case("predicate", predicate)
    case("auto_mesh", auto_mesh)
    if size > 1:
        case("bad_input", bad_input)  # 2 devices of 8 also give "outside x's mesh".
    if size == 2:
        case("index_forms", index_forms)
        case("promises/interpret", promises, "interpret")  # The kernels' own masking.
    if size == 8:
        for dtype in ("bfloat16", "int8", "bool"):
            case(f"modes/{dtype}", modes, dtype)
        case("promises", promises)
        case("in_scan", in_scan)
        case("two_axes", two_axes)  # A 4 x 2 grid.
    return report


# --- the child process: one of N jax.distributed processes -------------------------------


def run_process(k: int, n: int, port: int, out: str) -> None:
    import jax

    jax.config.update("jax_num_cpu_devices", 2)
    jax.config.update("jax_cpu_collectives_implementation", "gloo")  # The default; be sure.
    jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=n,
                               process_id=k, initialization_timeout=30)
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from pallas_pinned import _sharded

    mesh = jax.make_mesh((jax.device_count(),), ("data",))
    n_rows = 4 * jax.device_count()
    x0 = np.random.default_rng(0).standard_normal((n_rows, 5)).astype(np.float32)
    x = jax.device_put(x0, NamedSharding(mesh, P("data"), memory_kind="pinned_host"))
    x, got, seen = scenario((_sharded.scatter, _sharded.scatter_add, _sharded.gather), x, n_rows)
    assert x.sharding.memory_kind == "pinned_host" and not x.is_fully_addressable
    shards = {f"rows{s.index[0].start}": np.asarray(s.data) for s in x.addressable_shards}
    np.savez(os.path.join(out, f"process{k}.npz"), got=np.asarray(got.addressable_data(0)),
             seen=np.asarray(seen.addressable_data(0)), **shards)
    jax.distributed.shutdown()


if __name__ == "__main__":
    if sys.argv[1] == "--mesh":
        import jax

        jax.config.update("jax_num_cpu_devices", 8)  # Before any backend starts.
        for size in map(int, sys.argv[2].split(",")):  # A line as each size finishes.
            print(json.dumps({"size": size, "report": run_mesh(size)}), flush=True)
    else:
        run_process(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5])
    sys.exit(0)
