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
     4  4  version (2; a version 1 mark is the same without bytes 48 on)
     8  8  commitlog: every CommitLog byte below it was covered by a completed
           fsync; past it the log holds nothing durable (a power cut leaves
           zeros there: segments are created zero-filled and durable, and
           every cut is made durable before new bytes go past it).
    16  8  checkpoint known (1) or not (0)
    24 24  the checkpoint file's 24 bytes as of its last completed fsync
    48  8  unsynced files: 0, or the length n of the record at 56, written
           after the record is whole (so a kill inside the record's write
           leaves 0: nothing was written unsynced yet)
    56  n  the record: CRC-32 (zlib) of the rest (4), file count (2), then per
           file: name length (1), name (UTF-8, a file of the store root),
           present (1; 0: the file did not exist), content length (4), content

Unsynced files. A file the node writes without ever fsyncing it (the
broker's epoch file under `--emulate rmq-epoch-in-place`, RocketMQ's
in-place rewrite: ha/autoswitch/epoch_file.py) is durable as it was before
that first write, and no later: its writes sit in the page cache, where a
SIGKILL leaves them and a power cut takes them. So before its first such
write after an open, the node records here what each of those files holds
(`unsynced_files`), once; the power cut puts each back. What they hold at
that moment counts as durable: they were last written by the harness's
previous cut (fsynced), or before a clean close (a page cache keeps them
across the process's exit and writes them back within about 30 s; a
power cut right after a clean stop is not modelled, as for the CommitLog,
whose close fsyncs).

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
- unsynced files (above): each back to what it held before the node's
  first unsynced write of it (removed if it did not exist), fsynced, and
  the store root fsynced. The simulated disk loses those writes by itself
  (store/sim/memory_disk.py: an unsynced write or directory entry is gone
  after a crash), so both backends model the same loss. Neither models the
  kernel's own write-back of dirty pages (about 30 s after a write on
  Linux): a write stays lost however long before the cut it was made.
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
import zlib
from collections.abc import Mapping
from dataclasses import dataclass

from store.log.segments import NAME_DIGITS, segment_name
from store.seams.disk import Disk, DiskFile

MARK_FILE = "durable-mark"
MAGIC = b"DMRK"
VERSION = 2
_HEADER = struct.Struct(">4sI")
_COMMITLOG = struct.Struct(">q")
_CHECKPOINT = struct.Struct(">q24s")
_UNSYNCED = struct.Struct(">q")
COMMITLOG_AT = 8
CHECKPOINT_AT = 16
V1_SIZE = CHECKPOINT_AT + _CHECKPOINT.size  # 48
UNSYNCED_AT = V1_SIZE
SIZE = UNSYNCED_AT + _UNSYNCED.size  # 56: the unsynced files' record follows
CHECKPOINT_BYTES = 24
_RECORD_HEAD = struct.Struct(">IH")  # CRC of the rest, file count
_FILE_HEAD = struct.Struct(">B")  # name length
_FILE_BODY = struct.Struct(">BI")  # present, content length


class DurableMark:
    """The node's side: the open mark file of one store (POWER only)."""

    def __init__(self, file: DiskFile, store_dir: str) -> None:
        self._file = file
        self.store_dir = store_dir
        self._unsynced_recorded = False

    @classmethod
    def open(cls, disk: Disk, store_dir: str, commitlog_end: int) -> DurableMark:
        """Create or reset the mark at open: the recovered CommitLog end,
        checkpoint unknown (power_cut then leaves the checkpoint as it is,
        which is what the last run durably left or a later sync wrote), no
        unsynced files."""
        f = disk.open(os.path.join(store_dir, MARK_FILE), create=True)
        f.pwrite(_HEADER.pack(MAGIC, VERSION) + _COMMITLOG.pack(commitlog_end)
                 + _CHECKPOINT.pack(0, bytes(CHECKPOINT_BYTES)) + _UNSYNCED.pack(0), 0)
        # An earlier open's record may follow: with the length 0 it counts for nothing.
        return cls(f, store_dir)

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

    @property
    def unsynced_recorded(self) -> bool:
        return self._unsynced_recorded

    def unsynced_files(self, files: Mapping[str, bytes | None]) -> None:
        """Files of the store root (full paths) the node is about to write
        without an fsync, with what each holds now (None: it does not
        exist): a power cut puts them back (module docstring). Call once,
        BEFORE the first such write; the record is whole before it counts."""
        assert not self._unsynced_recorded, "unsynced files are recorded once per open"
        root = os.path.normpath(self.store_dir)
        named = {}
        for path, contents in files.items():
            assert os.path.normpath(os.path.dirname(path)) == root, (path, root)
            named[os.path.basename(path)] = contents
        record = encode_files(named)
        self._file.pwrite(record, SIZE)
        self._file.pwrite(_UNSYNCED.pack(len(record)), UNSYNCED_AT)
        self._unsynced_recorded = True

    def close(self) -> None:
        self._file.close()


# ------------------------------------------------------------ the harness

def encode_files(files: Mapping[str, bytes | None]) -> bytes:
    """The unsynced files' record (module docstring) of `files`, by name."""
    body = bytearray()
    for name, contents in files.items():
        raw = name.encode()
        assert _plain_name(name) and len(raw) < 256, name
        body += _FILE_HEAD.pack(len(raw)) + raw
        body += _FILE_BODY.pack(contents is not None, len(contents or b"")) + (contents or b"")
    rest = struct.pack(">H", len(files)) + bytes(body)
    return struct.pack(">I", zlib.crc32(rest)) + rest  # _RECORD_HEAD, then the files


