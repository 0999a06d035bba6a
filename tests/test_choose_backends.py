"""CPU tests of ``python -m benchmarks.choose_backends``: the table ``backend="auto"`` reads.

Each builds loop records by hand (the fields a run writes) and checks the rule:
Pallas or raw Triton by the noise margin, XLA's own set and add path only where it
was measured faster and did not lose read back (add: nor in the sparse client),
rows promised distinct judged apart, and what is left unmeasured.
"""

import json

import pytest

import tests.benchmark_helpers  # noqa: F401  (puts the repository root on sys.path)
from benchmarks import choose_backends


def _row(provider, backend, rows, us, dtype="float32"):
    return {"provider": provider, "backend": backend, "rows": rows, "row_bytes": 512,
            "dtype": dtype, "us_per_step": us, "correct": True}


def _xla_path_case(op, rows, kernel_us, xla_us, auto_us):
    """A case's kernel, XLA's bare op and auto on XLA's path (no kernel in its step)."""
    return [_row(f"ours_{op}", "pallas", rows, kernel_us), _row(f"xla_{op}", "-", rows, xla_us),
            _row(f"ours_{op}", "auto", rows, auto_us) | {"hlo_ops": {"fusion": 2}}]


def test_choose_backends_covers_set_add_and_gather():
    records = [
        _row("ours_set", "pallas", 16, 10.0), _row("ours_set", "triton", 16, 20.0),
        _row("xla_set", "-", 16, 12.0),
        _row("ours_add", "pallas", 4096, 50.0), _row("ours_add", "triton", 4096, 49.0),
        _row("xla_add", "-", 4096, 40.0),
        _row("ours_get", "pallas", 16, 30.0), _row("ours_get", "triton", 16, 20.0),
        _row("xla_get", "-", 16, 25.0),
        _row("ours_get", "pallas", 4096, 90.0),  # no XLA twin: not compared
        _row("ours_get", "auto", 16, 1.0),  # what the table decides: recorded, not a candidate
    ]
    classes, choices = choose_backends.choose(records)
    assert classes == [16, 4096]
    assert choices["set"]["float32"]["16"]["backend"] == "pallas"  # faster than XLA
    # 2 % faster is within the noise: Pallas stays. XLA's bare add beats the kernel,
    # but XLA's path as auto runs it was not measured: the kernel stays.
    assert choices["add"]["float32"]["4096"]["backend"] == "pallas"
    assert choices["add"]["float32"]["4096"]["xla_path"] == "unmeasured"
    assert choices["gather"]["float32"]["16"] == {
        "backend": "triton", "pallas_us": 30.0, "triton_us": 20.0, "xla_us": 25.0,
        "auto_us": 1.0, "cases": 1}
    assert "4096" not in choices["gather"]["float32"]
    wrong = [dict(r, correct=False) if r["provider"] == "ours_get" else r for r in records]
    assert "gather" not in choose_backends.choose(wrong)[1]


def test_choose_backends_keeps_the_set_kernel_where_auto_s_xla_path_was_not_faster():
    # XLA's bare set beats the kernel in both classes; ours with auto (XLA's path after
    # our de-duplication, measured where the table then said xla) beats the kernel by
    # more than the noise only in the first: only that class takes XLA's path.
    records = [
        _row("ours_set", "pallas", 16, 20.0), _row("ours_set", "triton", 16, 30.0),
        _row("xla_set", "-", 16, 10.0), _row("ours_set", "auto", 16, 12.0),
        _row("ours_set", "pallas", 1024, 28.0), _row("ours_set", "triton", 1024, 40.0),
        _row("xla_set", "-", 1024, 25.0), _row("ours_set", "auto", 1024, 51.0),
    ]
    choices = choose_backends.choose(records)[1]["set"]["float32"]
    assert choices["16"]["backend"] == "xla"
    assert choices["1024"]["backend"] == "pallas"
    # Unmeasured anywhere: the kernel stays. Measured in an earlier run only:
    # judged there, against that run's kernel.
    no_auto = [r for r in records if r["backend"] != "auto"]
    alone = choose_backends.choose(no_auto)[1]["set"]["float32"]
    assert alone["16"]["backend"] == alone["1024"]["backend"] == "pallas"
    assert alone["16"]["xla_path"] == "unmeasured"
    earlier = choose_backends.choose(no_auto, {"old.json": records})[1]["set"]["float32"]
    assert earlier["16"]["backend"] == "xla" and "old.json" in earlier["16"]["xla_path"]
    assert earlier["1024"]["backend"] == "pallas"


