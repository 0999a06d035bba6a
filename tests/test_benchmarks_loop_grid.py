"""CPU tests of the loop benchmark's grid, in-process: its interleaved timing and its providers.

A grid case is checked whole before any of it is timed, then its providers are
timed interleaved in ``--rounds`` rounds with the order rotated per round (as
the write patterns are): a provider timed alone would take the machine's drift
alone. A scan slower than ``--max-run-s`` is timed once without warm-up, and a
case past ``--time-budget-s`` is skipped whole. The measured floor
(``floor_launch``, ``benchmarks/loop_steps.py``) and the read-after-write
providers run on small buffers, against the numpy oracles. The CLI run of the
grid is in ``test_benchmarks_loop.py``.
"""

import json
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tests.benchmark_helpers  # noqa: F401  (puts the repository root on sys.path)
from benchmarks import loop, loop_steps, scan_runner
from benchmarks.loop_steps import PROVIDER_NAMES, PROVIDERS
from pallas_pinned import testing

# ---------------------------------------------------------------------------
# Interleaved timing

GRID_ROWS = ["baseline", "floor_launch", "xla_set", "ours_set"]


class _Quiet:
    def step(self, label: str) -> None:
        del label


def _grid_case(monkeypatch, *flags: str, started: float | None = None):
    """One grid case (8 rows x 64 B, 4 steps, 4 runs in 2 rounds) run in-process, its
    checks and calls logged: ``(events, records)``."""
    events = []
    right_check, right_call = loop.check_scan, scan_runner.call_scan

    def check(args, buf, record, *rest):
        events.append(("check", record["provider"]))
        return right_check(args, buf, record, *rest)

    def call(buf, scan, repeats, warmup):
        events.append((scan.record["provider"], repeats, warmup))
        return right_call(buf, scan, repeats, warmup)

    monkeypatch.setattr(loop, "check_scan", check)
    monkeypatch.setattr(scan_runner, "call_scan", call)
    args = loop.parse_args(["--steps", "4", "--runs", "4", "--warmup", "1",
                            "--rounds", "2", "--providers", ",".join(GRID_ROWS[1:]), *flags])
    records = loop.run_case(args, scan_runner.PinnedBuffer(args.seed), testing.LoopCase(8, 64),
                            time.monotonic() if started is None else started, _Quiet())
    return events, records


def test_a_grid_case_is_checked_whole_then_timed_interleaved_in_rounds(monkeypatch):
    # Timed one provider after the other, drift of the machine landed on one of
    # them (on an H200 a baseline that writes nothing measured 15.4 us per step,
    # XLA's set 8.2): every provider is checked first, then timed round-robin, rotated.
    events, records = _grid_case(monkeypatch)
    names = [r["provider"] for r in records]
    assert names == GRID_ROWS
    n = len(names)
    assert events[:n] == [("check", p) for p in names]  # every check before any timing
    assert events[n:2 * n] == [(p, 0, 1) for p in names]  # every warm-up before a timed call
    assert events[2 * n:] == [(p, 2, 0) for p in names] + [(p, 2, 0) for p in names[1:] + names[:1]]
    base, floor = records[0], records[1]
    for r in records:
        assert r["status"] == "ok" and r["correct"] is True, r
        assert r["runs"] == 4 and r["rounds"] == 2, r  # two timed runs in each round
        assert 0 < r["us_min"] <= r["us_per_step"] <= r["us_max"], r
        assert r["op_cost_us"] == pytest.approx(r["us_per_step"] - base["us_per_step"]), r
        assert r["floor_launch_us"] == floor["us_per_step"], r
    assert records[2]["kernel_floor_us"] == pytest.approx(
        floor["us_per_step"] + records[2]["pcie_us"])


def test_a_grid_scan_slower_than_max_run_s_is_timed_once_without_warm_up(monkeypatch):
    events, records = _grid_case(monkeypatch, "--max-run-s", "0")
    n = len(records)
    assert events[n:] == [(r["provider"], 1, 0) for r in records]  # one round, no warm-up
    for r in records:
        assert r["status"] == "ok" and r["correct"] is True, r
        assert r["runs"] == 1 and r["rounds"] == 1 and "timed once" in r["notes"], r
        assert r["us_min"] == r["us_per_step"] == r["us_max"], r


