"""CPU tests of ``python -m benchmarks.loop``: the grid and the write patterns.

The loop runs as CI would run it (a subprocess, ``--quick`` on CPU): every (case,
provider, backend) must be recorded, checked against the numpy replay and
timed (in rounds: ``rounds`` on every record); a provider broken on purpose
must be caught and fail the run. The write patterns (ring insert, KV-cache
write, per-sequence decode write) go through the index grammar of
``pallas_pinned.at``, and one pattern case is timed in-process to see its
providers interleaved. The grid's interleaved timing, the measured floor
(``floor_launch``) and the read-after-write providers are tested in-process
in ``test_benchmarks_loop_grid.py``.
"""

import argparse
import json
from pathlib import Path

import numpy as np
import pytest

import tests.benchmark_helpers  # noqa: F401  (puts the repository root on sys.path)
from benchmarks import environment, loop, loop_patterns, loop_steps, scan_runner
from benchmarks.loop_steps import PROVIDER_NAMES
from pallas_pinned import testing
from tests.benchmark_helpers import explain, run_cli

LOOP_FIELDS = ("op", "rows", "row_bytes", "dtype", "provider", "backend", "us_per_step",
               "us_min", "us_max", "runs", "rounds", "op_cost_us", "kernels_per_step",
               "correct")
PATTERN_NAMES = {c.name for c in loop_patterns.CPU_PATTERNS}
GRID_CASE = testing.LoopCase(64, 256)


# Providers broken on purpose: each must be caught (correct False, INCORRECT
# printed, exit status 1) while every other row stays ok and correct.
_LOOP = """
import sys
from benchmarks import loop, loop_patterns, loop_steps
right = loop_steps.write_fn
def wrong(name, backend):
    fn = right(name, backend)
    if name == "ours_set_unique":  # writes every update doubled
        return lambda x, i, u: fn(x, i, u * 2)
    return fn
loop_steps.write_fn = wrong
right_read = loop_steps.read_fn
loop_steps.read_fn = lambda name, backend: (  # gathers the neighbouring rows
    (lambda x, i: right_read(name, backend)(x, (i + 1) % x.shape[0]))
    if name in ("ours_get", "ours_add_read", "ours_set_read") else right_read(name, backend))
right_ours = loop_patterns._ours
def wrong_ours(op, n, backend, x, where, values):
    if op == "kv":  # writes one position too far
        where = (where + 1) % x.shape[1]
    return right_ours(op, n, backend, x, where, values)
loop_patterns._ours = wrong_ours
sys.exit(loop.main({argv!r}))
"""
BROKEN = ("ours_set_unique", "ours_get", "ours_kv", "ours_add_read", "ours_set_read")


@pytest.fixture(scope="module")
def loop_run(tmp_path_factory):
    """The CPU quick run (one grid case, every write pattern), with pallas rows (skipped
    without a GPU) and fewer steps and runs than its defaults."""
    out = tmp_path_factory.mktemp("loop")
    argv = ["--quick", "--out", str(out), "--steps", "6", "--runs", "2", "--backends", "pallas",
            "--xla-option", "xla_gpu_graph_min_graph_size=1"]
    done = run_cli([], code=_LOOP.format(argv=argv))
    assert done.returncode == 1, explain(done)  # the broken providers fail the run
    return out, done.stdout


def _loop(out: Path) -> dict:
    return json.loads((out / "loop.json").read_text())


def _expected_rows(backends: tuple[str, ...]) -> set[tuple[str, str]]:
    ours = [p for p in PROVIDER_NAMES if p.startswith("ours")]
    expected = {("baseline", "-"), ("floor_launch", "-"), ("xla_set", "-"), ("xla_add", "-"),
                ("xla_get", "-"), ("xla_add_read", "-"), ("xla_set_read", "-")}
    return expected | {(p, b) for p in ours for b in ("auto", *backends)}


def test_loop_prints_its_floor_note_and_the_bars_against_xla(loop_run):
    out, stdout = loop_run
    lines = stdout.splitlines()
    assert loop_steps.FLOOR_NOTE in lines
    at = lines.index(loop_steps.FLOOR_NOTE) + 1
    want = loop.bar_lines(_loop(out)["records"])
    # The grid case has four pairs; the broken ours_set_unique and ours_get give no ratio.
    assert want[0].startswith("auto against XLA, same semantics: ") and " of 2 pairs" in want[0]
    assert lines[at:at + len(want)] == want


