"""The symo.infer package's structure: its modules import each other without a cycle and only at module
level, every module imports on its own in a fresh interpreter, the package imports no higher room, and the
tracer's operation table is assembled explicitly.

The cycle check reads the import statements: a cycle whose modules only take names at the bottom of a file
(as the handler registration once did) imports without error, so running the imports alone cannot see it.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

from symo.infer import handlers, ops, ops_nn
from symo.infer.trace import Tracer

MODULES = ["symo.infer", "symo.infer.axes", "symo.infer.trace", "symo.infer.ops", "symo.infer.ops_nn",
           "symo.infer.handlers", "symo.infer.layout", "symo.infer.names", "symo.infer.verify",
           "symo.infer.inference"]
PACKAGE = Path(__file__).resolve().parents[1] / "symo" / "infer"
# rooms above spec inference, and the sibling rooms of room 3: symo.infer imports none of them
HIGHER = ["symo.optim", "symo.train", "symo.cli", "symo.experiments", "symo.hessian", "symo.laplace", "symo.gauge"]


def _python(code: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)


def _imports(path: Path) -> tuple[set[str], list[str]]:
    """The package's own modules that `path` imports (by file stem; "__init__" for the package itself), and
    the import statements not at module level, as "line: statement"."""
    tree = ast.parse(path.read_text())
    siblings = {p.stem for p in PACKAGE.glob("*.py")}
    at_top = {id(node) for node in tree.body}
    inner, edges = [], set()
    for node in ast.walk(tree):
        if not isinstance(node, (ast.Import, ast.ImportFrom)):
            continue
        if id(node) not in at_top:
            inner.append(f"{node.lineno}: {ast.unparse(node)}")
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            if node.module:
                edges.add(node.module.split(".")[0])
            else:  # `from . import a, b`: the submodules a and b, or names of the package's __init__
                edges |= {a.name if a.name in siblings else "__init__" for a in node.names}
    return edges, inner


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle in `graph` (module -> modules it imports), or None."""
    state: dict[str, str] = {}

    def visit(node: str, path: list[str]) -> list[str] | None:
        state[node] = "open"
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                return path[path.index(nxt):] + [nxt] if nxt in path else [node, nxt]
            if nxt not in state and (found := visit(nxt, path + [nxt])):
                return found
        state[node] = "done"
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start, [start])):
            return found
    return None


def test_no_import_cycle_and_no_import_inside_functions() -> None:
    graph, inner = {}, {}
    for path in sorted(PACKAGE.glob("*.py")):
        graph[path.stem], lines = _imports(path)
        if lines:
            inner[path.name] = lines
    assert _cycle(graph) is None, f"import cycle in symo/infer: {' -> '.join(_cycle(graph))}"
    assert not inner, f"imports inside functions (allowed only for optional heavy dependencies): {inner}"
    assert graph["handlers"] >= {"ops", "ops_nn"} and "handlers" in graph["inference"]


def test_no_module_imports_the_package_root_or_a_higher_room() -> None:
    for path in sorted(PACKAGE.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 2:
                assert node.module and node.module.split(".")[0] in ("compiler", "runtime"), \
                    f"{path.name}:{node.lineno}: {ast.unparse(node)}"
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0 else []
            for name in names:
                assert name.split(".")[0] != "symo" or name.startswith(("symo.compiler", "symo.runtime")), \
                    f"{path.name}:{node.lineno}: {ast.unparse(node)}"


@pytest.mark.parametrize("module", MODULES)
def test_module_imports_alone_in_a_fresh_interpreter(module: str) -> None:
    done = _python(f"import {module}")
    assert done.returncode == 0, done.stderr


def test_package_imports_no_higher_room() -> None:
    done = _python(f"import sys, symo.infer.inference; print([m for m in {HIGHER!r} if m in sys.modules])")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "[]"


def test_operation_table_is_the_union_of_the_handler_modules() -> None:
    assert not ops.HANDLERS.keys() & ops_nn.HANDLERS.keys()  # so the join's order picks no winner
    assert handlers.HANDLERS == {**ops.HANDLERS, **ops_nn.HANDLERS}
    assert {"linear", "add", "view", "cat", "layer_norm", "conv2d"} <= handlers.HANDLERS.keys()
    assert [key for key, _ in handlers.PREFIX_HANDLERS] == ["max_pool", "avg_pool", "adaptive_avg_pool",
                                                            "adaptive_max_pool", "lp_pool"]


def test_tracer_without_handlers_is_refused() -> None:
    with pytest.raises(ValueError, match="handlers"):
        Tracer({})


def test_old_module_paths_alias_the_new_modules_with_a_warning() -> None:
    """symo.infer_trace and the other flat modules of before keep importing, as the same module objects."""
    old = ["axes", "layout", "names", "ops", "ops_nn", "trace", "verify"]
    code = ("import importlib, warnings\n"
            f"for name in {old!r}:\n"
            "    with warnings.catch_warnings(record=True) as caught:\n"
            "        warnings.simplefilter('always')\n"
            "        module = importlib.import_module('symo.infer_' + name)\n"
            "    assert module is importlib.import_module('symo.infer.' + name), name\n"
            "    assert any(w.category is DeprecationWarning and f'moved to symo.infer.{name}' in str(w.message)\n"
            "               for w in caught), name\n"
            "print('ok')\n")
    done = _python(code)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"
