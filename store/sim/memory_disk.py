"""MemoryDisk: the simulated twin of store/seams/disk.py's RealDisk, behind the same
`Disk`/`DiskFile` protocols.

Files are byte arrays. Every write lands in a page cache and becomes
durable only when that file is fsynced; a directory entry (create, rename,
unlink) becomes durable only when its directory is fsynced, as on
ext4/POSIX. `crash()` returns the disk a power cut leaves: the durable
state, torn where a fault says so.

MemoryDisk faults (what the simulated cluster injects, docs/simulation.md), each drawn
from one seeded `random.Random` and recorded in `faults` (a list of dicts a
run can save as JSON):
- `torn-op` at a crash: one unsynced write of a file keeps a prefix of its
  bytes; `torn-seq`: some unsynced writes of a file survive, in order. Other
  unsynced writes are lost whole.
- `fsync-eio`: an fsync/fdatasync fails with EIO; as on Linux, the file's
  pending write-back is then dropped (the pages read back as written but are
  not durable, and a later fsync does not make them so).
- `read-corruption`: a latent error in a range of a file: reads return
  flipped bytes until the range is written again. Drawn only for reads of
  bytes that come from the medium: those a crash left (the file's durable
  length when this disk came up) before the first write to the file since
  (a log appends: what follows is its page cache's).
A fault whose probability is zero draws nothing from the generator, so
turning one fault on does not change when the others strike. MemoryDisk is
deterministic: no threads, no clock, every listing sorted. A lock
serialises its state so the store's flush thread may call it.

Simplifications (said so the simulation does not over-claim): directories
made with makedirs are durable at once; fsync and fdatasync both make the
file's size and bytes durable; a file's bytes are not torn within a write
except by `torn-op`.
"""

from __future__ import annotations

import errno
import mmap
import os
import random
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from store.config import ConfigError
from store.seams.clock import Clock
from store.seams.disk import Buffer
from store.seams.lock import StoreLockedError


@dataclass(frozen=True)
class DiskFaults:
    """Probabilities of MemoryDisk's faults (each drawn from the disk's one
    random generator). Per operation: `fsync_eio` per fsync/fdatasync,
    `read_corruption` per read (a latent error in a range of the read).
    Per crash and file with unsynced writes: `torn_write`, the chance the
    crash tears them (`torn-op` or `torn-seq`, even odds) instead of losing
    them whole."""

    fsync_eio: float = 0.0
    read_corruption: float = 0.0
    torn_write: float = 0.0

    def validate(self) -> DiskFaults:
        for name in ("fsync_eio", "read_corruption", "torn_write"):
            p = getattr(self, name)
            if not 0.0 <= p <= 1.0:
                raise ConfigError(f"disk fault probability {name}={p} must be in [0, 1]")
        return self


NO_FAULTS = DiskFaults()


@dataclass(frozen=True)
class Kept:
    """What a crash keeps of one file's unsynced writes, chosen instead of
    drawn (MemoryDisk.crash's `kept`): its first `whole` pending operations
    (writes and size changes, in order), then the first `torn_bytes` bytes
    of the next write (0: nothing of it)."""

    whole: int
    torn_bytes: int = 0


# A pending operation of a file: (pos, bytes) for a write, (size, None) for a size change.
PendingOp = tuple[int, bytes | None]


@dataclass
class _Inode:
    """One file's bytes: `data` as reads see them (the page cache),
    `durable` as a power cut leaves them, `pending` the writes and size
    changes between them, in order."""

    data: bytearray = field(default_factory=bytearray)
    durable: bytearray = field(default_factory=bytearray)
    pending: list[PendingOp] = field(default_factory=list)
    bad: list[tuple[int, int]] = field(default_factory=list)  # latent errors: [start, end)
    media_end: int = 0  # bytes [0, media_end) came from the medium (a crash's survivors)


def _apply(buf: bytearray, pos: int, data: bytes | None) -> None:
    if data is None:  # a size change
        if pos < len(buf):
            del buf[pos:]
        else:
            buf.extend(bytes(pos - len(buf)))
        return
    if pos > len(buf):
        buf.extend(bytes(pos - len(buf)))
    buf[pos:pos + len(data)] = data


def _eio(path: str) -> OSError:
    return OSError(errno.EIO, os.strerror(errno.EIO), path)