def test_the_loop_table_prints_the_spread_and_no_ratio_against_a_wrong_row(capsys):
    def record(provider, us, correct=True):
        return {"case": "c", "provider": provider, "backend": "-" if provider != "ours_set"
                else "auto", "op": "set", "rows": 8, "row_bytes": 64, "dtype": "float32",
                "status": "ok", "correct": correct, "us_per_step": us, "us_min": us - 1,
                "us_max": us + 2, "op_cost_us": None, "kernels_per_step": 1}

    loop.print_table([record("xla_set", 10.0), record("ours_set", 5.0)], "t")
    line = capsys.readouterr().out.splitlines()[-1]
    assert "10.0 [9.0–12.0]" in line and "5.0 [4.0–7.0]" in line and line.endswith("0.50")
    loop.print_table([record("xla_set", 10.0, correct=False), record("ours_set", 5.0)], "t")
    assert capsys.readouterr().out.splitlines()[-1].endswith("n/a (incorrect)")


def test_the_bars_name_each_pair_over_its_bar():
    def record(provider, us):
        return {"case": "c", "provider": provider, "backend": "auto" if provider[0] == "o"
                else "-", "us_per_step": us, "correct": True}

    found = [record("xla_set", 10.0), record("ours_set_unique", 11.5), record("xla_add", 10.0),
             record("ours_add", 14.0), record("ours_add_unique", 10.0), record("xla_get", 5.0),
             record("ours_get", 5.0)]
    lines = loop.bar_lines(found)
    assert lines[0].startswith("auto against XLA, same semantics: 3 of 4 pairs")
    assert len(lines) == 2 and "set, promised distinct" in lines[1] and "1.15x" in lines[1]


def test_loop_records_every_provider(loop_run):
    out, _ = loop_run
    records = _loop(out)["records"]
    rows = {(r["provider"], r["backend"]) for r in records if r["case"] == GRID_CASE.name}
    assert rows == _expected_rows(("pallas",))


def test_loop_records_are_checked_and_consistent(loop_run):
    out, _ = loop_run
    records = _loop(out)["records"]
    for r in records:
        missing = [f for f in LOOP_FIELDS if f not in r]
        assert not missing, (r["case"], r["provider"], missing)
        if r["backend"] == "pallas":  # needs a GPU: skipped, not an error
            assert r["status"] == "skipped: needs a CUDA GPU", r
            continue
        assert r["status"] == "ok" and r["correct"] is (r["provider"] not in BROKEN), r
        assert 0 < r["us_min"] <= r["us_per_step"] <= r["us_max"], r
        # --runs 2 under the default --rounds 5: one timed run in each of two rounds,
        # the grid's providers interleaved as the patterns' are.
        assert r["runs"] == 2 and r["rounds"] == 2, r
        assert r["kernels_per_step"] >= 1, r
        base = next(b for b in records if b["case"] == r["case"] and b["provider"] == "baseline")
        assert r["op_cost_us"] == pytest.approx(r["us_per_step"] - base["us_per_step"])
    meta = _loop(out)["meta"]
    assert meta["jax"] and meta["jaxlib"] and meta["date_utc"] and meta["steps"] == 6
    assert meta["grid"] == "cpu_quick"


def test_loop_compiles_every_scan_with_the_xla_options_it_records(loop_run, monkeypatch):
    out, _ = loop_run
    assert _loop(out)["meta"]["compiler_options"] == {"xla_gpu_graph_min_graph_size": 1}
    # ... and hands them to every compile, XLA's programs and ours alike.
    seen = []

    class Lowered:
        def compile(self, options=None):
            seen.append(options)
            return "compiled"

    compiled = scan_runner.compile_all({"a": Lowered, "b": Lowered}, {"xla_x": 1})
    assert {v[0] for v in compiled.values()} == {"compiled"} and seen == [{"xla_x": 1}] * 2


@pytest.mark.parametrize(("text", "expected"), [
    ("xla_gpu_graph_min_graph_size=1", ("xla_gpu_graph_min_graph_size", 1)),
    ("--xla_gpu_enable_command_buffer=FUSION", ("xla_gpu_enable_command_buffer", "FUSION")),
    ("xla_gpu_autotune_level=true", ("xla_gpu_autotune_level", True)),
])
def test_an_xla_option_parses_to_its_name_and_typed_value(text, expected):
    assert environment.parse_xla_option(text) == expected


@pytest.mark.parametrize("text", ["graph=1", "xla_gpu_graph_min_graph_size"])
def test_an_xla_option_without_a_name_or_value_is_refused(text):
    with pytest.raises(argparse.ArgumentTypeError, match="xla_<name>=<value>"):
        environment.parse_xla_option(text)


