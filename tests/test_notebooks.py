"""The notebooks run top to bottom, and are stored without outputs.

Each notebook checks its own results (against numpy) with asserts, so running
it is the test. On a CPU-only machine they pick small sizes and take seconds;
the kernels run in Jupyter kernels (nbclient + ipykernel) in the notebooks'
own folder, with matplotlib on the headless Agg backend.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import NOTEBOOK_PACKAGES_MISSING

NOTEBOOKS_DIR = Path(__file__).resolve().parents[1] / "notebooks"
NOTEBOOKS = (
    "01_dynamic_indices_on_pinned_host.ipynb",
    "02_pcie_scatter_performance.ipynb",
    "03_replay_buffer.ipynb",
    "04_index_forms.ipynb",
)
# Notebook 03 runs top to bottom through run_as_script.py, as on the GPU machine
# (test_run_as_script_runs_a_notebook): its cells need nothing of Jupyter's,
# whose kernel the other three exercise.
IN_JUPYTER = tuple(name for name in NOTEBOOKS if name != NOTEBOOKS[2])
HAVE_MATPLOTLIB = importlib.util.find_spec("matplotlib") is not None
CELL_TIMEOUT_S = 300  # Generous: a cold CI machine compiles slowly; the real runs take seconds.


def _notebook_client():
    """nbclient's NotebookClient and nbformat, or a skip saying what CI must install."""
    missing = []
    for module in ("nbclient", "nbformat", "ipykernel"):
        try:
            __import__(module)
        except ImportError:
            missing.append(module)
    if missing:
        pytest.skip(
            f"{NOTEBOOK_PACKAGES_MISSING}: {', '.join(missing)}; pip install -e '.[test]' "
            "(nbclient, nbformat, ipykernel, matplotlib) to run the notebooks"
        )
    import nbformat
    from nbclient import NotebookClient

    return NotebookClient, nbformat


@pytest.mark.parametrize("name", IN_JUPYTER)
def test_notebook_runs_top_to_bottom(name, tmp_path, monkeypatch):
    NotebookClient, nbformat = _notebook_client()
    # The kernel inherits the environment: headless plots, figures saved to a scratch folder.
    monkeypatch.setenv("MPLBACKEND", "Agg")
    monkeypatch.setenv("NOTEBOOK_FIGURES_DIR", str(tmp_path))
    notebook = nbformat.read(NOTEBOOKS_DIR / name, as_version=4)
    client = NotebookClient(
        notebook,
        timeout=CELL_TIMEOUT_S,
        kernel_name="python3",
        resources={"metadata": {"path": str(NOTEBOOKS_DIR)}},
    )
    client.execute()  # Raises CellExecutionError, with the cell and traceback, on failure.
    if HAVE_MATPLOTLIB:
        assert list(tmp_path.glob("*.png")), f"{name} drew no figure"


def _synthetic_record(case: str, provider: str, pattern: str, dtype: str, row_bytes: int,
                      n: int, median: float) -> dict:
    """The fields notebook 02 reads, which benchmarks.one_call and benchmarks.sweep share."""
    return {
        "case": case,
        "provider": provider,
        "pattern": pattern,
        "dtype": dtype,
        "row_bytes": row_bytes,
        "n_updates": n,
        "median_s": median,
        "min_s": median,
        "max_s": median,
        "gbps": n * row_bytes / median / 1e9,
        "updates_per_s": n / median,
        "ceiling_gbps": 50.0,
        "correct": True,
        "status": "ok",
    }


def _synthetic_results() -> dict:
    """A results file in benchmarks.one_call's layout, with made-up numbers (never shown as data).

    Two providers whose curves cross, two batch sizes and two dtypes per point (the notebook
    keeps one), a failed record, a skipped one and two errors (all left out of the plots; the
    failed one and the errors are named).
    """
    records = []
    for provider, per_update_s, per_byte_s in (("ours", 2e-9, 2e-11), ("xla", 1e-9, 8e-11)):
        for pattern in ("random_unique", "sorted"):
            for row_bytes in (4, 64, 512, 4096):
                for n, dtype in ((1024, "float32"), (4096, "float32"), (4096, "bfloat16")):
                    median = n * (per_update_s + per_byte_s * row_bytes)
                    median /= 4 if pattern == "sorted" else 1
                    case = f"{pattern}-{dtype}-{row_bytes}B-n{n}"
                    record = _synthetic_record(case, provider, pattern, dtype, row_bytes, n, median)
                    records.append(dict(record, target_case=n == 4096, b2b_gbps=None))
    records[0] = dict(records[0], correct=False)
    records.append(dict(records[1], provider="skipped", gbps=None,
                        status="skipped: time budget of 70 s used up"))
    for k in (3, 4):  # a provider that raised (float32 cases): said, not hidden
        records.append(dict(records[k], provider="raised", gbps=None, median_s=None,
                            status="error", error="RuntimeError: Could not create cache dir"))
    meta = {
        "benchmark": "one_call",
        "sweep": "full",
        "date_utc": "2026-12-02T00:00:00+00:00",
        "jax": "0.11.2",
        "jax_backend": "gpu",
        "device_kind": "NVIDIA H200 (synthetic test data)",
    }
    return {"meta": meta, "records": records, "summary": ["x"]}


