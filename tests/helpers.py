"""What the test modules share: the backend list, placement, data and result checks.

The oracles themselves live in :mod:`pallas_pinned.testing` (shared with the
benchmarks); this module only adapts them to the tests' habits.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import os

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from hypothesis import settings
from hypothesis import strategies as st

from pallas_pinned import testing
from pallas_pinned.testing import assert_same, gather_oracle, scatter_oracle


def has_gpu() -> bool:
    """Whether jax sees a CUDA GPU (the ``gpu`` marker runs only then)."""
    try:
        return bool(jax.devices("gpu"))
    except RuntimeError:
        return False


def triton_available() -> bool:
    """triton and jax-triton both installed (the kernels import with triton alone)."""
    if no_triton() is not None:
        return False
    # Not guarded: with triton installed, failing to import our module is a bug to see.
    from pallas_pinned.kernels import triton_common

    try:
        triton_common.check_installed()
    except ImportError:  # jax-triton, or one of its own dependencies, is not installed.
        return False
    return True


def no_triton() -> str | None:
    """Why ``import triton`` fails here (a skip reason), or None."""
    try:
        import triton  # noqa: F401
    except ImportError as err:
        return f"{TRITON_MISSING} ({str(err).splitlines()[0]})"
    return None


def cuda_devices() -> list:
    try:
        return jax.devices("cuda")
    except RuntimeError:
        return []


def why_no_triton_launch() -> str | None:
    """Why the raw Triton kernels cannot run here (a skip reason), or None.

    A jax-triton that is installed but cannot launch on a CUDA machine is a
    failure to see, not a reason to skip: the GPU tests then run and fail.
    """
    reason = no_triton()
    if reason:
        return reason
    if not cuda_devices():
        return "needs a CUDA GPU"
    if not triton_available():
        return JAX_TRITON_MISSING
    return None


def entry_rows(rng, num_rows: int, n: int, *, distinct: bool, markers: bool, dtype=np.int32):
    """Rows in random order (distinct, or with repeats), some replaced by out-of-range ones.

    The out-of-range rows are what the caller's normalization produces (one
    past the end, -1) plus the extremes of the index type, which a 32-bit or
    unsigned bounds check would get wrong. For the Triton kernel tests.
    """
    if n > num_rows:  # Fewer rows than entries: the rows past the end are out of range.
        rows = rng.permutation(n)
    elif distinct:
        rows = rng.permutation(num_rows)[:n]
    else:
        rows = rng.integers(0, num_rows, size=n)
    rows = rows.astype(dtype)
    if markers and n >= 8:  # Fewer entries all stay real, so that something happens.
        info = np.iinfo(dtype)
        choices = np.array([num_rows, -1, info.max, info.min], dtype)
        where = rng.choice(n, n // 8, replace=False)
        rows[where] = rng.choice(choices, where.size)
    return rows


def in_place_jit(function, on_host: bool):
    """``jit`` of an in-place kernel function, buffer donated, result placed like the buffer."""

    def run(x, *args):
        out = function(x, *args)
        if on_host:
            # Like pallas_call, triton_call declares its result in device
            # memory; it is the aliased host buffer, so say where it lives.
            out = jax.device_put(out, jax.memory.Space.Host)
        return out

    return jax.jit(run, donate_argnums=0)


# Skip reasons naming a dependency that the [test] extra installs: tests
# skipped for them in CI mean the extra is broken (conftest fails such a run).
TRITON_MISSING = "triton is not installed"
TRITON_EXTRA_MISSING = "needs the triton extra (pip install -e \".[triton]\")"
JAX_TRITON_MISSING = "jax-triton is not installed"
NOTEBOOK_PACKAGES_MISSING = "the notebook packages of the [test] extra are not installed"
ORBAX_MISSING = "needs orbax-checkpoint"  # tests/provenance_child.py's orbax maker
EXTRA_SKIP_REASONS = (
    TRITON_MISSING, TRITON_EXTRA_MISSING, JAX_TRITON_MISSING, NOTEBOOK_PACKAGES_MISSING,
    ORBAX_MISSING,
)

# Every correctness case runs through each backend. "pallas" and "triton"
# compile Triton kernels, so they exist on a GPU only; "triton" also needs
# the optional extra.
PALLAS = pytest.param("pallas", marks=pytest.mark.gpu)
TRITON = pytest.param(
    "triton",
    marks=[
        pytest.mark.gpu,
        pytest.mark.skipif(not triton_available(), reason=TRITON_EXTRA_MISSING),
    ],
)
BACKENDS = ["xla", "interpret", "auto", PALLAS, TRITON]
KERNEL_BACKENDS = ["interpret", PALLAS, TRITON]
# Off CUDA, "auto" runs the "xla" case's code: its kernel choice is the CUDA
# branch of a lax.platform_dependent whose default is XLA's own. On a grid of
# values (dtypes, modes, shapes, counts, promises) it repeats the xla case, so
# VALUE_BACKENDS runs it only where a GPU is seen. auto keeps its CPU cases
# where it takes another route than "xla" (index forms that are blocks, device
# memory) or where that platform_dependent meets jit, loops, donation, vmap or
# grad; which route it picks: tests/test_backends.py and tests/test_xla_path.py.
AUTO_REPEATS_XLA = "auto runs the xla case's code off CUDA"
VALUE_BACKENDS = [
    "xla",
    "interpret",
    pytest.param("auto", marks=pytest.mark.skipif(not has_gpu(), reason=AUTO_REPEATS_XLA)),
    PALLAS,
    TRITON,
]
assert sorted(p if isinstance(p, str) else p.values[0] for p in BACKENDS) == sorted(
    testing.BACKENDS
), "tests/helpers.py must list every backend of pallas_pinned.testing.BACKENDS"


# --- property tests ----------------------------------------------------------------
#
# conftest.py loads a derandomized hypothesis profile: every run draws the same examples.
# PALLAS_PINNED_EXAMPLES scales every test's count (e.g. 10 for a deeper local search,
# with HYPOTHESIS_PROFILE=explore for fresh draws).
EXAMPLES_SCALE = float(os.environ.get("PALLAS_PINNED_EXAMPLES", "1"))


def examples(count: int):
    """``@settings`` with ``count`` examples (times PALLAS_PINNED_EXAMPLES), the profile's rest."""
    return settings(max_examples=max(1, round(count * EXAMPLES_SCALE)))


