"""Runs a notebook's code cells, in order, as one plain Python program.

For machines without Jupyter (such as the GPU machine): only the standard
library is needed to read the notebook. Cells share one namespace, run in the
notebook's folder (as Jupyter does), with matplotlib on the headless Agg
backend; figures are saved as PNG files when ``--figures DIR`` is given.

Usage::

    python notebooks/run_as_script.py notebooks/01_dynamic_indices_on_pinned_host.ipynb \
        [--figures DIR] [--dump SCRIPT.py]

Exits non-zero, naming the cell, when a cell raises.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import sys
import time
import traceback
from pathlib import Path


def code_cells(notebook: Path) -> list[str]:
    """The source of every code cell, IPython magics and shell escapes commented out."""
    cells = json.loads(notebook.read_text())["cells"]
    sources = []
    for cell in cells:
        if cell.get("cell_type") != "code":
            continue
        source = cell["source"]
        source = "".join(source) if isinstance(source, list) else source
        # Magics (%time, !pip ...) are not Python; the notebooks here do not rely on them.
        lines = [
            f"# {line}" if line.lstrip().startswith(("%", "!")) else line
            for line in source.splitlines()
        ]
        sources.append("\n".join(lines))
    return sources


def run_cell(source: str, name: str, namespace: dict) -> None:
    """Executes one cell; echoes the value of a trailing expression, as Jupyter shows it."""
    tree = ast.parse(source, filename=name)
    last = tree.body[-1] if tree.body and isinstance(tree.body[-1], ast.Expr) else None
    if last is not None:
        tree.body.pop()
    exec(compile(tree, name, "exec"), namespace)
    if last is not None:
        value = eval(compile(ast.Expression(last.value), name, "eval"), namespace)
        if value is not None:
            print(repr(value))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("notebook", type=Path)
    parser.add_argument("--figures", type=Path, help="save every figure here as PNG")
    parser.add_argument("--dump", type=Path, help="write the cells as one script here, do not run")
    args = parser.parse_args(argv)

    notebook = args.notebook.resolve()
    cells = code_cells(notebook)
    if args.dump:
        body = "\n\n".join(f"# %% cell {k}\n{src}" for k, src in enumerate(cells))
        args.dump.write_text(body + "\n")
        print(f"wrote {len(cells)} cells to {args.dump}")
        return 0

    os.environ.setdefault("MPLBACKEND", "Agg")
    if args.figures:
        os.environ["NOTEBOOK_FIGURES_DIR"] = str(args.figures.resolve())
    os.chdir(notebook.parent)
    namespace = {"__name__": "__main__", "__file__": str(notebook)}
    for k, source in enumerate(cells):
        name = f"<{notebook.name} cell {k}>"
        print(f"# ---- cell {k} ----", flush=True)
        start = time.perf_counter()
        try:
            run_cell(source, name, namespace)
        except Exception:
            traceback.print_exc()
            print(f"FAILED in {name}", file=sys.stderr)
            return 1
        print(f"# ---- cell {k} done in {time.perf_counter() - start:.1f} s ----", flush=True)
    print(f"OK: {notebook.name} ran {len(cells)} code cells")
    return 0


if __name__ == "__main__":
    sys.exit(main())