@dataclass
class _Dir:
    entries: dict[str, _Inode | None] = field(default_factory=dict)  # None: a directory
    durable: dict[str, _Inode | None] = field(default_factory=dict)


def _kept_survivor(inode: _Inode, kept: Kept) -> _Inode:
    """The inode after a crash that keeps what `kept` says of its pending
    operations (MemoryDisk.crash's `kept`)."""
    data = bytearray(inode.durable)
    pending = inode.pending
    if not 0 <= kept.whole <= len(pending):
        raise ValueError(f"kept {kept.whole} whole operations of {len(pending)}")
    for pos, chunk in pending[:kept.whole]:
        _apply(data, pos, chunk)
    if kept.torn_bytes:
        pos, chunk = pending[kept.whole] if kept.whole < len(pending) else (0, None)
        if chunk is None or not 0 < kept.torn_bytes < len(chunk):
            raise ValueError(f"cannot keep {kept.torn_bytes} bytes of operation {kept.whole}")
        _apply(data, pos, chunk[:kept.torn_bytes])
    return _Inode(data=bytearray(data), durable=data, bad=list(inode.bad), media_end=len(data))


class MemoryFile:
    """An open file of a MemoryDisk."""

    def __init__(self, disk: MemoryDisk, path: str, inode: _Inode) -> None:
        self.disk = disk
        self.path = path
        self._inode = inode
        self._open = True

    def _live(self) -> _Inode:
        if not self._open:
            raise OSError(errno.EBADF, "file is closed", self.path)
        if self.disk.crashed:
            raise OSError(errno.EIO, "the disk crashed (power cut)", self.path)
        return self._inode

    def size(self) -> int:
        with self.disk.mutex:
            return len(self._live().data)

    def pwrite(self, data: Buffer, pos: int) -> int:
        with self.disk.mutex:
            self.disk.write(self._live(), pos, bytes(data))
        self.disk.observed("write", self.path)
        return len(data)

    def pwritev(self, chunks: Sequence[Buffer], pos: int) -> int:
        joined = b"".join(chunks)
        with self.disk.mutex:
            self.disk.write(self._live(), pos, joined)
        self.disk.observed("write", self.path)
        return len(joined)

    def pread(self, n: int, pos: int) -> bytes:
        with self.disk.mutex:
            return self.disk.read(self.path, self._live(), pos, n)

    def map(self) -> mmap.mmap:
        with self.disk.mutex:
            inode = self._live()
            data = self.disk.read(self.path, inode, 0, len(inode.data))
        if not data:
            raise ValueError("cannot mmap an empty file")
        m = mmap.mmap(-1, len(data))
        m.write(data)
        m.seek(0)
        return m

    def allocate(self, size: int) -> None:
        with self.disk.mutex:
            inode = self._live()
            if size <= len(inode.data):
                return
            self.disk.resize(inode, size)
        self.disk.observed("write", self.path)

    def truncate(self, size: int) -> None:
        with self.disk.mutex:
            self.disk.resize(self._live(), size)
        self.disk.observed("write", self.path)

    def fsync(self) -> None:
        with self.disk.mutex:
            self.disk.sync(self.path, self._live())
        self.disk.observed("fsync", self.path)

    def fdatasync(self) -> None:
        self.fsync()

    def start_writeback(self, pos: int, n: int) -> None:
        pass

    def drop_cache(self, pos: int, n: int) -> None:
        pass

    def close(self) -> None:
        self._open = False


class _MemoryLock:
    def __init__(self, disk: MemoryDisk, path: str) -> None:
        self.disk = disk
        self.path = path

    def release(self) -> None:
        with self.disk.mutex:
            if self.disk.locks.get(self.path) is self:
                del self.disk.locks[self.path]