INDEX_DTYPES = ("int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64")


@dataclasses.dataclass
class RowCase:
    """One call of a row op, drawn by :func:`row_cases`: a buffer of fresh random data, row
    indices (negative, out of range, repeated, unless a promise says otherwise), a mode, the
    promises, where the buffer lives, and whether the call runs under jit."""

    num_rows: int
    row_shape: tuple
    dtype: str
    indices: np.ndarray
    mode: str | None
    promises: dict
    kind: str
    jitted: bool
    seed: int

    def rng(self):
        return np.random.default_rng(self.seed)

    def jnp_indices(self):
        """The indices as jnp takes them (32-bit without x64), or None where they do not fit."""
        idx = self.indices.astype(object)
        if idx.size and (idx.min() < -(2**31) or idx.max() >= 2**31):
            return None
        return jnp.asarray(self.indices.astype(np.int64).astype(np.int32))


@st.composite
def row_cases(draw, dtypes, modes, *, counts=(0, 1, 5, 29)) -> RowCase:
    """A :class:`RowCase`, for the row ops' property tests (test_scatter, _gather, _add)."""
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    dtype = draw(st.sampled_from(dtypes))
    row_shape = draw(st.sampled_from([(3,), (), (100,), (4, 25), (1,), (0,)]))
    num_rows = draw(st.sampled_from([37, 1, 6]))
    promise = draw(st.sampled_from(["none", "none", "none", "unique", "sorted", "both"]))
    if promise == "none":
        shape = draw(st.sampled_from([(n,) for n in counts] + [(4, 5)]))
        idx = mixed_indices(rng, num_rows, shape)
        mode = draw(st.sampled_from(modes))
    else:
        # Honest promises: distinct and/or ascending rows, some past the end (dropped).
        n = draw(st.sampled_from([c for c in counts if c <= num_rows + 3]))
        idx = (rng.permutation(num_rows + 3)[:n] if promise in ("unique", "both")
               else rng.integers(0, num_rows + 3, size=n))
        if promise in ("sorted", "both"):
            idx = np.sort(idx)
        mode = None
    index_dtype = draw(st.sampled_from(("int32",) * 3 + INDEX_DTYPES))
    # Narrow types wrap as numpy casts them (the same array goes to both sides).
    idx = np.asarray(idx).astype(np.int64).astype(index_dtype)
    promises = {"unique_indices": promise in ("unique", "both"),
                "indices_are_sorted": promise in ("sorted", "both")}
    return RowCase(num_rows, row_shape, dtype, idx, mode, promises,
                   draw(st.sampled_from(["pinned_host", "pinned_host", "device"])),
                   draw(st.booleans()), seed)


