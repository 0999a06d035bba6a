"""``backend="auto"`` on XLA's own path: where the backend table measured XLA's
formulation faster than our kernels (``pallas_pinned._registry``), on the jax release
the table was measured with.

Set takes it where measured, after our de-duplication (the last duplicate wins); add
takes it for rows known distinct only (XLA's add slowed tenfold on ids that repeat
in the sparse-training client). The formulation itself is checked against jnp here on
any platform, and on the GPU as the step runs it.
"""

from __future__ import annotations

import functools
import importlib.resources
import json
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallas_pinned as pp
from pallas_pinned import _backend_table, _registry, _write_rows, tuning
from tests.registry_support import on_cuda


def test_auto_runs_xla_s_own_path_where_the_table_measured_it_faster(monkeypatch):
    # Size classes by their largest entry count; "xla" entries make a set under
    # auto run XLA's own x.at[rows].set(y). The formulation itself (reachable
    # for every op) is jnp's arithmetic, checked bit for bit against jnp here.
    table = {
        "size_classes": [16, 4096],
        "choices": {
            "set": {"float32": {"16": {"backend": "xla"}, "4096": {"backend": "pallas"}}},
            "add": {"float32": {"16": {"backend": "xla"}}},
        },
    }
    chosen = on_cuda(monkeypatch, table)
    assert _registry.measured_choice("set", "float32", 3) == "xla"
    assert _registry.measured_choice("set", "float32", 17) == "pallas"
    assert _registry.measured_choice("set", "float32", 10**6) == "pallas"  # Beyond: the last.
    assert _registry.measured_choice("max", "float32", 3) == "xla"  # Follows add.
    assert _registry.measured_choice("get", "float32", 3) == "pallas"  # Not measured.
    host = jax.sharding.make_single_device_sharding(jax.devices()[0], memory_kind="pinned_host")
    x0 = np.random.default_rng(0).standard_normal((8, 3)).astype(np.float32)
    on_host = jax.device_put(x0, host)
    assert chosen("set", on_host, 5) == "xla_native"
    assert chosen("set", on_host, 17) == "pallas"
    # Add takes it where XLA sums in our accumulator's dtype (float32, not bfloat16);
    # min, max and mul follow add's entries but have no XLA formulation.
    assert chosen("add", on_host, 5) == "xla_native"
    table["choices"]["add"]["bfloat16"] = {"16": {"backend": "xla"}}
    assert _registry.measured_choice("add", "bfloat16", 3) == "xla"
    on_host_bf16 = jax.device_put(x0.astype(jnp.bfloat16), host)
    assert chosen("add", on_host_bf16, 5) == "pallas"
    for op in ("min", "max", "mul"):
        assert chosen(op, on_host, 5) == "pallas", op
    # XLA's own formulation (run on CUDA; called directly here): the last duplicate wins
    # whatever order XLA applies them in (it drops every superseded one first), in each mode.
    from pallas_pinned.testing import scatter_add_oracle, scatter_oracle

    idx = np.array([1, 1, 1, -1, 9, 2, 1], np.int32)  # duplicates, negative, outside
    upd = np.random.default_rng(1).standard_normal((7, 3)).astype(np.float32) * 1e3
    for mode in (None, "clip"):
        cfg = _write_rows.RowWrite("set", mode, False, False, tuning.current())
        want = scatter_oracle(x0, idx, upd, mode)
        native = functools.partial(_write_rows._xla_native, cfg=cfg)
        for run in (native, jax.jit(native)):  # eagerly and under jit
            got = run(jax.device_put(x0, host), jnp.asarray(idx), jnp.asarray(upd))
            assert np.asarray(got).tobytes() == want.tobytes(), (mode, run)
    # Add: jnp's sums (duplicates summed, negatives wrapped, outside dropped or clipped;
    # "wrap" is resolved before the row path).
    for mode in (None, "clip"):
        cfg = _write_rows.RowWrite("add", mode, False, False, tuning.current())
        want = scatter_add_oracle(x0, idx, upd, mode)
        native = functools.partial(_write_rows._xla_native, cfg=cfg)
        for run in (native, jax.jit(native)):
            got = run(jax.device_put(x0, host), jnp.asarray(idx), jnp.asarray(upd))
            np.testing.assert_allclose(np.asarray(got), want, rtol=1e-6, err_msg=str(mode))