def test_a_grid_case_past_the_time_budget_is_skipped_whole(monkeypatch):
    events, records = _grid_case(monkeypatch, "--time-budget-s", "1",
                                 started=time.monotonic() - 2)
    assert events == [] and [r["provider"] for r in records] == GRID_ROWS
    for r in records:
        assert r["status"] == "skipped: time budget of 1 s used up", r
        assert r["runs"] == 0 and r["us_per_step"] is None, r


# ---------------------------------------------------------------------------
# The measured floor (floor_launch, PCIe) and reading back what was written


PROVIDER = {p.name: p for p in PROVIDERS}
BUFFERS = pytest.mark.parametrize("case", [testing.LoopCase(8, 4), testing.LoopCase(8, 64)],
                                  ids=["1-D buffer", "2-D buffer"])


def test_the_new_providers_run_by_default_and_can_be_picked():
    assert {"floor_launch", "xla_add_read", "ours_add_read", "xla_set_read",
            "ours_set_read"} <= set(PROVIDER_NAMES)
    assert loop.parse_args([]).providers == PROVIDER_NAMES
    args = loop.parse_args(["--providers", "floor_launch,ours_add_read,xla_set_read,"
                            "ours_set_read", "--backends", "interpret"])
    assert [(p.name, b) for p, b in loop.pairs(args)] == [
        ("baseline", "-"), ("floor_launch", "-"), ("ours_add_read", "auto"),
        ("xla_set_read", "-"), ("ours_set_read", "auto"), ("ours_add_read", "interpret"),
        ("ours_set_read", "interpret")]


def _one_scan(name: str, backend: str, case: testing.LoopCase, steps: int = 5, **scan_kw):
    """One scan of a provider over a fresh 64-row pinned buffer: ``(data, before, outputs)``."""
    buf = scan_runner.PinnedBuffer(seed=3)
    buf.ensure(case.dtype, loop_steps.buffer_shape(case, 64 * case.row_bytes))
    data = loop_steps.make_loop_data(case, 64 * case.row_bytes, steps, np.random.default_rng(3),
                                     check_written=64, check_others=8)
    before = np.asarray(jax.device_get(buf.x))
    scan = loop_steps.scan_fn(PROVIDER[name], backend, **scan_kw)
    outputs = scan(buf.x, data.table_dev, data.base_dev)
    return data, before, [np.asarray(jax.device_get(o)) for o in outputs]


@BUFFERS
def test_floor_launch_leaves_the_buffer_as_it_was(case):
    data, before, (after, last_indices, last_updates) = _one_scan("floor_launch", "-", case)
    assert after.shape == before.shape and after.tobytes() == before.tobytes()
    # It makes the step's indices and updates as the baseline does.
    np.testing.assert_array_equal(last_indices, data.table[-1])
    np.testing.assert_array_equal(last_updates, data.base + np.float32(data.table.shape[0] - 1))
    floor = PROVIDER["floor_launch"]
    assert loop_steps.check_replay(data, floor, before, after) is None
    assert loop_steps.check_replay(data, floor, before, after + 1).startswith(
        "the floor_launch changed the buffer: 64 sampled rows")


