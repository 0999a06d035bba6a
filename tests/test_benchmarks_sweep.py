"""CPU tests of ``python -m benchmarks.sweep``: its records, its failure rules, its providers.

The sweep runs as CI would run it (a subprocess, ``--cpu``, tiny sizes) and its
records are checked field by field; then once with providers broken on
purpose: a benchmark whose "correct" flag or exit status cannot fail would be
worse than none.
"""

import csv
import json
import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from benchmarks import cases, environment, providers
from tests.benchmark_helpers import explain, records, run_cli

REQUIRED_FIELDS = (
    "case", "provider", "row_bytes", "n_updates", "pattern", "dtype", "median_s", "min_s",
    "max_s", "gbps", "updates_per_s", "ceiling_gbps", "correct",
)
SCATTERS = ("ours", "ours_nocoalesce", "xla", "host_roundtrip")


_SWEEP = """
import sys
import jax.numpy as jnp
from benchmarks import providers as p, sweep
# An alternative broken on purpose where rows repeat: XLA writes doubled values. Its
# duplicate order is unspecified and was seen to tear such rows on the H200, so
# there a wrong alternative is reported, not failed (on unique rows it fails).
def doubled_where_rows_repeat(x, i, u):
    s = jnp.sort(i)
    return x.at[i].set(jnp.where(jnp.any(s[1:] == s[:-1]), u * 2, u))
p.JITTED["xla"] = p._donating(doubled_where_rows_repeat)
sys.exit(sweep.main({argv!r}))
"""


@pytest.fixture(scope="module")
def sweep_run(tmp_path_factory):
    """One tiny CPU sweep shared by the record tests (~10 s, mostly compiling)."""
    out = tmp_path_factory.mktemp("sweep")
    argv = [
        "--cpu", "--out", str(out), "--no-plots",
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
        "--reps", "3", "--max-reps", "5", "--min-time-s", "0",
        # Back to back where the GPU sweep does it for the ceiling ratios (512 B and up).
        "--back-to-back-row-bytes", "8", "--back-to-back-calls", "4",
    ]
    done = run_cli([], code=_SWEEP.format(argv=argv))
    assert done.returncode == 0, explain(done)
    return out, done.stdout


def _records(out: Path, stem: str = "scatter_custom") -> list[dict]:
    return records(out / f"{stem}.json")


def test_every_case_and_provider_has_a_record(sweep_run):
    out, _ = sweep_run
    found = _records(out)
    names = {r["case"] for r in found}
    assert len(names) == 8  # 2 counts x 2 patterns x 2 dtypes
    for case in names:
        got = [r["provider"] for r in found if r["case"] == case]
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
        assert r["reps"] >= 3
        payload = r["n_updates"] * r["row_bytes"]
        assert r["gbps"] == pytest.approx(payload / r["median_s"] / 1e9)
        assert r["updates_per_s"] == pytest.approx(r["n_updates"] / r["median_s"])


def test_scatters_are_checked_and_only_the_broken_one_is_wrong(sweep_run):
    out, stdout = sweep_run
    for r in _records(out):
        if r["provider"] == "ceiling":  # a copy: checked against the updates it copied
            assert r["correct"] is True and "of the copy match" in r["check"], r
        elif r["status"] == "ok":
            # The providers after a wrong one are still judged on their own writes.
            expected = r["provider"] != "xla" or r["pattern"] == "random_unique"
            assert r["correct"] is expected, (r["case"], r["provider"], r["check"])
    assert "INCORRECT: xla" in stdout
    assert "not failed, exempt: xla leaves the order of repeated rows unspecified" in stdout


def test_kernel_without_sort_is_skipped_only_for_duplicates(sweep_run):
    out, _ = sweep_run
    for r in _records(out):
        if r["provider"] == "ours_nocoalesce":
            expected_skip = r["pattern"] == "random_dup25"
            assert r["status"].startswith("skipped") == expected_skip, r["status"]