class MemoryDisk:
    """A deterministic in-memory disk with a page cache (see the module
    docstring). `rng` drives every probabilistic fault; `faults` records
    each one injected (with the simulated time from `clock`, if given)."""

    def __init__(self, rng: random.Random | None = None, faults: DiskFaults = NO_FAULTS,
                 clock: Clock | None = None) -> None:
        self.rng = rng if rng is not None else random.Random(0)
        self.fault_rates = faults.validate()
        self.clock = clock  # stamps each recorded fault (`at_ms`) when given
        self.faults: list[dict[str, Any]] = []
        self.mutex = threading.RLock()
        self.crashed = False
        self.locks: dict[str, _MemoryLock] = {}
        self._dirs: dict[str, _Dir] = {"/": _Dir()}
        self._fail_fsyncs: set[str] = set()
        # Told (kind, path) after each change of what a crash could leave:
        # "write" (a write or size change), "fsync", "dir-fsync" (an
        # exploration's crash points, chaos/explore/). None: nobody listens.
        self.observe: Callable[[str, str], None] | None = None

    # ------------------------------------------------------------- paths
    @staticmethod
    def _norm(path: str) -> str:
        return os.path.normpath(os.path.join("/", path))

    def _parent(self, path: str) -> tuple[_Dir, str]:
        p = self._norm(path)
        parent, name = os.path.split(p)
        d = self._dirs.get(parent)
        if d is None:
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), path)
        return d, name

    def _inode(self, path: str) -> _Inode:
        d, name = self._parent(path)
        if name not in d.entries:
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), path)
        inode = d.entries[name]
        if inode is None:
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), path)
        return inode

    def _check(self) -> None:
        if self.crashed:
            raise OSError(errno.EIO, "the disk crashed (power cut)")

    # ------------------------------------------------------- file content
    def write(self, inode: _Inode, pos: int, data: bytes) -> None:
        # From the first write on, the cache holds what follows (a log's
        # appends): only the bytes before it are still read from the medium.
        inode.media_end = min(inode.media_end, pos)
        _apply(inode.data, pos, data)
        inode.pending.append((pos, data))
        end = pos + len(data)
        inode.bad = [(a, b) for a, b in inode.bad if b <= pos or a >= end]  # rewritten: healed

    def resize(self, inode: _Inode, size: int) -> None:
        inode.media_end = min(inode.media_end, size)
        _apply(inode.data, size, None)
        inode.pending.append((size, None))

    def read(self, path: str, inode: _Inode, pos: int, n: int) -> bytes:
        out = bytearray(inode.data[pos:pos + max(0, n)])
        rate = self.fault_rates.read_corruption
        cold = min(len(out), inode.media_end - pos)
        if cold > 0 and rate and self.rng.random() < rate:
            a = pos + self.rng.randrange(cold)
            b = min(pos + cold, a + 1 + self.rng.randrange(64))
            inode.bad.append((a, b))
            self._record({"fault": "read-corruption", "path": path, "start": a, "end": b})
        for a, b in inode.bad:
            for i in range(max(a, pos), min(b, pos + len(out))):
                out[i - pos] ^= 0xFF
        return bytes(out)

    def sync(self, path: str, inode: _Inode) -> None:
        failed = self._norm(path) in self._fail_fsyncs
        rate = self.fault_rates.fsync_eio
        if failed or (inode.pending and rate and self.rng.random() < rate):
            self._fail_fsyncs.discard(self._norm(path))
            lost = sum(len(d) for _, d in inode.pending if d is not None)
            self._record({"fault": "fsync-eio", "path": path, "lost_writes":
                                len(inode.pending), "lost_bytes": lost})
            inode.pending.clear()  # Linux: the failed write-back is marked clean
            raise _eio(path)
        for pos, data in inode.pending:
            _apply(inode.durable, pos, data)
        inode.pending.clear()

    def observed(self, kind: str, path: str) -> None:
        """Tell the observer, if any (outside the mutex: it may crash the node)."""
        if self.observe is not None:
            self.observe(kind, self._norm(path))

    def _record(self, fault: dict[str, Any]) -> None:
        if self.clock is not None:
            fault["at_ms"] = self.clock.wall_ms()
        self.faults.append(fault)

    # ---------------------------------------------------- fault injection
    def fail_next_fsync(self, path: str) -> None:
        """The next fsync/fdatasync of `path` fails with EIO."""
        with self.mutex:
            self._fail_fsyncs.add(self._norm(path))

    def corrupt(self, path: str, start: int, end: int) -> None:
        """A latent error: reads of [start, end) of `path` return flipped
        bytes until the range is written again."""
        with self.mutex:
            self._inode(path).bad.append((start, end))
            self._record({"fault": "read-corruption", "path": path,
                                "start": start, "end": end})

    def crash(self, torn: str | None = None,
              kept: Mapping[str, Kept] | None = None) -> MemoryDisk:
        """A power cut: returns a new disk holding what was durable (this
        one refuses every later operation, so a dead process's thread cannot
        write into the restarted one's disk). `torn` forces "torn-op" or
        "torn-seq" on every file with unsynced writes; without it, each such
        file is torn with probability `torn_write`. `kept` chooses instead of
        drawing (an exploration of every state, chaos/explore/): each file
        it names (by its path in unsynced()) keeps that much of its unsynced
        writes, every other file none; nothing is drawn."""
        if torn not in (None, "torn-op", "torn-seq"):
            raise ValueError(f"torn must be None, 'torn-op' or 'torn-seq', not {torn!r}")
        if kept is not None and torn is not None:
            raise ValueError("give torn or kept, not both")
        with self.mutex:
            self.crashed = True
            after = MemoryDisk(self.rng, self.fault_rates, self.clock)
            after.faults = self.faults
            copies: dict[int, _Inode] = {}
            for dpath in sorted(self._dirs):
                d = self._dirs[dpath]
                if dpath != "/" and not self._durable_dir(dpath):
                    continue
                nd = _Dir()
                for name in sorted(d.durable):
                    inode = d.durable[name]
                    if inode is not None and id(inode) not in copies:
                        path = os.path.join(dpath, name)
                        copies[id(inode)] = (
                            self._survivor(path, inode, torn) if kept is None
                            else _kept_survivor(inode, kept.get(path, Kept(0))))
                    nd.entries[name] = nd.durable[name] = (
                        None if inode is None else copies[id(inode)])
                after._dirs[dpath] = nd
            return after

    def _durable_dir(self, dpath: str) -> bool:
        parent, name = os.path.split(dpath)
        d = self._dirs.get(parent)
        return d is not None and name in d.durable and (parent == "/" or self._durable_dir(parent))

    def _survivor(self, path: str, inode: _Inode, torn: str | None) -> _Inode:
        """The inode after a crash: its durable bytes, and maybe part of its
        unsynced writes (torn)."""
        data = bytearray(inode.durable)
        pending = inode.pending
        mode = torn
        rate = self.fault_rates.torn_write
        if pending and mode is None and rate and self.rng.random() < rate:
            mode = "torn-op" if self.rng.random() < 0.5 else "torn-seq"
        writes = [i for i, (_, d) in enumerate(pending) if d]
        if pending and mode == "torn-op" and writes:
            i = writes[self.rng.randrange(len(writes))]
            pos, chunk = pending[i]
            assert chunk is not None
            keep = self.rng.randrange(len(chunk))  # a strict prefix
            for p, d in pending[:i]:  # what the torn write lands on
                if d is None:
                    _apply(data, p, None)
            _apply(data, pos, chunk[:keep])
            self._record({"fault": "torn-op", "path": path, "pos": pos,
                                "kept": keep, "of": len(chunk)})
        elif pending and mode == "torn-seq":
            kept = sorted(self.rng.sample(range(len(pending)),
                                          self.rng.randrange(len(pending) + 1)))
            for i in kept:
                _apply(data, *pending[i])
            self._record({"fault": "torn-seq", "path": path, "kept": kept,
                                "of": len(pending)})
        return _Inode(data=bytearray(data), durable=data, bad=list(inode.bad),
                      media_end=len(data))

    def unsynced(self) -> dict[str, tuple[int, list[PendingOp]]]:
        """Each file a crash now would keep (its directory entry durable)
        that has unsynced writes: path -> (its durable length, its pending
        operations in order). What crash(kept=...) chooses from."""
        with self.mutex:
            out: dict[str, tuple[int, list[PendingOp]]] = {}
            for dpath in sorted(self._dirs):
                if dpath != "/" and not self._durable_dir(dpath):
                    continue
                for name, inode in sorted(self._dirs[dpath].durable.items()):
                    if inode is not None and inode.pending:
                        out[os.path.join(dpath, name)] = (len(inode.durable), list(inode.pending))
            return out

    def durable_range(self, path: str, start: int, end: int) -> bytes:
        """Bytes [start, end) of what `path` durably holds (fewer past its end)."""
        with self.mutex:
            return bytes(self._inode(path).durable[start:end])

    def durable_bytes(self, path: str) -> bytes:
        """What a crash now would leave in `path` (no faults)."""
        with self.mutex:
            return bytes(self._inode(path).durable)

    def durable_extent(self, path: str) -> tuple[bytes, int]:
        """durable_bytes(path) and the file's durable size (an export writes
        the zeros at the end of the bytes as a hole: chaos/harness/sparse.py)."""
        with self.mutex:
            durable = bytes(self._inode(path).durable)
            return durable, len(durable)

    def cached_bytes(self, path: str) -> bytes:
        """What a read of `path` returns now (its page cache; no faults),
        even on a disk that has crashed."""
        with self.mutex:
            return bytes(self._inode(path).data)

    # -------------------------------------------------------------- Disk
    def create(self, path: str) -> MemoryFile:
        with self.mutex:
            self._check()
            d, name = self._parent(path)
            if name in d.entries:
                raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), path)
            inode = d.entries[name] = _Inode()
            return MemoryFile(self, path, inode)

    def open(self, path: str, *, create: bool = False) -> MemoryFile:
        with self.mutex:
            self._check()
            d, name = self._parent(path)
            if create and name not in d.entries:
                d.entries[name] = _Inode()
            return MemoryFile(self, path, self._inode(path))

    def read_file(self, path: str, limit: int | None = None) -> bytes:
        with self.mutex:
            self._check()
            inode = self._inode(path)
            return self.read(path, inode, 0, len(inode.data) if limit is None else limit)

    def write_file(self, path: str, data: bytes) -> None:
        with self.mutex:
            f = self.open(path, create=True)
            self.resize(f._inode, 0)
            self.write(f._inode, 0, bytes(data))
            self.sync(path, f._inode)
        self.observed("fsync", path)

    def fsync_dir(self, path: str) -> None:
        with self.mutex:
            self._check()
            d = self._dirs.get(self._norm(path))
            if d is None:
                raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), path)
            d.durable = dict(d.entries)
        self.observed("dir-fsync", path)

    def makedirs(self, path: str) -> None:
        with self.mutex:
            self._check()
            p = self._norm(path)
            if p in self._dirs:
                return
            parent, name = os.path.split(p)
            self.makedirs(parent)
            d = self._dirs[parent]
            if name in d.entries:
                raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), path)
            d.entries[name] = d.durable[name] = None  # durable at once (see the docstring)
            self._dirs[p] = _Dir()

    def listdir(self, path: str) -> list[str]:
        with self.mutex:
            self._check()
            d = self._dirs.get(self._norm(path))
            if d is None:
                if self.exists(path):
                    raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), path)
                raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), path)
            return sorted(d.entries)

    def exists(self, path: str) -> bool:
        with self.mutex:
            p = self._norm(path)
            if p in self._dirs:
                return True
            d = self._dirs.get(os.path.dirname(p))
            return d is not None and os.path.basename(p) in d.entries

    def isfile(self, path: str) -> bool:
        with self.mutex:
            return self.exists(path) and self._norm(path) not in self._dirs

    def isdir(self, path: str) -> bool:
        with self.mutex:
            return self._norm(path) in self._dirs

    def islink(self, path: str) -> bool:
        return False

    def size(self, path: str) -> int:
        with self.mutex:
            return len(self._inode(path).data)

    def unlink(self, path: str) -> None:
        with self.mutex:
            self._check()
            self._inode(path)
            d, name = self._parent(path)
            del d.entries[name]

    def rmdir(self, path: str) -> None:
        with self.mutex:
            self._check()
            p = self._norm(path)
            d = self._dirs.get(p)
            if d is None:
                raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), path)
            if d.entries:
                raise OSError(errno.ENOTEMPTY, os.strerror(errno.ENOTEMPTY), path)
            parent, name = self._parent(p)
            del parent.entries[name]
            parent.durable.pop(name, None)
            del self._dirs[p]

    def rename(self, src: str, dst: str) -> None:
        with self.mutex:
            self._check()
            inode = self._inode(src)
            sd, sname = self._parent(src)
            dd, dname = self._parent(dst)
            if dd.entries.get(dname, inode) is None:
                raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), dst)
            del sd.entries[sname]
            dd.entries[dname] = inode

    def free_bytes(self, path: str) -> int:
        return 1 << 40

    def lock(self, path: str) -> _MemoryLock:
        with self.mutex:
            self._check()
            p = self._norm(path)
            if p in self.locks:
                raise StoreLockedError(
                    f"store {os.path.dirname(path) or '.'} is in use (lock file {path}, "
                    "held in this simulation); close that store first")
            self.open(path, create=True)
            lock = self.locks[p] = _MemoryLock(self, p)
            return lock
