"""The package's shape: imports run one way (no cycle, inside functions included), small modules.

Layers, top to bottom: the public ops (``scatter``, ``scatter_add``,
``scatter_combine``, ``gather``, ``at``, ``order``) → ``_front`` → the sharded layer
(``_sharded``, ``_sharded_route``) → the local layer (``_local_write``,
``_local_read``) → shared helpers → ``pallas_pinned.kernels``. This test
reads every import statement of every module, at any depth, and checks that
the graph has no cycle and that no module imports a layer above its own.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PUBLIC = {"scatter", "scatter_add", "scatter_combine", "gather", "at", "order"}
LAYERS = [  # Highest first; a module may import only its own layer or lower ones.
    {"__init__", "__main__"},
    {"cached_table"},  # and every _cache_* module (_layer)
    PUBLIC,
    {"_front"},
    {"_sharded", "_sharded_route"},
    {"_local_write", "_local_read"},
]
TOOLS = {"testing"}  # Serves tests and benchmarks, never the ops.


def _modules() -> dict[str, pathlib.Path]:
    found = {f"pallas_pinned.{p.stem}": p for p in (ROOT / "pallas_pinned").glob("*.py")}
    found |= {f"pallas_pinned.kernels.{p.stem}": p for p in (ROOT / "kernels").glob("*.py")}
    return found


def _imports(name: str, path: pathlib.Path, modules: dict) -> set[str]:
    """The package modules ``name`` imports, anywhere in its source: import statements
    (a package, or a name its ``__init__`` defines, counts as its ``__init__``) and
    ``importlib.import_module`` of a literal or f-string name (its literal prefix)."""
    package = name.rsplit(".", 1)[0]

    def resolve(target: str) -> str | None:
        target = target.rstrip(".")
        for candidate in (target, f"{target}.__init__"):
            if candidate in modules:
                return candidate
        return None

    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found = [resolve(alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # Relative: from .x import y / from . import y.
                base = ".".join([package] + ([base] if base else []))
            found = [resolve(f"{base}.{alias.name}") or resolve(base) for alias in node.names]
        elif (
            isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "import_module"
            and node.args
        ):
            arg = node.args[0]
            if isinstance(arg, ast.JoinedStr) and arg.values:
                arg = arg.values[0]
            literal = arg.value if isinstance(arg, ast.Constant) else None
            found = [resolve(literal)] if isinstance(literal, str) else []
        else:
            continue
        out |= {t for t in found if t is not None and t.startswith("pallas_pinned")}
    return out


def _graph():
    modules = _modules()
    return {
        name: {t for t in _imports(name, path, modules) if t != name}
        for name, path in modules.items()
    }


def _layer(name: str) -> int | None:
    if name.startswith("pallas_pinned.kernels"):
        return len(LAYERS) + 1
    stem = name.rsplit(".", 1)[1]
    if stem.startswith("_cache"):  # The cached table's private modules, however many.
        return 1
    for depth, layer in enumerate(LAYERS):
        if stem in layer:
            return depth
    return None if stem in TOOLS else len(LAYERS)  # A shared helper.


def test_no_import_cycle_anywhere():
    graph = _graph()
    state: dict[str, int] = {}

    def visit(node, path):
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycle = path[path.index(nxt):] + [nxt]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])


def test_imports_run_one_way():
    wrong = []
    for name, targets in _graph().items():
        mine = _layer(name)
        for target in targets:
            theirs = _layer(target)
            if mine is None or theirs is None:
                if target.endswith(".testing") and not name.endswith(".__main__"):
                    wrong.append(f"{name} imports {target}")
                continue
            if theirs < mine:
                wrong.append(f"{name} (layer {mine}) imports {target} (layer {theirs})")
    assert not wrong, "\n".join(wrong)


def test_kernels_never_import_the_package_above_them():
    for name, targets in _graph().items():
        if name.startswith("pallas_pinned.kernels"):
            assert all(t.startswith("pallas_pinned.kernels") for t in targets), (name, targets)


def test_modules_stay_small():
    # The benchmarks too: they are scripts, but read as code, and grew past the limit once.
    paths = [*_modules().values(), *(ROOT / "benchmarks").glob("*.py")]
    sizes = {str(p.relative_to(ROOT)): len(p.read_text().splitlines()) for p in paths}
    big = {name: lines for name, lines in sizes.items() if lines > 400}
    assert not big, big


def test_the_testing_modules_backends_are_the_ops_own():
    # testing.py loads none of the ops' modules, so it spells them out; they must agree.
    from pallas_pinned import _validation, testing

    assert testing.BACKENDS == _validation.BACKENDS


def test_the_import_reader_sees_the_package_root_and_import_module(tmp_path):
    # What a helper could otherwise use to reach a public op unseen.
    source = tmp_path / "_rows.py"
    source.write_text(
        "import importlib\nimport pallas_pinned\nfrom pallas_pinned import scatter_to_host\n"
        "from . import _block\nimportlib.import_module('pallas_pinned.at')\n"
        "importlib.import_module(f'pallas_pinned.kernels.{name}')\n"
    )
    found = _imports("pallas_pinned._rows", source, _modules())
    assert found == {
        "pallas_pinned.__init__", "pallas_pinned._block", "pallas_pinned.at",
        "pallas_pinned.kernels.__init__",
    }, found
    assert _layer("pallas_pinned.__init__") == 0  # The public layer: upward from a helper.


def test_no_library_or_kernel_line_cites_a_gpu_a_date_or_a_session():
    # Measurements live in docs/PERFORMANCE.md and are cited by name; code says why.
    import re

    anecdote = re.compile(r"\b(H100|H200|A100)\b|\b20\d\d-\d\d-\d\d\b|\b[Ss]ession \d+|"
                          r"\b\d\d:\d\d UTC\b|docs/lab")
    found = [f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
             for path in _modules().values()
             for n, line in enumerate(path.read_text().splitlines(), 1)
             if anecdote.search(line)]
    assert not found, "\n".join(found)