def _synthetic_sweep_results() -> dict:
    """An older file in benchmarks.sweep's layout (commit dd078c7): the only one that has the
    kernel without its sort (ours_nocoalesce), on random rows 4 times slower than on sorted."""
    records = []
    for provider in ("ours_nocoalesce", "ours"):
        for pattern, median in (("random_unique", 4e-4), ("sorted", 1e-4)):
            case = f"float32[262144|16]n1024-{pattern}"
            record = _synthetic_record(case, provider, pattern, "float32", 64, 1024, median)
            records.append(dict(record, row_elems=16, payload_bytes=64 * 1024))
    meta = {
        "sweep": "full",
        "date_utc": "2026-11-01T00:00:00+00:00",
        "jax_backend": "gpu",
        "device_kind": "NVIDIA H200 (synthetic test data)",
    }
    return {"meta": meta, "records": records, "memory_probes": [], "summary": {"note": "x"}}


def _run_notebook_02(results: Path, figures: Path, monkeypatch) -> str:
    """Executes notebook 02 on the results folder ``results``; returns its printed text."""
    NotebookClient, nbformat = _notebook_client()
    monkeypatch.setenv("PALLAS_PINNED_RESULTS", str(results))
    monkeypatch.setenv("MPLBACKEND", "Agg")
    monkeypatch.setenv("NOTEBOOK_FIGURES_DIR", str(figures))
    notebook = nbformat.read(NOTEBOOKS_DIR / NOTEBOOKS[1], as_version=4)
    NotebookClient(
        notebook,
        timeout=CELL_TIMEOUT_S,
        kernel_name="python3",
        resources={"metadata": {"path": str(NOTEBOOKS_DIR)}},
    ).execute()
    return "\n".join(
        out.get("text", "") for cell in notebook.cells for out in cell.get("outputs", [])
    )


def test_notebook_02_reads_a_results_file(tmp_path, monkeypatch):
    # The committed results change only with GPU runs; this runs the loading, crossover and
    # plotting code on files in the benchmarks' two layouts whose answers are known.
    results = tmp_path / "results"
    results.mkdir()
    (results / "bench_scatter_synthetic.json").write_text(json.dumps(_synthetic_results()))
    (results / "sweep_synthetic.json").write_text(json.dumps(_synthetic_sweep_results()))
    text = _run_notebook_02(results, tmp_path, monkeypatch)
    assert "plotting: results file bench_scatter_synthetic.json" in text, text[:2000]
    assert "1 records failed their correctness check" in text, text[:2000]
    assert "2 records are errors" in text, text[:3000]
    assert "raised: 2 cases: RuntimeError: Could not create cache dir" in text, text[:3000]
    assert "ours vs xla" in text, "the two synthetic providers cross; the table should say where"
    # one_call has no kernel without its sort: what order alone buys comes from the older sweep.
    assert "from results file sweep_synthetic.json" in text, text[-5000:]
    order = "64-byte rows, 1024 updates: order alone takes the kernel from 2.56 to 10.24 M"
    assert order in text, text[-5000:]
    # The other result files are absent here: the notebook must say so, not fill in numbers.
    assert "No GPU results of benchmarks.gather_add (at commit dd078c7)" in text, text[-3000:]
    assert "No loop results (loop*.json of benchmarks.loop)" in text, text[-3000:]


def test_notebook_02_without_results_says_so(tmp_path, monkeypatch):
    # No results at all (say, a fresh clone without benchmarks/results/): every section that
    # reads records says there are none, and the live run still checks itself.
    text = _run_notebook_02(tmp_path / "missing", tmp_path, monkeypatch)
    assert "No GPU results of benchmarks.one_call" in text, text[:3000]
    assert "No tuning records (benchmarks.tune's crossover study, at commit dd078c7" in text
    assert "No loop results (loop*.json of benchmarks.loop)" in text, text[-3000:]
    # The kernel runs where this process does: LIVE on a GPU, a labelled smoke run on CPU.
    import jax

    live = jax.default_backend() == "gpu"
    assert ("LIVE" if live else "CPU SMOKE RUN (not PCIe") in text, text[-3000:]
    assert "plotting:" not in text, "nothing to plot, yet the notebook claims a source"


def test_run_as_script_runs_a_notebook(tmp_path):
    # The GPU machine has no Jupyter: run_as_script.py is how the notebooks run there.
    # Notebook 03, the quickest, runs only here; the others share its cell mechanics.
    script = NOTEBOOKS_DIR / "run_as_script.py"
    notebook = NOTEBOOKS_DIR / NOTEBOOKS[2]
    command = [sys.executable, str(script), str(notebook), "--figures", str(tmp_path)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert f"OK: {NOTEBOOKS[2]}" in result.stdout
    if HAVE_MATPLOTLIB:
        assert (tmp_path / "03_step_time.png").exists(), result.stdout[-2000:]


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_is_stored_without_outputs(name):
    # Outputs hold machine-specific numbers and bloat diffs; the notebooks make them afresh.
    cells = json.loads((NOTEBOOKS_DIR / name).read_text())["cells"]
    code = [c for c in cells if c["cell_type"] == "code"]
    assert code, f"{name} has no code cells"
    dirty = [k for k, c in enumerate(code) if c.get("outputs") or c.get("execution_count")]
    assert not dirty, f"{name}: code cells {dirty} carry outputs; clear them before committing"
