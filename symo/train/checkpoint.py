"""Training checkpoints: written atomically, read with `weights_only=True`, checked against the run's settings.

A checkpoint holds plain data only (tensors, numbers, strings, lists, dicts), so `torch.load(...,
weights_only=True)` reads it and loading one never runs code from the file. Writing goes to a temporary
file in the same folder, which is fsynced and then renamed over the old one: a crash or Ctrl-C during
the write leaves the previous checkpoint whole. A full disk is reported as such.

Reading checks every record's CRC-32 first: torch.save writes a zip archive whose records carry one, but
torch.load does not check it, so a flipped bit in a tensor would load as altered weights.
"""

from __future__ import annotations

import errno
import os
import shutil
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from .config import spec_reference

FORMAT = "symo-train-1"
# What every checkpoint of symo train holds besides its format and settings (a resume reads each).
REQUIRED = ("model", "optimizer", "step", "history", "base_lrs")
# Settings that older checkpoints lack: such a run was written before the option existed, so it ran with this value
NEWER_SETTINGS: dict[str, Any] = {"precondition_frequency": None, "symo_options": {}}


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be used for this run; the file is left as it was."""


def save_checkpoint(path: str | Path, payload: Mapping[str, Any]) -> Path:
    """torch.save {"format": FORMAT, **payload} to `path` atomically (see `save_atomic`)."""
    return save_atomic(path, {"format": FORMAT, **payload})


def save_atomic(path: str | Path, obj: Any) -> Path:
    """torch.save to `path` atomically (temporary file in the same folder, fsync, rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        with open(tmp, "wb") as fh:
            torch.save(obj, fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except (OSError, RuntimeError) as exc:
        cause = _os_error(exc)  # torch.save turns a failed write into RuntimeError("enforce fail ..."): the cause
        if cause is not None and cause.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)):
            free = shutil.disk_usage(path.parent).free
            what = "the disk is full" if cause.errno == errno.ENOSPC else "the disk quota is exceeded"
            raise OSError(cause.errno, f"{what} ({free / 1e6:.1f} MB free in {path.parent}): the checkpoint could "
                          "not be written and the previous one was kept. Free some space, then continue with "
                          f"`symo train --resume {path.parent}`", str(path)) from None
        raise
    finally:
        if tmp.exists():
            tmp.unlink()
    return path


def load_checkpoint(path: str | Path, expected: Mapping[str, Any], map_location: str | torch.device = "cpu"
                    ) -> dict[str, Any]:
    """Read a checkpoint (weights_only) and check that its settings equal `expected`.

    Raises CheckpointError, naming the file and the settings that differ, for a missing, unreadable
    or corrupt file and for one written with other model / optimizer / schedule settings.
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: no checkpoint to resume from; start without --resume, or give the "
                              "--out-dir of the run to continue")
    try:
        damaged = damaged_record(path)
    except (zipfile.BadZipFile, OSError, EOFError, ValueError) as exc:
        raise CheckpointError(f"{path}: cannot read the checkpoint (not a whole zip archive: {str(exc)[:200]}); the "
                              "file is corrupt or not a symo train checkpoint. It was left as it is; start a new run "
                              "with another --out-dir") from None
    if damaged is not None:
        raise CheckpointError(f"{path}: the checkpoint is corrupt: its record {damaged!r} fails its CRC-32 check (a "
                              "flipped bit on disk or a broken copy), so its weights cannot be trusted. It was left as "
                              "it is; resume from an intact copy, or start a new run with another --out-dir")
    try:
        blob = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as exc:
        raise CheckpointError(f"{path}: cannot read the checkpoint ({type(exc).__name__}: {str(exc)[:200]}); "
                              "the file is corrupt or not a symo train checkpoint. It was left as it is; "
                              "start a new run with another --out-dir") from None
    if not isinstance(blob, dict) or blob.get("format") != FORMAT:
        raise CheckpointError(f"{path}: not a symo train checkpoint (format {FORMAT!r}); it was left as it is")
    missing = [k for k in REQUIRED if k not in blob]
    if missing:
        raise CheckpointError(f"{path}: the checkpoint lacks {', '.join(repr(k) for k in missing)} (every symo train "
                              f"checkpoint holds {', '.join(REQUIRED)}); it was not written whole by symo train. It "
                              "was left as it is; start a new run with another --out-dir")
    saved = blob.get("settings", {})
    saved = {k: saved.get(k, NEWER_SETTINGS.get(k, "<missing>")) for k in expected}
    if "spec" in saved:  # a run started before spec files were recorded by absolute path: this folder's file
        saved["spec"] = spec_reference(saved["spec"])
    diff = {k: (saved[k], v) for k, v in expected.items() if saved[k] != v}
    if diff:
        lines = ", ".join(f"{_flag(k)}: checkpoint {a!r} vs now {b!r}" for k, (a, b) in sorted(diff.items()))
        raise CheckpointError(f"{path}: the checkpoint was written with other settings ({lines}). Resume with the "
                              "checkpoint's settings (`--resume RUN_DIR` alone takes them all from the checkpoint), "
                              "or start a new run with another --out-dir; the checkpoint was left as it is")
    return blob


def damaged_record(path: str | Path) -> str | None:
    """The name of the first record of a zip archive (what torch.save writes) whose CRC-32 does not match
    its bytes, or None when all match. Raises zipfile.BadZipFile for a file that is not a whole archive."""
    with zipfile.ZipFile(path) as archive:
        return archive.testzip()


def _os_error(exc: BaseException) -> OSError | None:
    """The OSError behind `exc` (itself, or one it was raised while handling), if any."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, OSError):
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None


def _flag(key: str) -> str:
    """A setting's command-line option (--n-embd for n_embd); the corpus's name and vocabulary come from --data."""
    return {"vocab": "vocabulary of --data", "data": "--data", "symo_options": "--symo-option"}.get(
        key, "--" + key.replace("_", "-"))
