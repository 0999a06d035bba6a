"""Every ```python block of README.md runs as printed, on CPU.

The README is the first code people copy, so each python block is executed
verbatim. Choices, and why:

* **One fresh interpreter per block** (a subprocess, so a fresh namespace
  too): a reader pastes one block, not the whole page, so each block must
  define what it uses. A subprocess also means that a block which aborts the
  process (XLA's ``Check failed`` kills it with SIGABRT) fails its own test
  instead of taking pytest down.
* **CPU only** (``JAX_PLATFORMS=cpu``): CI has no GPU, and on a GPU machine the
  GPU suite covers the kernels; here the point is that the text runs as shown.
  CPU JAX has a ``pinned_host`` memory kind, so the blocks take the same
  memory-kind paths, with XLA's fallback instead of the kernel.
* Blocks fenced as anything else (``bash``, plain ```` ``` ````) are not run.
* The blocks themselves use modest sizes (tens of MiB at most), so there is
  nothing to shrink here; a block that needs a GPU-sized buffer is a README bug.

The README's shape is pinned too: its size, where its first example starts, that
every results file the docs cite exists, and that its two commands are dev.sh's.

The second half re-checks, on the installed jax, the rules of jnp's index modes
(``x.at[i].get/set/add(..., mode=...)``) that the ops follow ("the other modes are
jnp's"; ``scatter_to_host``'s docstring states them).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
BLOCK_TIMEOUT_S = 300  # Generous: a cold CI machine compiles slowly; the blocks take seconds.

# An opening fence of three or more backticks naming python, up to the same fence alone on a line.
FENCE = re.compile(
    r"^(?P<indent>[ \t]*)(?P<fence>`{3,})[ \t]*python[ \t]*\n"
    r"(?P<body>.*?)"
    r"^(?P=indent)(?P=fence)[ \t]*$",
    re.MULTILINE | re.DOTALL,
)


def python_blocks(text: str) -> list[tuple[str, int, str]]:
    """(nearest heading, line number of the fence, code) for every ```python block, in order."""
    blocks = []
    for match in FENCE.finditer(text):
        line = text.count("\n", 0, match.start()) + 1
        headings = re.findall(r"^#+[ \t]+(.+)$", text[: match.start()], re.MULTILINE)
        indent = match.group("indent")
        body = "".join(
            row[len(indent) :] if row.startswith(indent) else row
            for row in match.group("body").splitlines(keepends=True)
        )
        blocks.append((headings[-1].strip() if headings else "(top)", line, body))
    return blocks


BLOCKS = python_blocks(README.read_text())
README_MAX_BYTES = 12_000  # A reader's ten minutes (the docs issue's target: 12 KB).
FIRST_EXAMPLE_BY_LINE = 120
# The documents whose figures cite result files: each cited file must be committed.
CITING_DOCS = ("README.md", "docs/PERFORMANCE.md", "docs/GPU_RUNS.md", "benchmarks/README.md")
RESULT_PATH = re.compile(r"benchmarks/results/[A-Za-z0-9_./{},-]*[A-Za-z0-9_/}]")
# A result named without its folder, in backticks: `loop_quick_h200.json`, `sparse_hot_h200_x/`.
BARE_RESULT = re.compile(r"`([A-Za-z0-9_]+_h[12]00[A-Za-z0-9_./{},*-]*)`")


def test_readme_has_python_blocks():
    # Guards the extraction itself: a changed fence style must not silently test nothing.
    assert len(BLOCKS) >= 2, f"found {len(BLOCKS)} ```python blocks in README.md"


def test_readme_is_short_and_starts_with_an_example():
    size = len(README.read_bytes())
    assert size <= README_MAX_BYTES, f"README.md is {size} bytes; at most {README_MAX_BYTES}"
    first = BLOCKS[0][1]
    assert first <= FIRST_EXAMPLE_BY_LINE, f"the first python block starts at line {first}"


def _expand_braces(path: str) -> list[str]:
    """``a.{json,log}`` -> ``a.json``, ``a.log`` (one brace group, as the docs write them)."""
    match = re.search(r"\{([^{}]*)\}", path)
    if not match:
        return [path]
    head, tail = path[: match.start()], path[match.end() :]
    return [head + part + tail for part in match.group(1).split(",")]


@pytest.mark.parametrize("doc", CITING_DOCS)
def test_every_cited_result_file_is_committed(doc):
    text = (REPO / doc).read_text()
    cited = sorted({p for raw in RESULT_PATH.findall(text) for p in _expand_braces(raw)})
    missing = [p for p in cited if p != "benchmarks/results/" and not (REPO / p).exists()]
    results = REPO / "benchmarks" / "results"
    for raw in BARE_RESULT.findall(text):
        for name in _expand_braces(raw):
            if not list(results.glob(name.rstrip("/"))):
                missing.append(f"benchmarks/results/{name}")
    assert not missing, f"{doc} cites result files that are not in the tree: {missing}"
    # A probe kept in git history is cited with its commit (be68706:docs/lab/...).
    in_tree = re.sub(r"\b[0-9a-f]{7,40}:docs/lab/", "", text)
    assert "docs/lab" not in in_tree, f"{doc} still points into docs/lab/, which is gone"