def test_calls_back_to_back_are_timed_for_the_ratios_the_summary_reads(sweep_run):
    # Of this run's providers only ours is read back to back and can be issued so
    # (ours_triton is skipped on CPU; the CPU ceiling, jax.device_put, cannot be).
    out, stdout = sweep_run
    for r in _records(out):
        if r["status"] != "ok":
            continue
        carried = r["provider"] == "ours"
        assert (r["b2b_gbps"] is not None) == carried, (r["case"], r["provider"])
        if carried:
            assert r["b2b_calls"] == 4
            assert 0 < r["b2b_min_s"] <= r["b2b_median_s"] <= r["b2b_max_s"], r
            payload = r["n_updates"] * r["row_bytes"]
            assert r["b2b_gbps"] == pytest.approx(payload / r["b2b_median_s"] / 1e9)
        # CPU's ceiling (jax.device_put, allocating) is not issued back to back, so no
        # back-to-back ratio is made up against the synchronized one.
        assert r["b2b_frac_of_ceiling"] is None
    assert "back to back" in stdout


def test_back_to_back_ratio_takes_the_ceiling_back_to_back():
    from benchmarks import sweep

    def record(provider, gbps, b2b):
        return {"provider": provider, "gbps": gbps, "b2b_gbps": b2b, "status": "ok",
                "correct": True}

    found = [record("ceiling", 40.0, 50.0), record("ours", 30.0, 45.0), record("xla", 1.0, None)]
    sweep.fill_ceiling(found)
    assert found[1]["frac_of_ceiling"] == pytest.approx(0.75)
    assert found[1]["b2b_frac_of_ceiling"] == pytest.approx(0.9)
    assert found[1]["b2b_ceiling_gbps"] == 50.0
    assert "b2b_frac_of_ceiling" not in found[2]


def test_ceiling_of_the_same_case_is_attached(sweep_run):
    out, _ = sweep_run
    found = _records(out)
    for r in found:
        ceiling = next(c for c in found if c["case"] == r["case"] and c["provider"] == "ceiling")
        assert r["ceiling_gbps"] == ceiling["gbps"] and ceiling["gbps"] > 0