def test_auto_gives_add_s_xla_path_to_rows_known_distinct_only(monkeypatch):
    # XLA's add slowed tenfold on ids that repeat (the sparse client on Zipf ids)
    # and won on ids that seldom do, so a table's distinct_backend serves only rows known
    # distinct: promised unique_indices, or an index form that cannot repeat a row.
    table = {"size_classes": [16], "choices": {"add": {"float32": {
        "16": {"backend": "pallas", "distinct_backend": "xla"}}}}}
    chosen = on_cuda(monkeypatch, table)
    assert _registry.measured_choice("add", "float32", 3) == "pallas"
    assert _registry.measured_choice("add", "float32", 3, distinct=True) == "xla"
    # Beyond the measured classes XLA's path is unmeasured: the kernel serves.
    assert _registry.measured_choice("add", "float32", 17, distinct=True) == "pallas"
    assert _registry.measured_choice("max", "float32", 3, distinct=True) == "xla"  # Follows add.
    host = jax.sharding.make_single_device_sharding(jax.devices()[0], memory_kind="pinned_host")
    x0 = np.random.default_rng(3).standard_normal((13, 5)).astype(np.float32)
    on_host = jax.device_put(x0, host)
    assert chosen("add", on_host, 5) == "pallas"
    assert chosen("add", on_host, 5, distinct=True) == "xla_native"
    assert chosen("max", on_host, 5, distinct=True) == "pallas"

    # The public call hands its promise to the choice. "clip" and "wrap" may map distinct
    # indices onto one row, so there a promise of unique indices says nothing of the rows.
    seen, real = [], _registry.choose

    def spy(call, x):
        seen.append(call.unique)
        return real(call, x)

    monkeypatch.setattr(_registry, "choose", spy)
    idx, upd = jnp.array([1, 4], jnp.int32), jnp.ones((2, 5), jnp.float32)
    want = x0.copy()
    want[[1, 4]] += 1
    for kwargs, distinct in (({}, False), ({"unique_indices": True}, True),
                             ({"unique_indices": True, "mode": "clip"}, False),
                             ({"unique_indices": True, "mode": "wrap"}, False)):
        seen.clear()
        got = pp.scatter_add_to_host(jax.device_put(x0, host), idx, upd, **kwargs)
        assert seen == [distinct], kwargs
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-6, err_msg=str(kwargs))
    # Several axes: "clip" folds the out-of-range column 9 onto column 4, so the two
    # promised-unique index pairs hit one row: not distinct, and both updates land.
    cube0 = np.random.default_rng(4).standard_normal((3, 5, 2)).astype(np.float32)
    rows_i, cols_j = jnp.array([1, 1], jnp.int32), jnp.array([4, 9], jnp.int32)
    want = {mode: jnp.asarray(cube0).at[rows_i, cols_j].add(1.0, mode=mode)
            for mode in (None, "clip")}
    for mode, distinct in ((None, True), ("clip", False)):
        def add(x, i, j, mode=mode):
            return pp.at(x)[i, j].add(jnp.ones((2, 2), jnp.float32), mode=mode,
                                      unique_indices=True)

        seen.clear()
        for run in (add, jax.jit(add, donate_argnums=0)):  # eagerly and under jit
            got = run(jax.device_put(cube0, host), rows_i, cols_j)
            np.testing.assert_allclose(np.asarray(got), np.asarray(want[mode]), rtol=1e-6)
        # The jitted call reuses the op the eager one traced: one choice per mode.
        assert seen == [distinct], mode


