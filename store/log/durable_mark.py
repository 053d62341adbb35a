"""The durable mark: how far each file of a store was made durable by a
completed fsync, kept where a SIGKILL cannot undo it, so that a harness can
turn a SIGKILL into an exact power cut (the `power` crash model).

Why: under `power` a flush writes its bytes to the OS and then fsyncs them.
A SIGKILL between the two leaves the written bytes in the page cache, where
they survive the process; a power cut would lose them (LazyFS showed it;
docs/design.md, crash models). So the node records the end of every completed fsync here, and
the harness (cluster/backends: kill, and every start of a node that died)
calls `power_cut(data_dir)`, which discards what lies past the marks before
the node restarts or anyone reads its store.

Where a SIGKILL cannot undo it: the mark is a plain write to a small file,
never fsynced. A write that returned is in the kernel's page cache and
survives the death of the process that made it (only the machine's own
crash could lose it, and the harness reads the mark right after a kill, on
a running machine). A write is one syscall of at most 32 bytes within one
page, so a SIGKILL cannot tear it. Cost: one small pwrite per flush (see
docs/benchmarks.md, "The durable mark").

Ordering rules (the writers keep them; they are why the cut is exact):
- A mark is written only AFTER the fsync it records returned without error,
  and BEFORE the flush advances `flushed` (so BEFORE any ack it allows). A
  kill between the fsync and the mark discards bytes that were durable but
  not yet acknowledged: what a power cut just before the fsync completed
  would leave.
- A mark never moves past bytes that no completed fsync covered; at open it
  is set to the recovered end (recovery makes its cuts durable first).

Layout of `durable-mark` in the store root (big-endian):
     0  4  magic b"DMRK"
     4  4  version (1)
     8  8  commitlog: every CommitLog byte below it was covered by a completed
           fsync; past it the log holds nothing durable (a power cut leaves
           zeros there: segments are created zero-filled and durable, and
           every cut is made durable before new bytes go past it).
    16  8  checkpoint known (1) or not (0)
    24 24  the checkpoint file's 24 bytes as of its last completed fsync

What `power_cut` does, file by file (what a power cut would lose):
- commitlog/: every byte at or past the commitlog mark reads as zero
  (whole later segments too); the files keep their sizes.
- checkpoint: its first 24 bytes go back to their last fsynced value (an
  update is a pwrite made durable only by the periodic sync); a stale
  checkpoint only widens the next recovery.
- consumequeue/: left as the kill left it. A power cut could lose units
  written but not yet fsynced; keeping them changes nothing a consumer or
  the checker sees: units are derived from the CommitLog (the same record
  gives the same 20 bytes), recovery cuts every unit that points past the
  recovered log and re-dispatches from the checkpoint, so the rebuilt
  queues are the same either way.
- config/ (consumer offsets): left as is. Each persist writes a temp file,
  fsyncs it and renames it over the table (store/consume/consumer_offsets.py); a
  power cut could undo the rename until its directory is synced, bringing
  back older offsets: redelivery, never a loss. Not modelled.
- abort, lock: untouched (recovery reads `abort`).
Not covered: bytes a recovery writes in place at open (a repair from a
replica) before its own fsync, and a kill inside a truncation's steps; both
are below the mark of the previous run and stay as the kill left them.
"""

from __future__ import annotations

import contextlib
import errno
import os
import struct
from dataclasses import dataclass

from store.log.segments import NAME_DIGITS, segment_name
from store.seams.disk import Disk, DiskFile

MARK_FILE = "durable-mark"
MAGIC = b"DMRK"
VERSION = 1
_HEADER = struct.Struct(">4sI")
_COMMITLOG = struct.Struct(">q")
_CHECKPOINT = struct.Struct(">q24s")
COMMITLOG_AT = 8
CHECKPOINT_AT = 16
SIZE = CHECKPOINT_AT + _CHECKPOINT.size  # 48
CHECKPOINT_BYTES = 24


class DurableMark:
    """The node's side: the open mark file of one store (POWER only)."""

    def __init__(self, file: DiskFile) -> None:
        self._file = file

    @classmethod
    def open(cls, disk: Disk, store_dir: str, commitlog_end: int) -> DurableMark:
        """Create or reset the mark at open: the recovered CommitLog end,
        checkpoint unknown (power_cut then leaves the checkpoint as it is,
        which is what the last run durably left or a later sync wrote)."""
        f = disk.open(os.path.join(store_dir, MARK_FILE), create=True)
        f.pwrite(_HEADER.pack(MAGIC, VERSION) + _COMMITLOG.pack(commitlog_end)
                 + _CHECKPOINT.pack(0, bytes(CHECKPOINT_BYTES)), 0)
        return cls(f)

    @staticmethod
    def remove(disk: Disk, store_dir: str) -> None:
        """No mark (the `process` crash model keeps what the OS holds): a
        stale one from an earlier power-model run must not be applied."""
        with contextlib.suppress(FileNotFoundError):
            disk.unlink(os.path.join(store_dir, MARK_FILE))

    def commitlog_synced(self, end: int) -> None:
        """Every CommitLog byte below `end` is durable (an fsync completed)."""
        self._file.pwrite(_COMMITLOG.pack(end), COMMITLOG_AT)

    def checkpoint_synced(self, contents: bytes) -> None:
        """The checkpoint's first 24 bytes were `contents` when an fsync of
        it started, and that fsync completed."""
        assert len(contents) == CHECKPOINT_BYTES, len(contents)
        self._file.pwrite(_CHECKPOINT.pack(1, contents), CHECKPOINT_AT)

    def close(self) -> None:
        self._file.close()


