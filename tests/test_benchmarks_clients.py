"""CPU tests of the training benchmark (``python -m benchmarks.training``) and the GPU session.

The command runs as CI runs it (a subprocess, ``--quick``); then, in this process, with a
provider broken on purpose, which must be caught and fail the run.
"""

import json
import re
import subprocess

import numpy as np
import pytest

import tests.benchmark_helpers  # noqa: F401  (puts the repository root on sys.path)
from benchmarks import training
from benchmarks import training_providers as providers
from tests.benchmark_helpers import REPO, explain, records, run_cli

# ---------------------------------------------------------------------------
# training


@pytest.fixture(scope="module")
def training_run(tmp_path_factory):
    """``python -m benchmarks.training --quick`` as CI runs it (a Zipf exponent of 1.05 too:
    two tables' worth of ids)."""
    out = tmp_path_factory.mktemp("training")
    done = run_cli(["benchmarks.training", "--quick", "--zipf-s", "1.05,1.2", "--out", str(out),
                    "--xla-option", "xla_gpu_graph_min_graph_size=1"])
    assert done.returncode == 0, explain(done)
    return json.loads((out / "training.json").read_text()), done.stdout


def test_training_runs_every_provider_and_checks_it_against_the_device_table(training_run):
    result, stdout = training_run
    found = result["records"]
    assert sorted((r["zipf_s"], r["provider"]) for r in found) == sorted(
        (s, p) for s in (1.05, 1.2) for p in training.PROVIDERS)
    for r in found:
        assert r["status"] == "ok", r
        assert 0 < r["us_min"] <= r["us_per_step"] <= r["us_max"], r
        assert r["runs"] == training.QUICK["repeats"], r
        if r["provider"] == "device":
            assert r["memory_kind"] == "device" and r["correct"] is None
        else:
            assert r["memory_kind"] == "pinned_host" and r["correct"] is True, r
            assert r["checked_against"] == (
                "numpy replay" if r["provider"] == "transfer" else "device table")
    for s in (1.05, 1.2):
        at = {r["provider"]: r for r in found if r["zipf_s"] == s}
        for name in training.CACHED:  # the scan and its refresh, timed apart
            r = at[name]
            assert 0 < r["hit_rate"] < 1 and r["cold_rows_per_step"] > 0, r
            assert r["refresh_us_per_step"] > 0 and r["scan_us_per_step"] > 0
        # The floor moved the rows the cache counted cold.
        assert at["transfer"]["cold_rows_per_step"] == pytest.approx(
            at["cached_pipeline"]["cold_rows_per_step"])
    cells = result["summary"]["cells"]
    assert len(cells) == 2
    for cell in cells:
        at = {r["provider"]: r["us_per_step"] for r in found if r["zipf_s"] == cell["zipf_s"]}
        assert cell["cached_pipeline_over_device"] == pytest.approx(
            at["cached_pipeline"] / at["device"])
        assert cell["cached_over_floor"] == pytest.approx(
            at["cached"] / max(at["device"], at["transfer"]))
        assert cell["bytes_floor_us"] > 0
    meta = result["meta"]
    assert meta["compiler_options"] == {"xla_gpu_graph_min_graph_size": 1}
    assert meta["copy_rates"]["h2d_gbps"] > 0 and meta["repeated_ids"] is False
    assert "no verdict on the targets: a CPU run" in stdout


def _main(tmp_path, providers: str) -> tuple[int, dict]:
    argv = ["--quick", "--repeats", "1", "--warmup", "1", "--providers", providers,
            "--out", str(tmp_path)]
    rc = training.main(argv)
    return rc, {r["provider"]: r for r in records(tmp_path / "training.json")}


def test_training_fails_a_wrong_table_and_a_table_it_could_not_check(tmp_path, monkeypatch,
                                                                     capsys):
    import pallas_pinned as pp

    # "uncached" sets where it should add: every row it touches ends wrong.
    monkeypatch.setitem(providers.READ_ADD, "uncached", (pp.gather_from_host, pp.scatter_to_host))
    rc, found = _main(tmp_path, "device,uncached")
    assert rc == 1 and found["device"]["status"] == "ok"
    assert found["uncached"]["correct"] is False and found["uncached"]["max_abs_diff"] > 1e-3
    assert "INCORRECT: uncached" in capsys.readouterr().out

    def boom(x, i):
        raise ValueError("the reference raises")

    monkeypatch.setitem(providers.READ_ADD, "device", (boom, providers.READ_ADD["device"][1]))
    monkeypatch.setitem(providers.READ_ADD, "uncached", (pp.gather_from_host,
                                                         pp.scatter_add_to_host))
    rc, found = _main(tmp_path, "device,uncached")
    out = capsys.readouterr().out
    assert rc == 1 and "ValueError" in found["device"]["error"]
    assert found["uncached"]["status"] == "ok" and found["uncached"]["correct"] is None
    assert "ERROR: device" in out and "UNCHECKED: uncached" in out


