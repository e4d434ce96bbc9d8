"""Progress bars that suit where they are written: tqdm's bar on a terminal, plain periodic lines
elsewhere (a log file, a pipe, CI), so that a redirected run's log is readable text instead of one
long line of carriage returns.

    from symo.train.progress import progress
    for x in progress(items, desc="runs"): ...
    bar = progress(total=500, unit="step"); bar.update(1); bar.set_postfix_str("loss 1.8"); bar.close()
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable, Iterator
from typing import Any, TextIO


def _is_terminal(stream: TextIO) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # a closed or unusual stream: not a terminal
        return False


def progress(iterable: Iterable | None = None, *, total: int | None = None, desc: str | None = None,
             unit: str = "it", initial: int = 0, disable: bool = False, file: TextIO | None = None,
             interval: float = 30.0, **tqdm_options: Any) -> Any:
    """tqdm on a terminal; on anything else a `PlainProgress` that writes one line at the start, at
    most every `interval` seconds, and at the end. Both take `update`, `set_postfix_str`, `close`."""
    stream = sys.stderr if file is None else file
    if _is_terminal(stream):
        from tqdm.auto import tqdm  # only on a terminal: a log file or `symo --help` never loads it

        return tqdm(iterable, total=total, desc=desc, unit=unit, initial=initial, disable=disable, file=file,
                    **tqdm_options)
    return PlainProgress(iterable, total=total, desc=desc, unit=unit, initial=initial, disable=disable,
                         file=stream, interval=interval)


class PlainProgress:
    """Plain-text progress: `desc: 120/500 steps (24%), 41 s, loss 1.82` as whole lines."""

    def __init__(self, iterable: Iterable | None = None, *, total: int | None = None, desc: str | None = None,
                 unit: str = "it", initial: int = 0, disable: bool = False, file: TextIO | None = None,
                 interval: float = 30.0) -> None:
        self.iterable, self.desc, self.unit, self.disable = iterable, desc, unit, disable
        if total is None and iterable is not None and hasattr(iterable, "__len__"):
            total = len(iterable)  # type: ignore[arg-type]
        self.total, self.n, self.start_n = total, initial, initial
        self.file, self.interval = file, interval
        self.postfix = ""
        self.t0 = time.monotonic()
        self.last: float | None = None
        self.printed_n: int | None = None
        self.closed = False

    def __iter__(self) -> Iterator:
        for item in self.iterable or ():
            yield item
            self.update(1)
        self.close()

    def __enter__(self) -> PlainProgress:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def set_postfix_str(self, text: str = "", refresh: bool = True) -> None:
        self.postfix = text

    def set_description(self, desc: str | None = None, refresh: bool = True) -> None:
        self.desc = desc

    def update(self, n: int = 1) -> None:
        self.n += n
        now = time.monotonic()
        if self.last is None or now - self.last >= self.interval:
            self._line(now)

    def refresh(self) -> None:
        self._line(time.monotonic())

    def write(self, text: str) -> None:
        if not self.disable:
            print(text, file=self.file or sys.stderr, flush=True)

    def close(self) -> None:
        if not self.closed and self.printed_n != self.n:
            self._line(time.monotonic())
        self.closed = True

    def _line(self, now: float) -> None:
        self.last, self.printed_n = now, self.n
        if self.disable:
            return
        count = f"{self.n}/{self.total}" if self.total else f"{self.n}"
        singular = self.unit in ("it", "B") or self.unit.endswith("s") or (self.total or self.n) == 1
        units = self.unit if singular else self.unit + "s"
        share = f" ({100 * self.n / self.total:.0f}%)" if self.total else ""
        elapsed = now - self.t0
        rate = (self.n - self.start_n) / elapsed if elapsed > 0 and self.n > self.start_n else None
        parts = [f"{count} {units}{share}", f"{elapsed:.0f} s"]
        if rate:
            parts.append(f"{rate:.3g} {self.unit}/s")
        if self.postfix:
            parts.append(self.postfix)
        print((f"{self.desc}: " if self.desc else "") + ", ".join(parts), file=self.file or sys.stderr, flush=True)
