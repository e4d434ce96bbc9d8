"""The one error type of the compiler: a bad spec, with where it is and how to fix it."""

from __future__ import annotations


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
            where.append(f"key {key!r}")
        if param:
            where.append(f"parameter {param!r}")
        if axis is not None:
            where.append(f"axis {axis}")
        text = (", ".join(where) + ": " if where else "") + message
        if hint:
            text += f"\n  how to fix: {hint}"
        super().__init__(text)