def test_loop_prints_the_table_and_a_plot(loop_run):
    out, stdout = loop_run
    assert "ours/xla" in stdout and "kernels" in stdout
    import importlib.util

    if importlib.util.find_spec("matplotlib") is not None:  # else the run says it drew none
        assert (out / "loop.png").exists(), stdout[-2000:]
    else:
        assert "no plot: matplotlib is not installed" in stdout
    for name in BROKEN[:2]:
        assert f"INCORRECT: {name}[auto]" in stdout
    # The write was right; the rows read back after it were the neighbours.
    for op in ("add", "set"):
        assert (f"INCORRECT: ours_{op}_read[auto] on {GRID_CASE.name}: rows read after the "
                f"last {op}:") in stdout
        assert f" {op}_read " in stdout  # a line of the table: xla_{op}_read and ours_{op}_read
    assert "launch (op)" in stdout and "floor (+pcie)" in stdout


def test_every_write_pattern_is_measured_against_xla(loop_run):
    out, stdout = loop_run
    records = [r for r in _loop(out)["records"] if r["case"] in PATTERN_NAMES]
    for case in loop_patterns.CPU_PATTERNS:
        rows = {(r["provider"], r["backend"]) for r in records if r["case"] == case.name}
        assert rows == {("baseline", "-"), (f"xla_{case.op}", "-"), (f"ours_{case.op}", "auto"),
                        (f"ours_{case.op}", "pallas")}
        assert f" {case.op} " in stdout  # a line of the table
    for r in records:  # --runs 2: two rounds of one timed run each, interleaved
        if r["status"] == "ok":
            assert r["rounds"] == min(2, loop_patterns.ROUNDS) and r["runs"] == 2, r
        ours_ok = r["provider"].startswith("ours") and r["status"] == "ok"
        assert (r["same_step_ops_as_xla"] is None) is not ours_ok, r
    assert "INCORRECT: ours_kv[auto]" in stdout  # writes one position too far
    assert set(_loop(out)["meta"]["patterns"]) == PATTERN_NAMES


def test_the_ring_case_wraps_and_the_others_do_not_repeat_rows():
    for case in loop_patterns.CPU_PATTERNS:
        lengths0 = np.arange(case.shape[0]) % case.shape[1]
        rows = [loop_patterns.written_rows(case, t, lengths0) for t in range(16)]
        assert all(np.unique(r).size == case.rows for r in rows), case
        wraps = any(r[0] > r[-1] for r in rows)
        assert wraps == (case.op == "ring_wrap"), case  # the contiguous ring never straddles


def test_every_pattern_case_has_a_name_of_its_own():
    # The report keys records by case name: two cases of one name would print one's
    # figures under the other's rows (session 24 found the bfloat16 blocks of 64 and
    # 1024 rows sharing one).
    for patterns in (loop_patterns.GPU_PATTERNS, loop_patterns.CPU_PATTERNS):
        names = [case.name for case in patterns]
        assert len(set(names)) == len(names), names


def test_loop_gpu_plans_run_the_targets_first():
    args = loop.parse_args([])
    args.steps = args.runs = args.buffer_gib = args.time_budget_s = None
    loop.with_defaults(args, gpu=True)
    grid, plan, _ = loop.plan_cases(args)
    assert grid == "full" and plan[: len(testing.LOOP_TARGETS)] == list(testing.LOOP_TARGETS)
    assert args.steps == 200 and args.buffer_bytes == 1 << 30 and args.time_budget_s == 240
    planned_ops = [c.op for c in loop.planned_patterns(args)]
    assert list(dict.fromkeys(planned_ops)) == list(loop_patterns.PATTERN_OPS)
    args.quick = True
    assert loop.plan_cases(args)[:2] == ("quick", list(testing.LOOP_TARGETS))


# ---------------------------------------------------------------------------
# The measured floor (floor_launch, PCIe): in-process tests in test_benchmarks_loop_grid.py


def test_every_grid_record_carries_the_floor_of_its_case(loop_run):
    out, _ = loop_run
    records = [r for r in _loop(out)["records"] if r["case"] == GRID_CASE.name]
    floor = next(r for r in records if r["provider"] == "floor_launch")
    assert floor["op"] == "floor" and floor["correct"] is True and floor["us_per_step"] > 0
    # add reads and writes each row; the *_read ops read it back after their write.
    passes = {"set": 1, "get": 1, "add": 2, "add_read": 3, "set_read": 2}
    for r in records:
        assert r["floor_launch_us"] == floor["us_per_step"], r
        if r["op"] in ("none", "floor"):  # moves no rows
            assert r["pcie_us"] is None and r["kernel_floor_us"] is None, r
            continue
        transfer_us = passes[r["op"]] * GRID_CASE.rows * GRID_CASE.row_bytes / 52e9 * 1e6
        assert r["pcie_us"] == pytest.approx(transfer_us), r
        assert r["kernel_floor_us"] == pytest.approx(floor["us_per_step"] + transfer_us), r
    assert _loop(out)["meta"]["pcie_bytes_per_s"] == loop_steps.PCIE_BYTES_PER_S == 52e9


