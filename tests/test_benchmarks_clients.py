"""CPU tests of the client benchmarks (gather_add, tune, sparse_training, block_probe) and the
GPU session.

Each runs as CI would run it (a subprocess, ``--cpu`` or ``--quick``, tiny
sizes); each is also run with a provider broken on purpose, which must be
caught and fail the run.
"""

import json
import re
import subprocess

import numpy as np
import pytest

import tests.benchmark_helpers  # noqa: F401  (puts the repository root on sys.path)
from benchmarks import sparse_training
from tests.benchmark_helpers import REPO, explain, records, run_cli

# ---------------------------------------------------------------------------
# gather_add and tune


_GATHER_ADD = """
import sys
import jax
import pallas_pinned as pp
from benchmarks import gather_add
# Broken on purpose: an "add" that only sets, a wrong sum for every row that held a value.
gather_add.JITTED["add_ours"] = jax.jit(lambda x, i, u: pp.scatter_to_host(x, i, u),
                                        donate_argnums=0)
sys.exit(gather_add.main(["--cpu", "--quick", "--reps", "1", "--out", {out!r}]))
"""


def test_gather_add_checks_every_provider_and_fails_on_a_wrong_add(tmp_path):
    done = run_cli([], code=_GATHER_ADD.format(out=str(tmp_path)))
    assert done.returncode == 1, explain(done)
    found = records(tmp_path / "gather_add.json")
    assert {r["provider"] for r in found} == {
        "gather_ours", "gather_xla", "gather_ceiling", "set_ours", "add_ours", "add_xla"}
    for r in found:
        assert r["status"] == "ok" and r["correct"] is (r["provider"] != "add_ours"), r
    assert "INCORRECT: add_ours" in done.stdout
    # No ratio against the wrong add: each target line says why it has none.
    assert "add/set throughput n/a (add_ours incorrect)" in done.stdout
    assert "add ours/xla throughput n/a (add_ours incorrect)" in done.stdout
    assert "gather ours/xla throughput " in done.stdout


def test_gather_add_target_lines_name_a_missing_or_wrong_side():
    from benchmarks import gather_add

    def record(provider, status="ok", correct=True, rate=1e6):
        return {"case": "c", "provider": provider, "status": status, "correct": correct,
                "gbps": rate * 1e-6, "updates_per_s": rate}

    found = [record("gather_ours", rate=2e6), record("gather_xla", status="error", correct=None),
             record("gather_ceiling", rate=4e6), record("add_ours", correct=False),
             record("add_xla")]
    assert gather_add.target_lines(found, "c") == [
        "gather/ceiling 0.50x (2.0 vs 4.0 GB/s)",
        "add/set throughput n/a (add_ours incorrect; set_ours not run)",
        "gather ours/xla throughput n/a (gather_xla error)",
        "add ours/xla throughput n/a (add_ours incorrect)",
    ]
    right = [dict(r, status="ok", correct=True) for r in found] + [record("set_ours", rate=2e6)]
    assert gather_add.target_lines(right, "c")[1:] == [
        "add/set throughput 0.50x (1.0 vs 2.0 M rows/s)",
        "gather ours/xla throughput 2.00x (2.0 vs 1.0 M rows/s)",
        "add ours/xla throughput 1.00x (1.0 vs 1.0 M rows/s)",
    ]


def test_tune_runs_every_study_and_checks_it(tmp_path):
    done = run_cli(["benchmarks.tune", "--cpu", "--repeats", "1", "--out", str(tmp_path)],
                   timeout=300)
    assert done.returncode == 0, explain(done)
    found = records(tmp_path / "tune_scatter.json")
    assert {r["study"] for r in found} == {
        "crossover", "crossover_add", "crossover_gather", "fused_set"}
    for r in found:
        assert r["status"] == "ok" and r["correct"] is True, r
    # Both paths of each comparison were measured.
    assert {r["sorted"] for r in found if r["study"] == "crossover"} == {True, False}


# ---------------------------------------------------------------------------
# sparse_training


