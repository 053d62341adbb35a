"""The store's disk: every file operation it makes, behind one interface with
two implementations (TigerBeetle's real/simulated storage twins; turmoil's
filesystem twin).

- `RealDisk` (here): the operating system, the same system calls the store
  always made (pwrite/pwritev, fdatasync/fsync, posix_fallocate, ftruncate,
  mmap for the recovery scan, flock for the lock); files are opened with
  O_NOFOLLOW, and `size` does not follow a link either.
- `MemoryDisk` (store/sim/memory_disk.py): files are byte arrays with a page
  cache, a power cut and seeded faults, for the simulated cluster.

The interface is two protocols: `Disk` (paths: create, open, list, rename,
unlink, directory fsync, small whole-file reads and writes, the lock) and
`DiskFile` (an open file: positional writes and reads, a read-only map of
the whole file, truncate, fsync/fdatasync, write-back advice).
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
from collections.abc import Sequence
from typing import Any, Protocol

from store.seams.lock import StoreLock

Buffer = bytes | bytearray | memoryview

# Every store file is opened without following a link (ELOOP instead): a
# write through one would change a file outside the store. The open checks
# the layout first (store/layout.py); this covers a link made after that.
NOFOLLOW = os.O_NOFOLLOW


class DiskFile(Protocol):
    """An open file (read-write)."""

    path: str

    def size(self) -> int:
        """The file's size now (fstat)."""

    def pwrite(self, data: Buffer, pos: int) -> int:
        """Write at `pos`; returns how many bytes were written (maybe short)."""

    def pwritev(self, chunks: Sequence[Buffer], pos: int) -> int:
        """Write contiguous chunks at `pos` in one call; returns the bytes
        written (maybe short)."""

    def pread(self, n: int, pos: int) -> bytes:
        """Up to `n` bytes at `pos` (fewer at the end of the file)."""

    def map(self) -> mmap.mmap:
        """A read-only map of the whole file (the recovery scan); the caller
        closes it."""

    def allocate(self, size: int) -> None:
        """Reserve `size` bytes (posix_fallocate, or ftruncate where the
        filesystem cannot) so a full disk shows up now."""

    def truncate(self, size: int) -> None:
        """Set the size (ftruncate): cut, or extend with zeros."""

    def fsync(self) -> None:
        """Make the file's bytes and size durable."""

    def fdatasync(self) -> None:
        """Make the file's bytes durable (and the size they need)."""

    def start_writeback(self, pos: int, n: int) -> None:
        """Advice: start writing [pos, pos+n) to the disk now. No effect on
        durability; errors ignored."""

    def drop_cache(self, pos: int, n: int) -> None:
        """Advice: the cached pages of [pos, pos+n) may go (they are clean)."""

    def close(self) -> None:
        """Close; a second close does nothing."""


class DiskLock(Protocol):
    def release(self) -> None: ...


class Disk(Protocol):
    """The file operations of a store on its directory."""

    def create(self, path: str) -> DiskFile:
        """A new empty file (O_EXCL: FileExistsError if it exists); its
        directory entry is durable only after fsync_dir."""

    def open(self, path: str, *, create: bool = False) -> DiskFile:
        """An existing file, or a new empty one with `create`."""

    def read_file(self, path: str, limit: int | None = None) -> bytes:
        """The first `limit` bytes of a file (all of it without)."""

    def write_file(self, path: str, data: bytes) -> None:
        """Create or replace the contents of `path` with `data` and fsync it
        (not its directory)."""

    def fsync_dir(self, path: str) -> None:
        """Make the entries of directory `path` durable."""

    def makedirs(self, path: str) -> None:
        """Create `path` and its parents where missing."""

    def listdir(self, path: str) -> list[str]:
        """The names in directory `path`, sorted."""

    def exists(self, path: str) -> bool: ...

    def isfile(self, path: str) -> bool: ...

    def isdir(self, path: str) -> bool: ...

    def islink(self, path: str) -> bool: ...

    def size(self, path: str) -> int: ...

    def unlink(self, path: str) -> None: ...

    def rmdir(self, path: str) -> None: ...

    def rename(self, src: str, dst: str) -> None:
        """Atomically replace `dst` with `src` (os.replace); durable after
        fsync_dir of the directory."""

    def free_bytes(self, path: str) -> int:
        """Bytes free to this user on the filesystem holding `path`."""

    def lock(self, path: str) -> DiskLock:
        """Take the store lock at `path`; StoreLockedError when held."""