def run_row_op(op, case: RowCase, x0, *args, donate=True, **kwargs):
    """``op(x, indices, *args)`` on ``x0`` placed as ``case`` says, eagerly or under a jit
    (donating x where ``donate``). Indices that jax holds in 32 bits are an argument of the
    jit; wider ones (x64 is off) stay numpy, closed over, as a user's constant would be."""
    x = put(x0, case.kind)
    kwargs = dict(kwargs, mode=case.mode, **case.promises)
    if not case.jitted:
        return x, op(x, case.indices, *args, **kwargs)
    donated = (0,) if donate else ()
    traced = case.jnp_indices()
    if traced is None:
        run = jax.jit(lambda x, *a: op(x, case.indices, *a, **kwargs), donate_argnums=donated)
        return x, run(x, *args)
    run = jax.jit(lambda x, i, *a: op(x, i, *a, **kwargs), donate_argnums=donated)
    return x, run(x, traced, *args)


# --- placement -----------------------------------------------------------------


def default_device():
    """The GPU when there is one, else the first CPU device."""
    return jax.devices()[0]


def sharding(kind: str, device=None):
    return jax.sharding.make_single_device_sharding(device or default_device(), memory_kind=kind)


def put(array, kind: str = "pinned_host", device=None) -> jax.Array:
    return jax.device_put(array, sharding(kind, device))


def read(array: jax.Array) -> np.ndarray:
    """Host copy of any array, whatever its memory kind."""
    return np.asarray(array)


# --- data ----------------------------------------------------------------------


def np_dtype(dtype: str):
    return ml_dtypes.bfloat16 if dtype == "bfloat16" else np.dtype(dtype)


def exact_values(rng, shape, dtype: str) -> np.ndarray:
    """Random non-zero data whose sums are exact: quarters in [-16, 16) for floats.

    Sums of such values do not depend on their order, so the add oracle and
    every kernel must agree bit for bit. Integers span their full range
    (sums wrap).
    """
    if np.issubdtype(np.dtype(np_dtype(dtype)), np.integer):
        return testing.make_values(rng, shape, dtype)
    quarters = rng.integers(-64, 64, size=shape)
    quarters[quarters == 0] = 1
    return (quarters / 4).astype(np_dtype(dtype))


def mixed_indices(rng, num_rows: int, shape) -> np.ndarray:
    """Negative, out-of-range (both sides) and repeated rows, all in one batch."""
    idx = rng.integers(-num_rows - 3, num_rows + 3, size=shape)
    flat = idx.reshape(-1)
    if flat.size >= 3:
        flat[1] = flat[0]  # A sure duplicate.
        flat[2] = -1  # The last row, through wrapping.
    return idx


# --- result checks ---------------------------------------------------------------


def check_scatter(out, x0, indices, updates, mode=None, *, kind="pinned_host") -> None:
    """The result has the buffer's memory kind and equals the numpy oracle."""
    assert out.sharding.memory_kind == kind, out.sharding
    idx = np.asarray(indices)
    target = idx.shape + x0.shape[1:]
    upd = np.broadcast_to(np.asarray(updates), target).astype(x0.dtype)
    assert_same(read(out), scatter_oracle(x0, idx, upd, mode))


def check_gather(out, x0, idx, mode=None, fill_value=None) -> None:
    """Device memory, jnp's answer, and the oracle's (which must agree with jnp)."""
    assert out.sharding.memory_kind == "device", out.sharding
    kwargs = {} if fill_value is None else {"fill_value": fill_value}
    expected = np.asarray(jnp.asarray(x0).at[jnp.asarray(idx)].get(mode=mode, **kwargs))
    assert_same(read(out), expected, what="vs jnp")
    assert_same(expected, gather_oracle(x0, np.asarray(idx), mode, fill_value), what="oracle")