def test_the_cpu_plans_are_the_cpu_grid_and_every_pattern():
    args = loop.parse_args([])
    grid, plan, _ = loop.plan_cases(args)
    assert grid == "cpu" and plan == list(testing.LOOP_CPU_CASES)
    assert loop.planned_patterns(args) == list(loop_patterns.CPU_PATTERNS)
    assert loop.plan_cases(loop.parse_args(["--quick"]))[:2] == ("cpu_quick", [GRID_CASE])
    custom = loop.parse_args(["--rows", "16"])
    assert loop.planned_patterns(custom) == []  # a custom grid runs no pattern unless asked


def test_dtypes_alone_run_the_chosen_grid_s_shapes_in_those_dtypes():
    # --quick --dtypes bfloat16 is the grid in bfloat16 (it once ran one case).
    quick = loop.with_defaults(loop.parse_args(["--quick", "--dtypes", "bfloat16"]), gpu=True)
    grid, plan, _ = loop.plan_cases(quick)
    assert grid == "custom"
    assert plan == [testing.LoopCase(c.rows, c.row_bytes, "bfloat16")
                    for c in testing.LOOP_TARGETS]
    # With --rows or --row-bytes the grid is their cross product, as before.
    crossed = loop.with_defaults(
        loop.parse_args(["--rows", "5,64", "--row-bytes", "4", "--dtypes", "bfloat16"]), gpu=True)
    assert loop.plan_cases(crossed)[1] == [testing.LoopCase(5, 4, "bfloat16"),
                                           testing.LoopCase(64, 4, "bfloat16")]


def test_a_pattern_case_is_timed_interleaved_in_rounds(monkeypatch):
    # Timed one provider after the other, drift of the machine lands on one of
    # them: every provider is checked first, then timed round-robin, rotated.
    calls = []
    right = scan_runner.call_scan

    def logged(buf, scan, repeats, warmup):
        calls.append((scan.record["provider"], repeats, warmup))
        return right(buf, scan, repeats, warmup)

    monkeypatch.setattr(scan_runner, "call_scan", logged)
    args = loop.parse_args(["--steps", "4", "--runs", "4", "--warmup", "1"])
    args.rounds = 2
    case = next(c for c in loop_patterns.CPU_PATTERNS if c.op == "block")
    progress = type("Quiet", (), {"step": lambda self, label: None})()
    records = loop_patterns.run_pattern_case(args, scan_runner.PinnedBuffer(args.seed), case,
                                             False, progress)
    names = [r["provider"] for r in records]
    assert names == ["baseline", "xla_block", "ours_block"]
    warmups, timed = calls[:3], calls[3:]
    assert warmups == [(n, 0, 1) for n in names]  # every warm-up before any timed call
    assert timed == [(n, 2, 0) for n in names] + [(n, 2, 0) for n in names[1:] + names[:1]]
    for r in records:
        assert r["status"] == "ok" and r["correct"] is True, r
        assert r["rounds"] == 2 and r["runs"] == 4, r
        assert 0 < r["us_min"] <= r["us_per_step"] <= r["us_max"], r
    same = {r["provider"]: r["same_step_ops_as_xla"] for r in records}
    assert same["baseline"] is None and same["xla_block"] is None
    assert isinstance(same["ours_block"], bool)
    assert scan_runner.round_shares(3, 5) == [1, 1, 1]  # fewer runs than rounds
    assert scan_runner.round_shares(12, 5) == [3, 3, 2, 2, 2]


def test_a_write_pattern_that_writes_nothing_fails_its_check(monkeypatch):
    # ours_block runs right after xla_block on the same buffer: with the same values
    # for both, a block insert that wrote nothing passed (scan_runner.own_updates).
    monkeypatch.setattr(loop_patterns, "_ours", lambda op, n, backend, x, where, values: x)
    args = loop.parse_args(["--steps", "4", "--runs", "1", "--warmup", "0"])
    case = next(c for c in loop_patterns.CPU_PATTERNS if c.op == "block")
    progress = type("Quiet", (), {"step": lambda self, label: None})()
    records = loop_patterns.run_pattern_case(args, scan_runner.PinnedBuffer(args.seed), case,
                                             False, progress)
    correct = {r["provider"]: r["correct"] for r in records}
    assert correct == {"baseline": True, "xla_block": True, "ours_block": False}