@pytest.fixture(scope="module")
def sparse_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("sparse")
    done = run_cli(["benchmarks.sparse_training", "--quick", "--cpu", "--out", str(out),
                    "--xla-option", "xla_gpu_graph_min_graph_size=1"])
    assert done.returncode == 0, explain(done)
    return json.loads((out / "sparse_training.json").read_text()), done.stdout


def test_sparse_training_checks_ours_and_xla_against_the_device_table(sparse_run):
    result, stdout = sparse_run
    found = {r["provider"]: r for r in result["records"]}
    assert set(found) == set(sparse_training.PROVIDERS) >= {"ours", "xla", "device"}
    for name, r in found.items():
        assert r["status"] == "ok", r
        assert 0 < r["us_min"] <= r["us_per_step"] <= r["us_max"], r
        assert r["runs"] == sparse_training.QUICK["repeats"]
        if name == "device":
            assert r["memory_kind"] == "device" and r["max_abs_diff_vs_device"] is None
        else:
            want_kind = "device" if name in sparse_training.DEVICE_STEPS else "pinned_host"
            assert r["memory_kind"] == want_kind == r["expected_memory_kind"], r
            assert r["correct"] is True and r["max_abs_diff_vs_device"] <= 1e-5, r
    # The transfer floor moves each read row into the next: checked bit for bit against
    # its steps replayed in numpy.
    assert found["transfer"]["checked_against"] == "numpy replay"
    assert found["transfer"]["max_abs_diff_vs_device"] == 0 == found["transfer"]["tolerance"]
    assert found["ours"]["checked_against"] == found["ours_sorted"]["checked_against"] == (
        "device table")
    # The floor's rate is a GPU's, given rather than measured: no ratio to it on CPU.
    assert "ours / nominal PCIe floor: n/a (a CPU run" in stdout
    assert "not measured in this run" in stdout and "ours_over_pcie_floor" not in result["summary"]
    for line in ("ours / device table", "ours / xla",
                 "ours / measured transfer", "transfer alone / device table",
                 "ours with one shared order / device table",
                 "ours reading each distinct row once / the faster device table step",
                 "distinct ids per step"):
        assert line in stdout, stdout


def test_sparse_training_records_the_xla_options_it_compiled_with(sparse_run):
    meta = sparse_run[0]["meta"]
    assert meta["compiler_options"] == {"xla_gpu_graph_min_graph_size": 1}
    assert "xla_flags" in meta


def test_sparse_training_floor_and_distinct_ids_come_from_the_data(sparse_run):
    result, _ = sparse_run
    meta = result["meta"]
    rng = np.random.default_rng([meta["seed"], meta["rows"], meta["dim"], meta["batch"]])
    ids = sparse_training.zipf_ids(rng, meta["rows"], (meta["steps"], meta["batch"]),
                                   meta["zipf_s"])
    distinct = sparse_training.distinct_per_step(ids)
    assert meta["distinct_ids_per_step"]["mean"] == pytest.approx(distinct.mean())
    # Zipf repeats heavily: far fewer distinct rows than ids per step.
    assert distinct.max() < 0.8 * meta["batch"]
    floor = np.mean(2 * distinct * meta["dim"] * 4) / (meta["pcie_gbps"] * 1e9) * 1e6
    assert meta["pcie_floor_us_per_step"] == pytest.approx(floor)
    assert "nominal" in meta["pcie_floor_basis"] and "not measured" in meta["pcie_floor_basis"]
    summary = result["summary"]
    us = {r["provider"]: r["us_per_step"] for r in result["records"]}
    assert summary["ours_over_device"] == pytest.approx(us["ours"] / us["device"])
    assert summary["ours_over_xla"] == pytest.approx(us["ours"] / us["xla"])
    # The read-once step is judged against the faster of the two device steps.
    device_best = min(us["device"], us["device_distinct"])
    assert summary["ours_distinct_over_device"] == pytest.approx(us["ours_distinct"] / device_best)