# ------------------------------------------------------------ the harness

@dataclass(frozen=True)
class PowerCut:
    """What power_cut did to a store (`applied` False: nothing, `why`)."""

    applied: bool
    why: str
    commitlog_mark: int | None = None
    # The end of the data the cut took: bytes [commitlog_mark, data_end) held
    # something not zero (written, never fsynced) and are zeros now.
    data_end: int | None = None
    checkpoint_restored: bool = False

    def describe(self) -> str:
        if not self.applied:
            return f"power cut: nothing discarded ({self.why})"
        cp = "; checkpoint back to its last fsync" if self.checkpoint_restored else ""
        mark = self.commitlog_mark or 0
        took = (self.data_end or mark) - mark
        return (f"power cut: CommitLog cut at offset {mark}, the end of the last completed "
                f"fsync; {took} written but unsynced bytes discarded{cp}")


def read_mark(store_dir: str) -> tuple[int, bytes | None] | None:
    """(commitlog mark, checkpoint bytes or None), or None without a usable mark."""
    fd = _open_no_link(os.path.join(store_dir, MARK_FILE), os.O_RDONLY)
    if fd is None:
        return None
    with open(fd, "rb") as f:
        raw = f.read(SIZE)
    if len(raw) < SIZE or _HEADER.unpack_from(raw, 0) != (MAGIC, VERSION):
        return None
    (end,) = _COMMITLOG.unpack_from(raw, COMMITLOG_AT)
    known, cp = _CHECKPOINT.unpack_from(raw, CHECKPOINT_AT)
    return end, (cp if known == 1 else None)


def power_cut(store_dir: str) -> PowerCut:
    """Make a store a SIGKILL left into what a power cut at the same moment
    would leave (see the module docstring), durably, and remove the mark
    (the next open writes a new one). Call it only with the node's process
    gone. Does nothing for a store closed cleanly (no `abort`: its close
    fsynced everything) or without a mark (the process crash model, a store
    never opened, a cut already made)."""
    mark = read_mark(store_dir)
    if mark is None:
        return PowerCut(False, "no durable mark: not a power-model store, or already cut")
    if not os.path.exists(os.path.join(store_dir, "abort")):
        return PowerCut(False, "the store was closed cleanly")
    end, checkpoint = mark
    data_end = _clear_commitlog_from(os.path.join(store_dir, "commitlog"), end)
    restored = False
    if checkpoint is not None:
        path = os.path.join(store_dir, "checkpoint")
        fd = _open_no_link(path, os.O_WRONLY)
        if fd is not None:
            try:
                os.pwrite(fd, checkpoint, 0)
                os.fsync(fd)
            finally:
                os.close(fd)
            restored = True
    # Applied once: what is written from now on (a disk-damage step on the
    # stopped node, the next open's recovery) is the harness's or fsynced,
    # never the dead process's, and a second cut must not take it.
    os.unlink(os.path.join(store_dir, MARK_FILE))
    return PowerCut(True, "", end, data_end, restored)


def _open_no_link(path: str, flags: int) -> int | None:
    """A descriptor for `path`, or None when it is missing or a symbolic
    link: the cut never writes through a link into a file outside the store
    (the node's next open refuses the link: store/layout.py)."""
    try:
        return os.open(path, flags | os.O_NOFOLLOW)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return None
        raise


def _clear_commitlog_from(commitlog_dir: str, end: int) -> int:
    """Zero every segment byte at or past `end` (the file sizes stay) and
    fsync; returns the end of the non-zero bytes it cleared (`end` if none)."""
    try:
        names = sorted(os.listdir(commitlog_dir))
    except FileNotFoundError:
        return 0
    data_end = end
    for name in names:
        if len(name) != NAME_DIGITS or not name.isdigit() or name != segment_name(int(name)):
            continue
        start = int(name)
        path = os.path.join(commitlog_dir, name)
        if os.path.islink(path):
            continue  # never written through (the next open refuses it)
        size = os.path.getsize(path)
        if start + size <= end:
            continue
        cut = max(0, end - start)
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW)
        try:
            last = _last_non_zero(fd, cut, size)
            if last is not None:
                data_end = max(data_end, start + last + 1)
            os.ftruncate(fd, cut)  # what is cut reads back as zeros once extended
            os.ftruncate(fd, size)
            os.fsync(fd)
        finally:
            os.close(fd)
    return data_end


def _last_non_zero(fd: int, start: int, end: int, step: int = 1 << 20) -> int | None:
    """The position of the last non-zero byte in [start, end) of `fd`, if
    any (for the record of what the cut took)."""
    last = None
    pos = start
    while pos < end:
        chunk = os.pread(fd, min(step, end - pos), pos)
        if not chunk:
            break
        kept = len(chunk.rstrip(b"\0"))
        if kept:
            last = pos + kept - 1
        pos += len(chunk)
    return last