def decode_files(record: bytes) -> dict[str, bytes | None] | None:
    """The files a record names, with their contents; None when it is not
    one whole record (its CRC, a length past its end, a name that is not a
    plain file name)."""
    if len(record) < _RECORD_HEAD.size:
        return None
    crc, count = _RECORD_HEAD.unpack_from(record, 0)
    if zlib.crc32(record[4:]) != crc:
        return None
    files: dict[str, bytes | None] = {}
    pos = _RECORD_HEAD.size
    for _ in range(count):
        if pos + _FILE_HEAD.size > len(record):
            return None
        (n,) = _FILE_HEAD.unpack_from(record, pos)
        pos += _FILE_HEAD.size
        try:
            name = record[pos:pos + n].decode()
        except UnicodeDecodeError:
            return None
        pos += n
        if not _plain_name(name) or pos + _FILE_BODY.size > len(record):
            return None
        present, size = _FILE_BODY.unpack_from(record, pos)
        pos += _FILE_BODY.size
        if pos + size > len(record):
            return None
        files[name] = record[pos:pos + size] if present else None
        pos += size
    return files if pos == len(record) else None


def _plain_name(name: str) -> bool:
    """A file directly in the store root: no separator, not . or .., not
    the mark itself."""
    return bool(name) and os.sep not in name and "/" not in name and "\0" not in name \
        and name not in (".", "..", MARK_FILE)


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
    # Unsynced files (module docstring), by name: put back to what they held
    # before their first unsynced write, or removed (those writes made them).
    files_restored: tuple[str, ...] = ()
    files_removed: tuple[str, ...] = ()

    def describe(self) -> str:
        if not self.applied:
            return f"power cut: nothing discarded ({self.why})"
        cp = "; checkpoint back to its last fsync" if self.checkpoint_restored else ""
        files = (f"; {', '.join(self.files_restored)} back as before the node's writes "
                 "without an fsync" if self.files_restored else "")
        files += (f"; {', '.join(self.files_removed)} removed (created by writes without "
                  "an fsync)" if self.files_removed else "")
        mark = self.commitlog_mark or 0
        took = (self.data_end or mark) - mark
        return (f"power cut: CommitLog cut at offset {mark}, the end of the last completed "
                f"fsync; {took} written but unsynced bytes discarded{cp}{files}")


def _read_raw(store_dir: str) -> bytes | None:
    """The whole mark file, or None when it is missing, a link, or not a
    mark of a version this code reads."""
    fd = _open_no_link(os.path.join(store_dir, MARK_FILE), os.O_RDONLY)
    if fd is None:
        return None
    with open(fd, "rb") as f:
        raw = f.read()
    if len(raw) < V1_SIZE or _HEADER.unpack_from(raw, 0) not in ((MAGIC, 1), (MAGIC, VERSION)):
        return None
    return raw


def read_mark(store_dir: str) -> tuple[int, bytes | None] | None:
    """(commitlog mark, checkpoint bytes or None), or None without a usable mark."""
    raw = _read_raw(store_dir)
    if raw is None:
        return None
    (end,) = _COMMITLOG.unpack_from(raw, COMMITLOG_AT)
    known, cp = _CHECKPOINT.unpack_from(raw, CHECKPOINT_AT)
    return end, (cp if known == 1 else None)


def read_unsynced_files(store_dir: str) -> dict[str, bytes | None] | None:
    """The unsynced files the mark records, with what they held before
    their first unsynced write; None when it records none (or has no whole
    record: then no unsynced write was made)."""
    raw = _read_raw(store_dir)
    return None if raw is None else _unsynced_of(raw)


def _unsynced_of(raw: bytes) -> dict[str, bytes | None] | None:
    if len(raw) < SIZE or _HEADER.unpack_from(raw, 0)[1] < 2:
        return None
    (n,) = _UNSYNCED.unpack_from(raw, UNSYNCED_AT)
    if n <= 0 or SIZE + n > len(raw):
        return None
    return decode_files(raw[SIZE:SIZE + n])


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
    unsynced = read_unsynced_files(store_dir)
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
    files, removed = _restore_files(store_dir, unsynced or {})
    # Applied once: what is written from now on (a disk-damage step on the
    # stopped node, the next open's recovery) is the harness's or fsynced,
    # never the dead process's, and a second cut must not take it.
    os.unlink(os.path.join(store_dir, MARK_FILE))
    return PowerCut(True, "", end, data_end, restored, files, removed)


def _restore_files(store_dir: str, files: Mapping[str, bytes | None]
                   ) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Put each unsynced file back (module docstring), durably; returns the
    names it restored and those it removed. A link is left alone: never
    written through, nor removed (the node's next open refuses to follow it)."""
    done, removed = [], []
    for name, contents in sorted(files.items()):
        path = os.path.join(store_dir, name)
        if os.path.islink(path):
            continue
        if contents is None:
            try:
                os.unlink(path)
            except FileNotFoundError:
                continue
            removed.append(name)
            continue
        fd = _open_no_link(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        if fd is None:
            continue
        try:
            view = memoryview(contents)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        done.append(name)
    if done or removed:
        fd = os.open(store_dir, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    return tuple(done), tuple(removed)


def _open_no_link(path: str, flags: int, mode: int = 0o644) -> int | None:
    """A descriptor for `path`, or None when it is missing or a symbolic
    link: the cut never writes through a link into a file outside the store
    (the node's next open refuses the link: store/layout.py)."""
    try:
        return os.open(path, flags | os.O_NOFOLLOW, mode)
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
