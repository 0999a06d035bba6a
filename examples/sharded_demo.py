"""Periodic updates of one pinned_host buffer sharded along axis 0 over devices or processes.

A replay-buffer-like loop: every step each device produces a batch of new rows
(ring positions, global row numbers), adds to a "priority" column of rows
spread over every shard, and samples rows back. The loop runs inside one
jitted ``lax.scan`` that donates the buffer; the result is checked against a
numpy replay of the same steps, bit for bit. Exit status 0 only on success.

    python examples/sharded_demo.py --devices 8                  # one process, 8 CPU devices
    python examples/sharded_demo.py --devices 8 --processes 2    # 2 loopback processes x 4

On a machine with GPUs, ``--devices`` takes the first that many GPUs (one
process). Nothing is timed: on CPU speed means nothing, and on GPU the
single-device benchmarks measure the kernels.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys

import numpy as np


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--devices", type=int, default=8, help="devices in the mesh (all processes)")
    p.add_argument("--processes", type=int, default=1, help="loopback jax.distributed processes")
    p.add_argument("--rows-per-device", type=int, default=64)
    p.add_argument("--width", type=int, default=16, help="float32 elements per row")
    p.add_argument("--batch", type=int, default=6, help="new rows per device and step")
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--process-id", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, default=None, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def step_rows(t, batch_total: int, num_rows: int, xp):
    """The rows of step ``t``: new rows at ring positions, adds and samples spread out."""
    pos = (t * batch_total + xp.arange(batch_total)) % num_rows
    # Duplicates across shards (6 shares a factor with the row count), negative
    # rows that wrap once, as in numpy.
    bumped = (pos * 6 + 3) % num_rows - num_rows
    sampled = (pos * 13 + 5) % num_rows
    return pos, bumped, sampled


def step_values(t, batch_total: int, width: int, xp):
    # Small integers in float32: sums are exact in any order, so numpy can replay them.
    k = xp.arange(batch_total)[:, None] + xp.arange(width)[None, :]
    return ((t * batch_total + k) % 251).astype(xp.float32)


def numpy_replay(x: np.ndarray, steps: int, batch_total: int):
    x = x.copy()
    samples = []
    for t in range(steps):
        pos, bumped, sampled = step_rows(t, batch_total, x.shape[0], np)
        x[pos] = step_values(t, batch_total, x.shape[1], np)  # distinct rows
        np.add.at(x[:, 0], bumped % x.shape[0], np.float32(1.0))
        samples.append(x[sampled])
    return x, np.stack(samples)


def run(args) -> bool:
    import jax
    import jax.numpy as jnp
    from jax import lax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    import pallas_pinned as pp

    devices = jax.devices()[: args.devices]
    mesh = jax.make_mesh((len(devices),), ("data",), devices=devices)
    num_rows = args.rows_per_device * len(devices)
    batch_total = args.batch * len(devices)
    x0 = np.arange(num_rows * args.width, dtype=np.float32).reshape(num_rows, args.width) % 97
    x = jax.device_put(x0, NamedSharding(mesh, P("data"), memory_kind="pinned_host"))
    per_device = NamedSharding(mesh, P("data"))

    def step(x, t):
        pos, bumped, sampled = step_rows(t, batch_total, num_rows, jnp)
        # Each device computes its own part of the batch; the op routes it.
        pos = jax.reshard(pos.astype(jnp.int32), per_device)
        new = jax.reshard(step_values(t, batch_total, args.width, jnp), per_device)
        x = pp.scatter_to_host(x, pos, new, unique_indices=True)
        priority = jnp.zeros((batch_total, args.width), jnp.float32).at[:, 0].set(1.0)
        x = pp.scatter_add_to_host(x, bumped, priority)
        return x, pp.gather_from_host(x, sampled)

    loop = jax.jit(lambda x: lax.scan(step, x, jnp.arange(args.steps)), donate_argnums=0)
    x, samples = loop(x)
    want_x, want_samples = numpy_replay(x0, args.steps, batch_total)

    ok = x.sharding.memory_kind == "pinned_host" and x.sharding.spec[0] == "data"
    for shard in x.addressable_shards:  # This process's shards only.
        ok &= np.array_equal(np.asarray(shard.data), want_x[shard.index])
    ok &= np.array_equal(np.asarray(samples.addressable_data(0)), want_samples)
    lines = [f"process {jax.process_index()}: {'OK' if ok else 'MISMATCH'}"]
    if jax.process_index() == 0:
        d, b, w = len(devices), batch_total, args.width * 4
        # The cost model of pallas_pinned._sharded_route (all-gather routing), per step:
        routed = (d - 1) / d * (2 * b * (4 + w) + b * 4) + 2 * (d - 1) / d * b * w
        lines[:0] = [
            f"{jax.process_count()} process(es), {d} {devices[0].platform} devices, "
            f"{num_rows} rows x {w} B in pinned_host, {args.steps} steps of {b} new rows, "
            f"{b} adds, {b} samples",
            f"routed per device and step: ~{routed / 1024:.1f} KiB "
            "(the model, for inputs that start sharded; not measured)",
        ]
    # One write per process, so that the processes' lines do not run together.
    sys.stdout.flush()
    os.write(sys.stdout.fileno(), ("\n".join(lines) + "\n").encode())
    return bool(ok)


def launch(args) -> int:
    """Starts the loopback processes and waits for all of them (bounded)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    base = [sys.executable, __file__] + sys.argv[1:]
    procs = [subprocess.Popen(base + ["--process-id", str(k), "--port", str(port)], env=env)
             for k in range(args.processes)]
    codes = []
    try:
        for proc in procs:
            codes.append(proc.wait(timeout=300))
    except subprocess.TimeoutExpired:
        codes.append(1)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    return 0 if codes and all(code == 0 for code in codes) else 1


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.processes > 1 and args.process_id is None:
        if args.devices % args.processes:
            print("--devices must be a multiple of --processes", file=sys.stderr)
            return 2
        return launch(args)
    import jax

    if args.process_id is not None:  # One of the loopback processes.
        jax.config.update("jax_num_cpu_devices", args.devices // args.processes)
        jax.distributed.initialize(coordinator_address=f"127.0.0.1:{args.port}",
                                   num_processes=args.processes, process_id=args.process_id,
                                   initialization_timeout=60)
    else:  # Before any backend starts; only the CPU backend reads it (GPUs are GPUs).
        jax.config.update("jax_num_cpu_devices", args.devices)
    if len(jax.devices()) < args.devices:
        have = len(jax.devices())
        print(f"only {have} {jax.default_backend()} devices; asked for {args.devices}: pass "
              f"--devices {have}, or run on {args.devices} CPU devices with JAX_PLATFORMS=cpu",
              file=sys.stderr)
        return 2
    ok = run(args)
    if args.process_id is not None:
        jax.distributed.shutdown()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
