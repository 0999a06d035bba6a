"""CPU tests of ``python -m benchmarks.one_call``: its records, its failure rules, its providers.

The command runs as CI would run it (a subprocess, ``--quick``, tiny sizes on CPU)
with an alternative broken on purpose, and its records are checked field by field;
then with our provider broken: a benchmark whose "correct" flag or exit status cannot
fail would be worse than none.
"""

import json
import os
from types import SimpleNamespace

import numpy as np
import pytest

from benchmarks import environment, one_call, one_call_cases, one_call_providers
from tests.benchmark_helpers import explain, records, run_cli

REQUIRED_FIELDS = (
    "case", "provider", "row_bytes", "n_updates", "pattern", "dtype", "median_s", "min_s",
    "max_s", "gbps", "updates_per_s", "ceiling_gbps", "correct", "status", "target_case",
)

_ONE_CALL = """
import sys
import jax.numpy as jnp
from benchmarks import one_call, one_call_providers as p
# An alternative broken on purpose where rows repeat: XLA writes doubled values. Its
# duplicate order is unspecified, so there a wrong alternative is reported, not failed
# (on unique rows it fails).
def doubled_where_rows_repeat(x, i, u):
    s = jnp.sort(i)
    return x.at[i].set(jnp.where(jnp.any(s[1:] == s[:-1]), u * 2, u))
p.JITTED["xla"] = p._donating(doubled_where_rows_repeat)
sys.exit(one_call.main({argv!r}))
"""


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    """The CPU quick sweep (six cases: unique, repeated and sorted rows, bfloat16), once."""
    out = tmp_path_factory.mktemp("one_call")
    argv = ["--quick", "--out", str(out), "--reps", "3", "--max-reps", "5", "--min-time-s", "0",
            "--back-to-back-row-bytes", "4,512", "--back-to-back-calls", "4"]
    done = run_cli([], code=_ONE_CALL.format(argv=argv))
    assert done.returncode == 0, explain(done)
    return out, done.stdout


def _records(out) -> list[dict]:
    return records(out / "one_call_cpu.json")


def test_every_case_and_provider_has_a_checked_timed_record(quick_run):
    out, _ = quick_run
    found = _records(out)
    assert len({r["case"] for r in found}) == 6
    for case in {r["case"] for r in found}:
        got = sorted(r["provider"] for r in found if r["case"] == case)
        assert got == sorted(("ceiling", "ours", "xla", "host_roundtrip")), (case, got)
    for r in found:
        missing = [f for f in REQUIRED_FIELDS if f not in r]
        assert not missing and r["status"] == "ok", (r, missing)
        assert 0 < r["min_s"] <= r["median_s"] <= r["max_s"] and r["reps"] >= 3, r
        payload = r["n_updates"] * r["row_bytes"]
        assert r["gbps"] == pytest.approx(payload / r["median_s"] / 1e9)
        assert r["updates_per_s"] == pytest.approx(r["n_updates"] / r["median_s"])
        ceiling = next(c for c in found if c["case"] == r["case"] and c["provider"] == "ceiling")
        assert r["ceiling_gbps"] == ceiling["gbps"] > 0
        if r["provider"] == "ceiling":  # a copy: checked against the updates it copied
            assert r["correct"] is True, r
        else:  # the broken XLA is wrong only where rows repeat
            assert r["correct"] is (r["provider"] != "xla" or r["pattern"] != "random_dup25"), r


def test_the_run_says_what_is_wrong_and_what_is_exempt(quick_run):
    out, stdout = quick_run
    assert "INCORRECT: xla" in stdout
    assert "not failed, exempt: xla leaves the order of repeated rows unspecified" in stdout
    meta = json.loads((out / "one_call_cpu.json").read_text())["meta"]
    assert meta["jax"] and meta["date_utc"] and meta["jax_backend"] == "cpu"
    assert meta["thresholds"]["sort_from"] >= 0
    import importlib.util

    if importlib.util.find_spec("matplotlib") is not None:
        assert (out / "one_call_cpu_random_unique_float32.png").exists()


def test_calls_back_to_back_and_the_summary(quick_run):
    # Only ours can be issued back to back here (CPU's ceiling, jax.device_put, allocates);
    # no back-to-back ratio is made up against a synchronized ceiling.
    out, stdout = quick_run
    for r in _records(out):
        carried = r["provider"] == "ours" and r["row_bytes"] in (4, 512)
        assert (r["b2b_gbps"] is not None) == carried, r
        if carried:
            assert r["b2b_calls"] == 4 and 0 < r["b2b_min_s"] <= r["b2b_median_s"], r
        assert r["b2b_frac_of_ceiling"] is None
    summary = json.loads((out / "one_call_cpu.json").read_text())["summary"]
    targets = {r["case"] for r in _records(out) if r["target_case"]}
    assert len(summary) == len(targets) == 3
    assert summary[0].startswith("random_unique-float32-4B-n5: ours ") and "ours/xla" in summary[0]
    assert "summary:" in stdout and summary[0] in stdout