def test_choose_backends_counts_a_read_back_win_as_a_win():
    # The written case misses the margin (4.8 % faster), the read-back case wins by
    # 9 %: every figure favours XLA's path, so the class takes it; a written win
    # within the noise and a read-back tie say nothing.
    def run(written_us, read_us):
        return [
            _row("ours_set", "pallas", 16, 20.0), _row("xla_set", "-", 16, 10.0),
            _row("ours_set", "auto", 16, written_us) | {"hlo_ops": {"fusion": 3}},
            _row("ours_set_read", "pallas", 16, 30.0), _row("ours_set_read", "auto", 16, read_us),
        ]
    entry = choose_backends.choose(run(19.04, 27.3))[1]["set"]["float32"]["16"]
    assert entry["backend"] == "xla" and "read back: not slower" in entry["xla_path"]
    entry = choose_backends.choose(run(19.04, 29.0))[1]["set"]["float32"]["16"]
    assert entry["backend"] == "pallas" and "not faster" in entry["xla_path"]


def test_choose_backends_judges_xla_s_path_on_materialized_inputs_too(tmp_path):
    # The fused run has XLA's path 8 % ahead; with the step's inputs materialized it
    # lost by 20 %: a case of the class like any other, so the kernel stays. The kernel
    # choice itself (totals, Triton or Pallas) reads the source run alone.
    fused = _xla_path_case("set", 64, 7.2, 5.0, 6.6) + [_row("ours_set", "triton", 64, 10.0)]
    lost = _xla_path_case("set", 64, 7.0, 7.4, 8.4)
    alone = choose_backends.choose(fused)[1]["set"]["float32"]["64"]
    assert alone["backend"] == "xla"
    entry = choose_backends.choose(fused, materialized=lost)[1]["set"]["float32"]["64"]
    assert entry["backend"] == "pallas" and entry["pallas_us"] == 7.2
    # The same where the source's auto ran the kernel and an earlier run measured the
    # path: the materialized cases still count, so the choice does not flip back.
    kernel_ran = [dict(r, hlo_ops={"custom-call:x": 1}) if r["backend"] == "auto" else r
                  for r in fused]
    without = choose_backends.choose(kernel_ran, {"old.json": fused})
    assert without[1]["set"]["float32"]["64"]["backend"] == "xla"  # The earlier run alone.
    earlier = choose_backends.choose(kernel_ran, {"old.json": fused}, materialized=lost)
    assert earlier[1]["set"]["float32"]["64"]["backend"] == "pallas"
    won = _xla_path_case("set", 64, 7.0, 7.4, 6.9)
    assert choose_backends.choose(fused, materialized=won)[1]["set"]["float32"]["64"][
        "backend"] == "xla"
    # The command line takes only a run made with --inputs materialized.
    source, other = tmp_path / "loop.json", tmp_path / "not_materialized.json"
    source.write_text(json.dumps({"meta": {}, "records": fused}))
    other.write_text(json.dumps({"meta": {"inputs": "fused"}, "records": lost}))
    with pytest.raises(SystemExit, match="not a run with --inputs materialized"):
        choose_backends.main([str(source), "--out", str(tmp_path / "t.json"),
                              "--materialized-from", str(other)])


