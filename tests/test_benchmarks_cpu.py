"""CPU smoke tests of the benchmark package (``python -m benchmarks.<name>``).

Each CLI runs as CI would run it (a subprocess from the repository root,
``--cpu``, tiny sizes) and its records are checked field by field. The
checkers the benchmarks rely on are tested directly, and each CLI is run once
with a provider broken on purpose: a benchmark whose "correct" flag or exit
status cannot fail would be worse than none.
"""

import csv
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_pinned import testing

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:  # the benchmarks package lives at the repository root
    sys.path.insert(0, str(REPO))

from benchmarks import cases, checks, hlo, loop, providers  # noqa: E402

REQUIRED_FIELDS = (
    "case", "provider", "row_bytes", "n_updates", "pattern", "dtype", "median_s", "min_s",
    "max_s", "gbps", "updates_per_s", "ceiling_gbps", "correct",
)
SCATTERS = ("ours", "ours_nocoalesce", "xla", "host_roundtrip")
LOOP_FIELDS = ("op", "rows", "row_bytes", "dtype", "provider", "backend", "us_per_step",
               "us_min", "us_max", "op_cost_us", "kernels_per_step", "correct")


def _run(args: list[str], timeout: int = 180, code: str | None = None):
    """``python -m <args>`` (or ``python -c code``) from the repository root, on CPU."""
    cmd = [sys.executable, "-c", code] if code else [sys.executable, "-m", *args]
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False,
                          cwd=REPO, env=env)


def _explain(done) -> str:
    return done.stdout[-3000:] + done.stderr[-3000:]


# ---------------------------------------------------------------------------
# sweep


@pytest.fixture(scope="module")
def sweep_run(tmp_path_factory):
    """One tiny CPU sweep shared by the record tests (~10 s, mostly compiling)."""
    out = tmp_path_factory.mktemp("sweep")
    done = _run([
        "benchmarks.sweep", "--cpu", "--out", str(out), "--no-plots",
        # 8-byte rows: two f32 or four bf16 per row, so rows are not scalars.
        "--row-bytes", "8",
        # 5: the latency case; 300: not a multiple of any tile size.
        "--counts", "5,300",
        # Unique and duplicated rows: duplicates take the sort path and skip
        # the providers that need unique indices.
        "--patterns", "random_unique,random_dup25",
        "--dtypes", "float32,bfloat16",
        # ours_triton needs a GPU: recorded as skipped, never as an error.
        "--providers", "ceiling,ours_triton," + ",".join(SCATTERS),
        "--reps", "10", "--max-reps", "20",
    ])
    assert done.returncode == 0, _explain(done)
    return out, done.stdout


def _records(out: Path, stem: str = "scatter_custom") -> list[dict]:
    return json.loads((out / f"{stem}.json").read_text())["records"]


def test_every_case_and_provider_has_a_record(sweep_run):
    out, _ = sweep_run
    records = _records(out)
    names = {r["case"] for r in records}
    assert len(names) == 8  # 2 counts x 2 patterns x 2 dtypes
    for case in names:
        got = [r["provider"] for r in records if r["case"] == case]
        assert sorted(got) == sorted(("ceiling", "ours_triton") + SCATTERS), (case, got)


def test_absent_provider_is_skipped_not_failed(sweep_run):
    out, _ = sweep_run
    for r in _records(out):
        if r["provider"] == "ours_triton":
            assert r["status"] == "skipped: needs a CUDA GPU", r["status"]
        else:
            assert r["status"] != "error", r


def test_records_carry_the_required_fields(sweep_run):
    out, _ = sweep_run
    for r in _records(out):
        missing = [f for f in REQUIRED_FIELDS if f not in r]
        assert not missing, (r["case"], r["provider"], missing)
        if r["status"] != "ok":
            continue
        assert 0 < r["min_s"] <= r["median_s"] <= r["max_s"], r
        assert r["reps"] >= 10
        payload = r["n_updates"] * r["row_bytes"]
        assert r["gbps"] == pytest.approx(payload / r["median_s"] / 1e9)
        assert r["updates_per_s"] == pytest.approx(r["n_updates"] / r["median_s"])