@pytest.mark.parametrize("shape", [(1024,), (256, 16)])
def test_floor_launch_is_one_aliased_kernel_in_the_step_on_cuda(shape):
    # Lowered for an H200 without one: one Triton custom call in the scan's body, the buffer
    # (operand 2) aliased; annotate_device_placement only says the result is pinned.
    from jax.sharding import AxisType, NamedSharding, PartitionSpec

    device = jax.sharding.AbstractDevice("NVIDIA H200", num_cores=132, platform="cuda")
    mesh = jax.sharding.AbstractMesh((1,), ("x",), (AxisType.Explicit,), abstract_device=device)
    with jax.sharding.use_abstract_mesh(mesh):
        pinned = NamedSharding(mesh, PartitionSpec(), memory_kind="pinned_host")
        x = jax.ShapeDtypeStruct(shape, jnp.float32, sharding=pinned)
        table = jax.ShapeDtypeStruct((6, 8), jnp.int32)
        base = jax.ShapeDtypeStruct((8, *shape[1:]), jnp.float32)
        scan = loop_steps.scan_fn(PROVIDER["floor_launch"], "pallas")
        text = scan.trace(x, table, base).lower(lowering_platforms=("cuda",)).as_text()
    lines = text.splitlines()
    (kernel,) = [k for k, line in enumerate(lines) if "stablehlo.custom_call" in line
                 and "annotate_device_placement" not in line]
    assert "@__gpu$xla.gpu.triton" in lines[kernel] and "operand_index = 2" in lines[kernel]
    loop_start = next(k for k, line in enumerate(lines) if "stablehlo.while" in line)
    assert kernel > loop_start  # in the scan's body: not hoisted out of it


@pytest.mark.parametrize("name, backend", [
    ("xla_add_read", "-"), ("ours_add_read", "auto"), ("ours_add_read", "interpret"),
    ("xla_set_read", "-"), ("ours_set_read", "auto"), ("ours_set_read", "interpret")])