def test_choose_backends_takes_xla_s_set_path_only_where_a_read_back_does_not_lose():
    # XLA's path lost in some cases where the step reads the rows back, so its
    # set-then-read rows (auto's counted only where the same run's set ran
    # XLA's path) must not be slower than the kernel's by more than the noise.
    def run(read_us):
        return [
            _row("ours_set", "pallas", 16, 20.0), _row("xla_set", "-", 16, 10.0),
            _row("ours_set", "auto", 16, 12.0) | {"hlo_ops": {"fusion": 3}},
            _row("ours_set_read", "pallas", 16, 30.0), _row("ours_set_read", "auto", 16, read_us),
        ]
    entry = choose_backends.choose(run(31.0))[1]["set"]["float32"]["16"]
    assert entry["backend"] == "xla" and "read back: not slower" in entry["xla_path"]
    entry = choose_backends.choose(run(40.0))[1]["set"]["float32"]["16"]
    assert entry["backend"] == "pallas" and "read back: slower" in entry["xla_path"]
    # An auto read-back row whose set ran our kernel says nothing of XLA's path.
    kernel_ran = [dict(r, hlo_ops={"custom-call:x": 1}) if r["backend"] == "auto"
                  and r["provider"] == "ours_set" else r for r in run(40.0)]
    no_auto = [r for r in kernel_ran
               if not (r["provider"] == "ours_set" and r["backend"] == "auto")]
    earlier = choose_backends.choose(no_auto, {"old.json": run(31.0)})[1]["set"]["float32"]["16"]
    assert earlier["backend"] == "xla" and "old.json; read back: not slower" in earlier["xla_path"]
    entry = choose_backends.choose(kernel_ran)[1]["set"]["float32"]["16"]
    assert entry["xla_path"] == "unmeasured"


def test_choose_backends_writes_the_table_that_measures_xla_s_path(tmp_path, backend_table):
    # --xla-path-table: the shipped table with every set and add class on XLA's path,
    # which auto follows under $PALLAS_PINNED_BACKEND_TABLE (gpu_session.sh stage xlapath).
    from pallas_pinned import _registry

    out = tmp_path / "xla_path.json"
    assert choose_backends.main(["--xla-path-table", str(out)]) == 0
    shipped = json.loads(choose_backends.TABLE.read_text())
    forced = json.loads(out.read_text())
    assert forced["choices"]["gather"] == shipped["choices"]["gather"]
    backend_table(out)
    for size in shipped["size_classes"]:
        assert _registry.measured_choice("set", "float32", size) == "xla"
        assert _registry.measured_choice("add", "float32", size) == "xla"
        for op in ("set", "add"):
            assert _registry.measured_choice(op, "float32", size, distinct=True) == "xla"
    assert _registry.measured_choice("get", "float32", 64) == "pallas"


def test_choose_backends_judges_xla_s_add_path_as_its_set_path():
    # Add follows set's rule: XLA's path as auto ran it (no kernel in its step) must beat
    # the kernel by more than the noise, and its add-then-read rows must not lose.
    def run(read_us):
        return [
            _row("ours_add", "pallas", 64, 10.0), _row("xla_add", "-", 64, 7.0),
            _row("ours_add", "auto", 64, 7.5) | {"hlo_ops": {"fusion": 2}},
            _row("ours_add_read", "pallas", 64, 14.0),
            _row("ours_add_read", "auto", 64, read_us) | {"hlo_ops": {"fusion": 2}},
        ]
    client_agrees = (True, "the sparse-training client: not slower")
    entry = choose_backends.choose(run(14.5), add_client=client_agrees)[1]["add"]["float32"]["64"]
    assert entry["backend"] == "xla" and "read back: not slower" in entry["xla_path"]
    entry = choose_backends.choose(run(20.0), add_client=client_agrees)[1]["add"]["float32"]["64"]
    assert entry["backend"] == "pallas" and "read back: slower" in entry["xla_path"]
    # The set's evidence says nothing of add's.
    as_set = [dict(r, provider=r["provider"].replace("add", "set")) if r["backend"] == "auto"
              and r["provider"] == "ours_add" else r for r in run(14.5)]
    entry = choose_backends.choose(as_set)[1]["add"]["float32"]["64"]
    assert entry["backend"] == "pallas" and entry["xla_path"] == "unmeasured"


def _client_run(ours_us, kernels_us, add_choice="xla"):
    records = [{"provider": "ours", "status": "ok", "us_per_step": ours_us, "correct": True},
               {"provider": "ours_kernels", "status": "ok", "us_per_step": kernels_us,
                "correct": True}]
    return {"meta": {"auto_choices": {"gather": "pallas", "add": add_choice}},
            "records": records}


