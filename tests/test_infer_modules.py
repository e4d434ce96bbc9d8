"""The symo.infer package's structure at run time: every module imports on its own (no other module of
symo loaded before it), the package loads no higher room, and the tracer's operation table is assembled
explicitly. (The import rules read from the source, cycles included, are tests/test_architecture.py's,
for every module.)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from symo.infer import handlers, ops, ops_nn, ops_shape
from symo.infer.trace import Tracer

MODULES = ["symo.infer", "symo.infer.axes", "symo.infer.trace", "symo.infer.ops", "symo.infer.ops_shape",
           "symo.infer.ops_nn", "symo.infer.handlers", "symo.infer.layout", "symo.infer.names", "symo.infer.verify",
           "symo.infer.inference"]
# rooms above spec inference, and the sibling rooms of room 3: symo.infer imports none of them
HIGHER = ["symo.optim", "symo.train", "symo.cli", "symo.experiments", "symo.hessian", "symo.laplace", "symo.gauge"]


def _python(code: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)


@pytest.fixture(scope="module")
def imported_alone() -> dict[str, str]:
    """module -> "" or the error of importing it with no module of symo loaded: one interpreter, whose
    sys.modules is emptied of symo's modules before each import (torch and sympy stay loaded)."""
    code = ("import importlib, json, sys, traceback\n"
            "errors = {}\n"
            f"for name in {MODULES!r}:\n"
            "    for loaded in [m for m in sys.modules if m == 'symo' or m.startswith('symo.')]:\n"
            "        del sys.modules[loaded]\n"
            "    try:\n"
            "        importlib.import_module(name)\n"
            "        errors[name] = ''\n"
            "    except Exception:\n"
            "        errors[name] = traceback.format_exc()\n"
            "print(json.dumps(errors))\n")
    done = _python(code)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.parametrize("module", MODULES)
def test_module_imports_alone(module: str, imported_alone: dict[str, str]) -> None:
    assert imported_alone[module] == "", imported_alone[module]


@pytest.mark.slow
def test_package_imports_no_higher_room() -> None:
    done = _python(f"import sys, symo.infer.inference; print([m for m in {HIGHER!r} if m in sys.modules])")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "[]"


def test_operation_table_is_the_union_of_the_handler_modules() -> None:
    tables = [ops.HANDLERS, ops_shape.HANDLERS, ops_nn.HANDLERS]
    for i, a in enumerate(tables):  # no name in two tables, so the join's order picks no winner
        for b in tables[i + 1:]:
            assert not a.keys() & b.keys()
    assert handlers.HANDLERS == {**ops.HANDLERS, **ops_shape.HANDLERS, **ops_nn.HANDLERS}
    assert {"linear", "add", "view", "cat", "layer_norm", "conv2d"} <= handlers.HANDLERS.keys()
    assert [key for key, _ in handlers.PREFIX_HANDLERS] == ["max_pool", "avg_pool", "adaptive_avg_pool",
                                                            "adaptive_max_pool", "lp_pool"]


def test_tracer_without_handlers_is_refused() -> None:
    with pytest.raises(ValueError, match="handlers"):
        Tracer({})