def test_scatters_are_checked_and_correct(sweep_run):
    out, _ = sweep_run
    for r in _records(out):
        if r["provider"] == "ceiling":
            assert r["correct"] is None  # a copy, not a scatter: nothing to check
        elif r["status"] == "ok":
            assert r["correct"] is True, (r["case"], r["provider"], r["check"])


def test_kernel_without_sort_is_skipped_only_for_duplicates(sweep_run):
    out, _ = sweep_run
    for r in _records(out):
        if r["provider"] == "ours_nocoalesce":
            expected_skip = r["pattern"] == "random_dup25"
            assert r["status"].startswith("skipped") == expected_skip, r["status"]


def test_ceiling_of_the_same_case_is_attached(sweep_run):
    out, _ = sweep_run
    records = _records(out)
    for r in records:
        ceiling = next(c for c in records if c["case"] == r["case"] and c["provider"] == "ceiling")
        assert r["ceiling_gbps"] == ceiling["gbps"] and ceiling["gbps"] > 0


def test_csv_matches_json_and_summary_is_printed(sweep_run):
    out, stdout = sweep_run
    with (out / "scatter_custom.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == len(_records(out))
    assert set(REQUIRED_FIELDS) <= set(rows[0])
    meta = json.loads((out / "scatter_custom.json").read_text())["meta"]
    assert meta["jax"] and meta["date_utc"] and meta["jax_backend"] == "cpu"
    assert meta["thresholds"]["sort_min_updates"] >= 0
    assert "(a)" in stdout and "(d)" in stdout


@pytest.mark.parametrize(
    "flag, value",
    [
        ("--providers", "ours,bogus"),  # unknown provider names the bad one
        ("--patterns", "zigzag"),
        ("--counts", "5,abc"),
    ],
)
def test_bad_arguments_name_the_value(flag, value):
    done = _run(["benchmarks.sweep", "--cpu", "--dry-run", flag, value])
    assert done.returncode == 2
    assert value.split(",")[-1] in done.stderr


_BROKEN_SWEEP = """
import sys
from benchmarks import providers as p, sweep
# xla writes doubled values; device_roundtrip writes nothing at all.
p.JITTED["xla"] = p._donating(lambda x, i, u: x.at[i].set(u * 2))
p.JITTED["device_roundtrip"] = p._donating(lambda x, i, u: x)
if {break_ours!r} == "wrong":
    p.JITTED["ours"] = p._donating(lambda x, i, u: x)
if {break_ours!r} == "raises":
    def boom(x, i, u):
        raise ValueError("a provider that raises is an error, not 'unavailable'")
    p.JITTED["ours"] = boom
sys.exit(sweep.main(["--cpu", "--out", {out!r}, "--no-plots", "--row-bytes", "8",
                     "--counts", "300",
                     "--providers", "ceiling,ours,xla,device_roundtrip,host_roundtrip"]))
"""


def _broken_sweep(out: Path, break_ours: str):
    return _run([], code=_BROKEN_SWEEP.format(out=str(out), break_ours=break_ours))


def test_wrong_alternatives_are_flagged_but_only_ours_fails_the_run(tmp_path):
    # XLA's duplicate order is unspecified and was seen to tear rows on the
    # H200: alternatives are reported as incorrect, never fail the run.
    done = _broken_sweep(tmp_path, "no")
    assert done.returncode == 0, _explain(done)
    correct = {r["provider"]: r["correct"] for r in _records(tmp_path, "scatter_custom")}
    # The providers after a wrong one are still judged on their own writes.
    assert correct == {"ceiling": None, "ours": True, "xla": False, "device_roundtrip": False,
                       "host_roundtrip": True}
    assert "INCORRECT: xla" in done.stdout
    assert _broken_sweep(tmp_path / "wrong", "wrong").returncode == 1


def test_a_provider_that_raises_is_an_error_and_fails_the_run(tmp_path):
    done = _broken_sweep(tmp_path, "raises")
    assert done.returncode == 1, _explain(done)
    ours = next(r for r in _records(tmp_path) if r["provider"] == "ours")
    assert ours["status"] == "error" and "ValueError" in ours["error"]
    assert "ERROR: ours" in done.stdout
    # The others still ran, on a buffer rebuilt after the failure.
    assert all(r["status"] == "ok" for r in _records(tmp_path) if r["provider"] != "ours")


def test_only_a_failed_import_makes_a_provider_unavailable():
    gpu_without_torch = SimpleNamespace(
        gpu=True, torch=None, notes={"torch_unavailable": "torch is not importable (x)"})
    reasons = providers.unavailable(gpu_without_torch, ("torch_index_copy", "ours", "xla"))
    assert reasons == {"torch_index_copy": "unavailable: torch is not importable (x)"}
    cpu = SimpleNamespace(gpu=False, torch=None, notes={})
    assert providers.unavailable(cpu, ("ours_triton",)) == {"ours_triton": "needs a CUDA GPU"}


def test_gpu_plans_cover_the_targets_within_budget():
    from benchmarks import sweep

    for flags, limit_s in (([], 360), (["--quick"], 70)):
        args = sweep.parse_args(flags)
        name, plan, _, sizes = sweep.resolve(args, gpu=True)
        names = providers.default_providers(True, name)
        assert cases.Case("random_unique", "float32", 4, 1 << 24) in plan[:2]
        assert cases.Case("random_unique", "float32", 4, 5) in plan[:2]
        assert cases.estimate_sweep_seconds(plan, names, args, sizes) < limit_s, name


# ---------------------------------------------------------------------------
# The row checkers


def _scatter(before: np.ndarray, rows: np.ndarray, updates: np.ndarray) -> np.ndarray:
    after = before.copy()
    for r, u in zip(rows, updates, strict=True):
        after[r] = u
    return after


@pytest.fixture
def small_case():
    rng = np.random.default_rng(1)
    buffer = rng.standard_normal((64, 3)).astype(np.float32)
    rows = np.array([5, 17, 5, 40, 2])  # row 5 twice: the last (index 2) must win
    updates = rng.standard_normal((5, 3)).astype(np.float32)
    sample = checks.make_row_sample(rng, rows, 64, max_written=100, n_others=8)
    return buffer, rows, updates, sample


def _check(buffer, after, updates, sample, duplicates="last"):
    return checks.check_rows(buffer[sample.rows], after[sample.rows], sample,
                             updates[sample.hit_positions], duplicates=duplicates)


def test_sample_holds_every_written_row(small_case):
    _, rows, _, sample = small_case
    assert set(rows) <= set(sample.rows.tolist())
    assert sample.hit_positions.tolist() == [0, 1, 2, 3, 4]


def test_checker_accepts_a_correct_scatter(small_case):
    buffer, rows, updates, sample = small_case
    assert _check(buffer, _scatter(buffer, rows, updates), updates, sample) is None


def test_checker_catches_a_missing_write(small_case):
    buffer, rows, updates, sample = small_case
    after = _scatter(buffer, rows, updates)
    after[40] = buffer[40]
    assert "differ" in _check(buffer, after, updates, sample)


def test_checker_catches_a_stray_write(small_case):
    buffer, rows, updates, sample = small_case
    after = _scatter(buffer, rows, updates)
    untouched = next(r for r in sample.rows if r not in rows)
    after[untouched] += 1
    assert "differ" in _check(buffer, after, updates, sample)


def test_checker_duplicate_policies(small_case):
    buffer, rows, updates, sample = small_case
    first_wins = _scatter(buffer, rows[::-1], updates[::-1])  # row 5 gets update 0
    assert _check(buffer, first_wins, updates, sample, "last") is not None
    assert _check(buffer, first_wins, updates, sample, "any") is None
    foreign = _scatter(buffer, rows, updates)
    foreign[5] = updates[1]  # a value meant for another row
    assert _check(buffer, foreign, updates, sample, "any") is not None


def test_add_checker_allows_rounding_and_nothing_more(small_case):
    buffer, rows, updates, sample = small_case
    before = buffer[sample.rows]
    slots, hits = sample.hit_slots, updates[sample.hit_positions]
    right = testing.scatter_add_oracle(before, slots, hits)
    assert checks.check_added_rows(before, right, slots, hits) is None
    reordered = right.copy()
    reordered[slots[0]] = np.nextafter(reordered[slots[0]], np.float32(np.inf))
    assert checks.check_added_rows(before, reordered, slots, hits) is None
    once = testing.scatter_add_oracle(before, slots[1:], hits[1:])  # one update lost
    assert "differ" in checks.check_added_rows(before, once, slots, hits)


# ---------------------------------------------------------------------------
# The shared oracles and timing helper of pallas_pinned.testing


@pytest.mark.parametrize("dtype", ["int8", "uint16", "int32", "bool"])
@pytest.mark.parametrize("mode", [None, "clip", "fill", "drop", "promise_in_bounds"])
def test_oracles_agree_with_jnp(dtype, mode):
    # Integers and bool: exact whatever the summation order, so jnp must agree.
    rng = np.random.default_rng(3)
    x = testing.make_values(rng, (6, 2), dtype)
    idx = rng.integers(-9, 9, size=11)
    if mode == "promise_in_bounds":
        idx = rng.integers(0, 6, size=11)
    upd = testing.make_values(rng, (11, 2), dtype)
    got = np.asarray(jnp.asarray(x).at[idx].get(mode=mode))
    testing.assert_same(testing.gather_oracle(x, idx, mode), got)
    if mode in (None, "clip", "drop") and dtype != "bool":  # jnp cannot add bools
        added = np.asarray(jnp.asarray(x).at[idx].add(jnp.asarray(upd), mode=mode))
        testing.assert_same(testing.scatter_add_oracle(x, idx, upd, mode), added)


def test_gather_oracle_fill_value_and_defaults():
    x = np.arange(6, dtype=np.float32).reshape(3, 2)
    out = testing.gather_oracle(x, np.array([-4, 1, 3]), "fill")
    assert np.isnan(out[0]).all() and np.isnan(out[2]).all() and (out[1] == x[1]).all()
    filled = testing.gather_oracle(x, np.array([7]), "fill", fill_value=2.5)
    assert (filled == 2.5).all()


def test_add_oracle_rounds_16_bit_floats_once_per_row():
    import ml_dtypes

    x = np.array([[1.0]], ml_dtypes.bfloat16)
    tiny = np.full((4, 1), 2.0**-9, ml_dtypes.bfloat16)  # each alone rounds away from 1.0
    got = testing.scatter_add_oracle(x, np.zeros(4, np.int64), tiny)
    assert float(got[0, 0]) == pytest.approx(1.0 + 2.0**-7)


def test_time_calls_threads_the_state_and_skips_the_warmup():
    calls = []

    def step(state, k):
        calls.append(state)
        return state + k

    state, seconds = testing.time_calls(step, 0, 2, repeats=3, warmup=2)
    assert calls == [0, 2, 4, 6, 8] and state == 10
    assert len(seconds) == 3 and all(s >= 0 for s in seconds)


def test_loop_grid_starts_with_the_issue_targets():
    assert testing.LOOP_CASES[: len(testing.LOOP_TARGETS)] == testing.LOOP_TARGETS
    assert len(set(testing.LOOP_CASES)) == len(testing.LOOP_CASES) == 9 * 5 * 2
    assert set(testing.BACKENDS) == {"auto", "xla", "pallas", "triton", "interpret"}


# ---------------------------------------------------------------------------
# Kernel counting from HLO


_SYNTHETIC_HLO = """
HloModule m

%fused (p: f32[4]) -> f32[4] {
  %p = f32[4]{0} parameter(0)
  ROOT %n = f32[4]{0} negate(%p)
}

%ba (p: f32[4]) -> f32[4] {
  %p = f32[4]{0} parameter(0)
  ROOT %f = f32[4]{0} fusion(%p), kind=kLoop, calls=%fused
}

%bb (p: f32[4]) -> f32[4] {
  %p = f32[4]{0} parameter(0)
  %f1 = f32[4]{0} fusion(%p), kind=kLoop, calls=%fused
  ROOT %f2 = f32[4]{0} fusion(%f1), kind=kLoop, calls=%fused
}

%body (t: (s32[], f32[4])) -> (s32[], f32[4]) {
  %t = (s32[], f32[4]{0}) parameter(0)
  %i = s32[] get-tuple-element(%t), index=0
  %x = f32[4]{0:S(5)} get-tuple-element(%t), index=1
  %c = s32[] constant(1)
  %next = s32[] fusion(%i, %c), kind=kLoop, calls=%fused
  %k = f32[4]{0} custom-call(%x), custom_call_target="__gpu$xla.gpu.triton"
  %s = (f32[4]{0}, s32[4]{0}) sort(%k, %k), dimensions={0}, to_apply=%fused
  %b = f32[4]{0} bitcast(%k)
  %cs = (f32[4]{0}, f32[4]{0}) copy-start(%b)
  %cd = f32[4]{0} copy-done(%cs)
  %pick = pred[] constant(true)
  %cond = f32[4]{0} conditional(%pick, %cd, %cd), true_computation=%ba, false_computation=%bb
  ROOT %out = (s32[], f32[4]{0}) tuple(%next, %cond)
}

%cond (t: (s32[], f32[4])) -> pred[] {
  %t = (s32[], f32[4]{0}) parameter(0)
  ROOT %lt = pred[] constant(true)
}

ENTRY %main (x: f32[4]) -> f32[4] {
  %x = f32[4]{0} parameter(0)
  %z = s32[] constant(0)
  %init = (s32[], f32[4]{0}) tuple(%z, %x)
  %w = (s32[], f32[4]{0}) while(%init), condition=%cond, body=%body, backend_config=@TRIP
  ROOT %r = f32[4]{0} get-tuple-element(%w), index=1
}
""".replace("@TRIP", '{"known_trip_count":{"n":"50"}}')


def test_kernel_counting_rule_on_a_synthetic_module():
    # fusion + custom-call + sort + copy-start + the larger branch (2 fusions);
    # the trip count of 50 for 100 steps means XLA unrolled twice: halve it.
    counted = hlo.kernels_per_step(_SYNTHETIC_HLO, steps=100)
    assert counted.trip_count == 50
    assert counted.per_step == pytest.approx(6 / 2)
    assert counted.ops == {"fusion": 3, "custom-call:__gpu$xla.gpu.triton": 1, "sort": 1,
                           "copy-start": 1}


def test_kernel_counting_on_a_compiled_scan():
    def run(x):
        def body(x, t):
            return x.at[t % 4].add(1.0), None

        return jax.lax.scan(body, x, jnp.arange(7))[0]

    text = jax.jit(run).lower(jnp.zeros(4)).compile().as_text()
    counted = hlo.kernels_per_step(text, steps=7)
    assert counted.per_step >= 1 and sum(counted.ops.values()) >= 1, counted


# ---------------------------------------------------------------------------
# loop


@pytest.fixture(scope="module")
def loop_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("loop")
    done = _run(["benchmarks.loop", "--cpu", "--out", str(out)])
    assert done.returncode == 0, _explain(done)
    return out, done.stdout


def _loop(out: Path) -> dict:
    return json.loads((out / "loop.json").read_text())


def _expected_rows(backends: tuple[str, ...]) -> set[tuple[str, str]]:
    from benchmarks.loop_steps import PROVIDER_NAMES

    ours = [p for p in PROVIDER_NAMES if p.startswith("ours")]
    expected = {("baseline", "-"), ("xla_set", "-"), ("xla_add", "-")}
    return expected | {(p, b) for p in ours for b in ("auto", *backends)}


def test_loop_records_every_provider(loop_run):
    out, _ = loop_run
    records = _loop(out)["records"]
    for case in testing.LOOP_CPU_CASES:
        rows = {(r["provider"], r["backend"]) for r in records if r["case"] == case.name}
        assert rows == _expected_rows(()), case


def test_loop_records_are_checked_and_consistent(loop_run):
    out, _ = loop_run
    records = _loop(out)["records"]
    for r in records:
        missing = [f for f in LOOP_FIELDS if f not in r]
        assert not missing, (r["case"], r["provider"], missing)
        assert r["status"] == "ok" and r["correct"] is True, r
        assert 0 < r["us_min"] <= r["us_per_step"] <= r["us_max"], r
        assert r["kernels_per_step"] >= 1, r
        base = next(b for b in records if b["case"] == r["case"] and b["provider"] == "baseline")
        assert r["op_cost_us"] == pytest.approx(r["us_per_step"] - base["us_per_step"])
    meta = _loop(out)["meta"]
    assert meta["jax"] and meta["jaxlib"] and meta["date_utc"] and meta["steps"] == 20


def test_loop_prints_the_table_and_a_plot(loop_run):
    out, stdout = loop_run
    assert "ours/xla" in stdout and "kernels" in stdout
    assert (out / "loop.png").exists() or "matplotlib is not installed" in stdout


_BROKEN_LOOP = """
import sys
from benchmarks import loop, loop_steps
right = loop_steps.write_fn
def wrong(name, backend):
    fn = right(name, backend)
    if name == "ours_set_unique":  # writes every update doubled
        return lambda x, i, u: fn(x, i, u * 2)
    return fn
loop_steps.write_fn = wrong
sys.exit(loop.main(["--cpu", "--out", {out!r}, "--no-plots", "--rows", "16",
                    "--row-bytes", "8", "--steps", "4", "--runs", "1",
                    "--backends", "interpret,pallas"]))
"""


def test_loop_backend_rows_and_a_wrong_result(tmp_path):
    done = _run([], code=_BROKEN_LOOP.format(out=str(tmp_path)))
    assert done.returncode == 1, _explain(done)
    records = _loop(tmp_path)["records"]
    assert {(r["provider"], r["backend"]) for r in records} == _expected_rows(
        ("interpret", "pallas"))
    for r in records:
        if r["backend"] == "pallas":  # needs a GPU: skipped, not an error
            assert r["status"] == "skipped: needs a CUDA GPU", r
        elif r["provider"] == "ours_set_unique":  # broken on purpose, every backend
            assert r["correct"] is False, r
        else:
            assert r["status"] == "ok" and r["correct"] is True, r
    assert "INCORRECT: ours_set_unique[auto]" in done.stdout


def test_loop_gpu_plan_runs_the_targets_first_within_budget():
    args = loop.parse_args(["--cpu"])
    args.steps = args.runs = args.buffer_gib = args.time_budget_s = None
    loop.with_defaults(args, gpu=True)
    grid, plan, _ = loop.plan_cases(args)
    assert grid == "full" and plan[: len(testing.LOOP_TARGETS)] == list(testing.LOOP_TARGETS)
    assert args.steps == 200 and args.buffer_bytes == 1 << 30 and args.time_budget_s == 240
    cumulative = loop.estimate_seconds(args, plan)
    assert cumulative[len(testing.LOOP_TARGETS) - 1] < 0.5 * args.time_budget_s


# ---------------------------------------------------------------------------
# gather_add and tune


def test_gather_add_checks_every_provider(tmp_path):
    done = _run(["benchmarks.gather_add", "--cpu", "--quick", "--reps", "2",
                 "--out", str(tmp_path)])
    assert done.returncode == 0, _explain(done)
    records = json.loads((tmp_path / "gather_add.json").read_text())["records"]
    assert {r["provider"] for r in records} == {
        "gather_ours", "gather_xla", "gather_ceiling", "set_ours", "add_ours", "add_xla"}
    for r in records:
        assert r["status"] == "ok" and r["correct"] is True, r


_BROKEN_GATHER_ADD = """
import sys
import jax
import pallas_pinned as pp
from benchmarks import gather_add
# "add" that only sets: a wrong sum for every row that held a value.
gather_add.JITTED["add_ours"] = jax.jit(lambda x, i, u: pp.scatter_to_host(x, i, u),
                                        donate_argnums=0)
sys.exit(gather_add.main(["--cpu", "--quick", "--reps", "2", "--out", {out!r}]))
"""


def test_gather_add_fails_on_a_wrong_add(tmp_path):
    done = _run([], code=_BROKEN_GATHER_ADD.format(out=str(tmp_path)))
    assert done.returncode == 1, _explain(done)
    records = json.loads((tmp_path / "gather_add.json").read_text())["records"]
    assert all(r["correct"] is False for r in records if r["provider"] == "add_ours")
    assert "INCORRECT: add_ours" in done.stdout


def test_tune_runs_every_study_and_checks_it(tmp_path):
    done = _run(["benchmarks.tune", "--cpu", "--out", str(tmp_path)], timeout=300)
    assert done.returncode == 0, _explain(done)
    records = json.loads((tmp_path / "tune_scatter.json").read_text())["records"]
    assert {r["study"] for r in records} == {
        "crossover", "crossover_add", "crossover_gather", "small_dedupe"}
    for r in records:
        assert r["status"] == "ok" and r["correct"] is True, r
    # Both paths of each comparison were measured.
    assert {r["sorted"] for r in records if r["study"] == "crossover"} == {True, False}