def test_distinct_padded_is_each_steps_sorted_distinct_ids_then_distinct_pads():
    ids = np.array([[5, 3, 5, 9], [2, 2, 2, 2]], np.int32)
    got = sparse_training.distinct_padded(ids, 10)
    np.testing.assert_array_equal(got, [[3, 5, 9], [2, 10, 11]])
    assert got.dtype == np.int32


def test_transfer_rows_move_each_read_row_into_the_next_and_the_replay_follows():
    import jax

    from benchmarks import sparse_steps

    ids = np.array([[5, 3, 5, 9], [2, 2, 2, 2]], np.int32)
    rows = sparse_steps.transfer_rows(ids, 10)
    np.testing.assert_array_equal(rows[:, 0], [[3, 5, 9], [2, 10, 11]])  # read
    np.testing.assert_array_equal(rows[:, 1], [[5, 9, 13], [10, 11, 13]])  # written: sorted
    table0 = jax.numpy.arange(40, dtype=jax.numpy.float32).reshape(10, 4)
    want = np.array(table0)
    want[[5, 9]] = want[[3, 5]]  # step 0; step 1 reads row 2 and writes nothing in range
    np.testing.assert_array_equal(sparse_steps.transfer_replay(table0, rows), want)
    pinned = jax.sharding.make_single_device_sharding(jax.devices()[0], memory_kind="pinned_host")
    moved = jax.jit(sparse_steps._transfer_scan)(jax.device_put(table0, pinned), rows, None)
    np.testing.assert_array_equal(moved, want)


def test_sparse_training_fails_a_transfer_floor_that_moves_nothing(tmp_path, monkeypatch,
                                                                   capsys):
    import jax

    monkeypatch.setitem(sparse_training.JITTED, "transfer",
                        jax.jit(lambda table, ids, targets: table, donate_argnums=0))
    monkeypatch.setattr(sparse_training, "PROVIDERS", ("device", "transfer"))
    assert sparse_training.main(["--quick", "--repeats", "1", "--out", str(tmp_path)]) == 1
    found = {r["provider"]: r for r in records(tmp_path / "sparse_training.json")}
    assert found["transfer"]["correct"] is False and found["transfer"]["max_abs_diff_vs_device"] > 0
    stdout = capsys.readouterr().out
    assert "INCORRECT: transfer" in stdout
    assert "transfer alone / device table: n/a (transfer incorrect)" in stdout


def _ids_each_scan_is_timed_with(tmp_path, monkeypatch, extra: list[str]) -> dict:
    """Per provider, the ids of every warm-up and timed scan (``timing.measure`` spied on)."""
    seen, real = {}, sparse_training.timing.measure

    def spy(fn, state, *args, **kwargs):
        calls = seen.setdefault(len(seen), [])

        def recording(table, ids, targets):
            calls.append(np.asarray(ids))
            return fn(table, ids, targets)
        return real(recording, state, *args, **kwargs)

    monkeypatch.setattr(sparse_training.timing, "measure", spy)
    monkeypatch.setattr(sparse_training, "PROVIDERS", ("device", "ours_hot_xla_add", "transfer"))
    argv = ["--quick", "--repeats", "2", "--out", str(tmp_path), *extra]
    assert sparse_training.main(argv) == 0
    return dict(zip(sparse_training.PROVIDERS, seen.values(), strict=True))


def test_sparse_training_repeated_ids_repeat_the_checked_ids_in_every_timed_scan(
        tmp_path, monkeypatch):
    seen = _ids_each_scan_is_timed_with(tmp_path, monkeypatch, ["--repeated-ids"])
    checked = sparse_training.make_inputs(sparse_training.parse_args(["--quick"]))[3]
    for name in ("device", "ours_hot_xla_add"):
        assert len(seen[name]) == 3  # one warm-up, two timed
        assert all(np.array_equal(ids, checked) for ids in seen[name])
    meta = json.loads((tmp_path / "sparse_training.json").read_text())["meta"]
    assert meta["fresh_ids"] is False


@pytest.mark.parametrize("flag", [[], ["--fresh-ids"]], ids=["default", "named"])
def test_sparse_training_draws_fresh_ids_by_default(flag):
    assert sparse_training.parse_args(["--quick", *flag]).fresh_ids is True
    with pytest.raises(SystemExit):
        sparse_training.parse_args(["--quick", "--fresh-ids", "--repeated-ids"])


