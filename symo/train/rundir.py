"""The run folder of `symo train`, claimed for the life of a run.

`claim_run_folder` makes the folder, checks that files can be written in it (so an unwritable --out-dir
is found before the first step, not at the first checkpoint), takes an exclusive lock on its
`.symo-train.lock` file, and removes the temporary files that killed runs left behind
(`.ckpt.pt.tmp<pid>`, `.log.csv.tmp<pid>`). A second run with the same --out-dir is refused while the
first one lives. The lock is the operating system's (flock on POSIX, msvcrt.locking on Windows), so it
goes with its process: the lock file of a run killed with kill -9 is taken over by the next run, and
the lock file itself is left in place (deleting it would let two runs lock two different files).
Under torchrun, rank 0 claims the folder and every rank learns the outcome.
"""

from __future__ import annotations

import importlib
import os
import time
from pathlib import Path

import torch.distributed as dist

# the operating system's file lock, released when its process ends: flock on POSIX, locking on Windows
_LOCKS = importlib.import_module("fcntl" if os.name == "posix" else "msvcrt")

LOCK_NAME = ".symo-train.lock"
# What an interrupted atomic write leaves (checkpoint.save_checkpoint, runlog.write_csv): f".{name}.tmp{pid}"
TEMPORARY_PATTERNS = (".ckpt.pt.tmp*", ".log.csv.tmp*")


class RunFolderError(RuntimeError):
    """The run folder cannot be used: another run holds it, or it cannot be written."""


class RunFolder:
    """A claimed run folder; `release()` (or the end of the process) frees it."""

    def __init__(self, path: Path, fd: int | None, removed: list[Path]) -> None:
        self.path, self.fd, self.removed = path, fd, removed

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)  # closing the descriptor releases the lock
            self.fd = None


def claim_run_folder(path: Path, rank: int = 0, world: int = 1) -> RunFolder:
    """Claim `path` for this run (rank 0 does the work; every rank raises the same RunFolderError)."""
    folder, error = None, None
    if rank == 0:
        try:
            folder = _claim(Path(path))
        except RunFolderError as exc:
            error = str(exc)
    if world > 1:
        shared = [error]
        dist.broadcast_object_list(shared, src=0)
        error = shared[0]
    if error is not None:
        raise RunFolderError(error)
    return folder if folder is not None else RunFolder(Path(path), None, [])


def _claim(path: Path) -> RunFolder:
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".symo-write-test{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise RunFolderError(f"--out-dir {_short(path)}: cannot write in this folder ({exc.strerror or exc}); the "
                             "checkpoint and the log go there. Choose a folder you can write with --out-dir, or fix "
                             "its permissions") from None
    lock = path / LOCK_NAME
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
    if not _try_lock(fd):
        holder = os.read(fd, 200).decode("utf-8", "replace").strip() or "unknown"
        os.close(fd)
        raise RunFolderError(f"--out-dir {_short(path)}: another symo train run is using this folder (its lock file is "
                             f"held: {holder}). Wait for that run to end (or stop it), or choose another --out-dir")
    os.ftruncate(fd, 0)
    os.write(fd, f"process {os.getpid()}, started {time.strftime('%Y-%m-%d %H:%M:%S')}\n".encode())
    removed = []
    for pattern in TEMPORARY_PATTERNS:  # no other run writes here now: every such file is a killed run's
        for stale in path.glob(pattern):
            try:
                stale.unlink()
                removed.append(stale)
            except OSError:
                pass  # not ours to remove (another owner): harmless, it is never read
    return RunFolder(path, fd, removed)


def _try_lock(fd: int) -> bool:
    """Take the exclusive lock without waiting; False when another process holds it."""
    try:
        if os.name == "posix":
            _LOCKS.flock(fd, _LOCKS.LOCK_EX | _LOCKS.LOCK_NB)
        else:
            _LOCKS.locking(fd, _LOCKS.LK_NBLCK, 1)
    except OSError:
        return False
    return True


def _short(path: Path, limit: int = 200) -> str:
    """A path for a message, cut in the middle when longer than `limit` characters."""
    text = str(path)
    return text if len(text) <= limit else f"{text[:limit // 2 - 2]}...{text[-(limit // 2 - 1):]}"
