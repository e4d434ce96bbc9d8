"""The one error type of the compiler: a bad spec, with where it is and how to fix it."""

from __future__ import annotations

import difflib
from collections.abc import Iterable

MAX_NAME = 80  # a name longer than this is shortened in messages, so an error stays readable


def short(text: str, limit: int = MAX_NAME) -> str:
    """`text` cut to `limit` characters with an ellipsis: long names never flood a message."""
    text = str(text)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def few(names: Iterable[object], limit: int = 8) -> str:
    """A list of names for a hint, truncated: "['a', 'b', ... 40 more]"."""
    items = [short(str(n)) for n in names]
    shown = ", ".join(repr(n) for n in items[:limit])
    return f"[{shown}{f', ... {len(items) - limit} more' if len(items) > limit else ''}]"


def did_you_mean(name: object, options: Iterable[str], cutoff: float = 0.75) -> str:
    """' (did you mean 'x'?)' naming the option nearest to a misspelt `name`, or '' when none is near."""
    close = difflib.get_close_matches(str(name), list(options), n=1, cutoff=cutoff)
    return f" (did you mean {close[0]!r}?)" if close else ""


class SpecError(ValueError):
    """A spec that cannot be compiled.

    The message always names the file, the TOML key and (where it applies) the parameter and axis,
    and ends with a hint on how to fix it, so a user never has to read compiler code.
    """

    def __init__(
        self,
        message: str,
        *,
        file: str | None = None,
        key: str | None = None,
        param: str | None = None,
        axis: int | None = None,
        hint: str | None = None,
    ) -> None:
        self.file, self.key, self.param, self.axis, self.hint = file, key, param, axis, hint
        self.reason = message
        where = []
        if file:
            where.append(f"{file}")
        if key:
            where.append(f"key {short(key)!r}")
        if param:
            where.append(f"parameter {short(param)!r}")
        if axis is not None:
            where.append(f"axis {axis}")
        text = (", ".join(where) + ": " if where else "") + message
        if hint:
            text += f"\n  how to fix: {hint}"
        super().__init__(text)