def test_training_fails_a_provider_that_raises_and_gives_no_ratio_for_it(tmp_path, monkeypatch,
                                                                         capsys):
    def broken(*args):
        raise RuntimeError("the cached table is broken on purpose")

    monkeypatch.setattr(providers, "cached_provider", broken)
    rc, found = _main(tmp_path, "device,cached_pipeline,transfer")
    out = capsys.readouterr().out
    assert rc == 1
    assert found["cached_pipeline"]["status"] == "error"
    assert "broken on purpose" in found["cached_pipeline"]["error"]
    assert found["transfer"]["error"].startswith("no cache ran")
    assert ("cached_pipeline / max(device, transfer) n/a (cached_pipeline errored; transfer "
            "errored)") in out


@pytest.mark.parametrize("broken", ["moves nothing", "other rows"])
def test_training_fails_a_floor_that_moves_nothing_or_other_rows(tmp_path, monkeypatch, broken):
    if broken == "moves nothing":
        monkeypatch.setattr(providers, "transfer_scan", lambda table, rows, targets: table)
    else:  # each step's first cold row left out: fewer rows than the cache counted
        real = providers.cold_rows
        monkeypatch.setattr(providers, "cold_rows",
                            lambda *a: [r[1:] for r in real(*a)])
    rc, found = _main(tmp_path, "device,cached,transfer")
    assert rc == 1 and found["cached"]["correct"] is True
    floor = found["transfer"]
    if broken == "moves nothing":
        assert floor["correct"] is False and floor["max_abs_diff"] > 0
    else:
        assert floor["status"] == "error" and "the cache counted" in floor["error"]


def test_transfer_rows_move_each_read_row_into_the_next_and_the_replay_follows():
    import jax
    import jax.numpy as jnp

    ids = np.array([[5, 3, 5, 9], [2, 2, 2, 2]], np.int32)
    cold = providers.cold_rows(ids, np.array([2, -1]), 10)  # 2 cached; -1: an empty slot
    assert [c.tolist() for c in cold] == [[3, 5, 9], []]
    reads = providers.padded(cold, 10, 3)
    np.testing.assert_array_equal(reads, [[3, 5, 9], [10, 11, 12]])
    rows = providers.transfer_rows(reads, 10)
    np.testing.assert_array_equal(rows[:, 1], [[5, 9, 13], [11, 12, 13]])  # written: sorted
    table0 = jnp.arange(40, dtype=jnp.float32).reshape(10, 4)
    want = np.array(table0)
    want[[5, 9]] = want[[3, 5]]  # step 0; step 1 moves nothing in range
    np.testing.assert_array_equal(providers.transfer_replay(table0, rows), want)
    pinned = jax.sharding.make_single_device_sharding(jax.devices()[0], memory_kind="pinned_host")
    moved = jax.jit(providers.transfer_scan)(jax.device_put(table0, pinned), rows, None)
    np.testing.assert_array_equal(jax.device_put(moved, jax.memory.Space.Device), want)


def test_zipf_ids_are_skewed_in_range_and_fresh_unless_repeated():
    sets = training.draw_ids(np.random.default_rng(0), 1000, (20000,), 1.05, 3, False)
    for ids in sets:
        assert ids.min() >= 0 and ids.max() < 1000 and ids.dtype == np.int32
        counts = np.sort(np.bincount(ids, minlength=1000))[::-1]
        assert counts[0] > 50 * np.median(counts)  # one id far more popular than the median
    assert not np.array_equal(sets[0], sets[1]) and not np.array_equal(sets[1], sets[2])
    # The same ranks are the same ids in every set: one permutation spreads them.
    top = [np.bincount(ids, minlength=1000).argmax() for ids in sets]
    assert len(set(top)) == 1
    repeated = training.draw_ids(np.random.default_rng(0), 1000, (50,), 1.05, 3, True)
    assert all(r is repeated[0] for r in repeated)


def test_training_parses_its_grid():
    args = training.parse_args(["--quick", "--table-gib", "0.5,1", "--zipf-s", "1.05,1.2",
                                "--cache-fraction", "0.01,0.2", "--providers", "device,cached"])
    assert args.rows == [(1 << 29) // 64, (1 << 30) // 64]  # quick rows: 16 float32 each
    assert args.zipf_s == [1.05, 1.2] and args.cache_fraction == [0.01, 0.2]
    assert args.providers == ["device", "cached"]
    assert training.parse_args(["--quick"]).rows == [4096]
    for bad in (["--providers", "device,nope"], ["--cache-fraction", "0"], ["--rows", "0"]):
        with pytest.raises(SystemExit):
            training.parse_args(["--quick", *bad])


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
    assert "training" in stages
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
