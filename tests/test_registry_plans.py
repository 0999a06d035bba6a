"""``_registry.choose``'s plan for a table of calls: the one decision, asked directly.

Each row is a call (op, entries, promises, index type, mode, index form, backend, where the
buffer is) and the plan it must get: the implementation, the path and the path's steps.
``on_cuda`` rows ask as on a CUDA GPU with Pallas-Triton (``tests/registry_support``);
the others as on this CPU. tests/test_plan.py checks that nothing else decides.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

from pallas_pinned import _placement, _registry, tuning
from tests.registry_support import call_of

I32, U32 = jnp.int32, jnp.uint32
LIMITS = tuning.Thresholds()  # The defaults, whatever the environment says.
N1 = LIMITS.fused_max_unpromised_adds + 1  # Past the one launch for adds that may repeat.
BIG = LIMITS.fused_max_updates + 1  # Past every one launch.

# (op, entries, promise, index type, mode, kind, backend, on cuda) ->
# (implementation, path, the plan's other fields that must hold)
CASES = [
    # The one launch, and what it may assume of the rows.
    (("set", 5, None, I32, None, "axis0", "auto", True),
     ("pallas", "set_one_launch", {"unique": False, "unless_negative": False})),
    (("set", 5, "distinct", U32, None, "axis0", "auto", True),
     ("pallas", "set_one_launch", {"unique": True, "unless_negative": False})),
    (("set", 5, "distinct", I32, None, "axis0", "auto", True),
     ("pallas", "set_one_launch", {"unique": False, "unless_negative": True})),
    (("set", 5, "distinct", I32, "clip", "axis0", "auto", True),
     ("pallas", "set_one_launch", {"unique": False, "unless_negative": False})),
    (("set", 5, "distinct", I32, None, "rows", "auto", True),
     ("pallas", "set_one_launch", {"unique": False, "unless_negative": False})),
    (("add", 64, None, I32, None, "axis0", "auto", True),
     ("pallas", "add_one_launch", {"unless_negative": False, "atomic": False})),
    (("add", 1024, "distinct", I32, None, "axis0", "auto", True),
     ("pallas", "add_one_launch", {"unless_negative": True, "atomic": True})),
    (("add", 4096, "distinct", U32, None, "axis0", "auto", True),
     ("pallas", "add_one_launch", {"unique": True, "atomic": True})),
    # Past it: rows, sorted runs, and their steps.
    (("set", BIG, None, I32, None, "axis0", "auto", True),
     ("pallas", "set_rows", {"dedupe": True, "check_bounds": True})),
    (("set", BIG, "distinct", U32, "promise_in_bounds", "axis0", "auto", True),
     ("pallas", "set_rows", {"dedupe": False, "check_bounds": False})),
    (("set", BIG, "distinct", I32, "promise_in_bounds", "axis0", "auto", True),
     ("pallas", "set_rows", {"dedupe": True, "check_bounds": True})),
    (("set", LIMITS.sort_from, "distinct", U32, None, "axis0", "auto", True),
     ("pallas", "set_rows", {"dedupe": True})),
    (("add", N1, None, I32, None, "axis0", "auto", True),
     ("pallas", "add_runs", {"order": "kernel", "atomic": False})),
    (("add", N1, "sorted", I32, None, "axis0", "auto", True),
     ("pallas", "add_runs", {"order": "kernel", "ascending": False})),
    (("add", N1, "sorted", U32, None, "axis0", "auto", True),
     ("pallas", "add_runs", {"order": None, "ascending": True})),
    (("add", LIMITS.order_kernel_max + 1, None, I32, None, "axis0", "auto", True),
     ("pallas", "add_runs", {"order": "sort", "atomic": True})),
    (("add", BIG, "distinct", U32, None, "axis0", "auto", True),
     ("pallas", "add_rows", {"dedupe": False, "atomic": True})),
    (("add", BIG, "distinct", I32, None, "axis0", "auto", True),
     ("pallas", "add_runs", {"order": "sort"})),
    (("max", 5, None, I32, None, "axis0", "auto", True), ("pallas", "combine", {})),
    (("get", 5, None, I32, None, "axis0", "auto", True),
     ("pallas", "get_rows", {"sort": False})),
    (("get", LIMITS.sort_from, None, I32, None, "axis0", "auto", True),
     ("pallas", "get_rows", {"sort": True})),
    (("get", LIMITS.sort_from, "sorted", I32, None, "axis0", "auto", True),
     ("pallas", "get_rows", {"sort": False})),
    # The raw Triton family has no one launch and no runs kernel.
    (("set", 5, None, I32, None, "axis0", "triton", True),
     ("triton", "set_rows", {"dedupe": True})),
    (("add", N1, None, I32, None, "axis0", "triton", True),
     ("triton", "add_rows", {"dedupe": True, "atomic": False})),
    # The interpreter, the reference and the block copy.
    (("set", 5, None, I32, None, "axis0", "interpret", False),
     ("interpret", "set_one_launch", {"platforms": ()})),
    (("set", 5, None, I32, None, "axis0", "auto", False), ("xla", "reference", {})),
    (("add", 5, "distinct", U32, None, "axis0", "xla", True),
     ("xla", "reference", {"unique": True})),
    (("add", 5, "distinct", I32, None, "axis0", "xla", True),
     ("xla", "reference", {"unique": False})),
    (("set", 5, None, None, None, "block", "xla", True), ("block", "block", {})),
]


def _buffer():
    """A pinned float32 buffer (choose reads its placement and dtype; the sizes are the
    call's)."""
    sharding = jax.sharding.make_single_device_sharding(jax.devices()[0],
                                                        memory_kind="pinned_host")
    return jax.device_put(jnp.zeros((8, 4), jnp.float32), sharding)


@pytest.mark.parametrize(("call", "want"), CASES, ids=[
    "-".join(str(v) for v in case[0][:3] + case[0][4:7]) for case in CASES])
def test_the_plan_for_a_call(monkeypatch, call, want):
    op, n, promise, dtype, mode, kind, backend, cuda = call
    if cuda:
        monkeypatch.setattr(_registry, "_host_on_cuda", _placement.on_host)
        monkeypatch.setattr(_registry, "pallas_triton_usable", lambda: True)
    described = call_of(op, n, distinct=promise == "distinct", sorted_=promise == "sorted",
                        kind=kind, mode=mode, backend=backend, num_rows=1 << 20,
                        thresholds=LIMITS)
    plan = _registry.choose(described, _buffer(), dtype)
    name, path, fields = want
    assert (plan.name, plan.path) == (name, path), plan
    for field, value in fields.items():
        assert getattr(plan, field) == value, (field, plan)
    if plan.impl.kind == "kernels" and not plan.impl.interpret:
        # A kernel path on CUDA, the reference elsewhere: named by the plan, run as it says.
        assert plan.platforms[0] == ("cuda", path) and plan.platforms[-1] == (
            "default", "reference"), plan.platforms


def test_the_plans_paths_all_exist():
    from pallas_pinned import _read_rows, _write_rows

    paths = {want[1] for _, want in CASES} - {"block", "scalar"}
    assert paths <= set(_write_rows.PATHS) | set(_read_rows.PATHS)
    assert set(_write_rows.PATHS) | set(_read_rows.PATHS) <= paths | {
        "reference_in_order", "add_rows"}
