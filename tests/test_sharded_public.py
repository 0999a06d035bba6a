"""The public ops hand a buffer sharded along axis 0 to the sharded path.

Runs in a child process with 4 CPU devices (the suite's own process has 2):
the public functions on a ``NamedSharding(mesh, P("data"), "pinned_host")``
buffer agree bit for bit with the same calls on a one-device buffer.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

_CHILD = textwrap.dedent(
    """
    import jax
    jax.config.update("jax_num_cpu_devices", 4)
    import jax.numpy as jnp, numpy as np
    import pallas_pinned as pp
    from jax.sharding import NamedSharding, PartitionSpec as P, SingleDeviceSharding
    mesh = jax.make_mesh((4,), ("data",))
    sharded = NamedSharding(mesh, P("data"), memory_kind="pinned_host")
    single = SingleDeviceSharding(jax.devices()[0], memory_kind="pinned_host")
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
    print("ok")
    """
)


def test_public_ops_take_sharded_buffers():
    done = subprocess.run(
        [sys.executable, "-c", _CHILD], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().endswith("ok")
