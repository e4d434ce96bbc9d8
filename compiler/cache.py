"""Stage 5, cache: generated source by key, in memory and in a user-owned directory on disk.

Entries are content-addressed by the key (a hash of spec and shapes) and signed with an HMAC whose
secret lives beside them (mode 0600), so a corrupt or tampered entry fails verification and is
rebuilt, never executed. A cache directory that is not ours, or that others can write, is not used.
Writes are atomic (temporary file + rename), so a crash never leaves half an entry.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import stat
import tempfile
import warnings
from pathlib import Path

import platformdirs

from .emit import EMIT_VERSION

ENV_VAR = "SYMO_CACHE_DIR"
SECRET_BYTES = 32
# The key scheme: bumped with the emitter, so entries written by another emitter are never looked up
# (they stay on disk, unused, until the user clears the directory).
KEY_FORMAT = f"symo-kernel/emitter-{EMIT_VERSION}"


def cache_key_text(material: str) -> str:
    """The text an entry's key hashes: the key format, then what the source depends on."""
    return f"{KEY_FORMAT}|{material}"


def default_cache_dir() -> Path:
    """$SYMO_CACHE_DIR if set, else the platform's user cache folder (platformdirs)."""
    if os.environ.get(ENV_VAR):
        return Path(os.environ[ENV_VAR]).expanduser()
    return Path(platformdirs.user_cache_dir("symo", appauthor=False)) / "kernels"


class DiskCache:
    """Signed source files `<key>.py` + `<key>.mac` under one directory."""

    def __init__(self, directory: Path | None = None) -> None:
        self.directory = Path(directory) if directory else default_cache_dir()
        self._secret: bytes | None = None
        self.usable = self._prepare()

    def _prepare(self) -> bool:
        try:
            self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
            st = self.directory.stat()
        except OSError as exc:
            warnings.warn(f"symo: kernel cache {self.directory} unusable ({exc}); compiling in memory only",
                          stacklevel=3)
            return False
        if hasattr(os, "getuid") and (st.st_uid != os.getuid() or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)):
            warnings.warn(f"symo: kernel cache {self.directory} is not owned by you or is writable by "
                          f"others; not using it (set {ENV_VAR} to a private directory)", stacklevel=3)
            return False
        return True

    def _key_file(self) -> bytes:
        """The HMAC secret; a missing or damaged one (wrong length, unreadable) is replaced, which
        invalidates every entry signed with the old one (they are rebuilt)."""
        if self._secret is None:
            path = self.directory / ".secret"
            try:
                secret = path.read_bytes()
            except OSError:
                secret = b""
            if len(secret) != SECRET_BYTES:
                self._atomic_write(path, secrets.token_bytes(SECRET_BYTES))
                secret = path.read_bytes()
                if len(secret) != SECRET_BYTES:
                    raise OSError(f"cannot keep a secret in {path}")
            self._secret = secret
        return self._secret

    def _mac(self, key: str, source: str) -> bytes:
        return hmac.new(self._key_file(), f"{key}\0{source}".encode(), hashlib.sha256).hexdigest().encode()

    def path(self, key: str) -> Path:
        return self.directory / f"{key}.py"

    def load(self, key: str) -> str | None:
        """The verified source for `key`, or None (missing, corrupt or tampered: caller rebuilds).
        Any damage to the directory, the entry or the secret is a miss, never an exception."""
        if not self.usable:
            return None
        try:
            source = self.path(key).read_text(encoding="utf-8")
            mac = (self.directory / f"{key}.mac").read_bytes().strip()
            good = hmac.compare_digest(mac, self._mac(key, source))
        except (OSError, UnicodeError, ValueError):
            return None
        if not good:
            warnings.warn(f"symo: cache entry {self.path(key)} failed verification; rebuilding it",
                          stacklevel=3)
            return None
        return source

    def store(self, key: str, source: str) -> Path | None:
        if not self.usable:
            return None
        try:
            self._atomic_write(self.path(key), source.encode())
            self._atomic_write(self.directory / f"{key}.mac", self._mac(key, source))
        except (OSError, UnicodeError, ValueError) as exc:
            warnings.warn(f"symo: could not write the kernel cache ({exc})", stacklevel=3)
            return None
        return self.path(key)

    def _atomic_write(self, path: Path, data: bytes) -> None:
        fd, tmp = tempfile.mkstemp(dir=self.directory, prefix=".tmp-")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.chmod(tmp, 0o600)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
