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
        # O_NOFOLLOW: the pid below must not be written through a link into
        # a file outside the store (store/layout.py refuses one first).
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
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


def lock_holder(path: str) -> int | None:
    """The pid holding the store lock at `path` now, found without taking it
    (a reader must not make a starting node fail to lock): Linux lists every
    flock in /proc/locks by device and inode. None when nobody holds it, or
    where /proc/locks does not exist."""
    try:
        st = os.stat(path, follow_symlinks=False)
        with open("/proc/locks", encoding="ascii", errors="replace") as f:
            lines = f.readlines()
    except OSError:
        return None
    written = _pid_in(path)
    for line in lines:
        # "1: FLOCK  ADVISORY  WRITE 3084 fd:01:1183877 0 EOF" ("->" lines wait)
        fields = line.split()
        if len(fields) < 6 or fields[1] != "FLOCK" or fields[3] != "WRITE":
            continue
        dev, _, ino = fields[5].rpartition(":")
        if not ino.isdigit() or int(ino) != st.st_ino or not fields[4].isdigit():
            continue
        pid = int(fields[4])
        # The device as stat sees it; on overlay filesystems /proc/locks
        # names the layer below, so the pid the holder wrote decides.
        if dev == f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}" or pid == written:
            return pid
    return None


def _pid_in(path: str) -> int | None:
    try:
        with open(os.open(path, os.O_RDONLY | os.O_NOFOLLOW), "rb") as f:
            text = f.read(32).decode("ascii", "replace").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None