def test_choose_backends_keeps_add_on_the_kernel_unless_the_sparse_client_agrees():
    # The loop says XLA's add path wins (faster, read back not slower); the real client
    # (Zipf ids that repeat, each step reading the last one's rows) decides as well.
    records = [
        *_xla_path_case("add", 64, 10.0, 7.0, 7.5),
        _row("ours_add_read", "pallas", 64, 14.0),
        _row("ours_add_read", "auto", 64, 14.0) | {"hlo_ops": {"fusion": 2}},
    ]

    def entry(client):
        return choose_backends.choose(records, add_client=client)[1]["add"]["float32"]["64"]

    slower = choose_backends.client_verdict(_client_run(720.6, 72.9), "run.json")
    assert slower == (False, "the sparse-training client (run.json): slower, 720.6 against "
                             "the kernels' 72.9 us per step")
    assert entry(slower)["backend"] == "pallas"
    assert entry(slower)["client"] == "slower"
    assert "distinct_backend" not in entry(slower)  # no client on distinct ids either
    assert "faster than the kernel" in entry(slower)["xla_path"]  # the loop's own verdict
    # Within the noise: not slower, so XLA's path is taken.
    assert entry(choose_backends.client_verdict(_client_run(75.0, 72.9)))["backend"] == "xla"
    # A client run that did not take XLA's add path, or none at all, measured nothing.
    for unmeasured in (choose_backends.client_verdict(_client_run(70.0, 72.9, "pallas")),
                       choose_backends.client_verdict(None)):
        assert unmeasured[0] is None
        assert entry(unmeasured)["backend"] == "pallas"
    # On ids that seldom repeat the client agreed: rows known distinct take XLA's path.
    distinct = choose_backends.choose(records, add_client=slower, distinct_client=(
        True, "uniform ids: not slower"))[1]["add"]["float32"]["64"]
    assert distinct["backend"] == "pallas" and distinct["distinct_backend"] == "xla"
    assert distinct["distinct_client"] == "not slower"
    # Set never asks the client.
    as_set = [dict(r, provider=r["provider"].replace("add", "set")) for r in records]
    set_entry = choose_backends.choose(as_set, add_client=slower)[1]["set"]["float32"]["64"]
    assert set_entry["backend"] == "xla" and "client" not in set_entry


def test_choose_backends_ignores_auto_rows_that_ran_a_kernel():
    # auto ran our kernel there (its table said so when the run was made): no
    # evidence about XLA's path, however fast it was.
    records = [
        _row("ours_set", "pallas", 16, 20.0), _row("ours_set", "triton", 16, 30.0),
        _row("xla_set", "-", 16, 10.0),
        dict(_row("ours_set", "auto", 16, 12.0), hlo_ops={"custom-call:triton_kernel_call": 1}),
    ]
    entry = choose_backends.choose(records)[1]["set"]["float32"]["16"]
    assert entry["backend"] == "pallas" and entry["xla_path"] == "unmeasured"


def test_choose_backends_names_an_unmeasured_op(tmp_path, capsys):
    source = tmp_path / "loop.json"
    meta = {"thresholds": {"fused_max_updates": 64}, "date_utc": "d", "gpu_name": "g"}
    records = [_row("ours_set", "pallas", 16, 10.0), _row("ours_set", "triton", 16, 20.0),
               _row("xla_set", "-", 16, 30.0)]
    source.write_text(json.dumps({"meta": meta, "records": records}))
    out = tmp_path / "table.json"
    assert choose_backends.main([str(source), "--out", str(out)]) == 0
    table = json.loads(out.read_text())
    assert table["unmeasured"] == ["add", "gather"] and set(table["choices"]) == {"set"}
    assert "no gather rows" in capsys.readouterr().out


def test_choose_backends_ignores_the_floor_and_the_read_after_write_rows():
    measured = [_row("ours_set", "pallas", 16, 10.0), _row("ours_set", "triton", 16, 20.0),
                _row("xla_set", "-", 16, 12.0)]
    extra = [_row("floor_launch", "-", 16, 1.0)]
    for op in ("add_read", "set_read"):
        extra += [_row(f"xla_{op}", "-", 16, 1.0)] + [
            _row(f"ours_{op}", b, 16, 500.0) for b in ("pallas", "triton", "auto")]
    assert choose_backends.choose(measured + extra) == choose_backends.choose(measured)
    assert choose_backends.choose(extra) == ([], {})