def test_sparse_training_fresh_ids_give_each_scan_ids_of_its_own(tmp_path, monkeypatch):
    seen = _ids_each_scan_is_timed_with(tmp_path, monkeypatch, [])
    args = sparse_training.parse_args(["--quick", "--repeats", "2"])
    _, _, _, checked, hot_ids, fresh = sparse_training.make_inputs(args)
    assert len(fresh) == 3
    for name in ("device", "ours_hot_xla_add"):  # the same sets, in the same order
        assert [ids.tolist() for ids in seen[name]] == [f.tolist() for f in fresh]
    sets = [checked, *fresh]
    assert all(not np.array_equal(a, b) for k, a in enumerate(sets) for b in sets[k + 1:])
    for f in fresh:  # drawn alike: the same shape, range and share of hot entries
        assert f.shape == checked.shape and f.dtype == checked.dtype
        assert 0 <= f.min() and f.max() < args.rows
        hot = sparse_training.sparse_hot.cold_stats(f, hot_ids)["hot_entry_fraction"]
        want = sparse_training.sparse_hot.cold_stats(checked, hot_ids)["hot_entry_fraction"]
        assert abs(hot - want) < 0.1
    # The transfer floor moves the rows of each fresh set, padded to the one width of every
    # set (its compiled scan's, the checked set's included).
    width = max(int(sparse_training.distinct_per_step(f).max()) for f in sets)
    assert [rows.tolist() for rows in seen["transfer"]] == [
        sparse_training.transfer_rows(f, args.rows, width).tolist() for f in fresh]
    meta = json.loads((tmp_path / "sparse_training.json").read_text())["meta"]
    assert meta["fresh_ids"] is True


def test_sparse_training_names_the_floor_nominal_on_the_gpu():
    found = [{"provider": name, "us_per_step": us, "correct": True, "status": "ok",
              "is_reference": name == "device"} for name, us in (("device", 10.0), ("ours", 40.0))]
    lines = sparse_training.summarize(found, 20.0, on_gpu=True)["lines"]
    assert ("ours / nominal PCIe floor: 2.00x (40.0 us vs 20.0 us per step; the floor's rate is "
            "nominal, not measured in this run)") in lines
    off_gpu = sparse_training.summarize(found, 20.0, on_gpu=False)
    assert "ours_over_pcie_floor" not in off_gpu
    assert "ours / nominal PCIe floor: n/a (a CPU run: the floor is a GPU's PCIe rate)" in (
        off_gpu["lines"])


def test_zipf_ids_are_skewed_and_in_range():
    ids = sparse_training.zipf_ids(np.random.default_rng(0), 1000, (20000,), 1.1)
    assert ids.min() >= 0 and ids.max() < 1000 and ids.dtype == np.int32
    counts = np.sort(np.bincount(ids, minlength=1000))[::-1]
    assert counts[0] > 50 * np.median(counts)  # one id far more popular than the median


def test_sparse_training_fails_on_a_wrong_table_or_an_error(tmp_path, monkeypatch, capsys):
    import jax

    import pallas_pinned as pp

    # ours forgets the learning rate's sign: the table trains the wrong way.
    wrong = sparse_training._sgd_scan(pp.gather_from_host, pp.scatter_add_to_host, -0.5)
    monkeypatch.setitem(sparse_training.JITTED, "ours", jax.jit(wrong, donate_argnums=0))

    def boom(table, ids, targets):
        raise ValueError("a provider that raises fails the run")

    monkeypatch.setitem(sparse_training.JITTED, "xla", jax.jit(boom))
    # In this process: quick sizes (on the GPU where there is one, else the CPU).
    assert sparse_training.main(["--quick", "--repeats", "1", "--out", str(tmp_path)]) == 1
    stdout = capsys.readouterr().out
    found = {r["provider"]: r for r in records(tmp_path / "sparse_training.json")}
    assert found["ours"]["correct"] is False and found["ours"]["max_abs_diff_vs_device"] > 1e-3
    assert found["xla"]["status"] == "error" and "ValueError" in found["xla"]["error"]
    assert found["device"]["status"] == "ok"
    assert "INCORRECT: ours" in stdout and "ERROR: xla" in stdout