# --------------------------------------------------------------------- real

def _libc_sync_file_range() -> Any:
    """Linux's sync_file_range(2) (the os module has no binding), or None."""
    try:
        fn = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return fn


_SYNC_FILE_RANGE = _libc_sync_file_range()
_SYNC_FILE_RANGE_WRITE = 2


def _start_writeback(fd: int, pos: int, n: int) -> None:
    """Ask the kernel to start writing [pos, pos+n) of `fd` to the disk now,
    without waiting for it (SYNC_FILE_RANGE_WRITE). Only a head start for the
    fsync that follows, which alone makes the bytes durable: a failure here
    changes nothing and is ignored (the fsync reports any write error)."""
    if _SYNC_FILE_RANGE is not None:
        _SYNC_FILE_RANGE(fd, pos, n, _SYNC_FILE_RANGE_WRITE)


class RealFile:
    """A file descriptor; each method is one system call."""

    __slots__ = ("path", "fd")

    def __init__(self, path: str, fd: int) -> None:
        self.path = path
        self.fd = fd

    def size(self) -> int:
        return os.fstat(self.fd).st_size

    def pwrite(self, data: Buffer, pos: int) -> int:
        return os.pwrite(self.fd, data, pos)

    def pwritev(self, chunks: Sequence[Buffer], pos: int) -> int:
        return os.pwritev(self.fd, chunks, pos)

    def pread(self, n: int, pos: int) -> bytes:
        return os.pread(self.fd, n, pos)

    def map(self) -> mmap.mmap:
        return mmap.mmap(self.fd, 0, prot=mmap.PROT_READ)

    def allocate(self, size: int) -> None:
        try:
            os.posix_fallocate(self.fd, 0, size)
        except OSError as exc:
            if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
                raise
            os.ftruncate(self.fd, size)

    def truncate(self, size: int) -> None:
        os.ftruncate(self.fd, size)

    def fsync(self) -> None:
        os.fsync(self.fd)

    def fdatasync(self) -> None:
        os.fdatasync(self.fd)

    def start_writeback(self, pos: int, n: int) -> None:
        _start_writeback(self.fd, pos, n)

    def drop_cache(self, pos: int, n: int) -> None:
        os.posix_fadvise(self.fd, pos, n, os.POSIX_FADV_DONTNEED)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class RealDisk:
    """The operating system's filesystem."""

    def create(self, path: str) -> RealFile:
        return RealFile(path, os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644))

    def open(self, path: str, *, create: bool = False) -> RealFile:
        flags = os.O_RDWR | NOFOLLOW | (os.O_CREAT if create else 0)
        return RealFile(path, os.open(path, flags, 0o644))

    def read_file(self, path: str, limit: int | None = None) -> bytes:
        with open(os.open(path, os.O_RDONLY | NOFOLLOW), "rb") as f:
            return f.read() if limit is None else f.read(limit)

    def write_file(self, path: str, data: bytes) -> None:
        # O_NOFOLLOW fails before O_TRUNC could empty a link's target.
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | NOFOLLOW, 0o644)
        with open(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())

    def fsync_dir(self, path: str) -> None:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def makedirs(self, path: str) -> None:
        os.makedirs(path, exist_ok=True)

    def listdir(self, path: str) -> list[str]:
        return sorted(os.listdir(path))

    def exists(self, path: str) -> bool:
        return os.path.exists(path)

    def isfile(self, path: str) -> bool:
        return os.path.isfile(path)

    def isdir(self, path: str) -> bool:
        return os.path.isdir(path)

    def islink(self, path: str) -> bool:
        return os.path.islink(path)

    def size(self, path: str) -> int:
        return os.stat(path, follow_symlinks=False).st_size

    def unlink(self, path: str) -> None:
        os.unlink(path)

    def rmdir(self, path: str) -> None:
        os.rmdir(path)

    def rename(self, src: str, dst: str) -> None:
        os.replace(src, dst)

    def free_bytes(self, path: str) -> int:
        fs = os.statvfs(path)
        return fs.f_bavail * fs.f_frsize

    def lock(self, path: str) -> StoreLock:
        return StoreLock(path)