def test_readme_commands_are_dev_sh_commands():
    commands = set(re.findall(r"^bash dev\.sh (\w+)", README.read_text(), re.MULTILINE))
    assert commands == {"demo", "test"}, commands
    dev_sh = (REPO / "dev.sh").read_text()
    for command in commands:
        assert re.search(rf"^\s*{command}\)", dev_sh, re.MULTILINE), f"dev.sh has no {command!r}"


def test_fence_parser():
    text = "# A\n```python\nx = 1\n```\n```bash\nls\n```\n## B\n  ```python\n  y = 2\n  ```\n"
    assert python_blocks(text) == [("A", 2, "x = 1\n"), ("B", 9, "y = 2\n")]


@pytest.mark.parametrize(
    "heading, line, code",
    BLOCKS,
    ids=[f"L{line}-{re.sub(r'[^A-Za-z0-9]+', '_', h).strip('_')}" for h, line, _ in BLOCKS],
)
def test_readme_block_runs_on_cpu(heading, line, code, tmp_path):
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env.pop("XLA_FLAGS", None)  # The block must run with the defaults a reader has.
    script = tmp_path / f"readme_L{line}.py"
    script.write_text(code)
    try:
        result = subprocess.run(
            [sys.executable, str(script)],
            cwd=tmp_path,  # Not the checkout: the block must import the installed package.
            env=env,
            capture_output=True,
            text=True,
            timeout=BLOCK_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"README.md line {line} ({heading}): still running after {e.timeout} s")
    how = (
        f"killed by signal {-result.returncode}"
        if result.returncode < 0
        else f"exit status {result.returncode}"
    )
    assert result.returncode == 0, (
        f"README.md line {line} ({heading}) failed on CPU: {how}\n--- code ---\n{code}"
        f"--- stdout ---\n{result.stdout[-3000:]}\n--- stderr ---\n{result.stderr[-5000:]}"
    )


# --- jnp's index modes, as the ops follow them, re-checked on the installed jax. -----------------
# CI installs the newest jax, so a change in jnp's rules shows up here instead of silently
# falsifying what the README and the ops' docstrings say.

_ROWS = 5
_INDICES = np.array([0, 4, -1, -5, -6, 5, 7, -12])  # in range, wrapping once, out of range


def _wrapped(indices: np.ndarray) -> np.ndarray:
    """Negative indices wrap once, as in numpy (-1 is the last row; -6 of 5 stays negative)."""
    return np.where(indices < 0, indices + _ROWS, indices)


def _readme_get(x: np.ndarray, mode, fill) -> np.ndarray:
    rows = _wrapped(_INDICES)
    if mode in ("fill", "drop"):
        inside = (rows >= 0) & (rows < _ROWS)
        return np.where(inside, x[np.clip(rows, 0, _ROWS - 1)], fill)
    return x[np.clip(rows, 0, _ROWS - 1)]  # None and "clip": clamp into range


def _readme_write(x: np.ndarray, op: str, mode, updates: np.ndarray) -> list[set[float]]:
    """Per row, the values the README's rules allow after the write.

    jnp leaves the winner among duplicates unspecified, so a set allows any update aimed at the
    row; an add has one answer.
    """
    aimed: list[list[float]] = [[] for _ in range(_ROWS)]
    for row, u in zip(_wrapped(_INDICES), updates, strict=True):
        if mode == "clip":
            row = min(max(row, 0), _ROWS - 1)
        elif not 0 <= row < _ROWS:  # None, "drop" and "fill" skip rows still out of range.
            continue
        aimed[row].append(float(u))
    if op == "add":
        return [{float(x[r]) + sum(aimed[r])} for r in range(_ROWS)]
    return [set(aimed[r]) or {float(x[r])} for r in range(_ROWS)]


@pytest.mark.parametrize(
    ("dtype", "default_fill"),
    [
        ("float32", np.nan),
        ("bfloat16", np.nan),
        ("int32", -(2**31)),  # signed: the type's minimum
        ("uint8", 255),  # unsigned: the type's maximum
        ("bool", True),
    ],
)
@pytest.mark.parametrize("mode", [None, "clip", "fill", "drop"])
def test_jnp_get_modes_are_as_the_readme_states(dtype, default_fill, mode):
    base = np.arange(_ROWS) % 2 == 1 if dtype == "bool" else np.arange(_ROWS) * 10
    x = jnp.asarray(base, dtype)
    got = np.asarray(x.at[jnp.asarray(_INDICES)].get(mode=mode), np.float64)
    want = _readme_get(np.asarray(x, np.float64), mode, np.float64(default_fill))
    np.testing.assert_array_equal(got, want, err_msg=f"jax {jax.__version__}: get mode={mode}")


@pytest.mark.parametrize("op", ["set", "add"])
@pytest.mark.parametrize("mode", [None, "clip", "drop", "fill"])
def test_jnp_write_modes_are_as_the_readme_states(op, mode):
    x = jnp.arange(_ROWS, dtype=jnp.float32) * 10
    # Distinct updates, so the row a write landed in shows which index wrote it.
    updates = 100 + np.arange(_INDICES.size, dtype=np.float32)
    got = getattr(x.at[jnp.asarray(_INDICES)], op)(jnp.asarray(updates), mode=mode)
    allowed = _readme_write(np.asarray(x), op, mode, updates)
    got_rows = [float(v) for v in np.asarray(got)]
    bad = [(r, v, a) for r, (v, a) in enumerate(zip(got_rows, allowed, strict=True)) if v not in a]
    assert not bad, f"jax {jax.__version__}: {op} mode={mode}: (row, got, allowed) {bad}"