def test_sparse_training_without_its_reference_checks_nothing(tmp_path, monkeypatch, capsys):
    # The device table (the reference) errors: no later table is its own reference. Each is
    # recorded unchecked, the run fails, and no ratio or verdict reads an unchecked time.
    import jax

    def boom(table, ids, targets):
        raise ValueError("the reference's provider raises")

    monkeypatch.setitem(sparse_training.JITTED, "device", jax.jit(boom))
    monkeypatch.setattr(sparse_training, "PROVIDERS",
                        ("device", "device_distinct", "ours", "transfer"))
    assert sparse_training.main(["--quick", "--repeats", "1", "--out", str(tmp_path)]) == 1
    stdout = capsys.readouterr().out
    result = json.loads((tmp_path / "sparse_training.json").read_text())
    found = {r["provider"]: r for r in result["records"]}
    assert found["device"]["status"] == "error"
    for name in ("device_distinct", "ours"):
        r = found[name]
        assert r["status"] == "ok" and r["us_per_step"] is not None, r
        assert r["correct"] is None and r["max_abs_diff_vs_device"] is None, r
        assert r["note"].startswith("unchecked") and not r["is_reference"], r
        assert f"UNCHECKED: {name}" in stdout
    # The transfer floor is checked against its own steps replayed in numpy, no reference.
    assert found["transfer"]["correct"] is True
    for name in ("device_distinct", "ours"):  # the table's max|diff| column
        assert re.search(rf"^{name} .* unchecked  ok ", stdout, re.M), stdout
    assert "met" not in stdout and "ours_over_device" not in result["summary"]
    assert "ours / device table: n/a (ours unchecked; device errored; no verdict)" in stdout
    assert "ours / measured transfer of the distinct rows: n/a (ours unchecked)" in stdout


# ---------------------------------------------------------------------------
# block_probe


def test_block_probe_runs_the_sizes_asked_with_the_xla_options(tmp_path):
    # Every variant's buffer is checked against XLA's own copy inside the probe, which
    # raises on a difference; the options reach every compile and the results say so.
    done = run_cli(["benchmarks.block_probe", "--quick", "--rows", "8,16", "--row-bytes", "256",
                    "--xla-option", "xla_gpu_graph_min_graph_size=1", "--out", str(tmp_path)],
                   timeout=300)
    assert done.returncode == 0, explain(done)
    result = json.loads((tmp_path / "block_probe.json").read_text())
    assert result["meta"]["compiler_options"] == {"xla_gpu_graph_min_graph_size": 1}
    assert [(r["n"], r["row_bytes"]) for r in result["records"]] == [(8, 256), (16, 256)]
    for r in result["records"]:
        assert {"xla_dus", "ours_promise", "ours_rows", "xla_ds", "ours_get"} <= set(r["us"])
    # Each median printed with its [min–max].
    med, low, high = (result["records"][0][k]["xla_dus"] for k in ("median_us", "min_us",
                                                                   "max_us"))
    assert f"{med:.1f} [{low:.1f}–{high:.1f}]" in done.stdout


def test_block_probe_runs_bfloat16_blocks_of_the_row_bytes_asked(tmp_path):
    done = run_cli(["benchmarks.block_probe", "--quick", "--rows", "8", "--row-bytes", "256",
                    "--dtype", "bfloat16", "--out", str(tmp_path)], timeout=300)
    assert done.returncode == 0, explain(done)
    (record,) = json.loads((tmp_path / "block_probe.json").read_text())["records"]
    assert (record["n"], record["row_bytes"], record["dtype"]) == (8, 256, "bfloat16")
    assert {"xla_dus", "ours_promise", "ours_rows", "ours_wrap"} <= set(record["us"])


