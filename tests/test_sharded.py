"""The ops on a buffer sharded along axis 0 over 1, 2 and 8 CPU devices, and over processes.

The suite's conftest fixes two CPU devices before this module is imported, so
every multi-device case runs in a child process (tests/sharded_child.py, which
says what each runs). The mesh sizes: 1, the degenerate mesh; 2, the smallest
split; 8, the widest (also as a 4 x 2 grid). Two processes of two devices
each: every process holds several shards, and the others' are not
addressable (more processes add only more gloo ranks, upstream's). A mesh of
4 devices through the public ops: tests/test_sharded_public.py.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.sharded_child import bits, scenario

ROOT = Path(__file__).resolve().parents[1]
CHILD = Path(__file__).with_name("sharded_child.py")
MESH_SIZES = (1, 2, 8)
PROCESSES = 2


def _env() -> dict:
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(ROOT))
    env.pop("XLA_FLAGS", None)  # The children choose their device counts themselves.
    return env


@pytest.fixture(scope="module")
def mesh_reports(tmp_path_factory):
    """Each mesh size's report, from one child that runs the sizes in turn.

    One child, not one per size: it starts jax once and the sizes share programs
    (the single-device references among them), which costs less than children
    competing for the same cores. Returns the reports, the child's rc and stderr.
    """
    logs = tmp_path_factory.mktemp("mesh")
    sizes = ",".join(map(str, MESH_SIZES))
    with open(logs / "out", "w+") as out, open(logs / "err", "w+") as err:
        proc = subprocess.Popen([sys.executable, str(CHILD), "--mesh", sizes], cwd=ROOT,
                                env=_env(), stdout=out, stderr=err, text=True)
        try:
            proc.wait(timeout=600)
        except subprocess.TimeoutExpired:  # Bounded: no child outlives the module.
            proc.kill()
            proc.wait()
        out.seek(0)
        err.seek(0)
        records = [json.loads(line) for line in out if line.startswith('{"size": ')]
        return {r["size"]: r["report"] for r in records}, proc.returncode, err.read()[-4000:]


@pytest.mark.parametrize("size", MESH_SIZES)
def test_mesh(size, mesh_reports):
    reports, returncode, stderr = mesh_reports
    assert size in reports, f"the child stopped (rc {returncode}) before {size} devices:\n{stderr}"
    report = reports[size]
    failed = {name: text for name, text in report.items() if text != "ok"}
    assert not failed, "\n".join(f"{name}:\n{text}" for name, text in failed.items())
    expected = 4 + (size > 1) + 2 * (size == 2) + 6 * (size == 8)
    assert len(report) == expected, sorted(report)


def test_processes(tmp_path):
    """Loopback processes of 2 CPU devices each; shards agree bit for bit with one process."""
    import jax

    import pallas_pinned as pp

    processes = PROCESSES

    with socket.socket() as s:  # A free loopback port for the coordinator.
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = [
        subprocess.Popen([sys.executable, str(CHILD), "--process", str(k), str(processes),
                          str(port), str(tmp_path)], cwd=ROOT, env=_env(),
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for k in range(processes)
    ]
    logs = []
    try:
        for proc in procs:
            logs.append(proc.communicate(timeout=120)[0])
    finally:
        for proc in procs:  # Bounded: a hung process never outlives the test.
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert all(p.returncode == 0 for p in procs), "\n".join(log[-3000:] for log in logs)

    n_rows = 4 * 2 * processes
    x0 = np.random.default_rng(0).standard_normal((n_rows, 5)).astype(np.float32)
    one = jax.sharding.make_single_device_sharding(jax.devices()[0], memory_kind="pinned_host")
    ref_x, ref_got, ref_seen = scenario(
        (pp.scatter_to_host, pp.scatter_add_to_host, pp.gather_from_host),
        jax.device_put(x0, one), n_rows)
    ref_x = np.asarray(ref_x)
    covered = set()
    for k in range(processes):
        saved = np.load(tmp_path / f"process{k}.npz")
        np.testing.assert_array_equal(bits(saved["got"]), bits(ref_got))
        np.testing.assert_array_equal(bits(saved["seen"]), bits(ref_seen))
        for key in saved.files:
            if key.startswith("rows"):
                start = int(key[4:])
                block = saved[key]
                np.testing.assert_array_equal(bits(block), bits(ref_x[start:start + len(block)]))
                covered.update(range(start, start + len(block)))
    assert covered == set(range(n_rows))