def test_choose_backends_judges_rows_promised_distinct_apart():
    # A set promised unique skips our de-duplication: XLA's path may win there where the
    # de-duplicating one loses. Judged on the ours_set_unique rows (auto with no kernel
    # in its step, against the kernel told the same), read back included.
    def run(distinct_read_us):
        return [
            _row("xla_set", "-", 1024, 25.0),
            _row("ours_set", "pallas", 1024, 29.0),
            _row("ours_set", "auto", 1024, 51.0) | {"hlo_ops": {"fusion": 2}},
            _row("ours_set_unique", "pallas", 1024, 28.0),
            _row("ours_set_unique", "auto", 1024, 25.5) | {"hlo_ops": {"fusion": 2}},
            _row("ours_set_unique_read", "pallas", 1024, 50.0),
            _row("ours_set_unique_read", "auto", 1024, distinct_read_us),
        ]

    entry = choose_backends.choose(run(50.5))[1]["set"]["float32"]["1024"]
    assert entry["backend"] == "pallas" and "not faster" in entry["xla_path"]
    assert entry["distinct_backend"] == "xla"
    assert entry["distinct_xla_path"].startswith("faster than the kernel (this run")
    # Read back slower: the kernel serves distinct rows as well.
    entry = choose_backends.choose(run(60.0))[1]["set"]["float32"]["1024"]
    assert "distinct_backend" not in entry and "read back: slower" in entry["distinct_xla_path"]
    # The promised kernel no slower than XLA's bare set: nothing to judge.
    fast = [dict(r, us_per_step=24.0) if (r["provider"], r["backend"]) ==
            ("ours_set_unique", "pallas") else r for r in run(50.5)]
    entry = choose_backends.choose(fast)[1]["set"]["float32"]["1024"]
    assert "distinct_backend" not in entry and "distinct_xla_path" not in entry


def _sized_row(provider, backend, row_bytes, us):
    return _row(provider, backend, 256, us) | {"row_bytes": row_bytes}


def test_choose_backends_takes_xla_s_path_on_a_win_and_a_tie_not_on_a_win_and_a_loss():
    # Two cases in one class: a win beyond the noise with a tie within it takes XLA's
    # path; a win with a loss beyond the noise keeps the kernel.
    def run(second_auto_us):
        return [
            _sized_row("xla_set", "-", 4, 7.0), _sized_row("ours_set", "pallas", 4, 8.0),
            _sized_row("ours_set", "auto", 4, second_auto_us) | {"hlo_ops": {"fusion": 1}},
            _sized_row("xla_set", "-", 1024, 9.0), _sized_row("ours_set", "pallas", 1024, 12.0),
            _sized_row("ours_set", "auto", 1024, 9.5) | {"hlo_ops": {"fusion": 1}},
        ]

    assert choose_backends.choose(run(8.2))[1]["set"]["float32"]["256"]["backend"] == "xla"
    assert choose_backends.choose(run(9.0))[1]["set"]["float32"]["256"]["backend"] == "pallas"


def test_choose_backends_keeps_distinct_rows_on_a_promised_kernel_that_beats_xla():
    # The unpromised set takes XLA's path (with its de-duplication), but the kernel told
    # unique_indices beats XLA's bare set: rows known distinct stay on that kernel.
    records = [
        *_xla_path_case("set", 64, 10.0, 7.0, 7.5),
        _row("ours_set_unique", "pallas", 64, 6.0),
        _row("ours_set_unique", "auto", 64, 8.0) | {"hlo_ops": {"fusion": 2}},
    ]
    entry = choose_backends.choose(records)[1]["set"]["float32"]["64"]
    assert entry["backend"] == "xla" and entry["distinct_backend"] == "pallas"


@pytest.mark.parametrize("flag", ["--xla-path-from", "--add-client-from",
                                  "--distinct-client-from", "--materialized-from", None])
