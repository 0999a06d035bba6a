"""The cached-table examples run small on CPU, in a child process, and pass their checks.

``cached_embedding.py`` trains a DLRM-style recommender with eight tables pinned and
cached, checkpoints half way with orbax, resumes, and compares the runs (bit for bit) and a
device-table training (within its bound) itself.
``larger_than_device.py`` is the GPU-sized check of a table larger than the free device
memory, run small. Each one's exit status is the test.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "cached_embedding.py"


def test_cached_embedding_example_resumes_from_its_checkpoint_and_checks_itself():
    pytest.importorskip("orbax.checkpoint")
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    result = subprocess.run([sys.executable, str(EXAMPLE)], capture_output=True, text=True,
                            timeout=300, env=env, check=False)
    out = result.stdout
    assert result.returncode == 0, out[-3000:] + result.stderr[-3000:]
    assert out.rstrip().endswith("OK") and "MISMATCH" not in out, out
    assert "8 tables" in out and "checkpoint at step 6" in out, out
    assert "resumed = uninterrupted" in out and "empty caches = uninterrupted" in out, out


def test_larger_than_device_example_trains_and_checks_every_row():
    # Small on CPU (no --fill-gpu): the touched rows against a device table of just those
    # rows, the other rows bit for bit; its exit status is the test.
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    script = EXAMPLE.with_name("larger_than_device.py")
    result = subprocess.run([sys.executable, str(script), "--steps", "8"], capture_output=True,
                            text=True, timeout=300, env=env, check=False)
    out = result.stdout
    assert result.returncode == 0, out[-3000:] + result.stderr[-3000:]
    assert out.rstrip().endswith("OK") and "MISMATCH" not in out, out
    assert "other rows unchanged" in out and "touched rows = device table" in out, out
