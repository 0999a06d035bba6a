"""``pallas_pinned.tuning``: overrides, and defaults from ``$PALLAS_PINNED_TUNING``."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from pallas_pinned import tuning


def _defaults_in_child(setting: str) -> subprocess.CompletedProcess:
    """A fresh interpreter that imports pallas_pinned under ``$PALLAS_PINNED_TUNING``."""
    code = "from pallas_pinned import tuning; print(tuning.current())"
    env = {**os.environ, tuning.ENV: setting, "JAX_PLATFORMS": "cpu"}
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=120)


def test_override_is_scoped_and_validated():
    before = tuning.current()
    with tuning.override(atomic_add_from=0, sort_from=7) as inside:
        assert tuning.current() == inside
        assert (inside.atomic_add_from, inside.sort_from) == (0, 7)
    assert tuning.current() == before
    with pytest.raises(TypeError, match="no_such_threshold; the settings are .*order_kernel_max"):
        with tuning.override(no_such_threshold=1):
            pass
    with pytest.raises(ValueError, match="non-negative"):
        with tuning.override(atomic_add_from=-1):
            pass


def test_environment_sets_the_process_defaults():
    parsed = tuning._from_environment(" sort_from=12, atomic_add_from=0 ,")
    assert parsed == tuning.Thresholds(sort_from=12, atomic_add_from=0)
    assert tuning._from_environment("") == tuning.Thresholds()
    child = _defaults_in_child("sort_from=1,order_kernel_max=16")
    assert child.returncode == 0, child.stderr[-2000:]
    assert "sort_from=1," in child.stdout and "order_kernel_max=16" in child.stdout


def test_at_most_six_thresholds_each_citing_its_measurement():
    import dataclasses
    import pathlib

    names = [field.name for field in dataclasses.fields(tuning.Thresholds)]
    assert len(names) <= 6, names
    source = pathlib.Path(tuning.__file__).read_text()
    performance = (pathlib.Path(tuning.__file__).parents[1] / "docs" / "PERFORMANCE.md")
    thresholds = performance.read_text().split("## Thresholds", 1)[1].split("\n## ", 1)[0]
    for name in names:
        comment = source.split(f"    {name}: int")[0].rsplit("\n\n", 1)[1]
        assert "PERFORMANCE.md" in comment or "benchmarks/results/" in comment, name
        assert f"`{name}`" in thresholds, f"docs/PERFORMANCE.md's Thresholds omit {name}"


@pytest.mark.parametrize("setting, message", [
    ("sort_fro=1", "not name=value with a name of"),
    ("atomic_add_from", "not name=value with a name of"),
    ("atomic_add_from=1k", "takes an int"),
    ("atomic_add_from=-5", "non-negative"),
    ("atomic_add_from=0,atomic_add_from=5", "given twice"),
])
def test_a_bad_environment_entry_names_the_variable(setting, message):
    with pytest.raises(ValueError, match=message) as err:
        tuning._from_environment(setting)
    assert tuning.ENV in str(err.value)


def test_a_bad_environment_fails_the_import_clearly():
    child = _defaults_in_child("sort_from=maybe")
    assert child.returncode != 0
    assert f"${tuning.ENV}: sort_from takes an int" in child.stderr


def test_an_override_holds_in_its_own_asyncio_task_and_thread():
    # A context variable: another task on the same thread, and a thread started inside
    # the block, keep the defaults; a task created inside the block inherits it.
    import asyncio
    import threading

    defaults = tuning.current()
    seen = {}

    async def overriding(entered, done):
        with tuning.override(sort_from=0):
            seen["child task"] = await asyncio.create_task(_current())
            thread = threading.Thread(target=lambda: seen.update(thread=tuning.current()))
            thread.start()
            thread.join()
            entered.set()
            await done.wait()

    async def _current():
        return tuning.current()

    async def other(entered, done):
        await entered.wait()
        seen["other task"] = tuning.current()
        done.set()

    async def main():
        entered, done = asyncio.Event(), asyncio.Event()
        await asyncio.gather(overriding(entered, done), other(entered, done))

    asyncio.run(main())
    assert seen["other task"] == defaults and seen["thread"] == defaults
    assert seen["child task"].sort_from == 0
    assert tuning.current() == defaults


def test_a_users_jit_keeps_the_program_of_its_first_trace():
    # What the module docstring says: JAX's jit cache does not see the settings, so a
    # function jitted by the user keeps its first trace's path; a new function traced
    # inside the block takes the override's.
    import jax
    import jax.numpy as jnp
    import numpy as np

    import pallas_pinned as pp

    pinned = jax.sharding.make_single_device_sharding(jax.devices("cpu")[0],
                                                      memory_kind="pinned_host")
    x = jax.device_put(np.zeros((16, 4), np.float32), pinned)
    i, u = jnp.array([3, 1]), jnp.ones((2, 4), jnp.float32)

    def write(x, i, u):
        return pp.scatter_to_host(x, i, u, backend="interpret")  # Two entries: one launch.

    def path(jitted):
        text = str(jitted.trace(x, i, u).jaxpr)
        return "fused" if "scatter_rows_fused" in text else "rows"

    users = jax.jit(write)
    assert path(users) == "fused"
    with tuning.override(fused_max_updates=0):  # Past the one launch.
        assert path(users) == "fused"
        assert path(jax.jit(write)) == "fused"  # The same function: the same trace.
        assert path(jax.jit(lambda x, i, u: write(x, i, u))) == "rows"


def test_an_override_left_in_another_context_restores_the_settings():
    # An async fixture may enter the block in one task and leave it in another, whose
    # context did not set the variable: leaving must not raise.
    import contextvars

    before = tuning.current()
    block = tuning.override(sort_from=0)
    block.__enter__()
    elsewhere = contextvars.copy_context()
    elsewhere.run(block.__exit__, None, None, None)
    assert elsewhere.run(tuning.current) == before
    tuning._THRESHOLDS.set(before)  # Entered here: leave this context as it was.
    assert tuning.current() == before
