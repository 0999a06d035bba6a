"""What the CPU tests of the benchmark package share: running a CLI as CI would, reading records.

Each CLI runs in a subprocess from the repository root with ``JAX_PLATFORMS=cpu``
(``python -m benchmarks.<name> --quick ...``, or ``python -c`` for a run with a
provider broken on purpose), so that the test process's jax setup (two CPU
devices) never leaks into a benchmark.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:  # the benchmarks package lives at the repository root
    sys.path.insert(0, str(REPO))


def run_cli(args: list[str], timeout: int = 180, code: str | None = None):
    """``python -m <args>`` (or ``python -c code``) from the repository root, on CPU."""
    cmd = [sys.executable, "-c", code] if code else [sys.executable, "-m", *args]
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False,
                          cwd=REPO, env=env)


def explain(done) -> str:
    return done.stdout[-3000:] + done.stderr[-3000:]


def records(path: Path) -> list[dict]:
    return json.loads(path.read_text())["records"]