def test_csv_matches_json_and_summary_is_printed(sweep_run):
    out, stdout = sweep_run
    with (out / "scatter_custom.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == len(_records(out))
    assert set(REQUIRED_FIELDS) <= set(rows[0])
    meta = json.loads((out / "scatter_custom.json").read_text())["meta"]
    assert meta["jax"] and meta["date_utc"] and meta["jax_backend"] == "cpu"
    assert meta["thresholds"]["sort_from"] >= 0
    assert "(a)" in stdout and "(d)" in stdout


def test_the_time_budget_never_skips_what_the_summary_reads(tmp_path):
    # A budget spent before the first case: the target cases (5 and 300 rows of 4 B,
    # the largest count of 512 B) still time the ceiling, ours and xla; everything
    # else is skipped, and the summary's 512 B line has its numbers.
    done = run_cli(["benchmarks.sweep", "--cpu", "--out", str(tmp_path), "--no-plots",
                    "--row-bytes", "4,512", "--counts", "5,300", "--patterns", "random_unique",
                    "--dtypes", "float32", "--providers", "ceiling,ours,xla,host_roundtrip",
                    "--reps", "2", "--min-time-s", "0", "--time-budget-s", "0.001",
                    "--back-to-back-calls", "2"])
    assert done.returncode == 0, explain(done)
    for r in _records(tmp_path):
        target = r["row_bytes"] == 4 or r["n_updates"] == 300
        essential = target and r["provider"] in ("ceiling", "ours", "xla")
        assert (r["status"] == "ok") == essential, (r["case"], r["provider"], r["status"])
    ours_512 = next(r for r in _records(tmp_path)
                    if r["provider"] == "ours" and r["row_bytes"] == 512 and r["n_updates"] == 300)
    assert ours_512["b2b_gbps"] is not None
    assert "(b) 512 B random rows, n=300: ours" in done.stdout
    assert "2 calls back to back" in done.stdout


def test_a_target_without_a_timing_is_named_in_the_summary():
    from benchmarks import report

    def record(provider, row_bytes, n, status="ok", median_s=1e-3):
        return {"provider": provider, "row_bytes": row_bytes, "n_updates": n,
                "pattern": "random_unique", "dtype": "float32", "status": status,
                "median_s": median_s if status == "ok" else None, "gbps": 1.0,
                "ceiling_gbps": 2.0, "updates_per_s": n / median_s}

    found = [record("ours", 4, 5), record("xla", 4, 5),
             record("ours", 2048, 1024, status="error")]
    lines = report.sweep_summary(found, [], 1 << 30)
    assert "(c) 2048 B random rows, n=1K: ours not timed (error)" in lines


@pytest.mark.parametrize(
    "flag, value",
    [
        ("--providers", "ours,bogus"),  # unknown provider names the bad one
        ("--patterns", "zigzag"),
        ("--counts", "5,abc"),
    ],
)
def test_bad_arguments_name_the_value(flag, value, capsys):
    from benchmarks import sweep

    with pytest.raises(SystemExit) as exited:
        sweep.parse_args(["--cpu", "--dry-run", flag, value])
    assert exited.value.code == 2
    assert value.split(",")[-1] in capsys.readouterr().err


_BROKEN_SWEEP = """
import sys
from benchmarks import providers as p, sweep
# ours raises; ours_hinted (the unique hint, 300 random unique rows) writes
# nothing; device_roundtrip (an alternative) writes nothing.
def boom(x, i, u):
    raise ValueError("a provider that raises is an error, not 'unavailable'")
p.JITTED["ours"] = boom
p.JITTED["ours_hinted_unique"] = p._donating(lambda x, i, u: x)
p.JITTED["device_roundtrip"] = p._donating(lambda x, i, u: x)
sys.exit(sweep.main(["--cpu", "--out", {out!r}, "--no-plots", "--row-bytes", "8",
                     "--counts", "300", "--reps", "2", "--min-time-s", "0",
                     "--providers", "ceiling,ours,ours_hinted,device_roundtrip,"
                     "host_roundtrip"]))
"""


def test_ours_raising_or_wrong_fails_the_run(tmp_path):
    done = run_cli([], code=_BROKEN_SWEEP.format(out=str(tmp_path)))
    assert done.returncode == 1, explain(done)
    found = {r["provider"]: r for r in _records(tmp_path)}
    assert found["ours"]["status"] == "error" and "ValueError" in found["ours"]["error"]
    assert "ERROR: ours" in done.stdout
    assert found["ours_hinted"]["correct"] is False
    assert "INCORRECT: ours_hinted" in done.stdout
    assert found["device_roundtrip"]["correct"] is False
    assert found["host_roundtrip"]["correct"] is True
    # The others still ran, on a buffer rebuilt after the failure.
    assert all(r["status"] == "ok" for name, r in found.items() if name != "ours")


def test_an_error_record_alone_fails_the_run(capsys):
    from benchmarks import sweep

    error = {"status": "error", "provider": "torch_triton_zerocopy", "case": "c",
             "error": "RuntimeError: Could not create or locate cache dir", "correct": None}
    assert sweep.exit_status([error], [], {}) == 1
    assert "ERROR: torch_triton_zerocopy" in capsys.readouterr().out
    assert sweep.exit_status([dict(error, status="ok")], [], {}) == 0


def test_a_wrong_result_fails_the_run_unless_rows_repeat_under_an_unspecified_order(capsys):
    from benchmarks import sweep

    wrong = {"status": "ok", "provider": "xla", "case": "c", "correct": False, "check": "x",
             "pattern": "random_unique", "duplicates": "any"}
    assert sweep.exit_status([wrong], [], {}) == 1  # unique rows: no order to blame
    assert "exempt" not in capsys.readouterr().out
    assert sweep.exit_status([dict(wrong, pattern="random_dup25")], [], {}) == 0
    assert "not failed, exempt: xla leaves" in capsys.readouterr().out
    for promised in ({"provider": "ours"}, {"provider": "host_roundtrip", "duplicates": "last"},
                     {"provider": "ceiling", "duplicates": "last"}):
        assert sweep.exit_status([dict(wrong, pattern="random_dup25", **promised)], [], {}) == 1


_NOOP_CEILING = """
import sys
from benchmarks import providers as p, sweep
p._bind_device_put = lambda bench, data, updates: p.Bound(lambda state: state)  # copies nothing
sys.exit(sweep.main(["--cpu", "--out", {out!r}, "--no-plots", "--row-bytes", "512",
                     "--counts", "1K", "--patterns", "random_unique", "--reps", "2",
                     "--min-time-s", "0", "--providers", "ceiling,ours"]))
"""


def test_a_ceiling_that_copies_nothing_gives_no_ratio_and_fails_the_run(tmp_path):
    done = run_cli([], code=_NOOP_CEILING.format(out=str(tmp_path)))
    assert done.returncode == 1, explain(done)
    found = {r["provider"]: r for r in _records(tmp_path)}
    assert found["ceiling"]["correct"] is False and found["ours"]["correct"] is True
    for r in found.values():
        assert r["frac_of_ceiling"] is None and r["ceiling_gbps"] is None, r
        assert r["ceiling_note"] == "no ratio: ceiling incorrect", r
    assert "INCORRECT: ceiling" in done.stdout and "ceiling n/a (incorrect)" in done.stdout


def test_the_torch_ceilings_copy_is_checked_in_the_host_buffers_head():
    # The torch ceiling needs CUDA; its check runs here on a stand-in that copies with numpy.
    import numpy as np

    from benchmarks import sweep
    from benchmarks.workspace import CheckUpdates

    upd = np.arange(24, dtype=np.float32).reshape(6, 4)
    data = SimpleNamespace(upd=upd, case=SimpleNamespace(n_updates=6, row_bytes=16),
                           sample=SimpleNamespace(hit_positions=np.array([0, 2, 5])))
    bench = SimpleNamespace(host=SimpleNamespace(raw=np.zeros(256, np.uint8)), x=None)
    rolled = np.roll(upd, 1, axis=0)  # what CheckUpdates(1, None) hands the provider

    def copy(state):
        bench.host.raw[:rolled.nbytes] = rolled.view(np.uint8).ravel()

    ceiling = SimpleNamespace(updates="torch", target="none")
    for step, right in ((copy, True), (lambda state: None, False)):
        bound = SimpleNamespace(step=step, prepare=None, args=())
        mismatch, _ = sweep.check_copy(bench, data, ceiling, bound, CheckUpdates(1, None))
        assert (mismatch == "") is right, mismatch


def test_the_jax_ceilings_copy_is_checked_through_its_observed_step():
    # The jax ceiling deletes its copy inside the call: the check reads it through
    # Bound.observed. A right copy passes; one that puts nothing, copies to device
    # memory, puts other rows or cannot be observed fails.
    import jax
    import numpy as np

    from benchmarks import sweep
    from benchmarks.workspace import CheckUpdates

    upd = np.arange(24, dtype=np.float32).reshape(6, 4)
    data = SimpleNamespace(upd=upd, case=SimpleNamespace(n_updates=6, row_bytes=16),
                           sample=SimpleNamespace(hit_positions=np.array([0, 2, 5])))
    bench = SimpleNamespace(x=None)
    rolled = np.roll(upd, 1, axis=0)  # what CheckUpdates(1, None) hands the provider

    def bound(made, space=jax.memory.Space.Host):
        def observed(fn):
            def step(state):
                if made is not None:
                    fn(jax.device_put(made, space))
                return state
            return providers.Bound(step)
        return providers.Bound(lambda state: state, observed=observed)

    ceiling = SimpleNamespace(updates="jax", target="none")
    cases = ((bound(rolled), ""), (bound(None), "the copy put nothing in pinned memory"),
             (bound(rolled, jax.memory.Space.Device), "the copy put nothing in pinned memory"),
             (bound(rolled + 1), "sampled rows of the copy differ from the updates"),
             (providers.Bound(lambda state: state), "the copy cannot be checked"))
    for made, want in cases:
        mismatch, _ = sweep.check_copy(bench, data, ceiling, made, CheckUpdates(1, None))
        assert mismatch.startswith(want) and (mismatch == "") == (want == ""), mismatch


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
    # The full sweep measures the raw Triton peer (its cache directory is
    # made usable before launch); the quick one leaves it out.
    assert "torch_triton_zerocopy" in providers.default_providers(True, "full")


class _Knobs:
    def __init__(self, directory):
        self.cache = SimpleNamespace(dir=directory)


def test_triton_cache_dir_is_made_usable(tmp_path):
    # jax-triton deletes TRITON_CACHE_DIR on import; an empty or unusable
    # directory made every launch of the raw Triton peer raise on the H200.
    env = {}
    knobs = _Knobs("")
    chosen = environment.ensure_triton_cache_dir(knobs, env)
    assert knobs.cache.dir == chosen == env["TRITON_CACHE_DIR"]
    assert os.path.isdir(chosen) and os.access(chosen, os.W_OK)
    good = tmp_path / "kept"
    knobs = _Knobs(str(good))
    assert environment.ensure_triton_cache_dir(knobs, {}) == str(good) and good.is_dir()
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    env = {"PALLAS_PINNED_TRITON_CACHE": str(tmp_path / "chosen")}
    knobs = _Knobs(str(blocker / "cannot"))  # under a file: cannot be made
    assert environment.ensure_triton_cache_dir(knobs, env) == str(tmp_path / "chosen")
    env = {}
    assert environment.ensure_triton_cache_dir(None, env) == env["TRITON_CACHE_DIR"]  # old triton


def _bench_for_measure(**overrides):
    args = SimpleNamespace(warmup=2, max_run_s=0.05, reps=2, max_reps=3, min_time_s=0.0,
                           back_to_back_row_bytes=(), **overrides)
    case = SimpleNamespace(row_bytes=8, n_updates=4)
    return SimpleNamespace(args=args, x=None), SimpleNamespace(case=case, upd_dev=None)


def test_max_run_s_judges_the_last_warm_up_call_not_the_compile():
    # The timed program's first call compiles (slow); the warm calls after it are fast:
    # timed, not recorded as a skip. A provider slow on its last warm-up call is.
    import time

    from benchmarks import sweep

    def provider(first_s, then_s):
        calls = []

        def step(state):
            time.sleep(first_s if not calls else then_s)
            calls.append(1)
            return state

        bound = SimpleNamespace(step=step, args=(), prepare=None, unsynced=None, wait=None)
        return SimpleNamespace(bind=lambda data, upd: bound, target="none", updates="jax",
                               name="ours"), calls

    bench, data = _bench_for_measure()
    fast, calls = provider(0.2, 0.0)
    measured, _ = sweep.measure(bench, data, fast)
    assert not isinstance(measured, float) and measured.reps == 2
    assert len(calls) == 1 + 2 + 2  # the compiling call, --warmup 2, the timed repeats
    slow, _ = provider(0.0, 0.1)
    assert sweep.measure(bench, data, slow)[0] >= 0.1  # the seconds of one run: untimed


def test_ours_untimed_on_a_target_case_fails_the_run(capsys):
    from benchmarks import sweep

    skipped = {"status": "skipped: one run took 3.00 s > --max-run-s", "provider": "ours",
               "case": "c", "correct": True, "median_s": None, "target_case": True}
    assert sweep.exit_status([skipped], [], {}) == 1
    assert "UNTIMED: ours on target case c" in capsys.readouterr().out
    # Off the targets (or a peer on one) a skip is reported in the table, not failed.
    assert sweep.exit_status([dict(skipped, target_case=False)], [], {}) == 0
    assert sweep.exit_status([dict(skipped, provider="xla")], [], {}) == 0


def test_only_the_third_party_import_is_guarded(monkeypatch):
    # triton absent makes the raw Triton peer unavailable; an ImportError inside our own
    # peer module (triton present) is a bug that fails, never "unavailable".
    import sys

    import benchmarks

    with pytest.raises(ValueError, match="is ours"):
        environment.optional_import("benchmarks.triton_peer")
    asked = []

    def absent(name):
        asked.append(name)
        return None, f"{name} is not importable (x)"

    monkeypatch.setattr(providers, "optional_import", absent)
    bench = SimpleNamespace(gpu=True, torch=object(), host=object(), notes={})
    assert providers.unavailable(bench, ("torch_triton_zerocopy", "ours_triton")) == {
        "torch_triton_zerocopy": "unavailable: triton is not importable (x)",
        "ours_triton": "unavailable: jax_triton is not importable (x)"}
    assert asked == ["triton", "jax_triton"]
    assert [p.name for p in providers.torch_providers(bench)] == ["ceiling", "torch_index_copy"]
    monkeypatch.setattr(providers, "optional_import", lambda name: (object(), None))
    monkeypatch.delattr(benchmarks, "triton_peer", raising=False)
    monkeypatch.setitem(sys.modules, "benchmarks.triton_peer", None)  # its import fails
    with pytest.raises(ImportError):
        providers.torch_providers(bench)