# --- interpret runs a kernel -----------------------------------------------------------
#
# "interpret" is the one backend that runs the Pallas kernels off a GPU, and a case that
# silently took XLA's path instead would still match every oracle. So each read and
# write called with it must stage a pallas_call (check_interpret_runs_kernels). The
# staged program is what is checked, not a spy on the kernels at trace time: the ops'
# jits keep their traced programs, so a signature called again traces nothing, whereas
# jax.make_jaxpr hands back the kept program whole (and for a read the call that
# follows reuses the trace that make_jaxpr made).


def calls_pallas(jaxpr) -> bool:
    """Whether ``jaxpr`` (a Jaxpr or ClosedJaxpr), or one nested in it, has a pallas_call."""
    jaxpr = getattr(jaxpr, "jaxpr", jaxpr)
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "pallas_call":
            return True
        # Nested programs (jit, custom_vjp, custom_vmap, cond's branches, while,
        # shard_map) sit in the equation's parameters, alone or in tuples.
        for param in eqn.params.values():
            for sub in param if isinstance(param, tuple | list) else (param,):
                if hasattr(getattr(sub, "jaxpr", sub), "eqns") and calls_pallas(sub):
                    return True
    return False


def _moves_nothing(name, call, program, real_read) -> bool:
    """Whether the library rightly runs no kernel for this call: nothing to read or write.

    ``_local_read.read_traced`` returns without one when the result or the buffer
    has no elements, ``_local_write.write_traced`` (and ``write``) when the index
    selects no entries or the buffer has no elements; a rank-0 host buffer's one
    value is computed on the device (``_local_write._scalar_write``).
    """
    x = call.arguments["x"]
    if x.size == 0:
        return True
    if name == "read":
        return any(aval.size == 0 for aval in program.out_avals)
    if x.ndim == 0 and x.aval.memory_space == jax.memory.Space.Host:
        return True
    # How many elements the index selects: the shape of the same index read (by XLA,
    # staged only), which is the shape the write broadcasts its updates to.
    selected = jax.eval_shape(lambda: real_read(
        x, call.arguments["index"], mode=None, fill_value=None, indices_are_sorted=False,
        unique_indices=False, backend="xla",
    ))
    return selected.size == 0


def _kernel_checked(real, real_read):
    """``real`` (``_front.read`` or ``_front.write``), asserting that "interpret" stages
    a pallas_call wherever there is something to read or write."""
    signature = inspect.signature(real)

    @functools.wraps(real)
    def run(*args, **kwargs):
        call = signature.bind(*args, **kwargs)
        if call.arguments.get("backend") != "interpret":
            return real(*args, **kwargs)
        try:
            # Closing over the arguments keeps concrete ones concrete, so the op takes
            # its eager path as the call below does (a read hits the same jit entry; a
            # write its non-donating twin: nothing runs here, no buffer is consumed).
            program = jax.make_jaxpr(lambda: real(*args, **kwargs))()
        except Exception:
            # Bad input: the test expects the op's own error, so the op raises it. Should
            # the op run, the trace's error is a fault of this check, and shows.
            real(*args, **kwargs)
            raise
        if not calls_pallas(program) and not _moves_nothing(
            real.__name__, call, program, real_read
        ):
            x = call.arguments["x"]
            raise AssertionError(
                f'backend="interpret" ran no Pallas kernel: {real.__name__} of x '
                f"{x.dtype}{list(x.shape)} at {call.arguments['index']!r:.200} staged no "
                "pallas_call (did it take XLA's path?)"
            )
        return real(*args, **kwargs)

    return run


def check_interpret_runs_kernels(monkeypatch) -> None:
    """Makes every op called with ``backend="interpret"`` fail unless it runs a kernel.

    Every public op (and ``at``) goes through ``_front.read`` or ``_front.write``;
    ``monkeypatch`` puts the originals back after the test.
    """
    from pallas_pinned import _front

    real_read = _front.read
    for name in ("read", "write"):
        monkeypatch.setattr(_front, name, _kernel_checked(getattr(_front, name), real_read))