_BROKEN = """
import sys
from benchmarks import one_call, one_call_providers as p
# ours raises; ours_triton is absent on CPU (skipped, not an error).
def boom(x, i, u):
    raise ValueError("a provider that raises is an error, not 'unavailable'")
p.JITTED["ours"] = boom
sys.exit(one_call.main(["--out", {out!r}, "--no-plots", "--row-bytes", "8", "--counts", "300",
                        "--reps", "2", "--min-time-s", "0",
                        "--providers", "ceiling,ours,ours_triton,host_roundtrip"]))
"""


def test_ours_raising_fails_the_run_and_the_rest_still_run(tmp_path):
    done = run_cli([], code=_BROKEN.format(out=str(tmp_path)))
    assert done.returncode == 1, explain(done)
    found = {r["provider"]: r for r in records(tmp_path / "one_call_custom.json")}
    assert found["ours"]["status"] == "error" and "ValueError" in found["ours"]["error"]
    assert "ERROR: ours" in done.stdout
    assert "left out: ours_triton: needs a CUDA GPU" in done.stdout
    assert set(found) == {"ceiling", "ours", "host_roundtrip"}
    assert found["host_roundtrip"]["correct"] is True and found["ceiling"]["correct"] is True


def _bench():
    args = SimpleNamespace(seed=0, largest={})
    return one_call_providers.Bench(args, False, 1 << 16, np.random.default_rng(0))


@pytest.mark.parametrize("broken", ["nothing", "stray"])
def test_a_write_that_misses_or_strays_is_caught(broken):
    bench = _bench()
    case = one_call_cases.Case("random_unique", "float32", 16, 64)
    bench.set_layout("float32", (1 << 12, 4))
    data = one_call_providers.make_case_data(bench, case)
    [ours] = one_call_providers.build_providers(bench, ("ours",))
    assert one_call.check_once(bench, data, ours, 0)[0] == ""
    right = one_call_providers.JITTED["ours"]
    wrong = {"nothing": lambda x, i, u: x,
             "stray": lambda x, i, u: right(x, (i + 1) % x.shape[0], u)}[broken]
    try:
        one_call_providers.JITTED["ours"] = one_call_providers._donating(wrong)
        assert "differ" in one_call.check_once(bench, data, ours, 1)[0]
    finally:
        one_call_providers.JITTED["ours"] = right


def test_the_ceiling_copy_is_checked_and_a_wrong_one_gives_no_ratio():
    import jax

    bench = _bench()
    data = SimpleNamespace(upd=np.arange(24, dtype=np.float32).reshape(6, 4),
                           case=SimpleNamespace(n_updates=6, row_bytes=16),
                           sample=SimpleNamespace(hit_positions=np.array([0, 2, 5])))
    rolled = np.roll(data.upd, 1, axis=0)  # what CheckUpdates(1, None) hands the provider

    def bound(made, space=jax.memory.Space.Host):
        def observed(fn):
            def step(state):
                if made is not None:
                    fn(jax.device_put(made, space))
                return state
            return one_call_providers.Bound(step)
        return one_call_providers.Bound(lambda state: state, observed=observed)

    ceiling = SimpleNamespace(updates="jax", target="none")
    check = one_call_providers.CheckUpdates(1, None)
    for made, want in ((bound(rolled), ""), (bound(None), "the copy put nothing"),
                       (bound(rolled, jax.memory.Space.Device), "the copy put nothing"),
                       (bound(rolled + 1), "sampled rows of the copy differ")):
        mismatch, _ = one_call.check_copy(bench, data, ceiling, made, check)
        assert mismatch.startswith(want) and (mismatch == "") == (want == ""), mismatch
    found = [{"provider": "ceiling", "status": "ok", "correct": False, "gbps": 1.0},
             {"provider": "ours", "status": "ok", "correct": True, "gbps": 2.0}]
    one_call.fill_ceiling(found)
    assert all(r["ceiling_note"] == "no ratio: ceiling incorrect" for r in found)


