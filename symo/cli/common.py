"""What every `symo` command shares: the user-error exception, `--model module:factory` and `--shapes`
/ `--size` parsing, and one-line error descriptions. Only the standard library: `symo --help` loads it."""

from __future__ import annotations

import importlib
import json
import os
import sys
from pathlib import Path


class CommandError(Exception):
    """A user error on the command line: main() prints `error: <message>` (no traceback) and returns
    `status`: 2 for input refused as given (a bad spec, a bad option value, a usage error, as argparse's),
    1 for something that failed while running (a model that does not import or build, an unreadable file)."""

    def __init__(self, message: str, status: int = 1) -> None:
        super().__init__(message)
        self.status = status


def _import(module: str):
    """Import `module` as `python -m` does: the current folder comes first on sys.path, so
    `--model mymodels:factory` finds ./mymodels.py (the `symo` console script alone would not)."""
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
        importlib.invalidate_caches()
    return importlib.import_module(module)


def _short(text: str, limit: int = 120) -> str:
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _load_factory(text: str):
    label = _short(text, 300)  # for the messages
    module, _, attr = text.partition(":")
    if not attr:
        raise CommandError(f"--model expects module:factory (e.g. symo.train.models:gpt_small), got {label!r}", 2)
    try:
        factory = getattr(_import(module), attr)
    except (ImportError, AttributeError) as exc:
        raise CommandError(f"--model {label!r}: {_short(str(exc), 300)}") from None
    except Exception as exc:  # the module itself failed (empty name, a syntax error, an error at import)
        raise CommandError(f"--model {label!r}: importing {module!r} raised {type(exc).__name__}: {exc}") from None
    if not callable(factory):
        raise CommandError(f"--model {label!r}: {attr} is not callable (give a function or class returning an "
                           "nn.Module)")
    try:
        model = factory()
    except Exception as exc:  # the user's factory: report it, without a traceback
        raise CommandError(f"--model {label!r}: the factory raised {type(exc).__name__}: {exc}") from None
    if not callable(getattr(model, "named_parameters", None)):
        raise CommandError(f"--model {label!r}: the factory returned {type(model).__name__}, not an nn.Module")
    return model


def _parse_shapes(text: str) -> dict[str, tuple[int, ...]]:
    """`name=16x8,other=16` or a path to a JSON file {name: [16, 8]}."""
    try:
        is_file = Path(text).is_file()
    except (OSError, ValueError):  # a name too long for the file system: not a file, so read it as name=shape
        is_file = False
    if is_file:
        try:
            data = json.loads(Path(text).read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise CommandError(f"--shapes {_short(text)}: cannot read a JSON object {{name: [dims]}} ({exc})") from None
        if not isinstance(data, dict) or not all(isinstance(v, list) for v in data.values()):
            raise CommandError(f"--shapes {_short(text)}: expected a JSON object {{name: [dims]}}, "
                             'e.g. {"fc1.weight": [16, 8]}')
        return {k: tuple(v) for k, v in data.items()}
    shapes = {}
    for item in filter(None, text.split(",")):
        name, sep, dims = item.partition("=")
        try:
            if not sep:
                raise ValueError
            shapes[name.strip()] = tuple(int(d) for d in dims.lower().split("x"))
        except ValueError:
            raise CommandError(f"--shapes: cannot read {_short(item)!r}; write name=16x8,other=16 or a JSON file",
                               2) from None
    return shapes


def _parse_sizes(items: list[str]) -> dict[str, int]:
    sizes = {}
    for item in items:
        name, _, value = item.partition("=")
        if not (value.isascii() and value.isdigit()):  # "1²".isdigit() is True, int("1²") fails
            raise CommandError(f"--size expects space=N (e.g. head{{i}}=4), got {_short(item)!r}", 2)
        if name in sizes and sizes[name] != int(value):
            raise CommandError(f"--size gives {_short(name)!r} twice, {sizes[name]} and {value}; give it once", 2)
        sizes[name] = int(value)
    return sizes


def _describe(exc: BaseException, limit: int = 1000) -> str:
    """An unexpected error in one line of bounded length: an OSError by its reason and (shortened) file."""
    if isinstance(exc, OSError) and exc.filename is not None:
        name = str(exc.filename)
        return f"{exc.strerror or type(exc).__name__}: {name if len(name) <= 120 else name[:117] + '...'}"
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _spec_error() -> type[Exception] | tuple[()]:
    """symo.SpecError if the compiler was imported (a SpecError can only come from it), else nothing to catch."""
    errors = sys.modules.get("symo.compiler.errors")
    return errors.SpecError if errors is not None else ()