def test_choose_backends_refuses_a_named_file_that_does_not_exist(tmp_path, flag):
    # A file the user named is never dropped silently (the defaults are committed).
    source = tmp_path / "loop.json"
    source.write_text(json.dumps({"meta": {}, "records": []}))
    missing = tmp_path / "missing.json"
    argv = [str(missing if flag is None else source), "--out", str(tmp_path / "t.json")]
    argv += [] if flag is None else [flag, str(missing)]
    with pytest.raises(SystemExit, match=f"no such file: {missing}"):
        choose_backends.main(argv)
    assert not (tmp_path / "t.json").exists()


def test_choose_backends_names_the_cases_an_errored_provider_drops(tmp_path, capsys):
    # XLA's set errored in one of the class's two cases: the class is chosen on the other,
    # and the run says which case it left out and why.
    records = [
        _sized_row("ours_set", "pallas", 4, 8.0), _sized_row("xla_set", "-", 4, 9.0),
        _sized_row("ours_set", "pallas", 1024, 12.0),
        _sized_row("xla_set", "-", 1024, None) | {"status": "error", "correct": None},
        _sized_row("ours_get", "pallas", 4, 8.0) | {"correct": None},  # unchecked
    ]
    dropped = []
    entry = choose_backends.choose(records, dropped=dropped)[1]["set"]["float32"]["256"]
    assert entry["cases"] == 1
    assert dropped == ["set float32 <= 256 rows: 256 rows x 1024 B: no usable xla"]
    source = tmp_path / "loop.json"
    source.write_text(json.dumps({"meta": {}, "records": records}))
    assert choose_backends.main([str(source), "--out", str(tmp_path / "t.json")]) == 0
    err = capsys.readouterr().err
    assert "case dropped: set float32 <= 256 rows: 256 rows x 1024 B: no usable xla" in err
    assert "row not read: xla_set[-] float32 256 rows x 1024 B: error" in err
    assert "row not read: ours_get[pallas] float32 256 rows x 4 B: unchecked" in err


def test_an_unchecked_client_row_is_no_verdict():
    # Only a row checked right is evidence: an unchecked one (correct None, as every row
    # of a sparse-training run without its reference table) measures nothing.
    run = _client_run(70.0, 72.9)
    run["records"][0]["correct"] = None
    assert choose_backends.client_verdict(run)[0] is None


def _errored(row):
    return row | {"status": "error", "correct": None, "us_per_step": None}


def test_choose_backends_judges_the_kernel_against_xla_where_triton_errored(tmp_path, capsys):
    # Triton errored in the one case where XLA's bare set and its path beat the kernel 3x:
    # the case still counts against XLA (Pallas and XLA were timed there), only not in
    # the choice between the kernels; the table names what it lacked.
    def run(triton_us):
        triton = _sized_row("ours_set", "triton", 1024, triton_us)
        return [
            _sized_row("ours_set", "pallas", 4, 8.0), _sized_row("ours_set", "triton", 4, 9.0),
            _sized_row("xla_set", "-", 4, 9.0),
            _sized_row("ours_set", "auto", 4, 8.1) | {"hlo_ops": {"fusion": 2}},
            _sized_row("ours_set", "pallas", 1024, 30.0),
            triton if triton_us else _errored(triton), _sized_row("xla_set", "-", 1024, 10.0),
            _sized_row("ours_set", "auto", 1024, 11.0) | {"hlo_ops": {"fusion": 2}},
        ]
    measured = choose_backends.choose(run(31.0))[1]["set"]["float32"]["256"]
    dropped = []
    entry = choose_backends.choose(run(None), dropped=dropped)[1]["set"]["float32"]["256"]
    assert entry["backend"] == measured["backend"] == "xla"
    assert entry["cases"] == measured["cases"] == 2 and entry["xla_us"] == 19.0
    why = "256 rows x 1024 B: no usable triton: judged against XLA, not between kernels"
    assert dropped == [f"set float32 <= 256 rows: {why}"] and entry["left_out"] == [why]
    assert "triton_us" not in entry  # no sum over cases that lack it
    assert "left_out" not in measured
    source = tmp_path / "loop.json"
    source.write_text(json.dumps({"meta": {}, "records": run(None)}))
    out = tmp_path / "t.json"
    assert choose_backends.main([str(source), "--out", str(out)]) == 0
    assert json.loads(out.read_text())["choices"]["set"]["float32"]["256"]["left_out"] == [why]
    assert f"case dropped: set float32 <= 256 rows: {why}" in capsys.readouterr().err
    # XLA errored where Triton was 2x faster: that case still chooses between the kernels.
    records = [_sized_row("ours_set", "pallas", 4, 10.0), _sized_row("ours_set", "triton", 4, 10.0),
               _sized_row("xla_set", "-", 4, 12.0), _sized_row("ours_set", "pallas", 1024, 40.0),
               _sized_row("ours_set", "triton", 1024, 20.0),
               _errored(_sized_row("xla_set", "-", 1024, 0.0))]
    entry = choose_backends.choose(records)[1]["set"]["float32"]["256"]
    assert entry["backend"] == "triton" and entry["cases"] == 1
    assert entry["left_out"] == ["256 rows x 1024 B: no usable xla"]


