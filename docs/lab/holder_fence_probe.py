"""Lab probe (session 32): does the holder need its fence on the GPU?

An eager add's result goes straight into the caller's donating jit before it is computed, and
no call of ours follows (tests/test_dropped_results.py's GPU test of the fence). With the
fence, the holder lets go of the add's arrays within its test's 5 s; with ``_fenced``
replaced by ``lambda devices: False``, nothing vouches for that entry, and the prediction is
that it stays held (the test fails) unless the thread happened to wait for the result before
the caller's jit donated it.

    python docs/lab/holder_fence_probe.py
"""

import os
import sys

import pytest

sys.path.insert(0, os.getcwd())  # The repository root: the tests import ``tests.helpers``.

from pallas_pinned import _holder

TEST = ["-q", "-p", "no:cacheprovider", "-m", "gpu", "-k", "fence",
        "tests/test_dropped_results.py"]

for fence in (True, False):
    if not fence:
        _holder._fenced = lambda devices: False
    rc = pytest.main(TEST)
    print(f"fence {'on' if fence else 'off'}: pytest rc={int(rc)}", flush=True)
sys.exit(0)