def test_block_probe_checks_each_row_a_reader_returned(monkeypatch):
    # Rows read in the wrong order sum the same: the probe compares the rows themselves.
    import jax.numpy as jnp

    from benchmarks import block_probe

    right_writers, right_readers = block_probe._writers, block_probe._readers
    monkeypatch.setattr(block_probe, "_writers",
                        lambda n: {"xla_dus": right_writers(n)["xla_dus"]})

    def readers(n):
        xla_ds = right_readers(n)["xla_ds"]
        return {"xla_ds": xla_ds, "reversed": lambda x, pos: jnp.flip(xla_ds(x, pos), 0)}

    monkeypatch.setattr(block_probe, "_readers", readers)
    with pytest.raises(AssertionError, match="reversed read other rows"):
        block_probe.run_case(64, 8, 4, 3, 1)
    monkeypatch.setattr(block_probe, "_readers",
                        lambda n: {"xla_ds": right_readers(n)["xla_ds"]})
    results, _ = block_probe.run_case(64, 8, 4, 3, 1)
    assert set(results) == {"xla_dus", "xla_ds"}


# ---------------------------------------------------------------------------
# The GPU session script


def test_gpu_session_script_parses_and_lists_every_stage():
    script = REPO / "benchmarks" / "gpu_session.sh"
    assert subprocess.run(["bash", "-n", str(script)], check=False).returncode == 0
    text = script.read_text()
    stages = set(re.findall(r"^\s{4}([a-z|]+)\)$", text, re.M))
    stages = {s for group in stages for s in group.split("|")}
    header = re.search(r"^# Stages: (.*)$", text, re.M).group(1)
    assert stages == set(header.split()), (stages, header)
    assert "sparse" in stages
    for stage in stages:  # each stage's time is in the header
        assert re.search(rf"\b{stage} [~<]", text), stage
    # Every stage runs under a timeout.
    bodies = re.split(r"^\s{4}[a-z|]+\)$", text, flags=re.M)[1:]
    assert all("timeout " in body.split(";;")[0] for body in bodies), "a stage without timeout"


_FAKE_PYTHON = """#!/usr/bin/env bash
case "$*" in *pytest*) echo "=== 3 failed, 40 passed ==="; exit 1 ;; esac
exit 0
"""
# Runs the command without its duration; with $HANG set, pytest "runs out" of it instead.
_FAKE_TIMEOUT = """#!/usr/bin/env bash
shift
case "${HANG:-}:$*" in 1:*pytest*) exit 124 ;; esac
exec "$@"
"""


def test_gpu_session_prints_each_rc_and_fails_when_a_stage_failed(tmp_path):
    # Stand-ins for python3 and timeout: the script's own bookkeeping, without a GPU.
    import os

    fake = tmp_path / "bin"
    fake.mkdir()
    for name, text in (("python3", _FAKE_PYTHON), ("timeout", _FAKE_TIMEOUT),
                       ("nvidia-smi", "#!/bin/sh\nexit 0\n")):
        (fake / name).write_text(text)
        (fake / name).chmod(0o755)

    def session(stages, **env):
        return subprocess.run(
            ["bash", str(REPO / "benchmarks" / "gpu_session.sh"), stages], cwd=tmp_path,
            env={**os.environ, "PATH": f"{fake}:{os.environ['PATH']}",
                 "OUT": str(tmp_path / "out"), **env},
            capture_output=True, text=True, timeout=60, check=False)

    failed = session("tests demo")
    assert failed.returncode == 1, failed.stdout + failed.stderr
    assert "tests rc=1\n" in failed.stdout and "demo rc=0\n" in failed.stdout  # demo still ran
    assert "FAILED: tests" in failed.stdout
    hung = session("tests demo", HANG="1")
    assert hung.returncode == 1 and "tests rc=124 (timed out)" in hung.stdout, hung.stdout
    passed = session("demo nostage")  # an unknown stage runs nothing and fails nothing
    assert passed.returncode == 0, passed.stdout + passed.stderr
    assert "demo rc=0" in passed.stdout and "unknown stage: nostage" in passed.stdout