@pytest.mark.gpu
@pytest.mark.parametrize("n", [64, 1024, 4096])
def test_gpu_auto_on_xla_s_own_path_matches_jnp_with_duplicates(tmp_path, backend_table, n):
    # A table with XLA's path for every set and add class (what the xlapath stage of
    # gpu_session.sh measures): auto's set keeps the last duplicate and its add sums
    # them all, on the host buffer, as jnp does; the step launches none of our kernels.
    table = json.loads(
        importlib.resources.files("pallas_pinned").joinpath("backend_table.json").read_text()
    )
    for op in ("set", "add"):
        for entry in table["choices"][op]["float32"].values():
            entry["backend"] = "xla"
    path = tmp_path / "xla_path.json"
    path.write_text(json.dumps(table))
    backend_table(path)
    cpu = jax.devices("cpu")[0]  # jnp's scatter there applies duplicates in order.

    def jnp_on_cpu(method, x, i, u):
        on_cpu = [jax.device_put(a, cpu) for a in (x, i, u)]
        return np.asarray(getattr(on_cpu[0].at[on_cpu[1]], method)(on_cpu[2]))

    rng = np.random.default_rng(n)
    host = jax.sharding.make_single_device_sharding(jax.devices()[0], memory_kind="pinned_host")
    x0 = rng.standard_normal((50_000, 64)).astype(np.float32)
    idx = np.minimum(rng.zipf(1.3, n), 50_000 + 7).astype(np.int32) - 8  # repeats, <0, >=N
    upd = rng.standard_normal((n, 64)).astype(np.float32)
    for op, fn in (("set", pp.scatter_to_host), ("add", pp.scatter_add_to_host)):
        step = jax.jit(fn, donate_argnums=0)
        hlo = step.lower(jax.device_put(x0, host), idx, upd).compile().as_text()
        assert "custom-call" not in hlo, op  # No kernel of ours in the step.
        for run in (fn, step):
            got = np.asarray(run(jax.device_put(x0, host), jnp.asarray(idx), jnp.asarray(upd)))
            want = jnp_on_cpu(op, x0, idx, upd)
            if op == "set":
                assert got.tobytes() == want.tobytes(), (op, n, run)
            else:
                np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4, err_msg=op)


@pytest.mark.gpu
@pytest.mark.parametrize("n", [5, 1024, 16384, 20_000])
def test_gpu_auto_adds_promised_distinct_rows_on_xla_s_path_up_to_the_last_class(
        backend_table, n):
    # The shipped table gives float32 adds of rows known distinct to XLA's own path, up
    # to its largest class (16384), and keeps the rest on the kernels: the promise and
    # the count decide, and both paths match jnp.
    backend_table(None)
    assert _registry._table()["size_classes"][-1] == 16384
    rng = np.random.default_rng(n)
    host = jax.sharding.make_single_device_sharding(jax.devices()[0], memory_kind="pinned_host")
    x0 = rng.standard_normal((50_000, 64)).astype(np.float32)
    idx = rng.permutation(50_000)[:n].astype(np.int32)
    upd = rng.standard_normal((n, 64)).astype(np.float32)
    want = x0.copy()
    want[idx] += upd
    for promised in (True, False):
        step = jax.jit(functools.partial(pp.scatter_add_to_host, unique_indices=promised),
                       donate_argnums=0)
        hlo = step.lower(jax.device_put(x0, host), idx, upd).compile().as_text()
        assert ("custom-call" in hlo) is not (promised and n <= 16384), promised
        got = np.asarray(step(jax.device_put(x0, host), jnp.asarray(idx), jnp.asarray(upd)))
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6, err_msg=str(promised))


def test_xla_s_own_path_is_trusted_only_on_the_measured_gpu_and_release(monkeypatch):
    # XLA's handling of dynamic indices into host memory changes between releases (older
    # ones abort), and its speed against the kernels between GPUs: the table's xla entries
    # count only on the GPU model and release they were measured on, never with host
    # compute disabled. Elsewhere one warning says the kernels serve.

    here = jax.devices()[0].device_kind

    def trusted(measured_jax, flags="", gpu=here):
        monkeypatch.setattr(_backend_table, "_table",
                            lambda: {"measured": {"jax": measured_jax, "gpu_name": gpu}})
        monkeypatch.setenv("XLA_FLAGS", flags)
        _backend_table.xla_host_path_trusted.cache_clear()
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                answer = _backend_table.xla_host_path_trusted()
            said = [str(w.message) for w in caught if "backend table" in str(w.message)]
            assert len(said) == (0 if answer or flags.endswith("offload") or "=true" in flags
                                 else 1), said
            return answer
        finally:
            _backend_table.xla_host_path_trusted.cache_clear()

    assert trusted(jax.__version__)
    assert not trusted("0.4.30")
    assert not trusted(jax.__version__, gpu="NVIDIA A100-SXM4-80GB")
    assert not trusted(jax.__version__, "--xla_disable_automatic_host_compute_offload=true")
    assert not trusted(jax.__version__, "--xla_disable_automatic_host_compute_offload")
    assert trusted(jax.__version__, "--xla_disable_automatic_host_compute_offload=false")