@BUFFERS
def test_the_rows_read_after_a_write_are_the_oracle_s(name, backend, case):
    op = PROVIDER[name].op
    oracle = testing.scatter_oracle if op == "set_read" else testing.scatter_add_oracle
    data, before, (after, carried) = _one_scan(name, backend, case)
    expected = before.copy()
    for t, rows in enumerate(data.table):
        expected = oracle(expected, rows, data.base + np.float32(t))
    last = data.table[-1]
    # The carried rows: read after the last step's write, at its rows; a set's are
    # the last step's updates, bit for bit (the rows are distinct within a step).
    if op == "set_read":
        assert after.tobytes() == expected.tobytes()
        assert carried.tobytes() == (data.base + np.float32(len(data.table) - 1)).tobytes()
    np.testing.assert_allclose(after, expected, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(carried, expected[last], rtol=1e-6, atol=1e-6)
    assert loop_steps.check_read_back(data, op, before[last], carried) is None
    neighbours = expected[(last + 1) % expected.shape[0]]
    assert f"rows read after the last {op.removesuffix('_read')}" in loop_steps.check_read_back(
        data, op, before[last], neighbours)


@pytest.mark.parametrize("name, backend", [
    ("xla_set", "-"), ("ours_add", "interpret"), ("xla_add_read", "-"), ("baseline", "-")])
def test_materialized_inputs_change_what_fuses_not_what_is_written(name, backend):
    # --inputs materialized puts an optimization barrier between the making of a step's
    # indices and updates and their use (so XLA cannot fuse the making into its scatter);
    # the rows written and read are the same as without it.
    case = testing.LoopCase(8, 64)
    plain = _one_scan(name, backend, case)[2]
    data, _, barred = _one_scan(name, backend, case, materialized=True)
    for a, b in zip(plain, barred, strict=True):
        assert a.tobytes() == b.tobytes()
    buf = scan_runner.PinnedBuffer(seed=3)
    buf.ensure(case.dtype, loop_steps.buffer_shape(case, 64 * case.row_bytes))

    def text(**kw):
        scan = loop_steps.scan_fn(PROVIDER[name], backend, **kw)
        return scan.lower(buf.x, data.table_dev, data.base_dev).as_text()

    # One barrier more (a read-back provider has its own already).
    barriers = [text(**kw).count("stablehlo.optimization_barrier")
                for kw in ({}, {"materialized": True})]
    assert barriers[1] == barriers[0] + 1


def test_the_inputs_flag_is_recorded_and_named_in_the_table(tmp_path, capsys):
    assert loop.parse_args([]).inputs == "fused"
    assert loop.main(["--rows", "8", "--row-bytes", "64", "--steps", "2", "--runs", "1",
                      "--rounds", "1", "--providers", "xla_set", "--inputs", "materialized",
                      "--no-plots", "--out", str(tmp_path)]) == 0
    meta = json.loads((tmp_path / "loop.json").read_text())["meta"]
    assert meta["inputs"] == "materialized"
    assert "inputs materialized" in capsys.readouterr().out


# ---------------------------------------------------------------------------
# Checks that a wrong provider cannot pass


def test_a_provider_that_writes_nothing_fails_its_check(monkeypatch, capsys):
    # The providers run one after the other on one buffer. With the same values for
    # all, a set that wrote nothing found the rows XLA's set had just written and
    # passed: each provider now writes values of its own (scan_runner.own_updates).
    right = loop_steps.write_fn

    def write_fn(name, backend):
        return (lambda x, i, u: x) if name == "ours_set" else right(name, backend)

    monkeypatch.setattr(loop_steps, "write_fn", write_fn)
    _, records = _grid_case(monkeypatch)
    by_name = {r["provider"]: r for r in records}
    assert by_name["xla_set"]["correct"] is True
    assert by_name["ours_set"]["correct"] is False
    assert "differ from the numpy replay" in by_name["ours_set"]["check"]
    assert loop.exit_status(records) == 1
    assert "INCORRECT: ours_set[auto]" in capsys.readouterr().out


def test_the_add_check_catches_one_lost_bfloat16_update():
    # Rows hit about 100 times grow to thousands; a rounding bound on such sums would let
    # a lost update of step 100 (about 100) pass in bfloat16. A step adds one update
    # per row, rounded once, so the replay is compared bit for bit.
    case = testing.LoopCase(64, 64, "bfloat16")
    data = loop_steps.make_loop_data(case, 128 * case.row_bytes, 200, np.random.default_rng(5),
                                     check_written=64, check_others=0)
    before = testing.make_values(np.random.default_rng(6), (data.sample.size, case.row_elems),
                                 "bfloat16")
    expected = loop_steps._replay(data, "add", before, data.hits)
    lost = list(data.hits)
    positions, slots = lost[100]
    lost[100] = (positions[1:], slots[1:])  # step 100's first update dropped
    after = loop_steps._replay(data, "add", before, lost)
    assert np.abs(after.astype(np.float32) - expected.astype(np.float32)).max() >= 64
    add = PROVIDER["ours_add"]
    assert loop_steps.check_replay(data, add, before, expected) is None
    assert "differ" in loop_steps.check_replay(data, add, before, after)


def test_the_time_budget_s_cut_is_reported_and_fewer_runs_are_named(monkeypatch, capsys):
    _, records = _grid_case(monkeypatch, "--time-budget-s", "1", started=time.monotonic() - 2)
    assert loop.exit_status(records) == 0  # the caller's budget, not a failure
    assert "INCOMPLETE: the time budget left out 4 of 4 rows, in 1 cases: 8x64B-float32" in (
        capsys.readouterr().out)
    args = loop.parse_args(["--runs", "4", "--max-run-s", "0"])
    found = [{"runs": 4, "status": "ok"}, {"runs": 1, "status": "ok"},
             {"runs": None, "status": "ok"}, {"runs": 0, "status": "skipped: x"}]
    assert loop.fewer_runs(args, found) == (
        " (1 rows timed once, without warm-up, being slower than --max-run-s 0 s)")
    assert loop.fewer_runs(args, found[:1]) == ""


def test_a_bfloat16_add_passes_whether_its_update_was_rounded_or_not(tmp_path):
    # XLA on CPU keeps base + t in float32 where it feeds our add's float32 accumulator
    # (and rounds it before its own add): either replay may hold per element, and the
    # CPU grid's bfloat16 case failed every one of our adds under one replay alone.
    assert loop.main(["--dtypes", "bfloat16", "--rows", "16", "--row-bytes", "256",
                      "--steps", "6", "--runs", "1", "--rounds", "1", "--patterns", "none",
                      "--providers", "xla_add,ours_add,ours_add_read,ours_add_unique",
                      "--no-plots", "--out", str(tmp_path)]) == 0
