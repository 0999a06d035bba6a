"""Lab run (session 32): tests/test_dropped_results.py's late-call GPU test with the holder
off, then as shipped: which of its cases see the race.

    python docs/lab/dropped_test_holder_off.py
"""

import os
import sys

import pytest

sys.path.insert(0, os.getcwd())  # The repository root: the tests import ``tests.helpers``.

from pallas_pinned import _holder  # noqa: E402

TEST = ["-q", "-p", "no:cacheprovider", "-m", "gpu", "-k", "late_call",
        "tests/test_dropped_results.py"]
shipped = _holder._HOLDER.hold
for off in (True, False):
    _holder._HOLDER.hold = (lambda result, inputs, devices=None: None) if off else shipped
    rc = pytest.main(TEST)
    print(f"holder {'off' if off else 'on'}: pytest rc={int(rc)}", flush=True)
sys.exit(0)