def test_exit_status_rules(capsys):
    wrong = {"status": "ok", "provider": "xla", "case": "c", "correct": False, "check": "x",
             "pattern": "random_unique", "duplicates": "any", "target_case": False,
             "median_s": 1.0}
    assert one_call.exit_status([wrong], {}) == 1  # unique rows: no order to blame
    assert one_call.exit_status([dict(wrong, pattern="random_dup25")], {}) == 0
    assert one_call.exit_status([dict(wrong, pattern="random_dup25", provider="ours")], {}) == 1
    untimed = dict(wrong, provider="ours", correct=True, median_s=None, target_case=True,
                   status="skipped: one run took 3.00 s > --max-run-s")
    assert one_call.exit_status([untimed], {}) == 1
    assert "UNTIMED: ours on target case c" in capsys.readouterr().out
    assert one_call.exit_status([dict(untimed, target_case=False)], {}) == 0
    assert one_call.exit_status([], {"case_errors": ["c: MemoryError"]}) == 1


def test_gpu_plans_put_the_targets_first():
    for flags, name in (([], "full"), (["--quick"], "quick")):
        args = one_call.parse_args(flags)
        args.buffer_bytes, args.max_payload = 4 << 30, 512 << 20
        sweep, plan = one_call_cases.plan(args, gpu=True)
        assert sweep == name
        targets = [c for c in plan if one_call_cases.is_target(c, args.largest)]
        assert plan[: len(targets)] == targets and len(targets) == 5
        assert one_call_cases.Case("random_unique", "float32", 4, 1 << 24) in targets


@pytest.mark.parametrize("flag, value", [("--providers", "ours,bogus"),
                                         ("--patterns", "zigzag"), ("--counts", "5,abc")])
def test_bad_arguments_name_the_value(flag, value, capsys):
    with pytest.raises(SystemExit) as exited:
        one_call.parse_args([flag, value])
    assert exited.value.code == 2 and value.split(",")[-1] in capsys.readouterr().err


def test_only_a_failed_import_makes_a_provider_unavailable(monkeypatch):
    gpu = SimpleNamespace(gpu=True, torch=None, notes={"torch_unavailable": "no torch (x)"})
    assert one_call_providers.unavailable(gpu, ("torch_triton_zerocopy", "ours")) == {
        "torch_triton_zerocopy": "unavailable: no torch (x)"}
    cpu = SimpleNamespace(gpu=False, torch=None, notes={})
    assert one_call_providers.unavailable(cpu, ("ours_triton",)) == {
        "ours_triton": "needs a CUDA GPU"}
    monkeypatch.setattr(one_call_providers, "optional_import",
                        lambda name: (None, f"{name} is not importable (x)"))
    assert one_call_providers.unavailable(gpu, ("ours_triton",)) == {
        "ours_triton": "unavailable: jax_triton is not importable (x)"}
    with pytest.raises(ValueError, match="is ours"):
        environment.optional_import("benchmarks.triton_peer")


class _Knobs:
    def __init__(self, directory):
        self.cache = SimpleNamespace(dir=directory)


def test_triton_cache_dir_is_made_usable(tmp_path):
    # jax-triton deletes TRITON_CACHE_DIR on import; an empty or unusable directory
    # made every launch of the raw Triton peer raise.
    env = {}
    knobs = _Knobs("")
    chosen = environment.ensure_triton_cache_dir(knobs, env)
    assert knobs.cache.dir == chosen == env["TRITON_CACHE_DIR"]
    assert os.path.isdir(chosen) and os.access(chosen, os.W_OK)
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    env = {"PALLAS_PINNED_TRITON_CACHE": str(tmp_path / "chosen")}
    knobs = _Knobs(str(blocker / "cannot"))  # under a file: cannot be made
    assert environment.ensure_triton_cache_dir(knobs, env) == str(tmp_path / "chosen")


def test_max_run_s_judges_the_last_warm_up_call_not_the_compile():
    import time

    def provider(first_s, then_s):
        calls = []

        def step(state):
            time.sleep(first_s if not calls else then_s)
            calls.append(1)
            return state

        bound = SimpleNamespace(step=step, args=(), prepare=None, unsynced=None, wait=None)
        return SimpleNamespace(bind=lambda data, upd: bound, target="none", updates="jax",
                               name="ours"), calls

    args = SimpleNamespace(warmup=2, max_run_s=0.05, reps=2, max_reps=3, min_time_s=0.0,
                           back_to_back_row_bytes=())
    bench = SimpleNamespace(args=args, x=None)
    data = SimpleNamespace(case=SimpleNamespace(row_bytes=8, n_updates=4), upd_dev=None)
    fast, calls = provider(0.2, 0.0)
    measured, _ = one_call.measure(bench, data, fast)
    assert not isinstance(measured, float) and measured.reps == 2
    assert len(calls) == 1 + 2 + 2  # the compiling call, --warmup 2, the timed repeats
    slow, _ = provider(0.0, 0.1)
    assert one_call.measure(bench, data, slow)[0] >= 0.1  # the seconds of one run: untimed
