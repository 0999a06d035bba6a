"""The examples run on CPU, each in a child process, and pass their own checks.

Each example replays its loop in plain jnp and exits non-zero on any
mismatch, so its exit status is the test. ``--time`` also runs the timing
code (CPU numbers, not asserted) so that it cannot rot unseen between GPU runs.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def _run(script: str, *args: str) -> str:
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    command = [sys.executable, str(EXAMPLES / script), *args]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env,
                            check=False)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result.stdout


@pytest.mark.parametrize("script", ["kv_cache_offload.py", "replay_buffer.py"])
def test_example_checks_itself(script):
    out = _run(script, "--time", "--repeats", "2")
    assert out.rstrip().endswith("OK"), out
    assert "MISMATCH" not in out, out
    assert "(CPU, median)" in out and "failed" not in out, out


def test_replay_buffer_example_wraps_many_times():
    out = _run("replay_buffer.py", "--capacity", "7", "--insert", "5", "--sample", "9",
               "--steps", "11")
    assert "wrapped 7x" in out and out.rstrip().endswith("OK"), out


# One process, and two of four devices each: every process holds several shards and the
# other's are not addressable. More processes add only gloo ranks (upstream's), as for
# tests/test_sharded.py's processes; four cost a jax start each on a 2-core runner.
@pytest.mark.parametrize("processes", [1, 2])
def test_sharded_demo_agrees_with_its_numpy_replay(processes):
    # 8 CPU devices in all, over jax.distributed loopback processes where more than one.
    out = _run("sharded_demo.py", "--devices", "8", "--processes", str(processes))
    assert out.count(": OK") == processes, out
