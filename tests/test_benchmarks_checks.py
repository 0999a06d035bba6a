"""CPU tests of what every benchmark relies on: the row checkers, the oracles and timing helper
of ``pallas_pinned.testing``, the kernel counting rule of ``benchmarks.hlo``, and the formatting
of ``benchmarks.report``.

A checker that cannot fail would make every benchmark's "correct" flag
meaningless, so each is shown a right result and the wrong ones it must catch.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tests.benchmark_helpers  # noqa: F401  (puts the repository root on sys.path)
from benchmarks import checks, hlo, report
from pallas_pinned import testing

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
    if mode in (None, "clip", "drop"):
        # jnp on the CPU applies duplicates in order: the last one wins, as ours.
        with jax.default_device(jax.devices("cpu")[0]):
            written = np.asarray(jnp.asarray(x).at[idx].set(jnp.asarray(upd), mode=mode))
        testing.assert_same(testing.scatter_oracle(x, idx, upd, mode), written)


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
# Formatting


def test_a_median_prints_with_its_min_and_max_in_its_unit():
    assert report.format_seconds_span(12.3e-6, 6.15e-6, 24.6e-6) == "12.3 us [6.2–24.6]"
    assert report.format_seconds_span(0.5, 0.25, 1.5) == "500.00 ms [250.00–1500.00]"
    assert report.format_seconds_span(None, None, None) == "-"
    assert report.format_count(1 << 20) == "1M" and report.format_count(300) == "300"
