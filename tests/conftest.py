"""Test setup shared by every module: two CPU devices, the GPU marker, seeds, the skip summary.

Also: compiles without XLA's CPU optimizations when there is no GPU, through one
on-disk compilation cache for the run, and the slowest modules first (for
pytest-xdist, which dev.sh runs).

Two CPU devices exist so that "inputs on different devices" is testable on a
laptop; GPU tests (``@pytest.mark.gpu``) are skipped unless a CUDA GPU is seen.
In CI (``CI=true``) a test skipped because a dependency of the ``[test]``
extra is missing (triton, jax-triton) fails the run: those tests need no GPU.
"""

from __future__ import annotations

import collections
import os
import shutil
import tempfile
import zlib

import jax
import numpy as np
import pytest
from hypothesis import HealthCheck, settings

# Two CPU devices for the cross-device error tests. The option must be set
# before jax initializes its backends, i.e. before anything asks for devices.
jax.config.update("jax_num_cpu_devices", 2)

from tests.helpers import (  # noqa: E402  (may initialize backends)
    EXTRA_SKIP_REASONS,
    check_interpret_runs_kernels,
    has_gpu,
)

# Without a GPU the suite compiles thousands of tiny programs and runs each once
# or twice: XLA's CPU optimizations (LLVM's) cost more compile time than they
# could save, as for tests/index_support.py's FAST_COMPILE. The environment
# variable carries the choice to child processes; set it to 0 to optimize.
if not has_gpu() and "JAX_DISABLE_MOST_OPTIMIZATIONS" not in os.environ:
    os.environ["JAX_DISABLE_MOST_OPTIMIZATIONS"] = "1"
    jax.config.update("jax_disable_most_optimizations", True)

# Without a GPU, one compilation cache for the whole run, on disk: its workers
# (pytest-xdist) and the child processes they start (the environment carries it) compile
# many of the same programs, and a test that builds a fresh jit of a program compiled
# before (a new lambda, or after jax.clear_caches()) finds it there. Keyed by the
# program's HLO, its options and jax's version, so a hit is the program that would have
# compiled; jax logs "Finished XLA compilation" for a hit too (tests that count compiles
# still see each). With a GPU the programs compile as a user's would (XLA's autotuning
# would share the cache). The first process to load this file (the xdist controller)
# makes the folder and removes it at the end; a JAX_COMPILATION_CACHE_DIR already set is
# used as it is.
_OWN_CACHE = not has_gpu() and "JAX_COMPILATION_CACHE_DIR" not in os.environ
if _OWN_CACHE:
    os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="pallas_pinned_tests_jax_")
    # Every program, however small or quick to compile: the suite's are all small.
    os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
    os.environ["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"] = "0"
if not has_gpu() and os.environ.get("JAX_COMPILATION_CACHE_DIR"):
    jax.config.update("jax_compilation_cache_dir", os.environ["JAX_COMPILATION_CACHE_DIR"])
    jax.config.update("jax_persistent_cache_min_compile_time_secs",
                      float(os.environ.get("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", 1)))
    jax.config.update("jax_persistent_cache_min_entry_size_bytes",
                      int(os.environ.get("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", 0)))

# Property tests (hypothesis) draw the same examples on every run, so that CI is
# reproducible and a failure repeats; each test sets its own (modest) count through
# tests/helpers.py's examples(). HYPOTHESIS_PROFILE=explore draws fresh ones.
_PROFILE = {
    "deadline": None,  # first examples compile: their time says nothing
    "database": None,
    "print_blob": True,
    "suppress_health_check": [HealthCheck.too_slow, HealthCheck.data_too_large,
                              HealthCheck.differing_executors],
}
settings.register_profile("ci", derandomize=True, **_PROFILE)
settings.register_profile("explore", derandomize=False, **_PROFILE)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

# The modules that take longest (15 to 60 s each on 2 cores, longest first: child
# processes, whole notebooks, the largest grids) go first: with several workers (dev.sh:
# pytest-xdist, one module per worker at a time, in this order) the short ones then
# fill in around them and the workers finish together, not one waiting on a long module
# that its name sorted last.
FIRST = ("test_sharded.py", "test_index_dynamic.py", "test_scatter_add.py",
         "test_notebooks.py", "test_index_advanced.py", "test_kept_plans.py",
         "test_semantics.py", "test_index_fuzz.py", "test_sharded_public.py",
         "test_cached_example.py", "test_index_static.py", "test_paths.py",
         "test_gpu_grammar.py", "test_promises.py", "test_sharded_meshes.py",
         "test_provenance.py", "test_index_wrap.py", "test_cached_training.py")


def pytest_unconfigure(config):
    if _OWN_CACHE:
        shutil.rmtree(os.environ["JAX_COMPILATION_CACHE_DIR"], ignore_errors=True)


def pytest_collection_modifyitems(config, items):
    rank = {name: k for k, name in enumerate(FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(FIRST)))  # Stable: others keep order.
    if has_gpu():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (marker 'gpu'); none found")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _interpret_runs_kernels(monkeypatch):
    """Every test: an op called with backend="interpret" must run a Pallas kernel.

    The test modules call the ops themselves (the helpers only see results), so the
    check sits on the ops' one front (``tests/helpers.py``, check_interpret_runs_kernels).
    """
    check_interpret_runs_kernels(monkeypatch)


@pytest.fixture
def rng(request):
    """A different random stream per test case, the same in every process and run.

    Seeded by a CRC of the test id: ``hash()`` of a string changes from one
    process to the next (PYTHONHASHSEED), which would make failures unrepeatable.
    """
    return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))


def _skip_reason(report) -> str:
    longrepr = report.longrepr
    reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
    reason = reason.removeprefix("Skipped: ")
    # "needs a CUDA GPU (marker 'gpu'); none found" -> "needs a CUDA GPU".
    return reason.split(" (", 1)[0].split(";", 1)[0].strip()


def _missing_extra(holder) -> collections.Counter:
    """Skips whose reason names a dependency the [test] extra installs, by reason.

    ``holder`` is the session or the terminal reporter (anything with ``config``).
    """
    reporter = holder.config.pluginmanager.get_plugin("terminalreporter")
    skipped = reporter.stats.get("skipped", []) if reporter else []
    reasons = (_skip_reason(report) for report in skipped)
    return collections.Counter(r for r in reasons if r.startswith(EXTRA_SKIP_REASONS))


def pytest_sessionfinish(session, exitstatus):
    if os.environ.get("CI") == "true" and exitstatus == 0 and _missing_extra(session):
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """One line of skip reasons with their counts, just above pytest's own last line."""
    skipped = terminalreporter.stats.get("skipped", [])
    if not skipped:
        return
    counts = collections.Counter(_skip_reason(report) for report in skipped)
    summary = "; ".join(f"{count} {reason}" for reason, count in counts.most_common())
    terminalreporter.write_line(f"skipped: {summary}")
    missing = _missing_extra(terminalreporter)
    if missing and os.environ.get("CI") == "true":
        terminalreporter.write_line(
            f"FAILED (CI): {sum(missing.values())} tests skipped for a dependency of the "
            f"[test] extra: {dict(missing)}; the extra must install them (triton, jax-triton, "
            "the notebook packages, orbax-checkpoint)",
            red=True,
        )
