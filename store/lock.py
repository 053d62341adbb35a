"""The store's `lock` file: an exclusive flock held while a process has the
store open, with the holder's pid written in it so a second opener can say who."""

from __future__ import annotations

import fcntl
import os


class StoreLockedError(RuntimeError):
    """Another process has this store directory open."""


class StoreLock:
    def __init__(self, path: str) -> None:
        self.path = path
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(self.fd, 32, 0).decode("ascii", "replace").strip() or "unknown"
            os.close(self.fd)
            self.fd = -1
            raise StoreLockedError(
                f"store {os.path.dirname(path) or '.'} is in use by process {holder} "
                f"(lock file {path}); stop that process or choose another directory"
            ) from None
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, f"{os.getpid()}\n".encode(), 0)

    def release(self) -> None:
        if self.fd >= 0:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = -1