def test_choose_backends_decides_no_win_of_xla_s_path_on_evidence_rows_left_out(
        tmp_path, capsys):
    # XLA's path beat the kernel in the source; with materialized inputs it lost 3x in
    # the one case whose row errored. A win needs a loss in no case: with that row left
    # out the class stays on the kernel, and its entry and stderr name the row.
    source = _xla_path_case("set", 256, 30.0, 10.0, 11.0)
    lost = _xla_path_case("set", 256, 20.0, 25.0, 60.0)
    errored = [*lost[:2], _errored(lost[2])]
    row = "ours_set[auto] float32 256 rows x 512 B: error"

    def entry(**kw):
        return choose_backends.choose(source, **kw)[1]["set"]["float32"]["256"]

    assert entry(materialized=lost)["backend"] == "pallas"
    assert entry()["backend"] == "xla"
    undecided = entry(materialized=errored)
    assert undecided["backend"] == "pallas"
    assert undecided["xla_path"] == (
        f"undecided (this run: faster where measured, rows left out: materialized inputs: {row})")
    # A loss measured beside a row left out is still a loss, said with the row.
    both = [*lost, _sized_row("ours_set", "pallas", 4, 20.0), _sized_row("xla_set", "-", 4, 25.0),
            _errored(_sized_row("ours_set", "auto", 4, 0.0))]
    lost_entry = entry(materialized=both)
    assert lost_entry["backend"] == "pallas" and lost_entry["xla_path"].startswith(
        "not faster than the kernel (this run;")
    assert "rows left out: materialized inputs: ours_set[auto] float32 256 rows x 4 B" in (
        lost_entry["xla_path"])
    # The same for an earlier run's read-back row: that run does not decide the win.
    read = [_row("ours_set_read", "pallas", 256, 40.0),
            _errored(_row("ours_set_read", "auto", 256, 0.0))]
    no_auto = [r for r in source if r["backend"] != "auto"]
    earlier = choose_backends.choose(no_auto, {"old.json": source + read})
    assert earlier[1]["set"]["float32"]["256"]["xla_path"] == (
        "undecided (old.json: faster where measured, rows left out: old.json: "
        "ours_set_read[auto] float32 256 rows x 512 B: error)")
    # The command line names every evidence run's rows it did not read, as the source's.
    paths = {}
    for name, records, meta in (("loop", no_auto, {}), ("old", source + read, {}),
                                ("mat", errored, {"inputs": "materialized"})):
        paths[name] = tmp_path / f"{name}.json"
        paths[name].write_text(json.dumps({"meta": meta, "records": records}))
    out = tmp_path / "t.json"
    assert choose_backends.main([str(paths["loop"]), "--out", str(out), "--xla-path-from",
                                 str(paths["old"]), "--materialized-from",
                                 str(paths["mat"])]) == 0
    err = capsys.readouterr().err
    assert f"row not read ({paths['mat']}): {row}" in err
    assert f"row not read ({paths['old']}): ours_set_read[auto] float32 256 rows x 512 B" in err
    assert json.loads(out.read_text())["choices"]["set"]["float32"]["256"]["backend"] == "pallas"
