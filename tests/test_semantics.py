"""Where the ops follow jnp, and where they deliberately do not.

* Casting updates: a lossy cast warns (FutureWarning) exactly when jnp's own
  ``.at[].set`` / ``.add`` warns for the same pair of types; safe casts are silent.
* Wide indices with x64 enabled: compared at full width. jnp on jax 0.12
  truncates them to 32 bits: ``jnp.zeros(8).at[jnp.array([2**32 + 5])].set(1)``
  writes row 5, and ``.get()`` reads row 5. Ours drops such an index (mode
  None/"drop"), clips it to the last row ("clip"), and never touches row 5.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallas_pinned as pp
from tests.helpers import TRITON_EXTRA_MISSING, put, triton_available

# name: (buffer dtype, updates, lossy by jnp's rule)
CASTS = {
    "float32 array into int32": ("int32", lambda: jnp.ones(2, jnp.float32), True),
    "python float into int32": ("int32", lambda: 1.5, True),
    "float64 numpy into bfloat16": ("bfloat16", lambda: np.ones(2, np.float64), True),
    "float32 numpy into bfloat16": ("bfloat16", lambda: np.ones(2, np.float32), True),
    "float32 into float16": ("float16", lambda: jnp.ones(2, jnp.float32), True),
    "int32 into int8": ("int8", lambda: jnp.ones(2, jnp.int32), True),
    "uint8 into int8": ("int8", lambda: jnp.ones(2, jnp.uint8), True),
    "float32 into bool": ("bool", lambda: jnp.ones(2, jnp.float32), True),
    "python int into float32": ("float32", lambda: 3, False),
    "python int into int8": ("int8", lambda: 3, False),
    "int8 into int32": ("int32", lambda: jnp.ones(2, jnp.int8), False),
    "int32 into float32": ("float32", lambda: jnp.ones(2, jnp.int32), False),
    "bfloat16 into float32": ("float32", lambda: jnp.ones(2, jnp.bfloat16), False),
    "python float into bfloat16": ("bfloat16", lambda: 1.5, False),
    "python bool into int8": ("int8", lambda: True, False),
}


def _future_warnings(fn) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fn()
    return [str(w.message) for w in caught if issubclass(w.category, FutureWarning)]


@pytest.mark.parametrize(
    ("case", "op"),
    # add refuses bool buffers, as jnp does (tests/test_errors.py).
    [(c, op) for c in CASTS for op in ("set", "add") if (op, CASTS[c][0]) != ("add", "bool")],
)
def test_lossy_casts_warn_as_jnp_does(case, op):
    dtype, updates, lossy = CASTS[case]
    idx = jnp.array([1, 2])
    x0 = jnp.zeros((4, 2), dtype)
    jnp_op = (
        (lambda: x0.at[idx].set(updates())) if op == "set" else (lambda: x0.at[idx].add(updates()))
    )
    ours = pp.scatter_to_host if op == "set" else pp.scatter_add_to_host
    jnp_warned = bool(_future_warnings(jnp_op))
    ours_warned = _future_warnings(lambda: ours(put(np.asarray(x0)), idx, updates()))
    assert jnp_warned == lossy, f"jnp's rule changed for {case}"
    assert bool(ours_warned) == jnp_warned, ours_warned
    if ours_warned:
        assert "cast" in ours_warned[0] and str(jnp.dtype(dtype)) in ours_warned[0]


@pytest.mark.parametrize("op", ["set", "add"])
def test_fill_mode_of_a_write_is_drop_as_in_jnp(op):
    # jnp's scatter modes include "fill", which for a write means "drop".
    idx = jnp.array([1, 9, -1, -20, 3])  # No duplicate: jnp leaves their order open.
    upd = jnp.arange(5.0, dtype=jnp.float32) + 10
    x0 = np.arange(8, dtype=np.float32) + 1
    ours = pp.scatter_to_host if op == "set" else pp.scatter_add_to_host
    got = np.asarray(ours(put(x0), idx, upd, mode="fill"))
    ref = jnp.asarray(x0).at[idx]
    expected = ref.set(upd, mode="fill") if op == "set" else ref.add(upd, mode="fill")
    np.testing.assert_array_equal(got, np.asarray(expected))
    np.testing.assert_array_equal(got, np.asarray(ours(put(x0), idx, upd, mode="drop")))


# --- wide indices (x64), in a child process: x64 is a global setting ----------------

_WIDE_INDEX_CHILD = textwrap.dedent(
    """
    import json, sys
    import jax
    jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp
    import numpy as np
    import pallas_pinned as pp
    from pallas_pinned.testing import gather_oracle, scatter_add_oracle, scatter_oracle

    backends = sys.argv[1].split(",")
    pinned = jax.sharding.make_single_device_sharding(jax.devices()[0], memory_kind="pinned_host")
    BIG = [2**31 + 5, 2**32 + 5, -(2**32) + 5, 2**63 - 3]  # 5 and -3 modulo 2**32
    forms = {
        "numpy int64": lambda v: np.array(v, np.int64),
        "jax int64": lambda v: jnp.array(v, jnp.int64),
        "list": lambda v: list(v),
    }
    cases = [(form, BIG) for form in forms] + [("python int", [v]) for v in BIG]
    failures, count = [], 0
    x0 = np.arange(1, 9, dtype=np.float32)  # Row r holds r + 1: never zero.
    for backend in backends:
        for form, values in cases:
            idx = values[0] if form == "python int" else forms[form](values)
            for op, modes in (("set", (None, "drop", "clip")), ("add", (None, "drop", "clip")),
                              ("get", (None, "fill", "clip"))):
                for mode in modes:
                    count += 1
                    what = f"{op} {backend} {form} {values} mode={mode}"
                    try:
                        x = jax.device_put(x0, pinned)
                        if op == "set":
                            out = pp.scatter_to_host(x, idx, 100.0, mode=mode, backend=backend)
                            want = scatter_oracle(x0, np.array(values, object),
                                                  np.full(len(values), 100.0, np.float32), mode)
                        elif op == "add":
                            out = pp.scatter_add_to_host(x, idx, 100.0, mode=mode, backend=backend)
                            want = scatter_add_oracle(x0, np.array(values, object),
                                                      np.float32(100.0), mode)
                        else:
                            out = pp.gather_from_host(x, idx, mode=mode, backend=backend)
                            want = gather_oracle(x0, np.array(values, object), mode)
                        got = np.asarray(out).reshape(-1)
                        want = np.asarray(want).reshape(-1)
                        if op != "get" and got[5] != x0[5]:
                            failures.append(f"{what}: wrote row 5 (truncated index): {got}")
                        elif op == "get" and np.any(got == x0[5]):
                            failures.append(f"{what}: read row 5 (truncated index): {got}")
                        elif not np.array_equal(got, want, equal_nan=True):
                            failures.append(f"{what}: got {got}, want {want}")
                    except Exception as err:
                        failures.append(f"{what}: {type(err).__name__}: {err}")
    print(json.dumps({"count": count, "failures": failures}))
    """
)


CPU_BACKENDS = ["xla", "interpret", "auto"]
GPU_BACKENDS = CPU_BACKENDS + ["pallas"]


@pytest.mark.parametrize(
    ("platform", "backends"),
    [
        ("cpu", CPU_BACKENDS),
        pytest.param("cuda", GPU_BACKENDS, marks=pytest.mark.gpu),
        # Triton apart: without the extra it shows as a skip, never vanishes.
        pytest.param("cuda", ["triton"], marks=[
            pytest.mark.gpu,
            pytest.mark.skipif(not triton_available(), reason=TRITON_EXTRA_MISSING),
        ]),
    ],
    ids=["cpu", "gpu", "gpu-triton"],
)
def test_wide_indices_compare_at_full_width_with_x64(platform, backends):
    # Children side by side, several backends each: one per 4 cores (on a small
    # machine one child, which starts jax once and compiles without competition).
    env = dict(os.environ, JAX_PLATFORMS=platform, XLA_PYTHON_CLIENT_PREALLOCATE="false")
    count = min(len(backends), max(1, (os.cpu_count() or 1) // 4))
    children = {
        ",".join(group): subprocess.Popen(
            [sys.executable, "-c", _WIDE_INDEX_CHILD, ",".join(group)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for group in (backends[k::count] for k in range(count))
    }
    failures = []
    for group, child in children.items():
        stdout, stderr = child.communicate(timeout=600)
        assert child.returncode == 0, f"{group}: rc {child.returncode}\n{stderr[-3000:]}"
        report = json.loads(stdout.strip().splitlines()[-1])
        # 3 array forms + 4 Python ints, each through 3 ops x 3 modes, per backend.
        assert report["count"] == 7 * 9 * len(group.split(",")), report["count"]
        failures += report["failures"]
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("name,dtype,updates,index", [
    ("a list of floats", "float32", [1.0, 2.0, 3.0], np.array([0, 2])),
    ("a nested list", "float32", [[1.0, 2.0, 3.0]], np.array([1])),
    ("a Python int past int32, into uint32", "uint32", 2**32 - 1, 1),
    ("a Python int past int32 with max", "uint32", 3_000_000_000, np.array([0, 3])),
])
def test_updates_as_jnp_takes_them(name, dtype, updates, index):
    # jnp's .at[] takes a list as jnp.asarray does, and a Python int that fits the
    # buffer's type even where it does not fit the default int type.
    a = np.zeros((4, 3), dtype)
    method = "max" if "max" in name else "set"
    expected = getattr(jnp.asarray(a).at[index], method)(updates)
    got = getattr(pp.at(put(a))[index], method)(updates)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(expected), err_msg=name)
    assert got.dtype == expected.dtype


def test_lossy_updates_are_cast_before_they_combine():
    # The documented difference: where jnp warns of a lossy cast (and says it will
    # become an error), we cast the updates to x's dtype, then combine; jnp
    # combines in the promoted type. Cast first, and both agree.
    a = np.array([5, 7, 9], np.int32)
    with pytest.warns(FutureWarning, match="cast before add, subtract, multiply, min or max"):
        ours = pp.at(put(a))[np.array([0, 1])].multiply(0.5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        theirs = jnp.asarray(a).at[np.array([0, 1])].multiply(0.5)
    assert np.asarray(ours).tolist() == [0, 0, 9]  # 0.5 cast to 0 first
    assert np.asarray(theirs).tolist() == [2, 3, 9]  # 2.5 and 3.5, rounded toward zero
    cast = np.int32(0.5)
    assert (np.asarray(pp.at(put(a))[np.array([0, 1])].multiply(cast)).tolist()
            == np.asarray(jnp.asarray(a).at[np.array([0, 1])].multiply(cast)).tolist())


_X64_CAST_CHILD = textwrap.dedent(
    """
    import warnings
    import jax
    jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp, numpy as np
    import pallas_pinned as pp
    warnings.simplefilter("ignore", FutureWarning)  # Both warn alike: tests above.
    pinned = jax.sharding.make_single_device_sharding(jax.devices()[0], memory_kind="pinned_host")
    cases = [  # buffer dtype, updates: int64 meets uint64 in float64 in jnp's promotion
        ("uint64", np.array([-1, 2**62 + 1], np.int64)),
        ("int64", np.array([2**64 - 1, 2**62 + 1], np.uint64)),
        ("uint64", np.array([-2, 5], np.int8)),
        ("uint32", np.array([-1, 7], np.int32)),
        ("float32", np.array([2**53 + 1, -3], np.int64)),
    ]
    failures = []
    for dtype, updates in cases:
        x0 = np.zeros(3, dtype)
        want = np.asarray(jnp.asarray(x0).at[np.array([0, 2])].set(updates))
        for backend in ("xla", "interpret"):
            for index in (np.array([0, 2]), slice(0, 3, 2)):
                got = pp.at(jax.device_put(x0, pinned))[index].set(updates, backend=backend)
                if np.asarray(got).tobytes() != want.tobytes():
                    failures.append(f"{dtype} <- {updates.dtype} {backend} {index}: "
                                    f"{np.asarray(got)} != jnp's {want}")
    print(failures)
    """
)


def test_with_x64_a_set_casts_updates_as_jnp_does_through_their_common_type():
    # jnp promotes buffer and updates first (int64 with uint64: float64), then casts
    # back: -1 into uint64 gives 0, not 2**64 - 1; 2**62 + 1 rounds. Ours follows.
    done = subprocess.run([sys.executable, "-c", _X64_CAST_CHILD], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "[]", done.stdout[-3000:]


@pytest.mark.parametrize("backend", ["auto", "interpret"])
@pytest.mark.parametrize("op", ["get", "set", "add", "min", "multiply"])
def test_ops_under_x64_and_strict_dtype_promotion_give_jnps_result(op, backend):
    # A user's jax_numpy_dtype_promotion="strict" with x64 on: the kernels' own index
    # arithmetic (int32 program ids, int64 aranges) refused every op, even under auto on
    # the CPU, whose traced program holds the CUDA kernel too.
    with jax.enable_x64(True), jax.numpy_dtype_promotion("strict"):
        x0 = np.arange(32, dtype=np.float32).reshape(8, 4)
        pinned = jax.sharding.make_single_device_sharding(jax.devices()[0],
                                                          memory_kind="pinned_host")

        def ours(x, i, u):
            at = pp.at(x)[i]
            return at.get(backend=backend) if op == "get" else getattr(at, op)(u, backend=backend)

        def theirs(x, i, u):
            return x.at[i].get() if op == "get" else getattr(x.at[i], op)(u)

        for index in (np.array([1, 5, 1], np.int32), np.array([[0, 3], [6, -1]], np.int64)):
            i = jnp.asarray(index)
            u = jnp.full(index.shape + (4,), 2.0, jnp.float32)
            want = np.asarray(theirs(jnp.asarray(x0), i, u))
            for call in (ours, jax.jit(ours)):  # Eagerly and under jit.
                got = np.asarray(call(jax.device_put(x0, pinned), i, u))
                assert got.tobytes() == want.tobytes(), (op, index, call)


@pytest.mark.parametrize("check", ["debug_infs", "debug_nans"])
def test_a_write_that_trips_a_nan_or_inf_check_keeps_its_buffer(check):
    # JAX re-runs a call that made an inf (or NaN) de-optimized on the same inputs; a
    # donated buffer would be gone by then (it was: "Array has been deleted", x lost).
    x0 = np.zeros((8, 4), np.float32)
    x0[6, 0] = np.inf if check == "debug_infs" else np.nan
    pinned = jax.sharding.make_single_device_sharding(jax.devices()[0], memory_kind="pinned_host")
    x = jax.device_put(x0, pinned)
    with getattr(jax, check)(True), pytest.raises(FloatingPointError):
        pp.at(x)[jnp.array([1, 2])].add(jnp.ones((2, 4), jnp.float32))
    assert not x.is_deleted()
    assert np.asarray(x).tobytes() == x0.tobytes()
    assert np.asarray(pp.at(x)[1].add(1.0))[1].tolist() == [1.0] * 4  # Usable after.
