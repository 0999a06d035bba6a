"""``benchmarks.verdict``: the count of loop pairs where ``auto`` is slower than XLA."""

import json

import tests.benchmark_helpers  # noqa: F401  (puts the repository root on sys.path)
from benchmarks import verdict


def _row(case, provider, backend, median, lo, hi, status="ok"):
    op = provider.split("_")[1]  # the loop's op of the row: "set" for "ours_set_unique"
    return {"case": case, "op": op, "provider": provider, "backend": backend, "status": status,
            "us_per_step": median, "us_min": lo, "us_max": hi}


RECORDS = [
    _row("64x1024B-float32", "xla_set", "-", 8.0, 7.5, 8.5),
    _row("64x1024B-float32", "ours_set", "auto", 10.0, 9.0, 11.0),            # apart
    _row("64x1024B-float32", "ours_set_unique", "auto", 8.2, 7.0, 9.0),       # slower only
    _row("64x1024B-float32", "ours_set_unique_sorted", "auto", 7.9, 7.0, 9.0),  # faster
    _row("64x1024B-float32", "ours_set", "pallas", 20.0, 19.0, 21.0),         # not auto
    _row("64x1024B-float32", "ours_add", "auto", 30.0, 29.0, 31.0),           # no XLA peer
    _row("ring[8,4]x2-float32", "xla_ring", "-", 5.0, 4.0, 6.0),
    _row("ring[8,4]x2-float32", "ours_ring", "auto", 6.5, 6.1, 7.0),          # apart
    _row("5x4B-float32", "xla_get", "-", None, None, None, status="skipped: time budget"),
    _row("5x4B-float32", "ours_get", "auto", 1.0, 1.0, 1.0),                  # peer untimed
    _row("5x4B-float32", "xla_set", "-", 100.0, 99.0, 101.0),  # another case's XLA set
    _row("5x4B-float32", "ours_set", "auto", 3.0, None, None),              # no range
]


def test_xla_peer_is_xla_of_the_rows_op_whatever_it_promised():
    def peer(provider, op):
        return verdict.xla_peer({"provider": provider, "op": op})
    assert peer("ours_set_unique_sorted", "set") == "xla_set"
    assert peer("ours_add_unique_read", "add_read") == "xla_add_read"
    assert peer("ours_kv_block", "kv_block") == "xla_kv_block"
    assert peer("xla_set", "set") is None
    assert peer("baseline", "none") is None


def test_pairs_are_auto_rows_with_a_timed_xla_peer_of_the_same_case():
    pairs = verdict.auto_xla_pairs(RECORDS)
    assert [(p.case, p.provider) for p in pairs] == [
        ("64x1024B-float32", "ours_set"), ("64x1024B-float32", "ours_set_unique"),
        ("64x1024B-float32", "ours_set_unique_sorted"), ("ring[8,4]x2-float32", "ours_ring")]
    assert {p.xla["provider"] for p in pairs} == {"xla_set", "xla_ring"}
    assert all(p.xla["case"] == p.case for p in pairs)  # never another case's XLA row
    assert [p.xla["us_per_step"] for p in pairs[:3]] == [8.0, 8.0, 8.0]


def test_lines_count_slower_medians_and_list_only_the_pairs_apart():
    lines = verdict.verdict_lines(RECORDS)
    assert lines[0].startswith("auto against XLA: slower by the median in 3 of 4 pairs; in 2 ")
    assert len(lines) == 3
    assert "ours_set " in lines[1] and "10.0 [9.0–11.0]" in lines[1] and "8.0 [7.5–8.5]" in lines[1]
    assert "ours_ring" in lines[2]


def test_a_run_without_pairs_says_so():
    assert verdict.verdict_lines(RECORDS[4:6]) == ["auto against XLA: no timed pair in this run"]


def test_the_command_reads_a_committed_result(tmp_path, capsys):
    path = tmp_path / "loop.json"
    path.write_text(json.dumps({"meta": {}, "records": RECORDS}))
    assert verdict.main([str(path)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == str(path) and out[1].startswith("auto against XLA: slower by the median in 3")
