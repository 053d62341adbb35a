"""The `checkpoint` file, RocketMQ's StoreCheckpoint layout: a 4 KiB page with
three big-endian longs: physicMsgTimestamp at 0, logicsMsgTimestamp at 8,
indexMsgTimestamp at 16 (ms). It only ever holds the store timestamp of a
record that was already fsynced, so a stale checkpoint makes recovery scan
more, never less.

This store adds one field in the page's free space, at 24 (RocketMQ leaves
it zero): b"DLFE", a long, the flushed END — every CommitLog byte below
it had been fsynced when it was written — and a CRC-32 of both, so that a
torn write of the page (a crash keeping a prefix of it) cannot pass off a
mix of an old and a new end as a larger one. Timestamps cannot tell records
stored in the same millisecond apart (nor survive a clock stepping back);
a position can: recovery decides "flushed or torn" from it
(store/log/recovery.py). A clean close writes it at the end of the log, so a
clean shutdown vouches for everything below that end. A checkpoint without
the field (written by an older version) reads with `flushed_end` None:
recovery then falls back to the timestamps and says what it cannot tell;
so does one whose field fails its CRC.

A second field, at 40, holds controller mode's confirm offset (RocketMQ's
StoreCheckpoint.confirmPhyOffset, at 32 in its page, which this page uses
for the flushed end): how far every SyncStateSet member had acknowledged
(store/consume/consume_side.py). As RocketMQ's StoreCheckpoint.flush puts
it into the page and forces the page, it is written only by `sync` (the
thorough interval, a clean close) and by `lower`, each time followed by an
fsync: the value read back after any crash is the one of the last sync.
Absent (classic mode, an older version): `confirm_offset` None.

Layout (big-endian):
     0  8  physicMsgTimestamp (ms)
     8  8  logicsMsgTimestamp (ms)
    16  8  indexMsgTimestamp (ms)
    24  4  b"DLFE" (the field below is present)
    28  8  flushed end (CommitLog offset)
    36  4  CRC-32 (zlib) of bytes 24..36
    40  4  b"DLCO" (the field below is present)
    44  8  confirm offset (CommitLog offset)
    52  4  CRC-32 (zlib) of bytes 40..52
"""

from __future__ import annotations

import struct
import threading
import zlib
from collections.abc import Callable
from dataclasses import dataclass

from store.log.durable_mark import DurableMark
from store.seams.disk import Disk, RealDisk

FILE_SIZE = 4096
_LAYOUT = struct.Struct(">qqq")
_END = struct.Struct(">4sqI")
END_AT = _LAYOUT.size
END_MAGIC = b"DLFE"
CONFIRM_AT = END_AT + _END.size  # 40
CONFIRM_MAGIC = b"DLCO"
# RocketMQ starts abnormal recovery at the first segment older than the
# checkpoint minus 3 s, to cover clock steps between records.
SAFETY_MARGIN_MS = 3000


@dataclass(frozen=True)
class Checkpoint:
    physic_ms: int = 0
    logics_ms: int = 0
    index_ms: int = 0
    # Every CommitLog byte below it was fsynced; None: an older checkpoint
    # that does not say (module docstring).
    flushed_end: int | None = None
    # Controller mode's confirm offset as of the last sync; None: the page
    # holds none (module docstring).
    confirm_offset: int | None = None

    @property
    def min_timestamp_ms(self) -> int:
        return max(0, min(self.physic_ms, self.logics_ms) - SAFETY_MARGIN_MS)


def read_checkpoint(path: str, disk: Disk | None = None) -> tuple[Checkpoint | None, str | None]:
    """(checkpoint, None), or (None, why it could not be used)."""
    try:
        raw = (disk or RealDisk()).read_file(path, CONFIRM_AT + _END.size)
    except FileNotFoundError:
        return None, "checkpoint file is missing"
    except OSError as exc:
        return None, f"checkpoint unreadable: {exc.strerror}"
    if len(raw) < _LAYOUT.size:
        return None, f"checkpoint is {len(raw)} bytes, needs {_LAYOUT.size}"
    cp = Checkpoint(*_LAYOUT.unpack_from(raw))
    if min(cp.physic_ms, cp.logics_ms) < 0:
        return None, "checkpoint holds negative timestamps"
    if len(raw) >= END_AT + _END.size:
        magic, end, crc = _END.unpack_from(raw, END_AT)
        if magic == END_MAGIC and crc == _end_crc(end):
            if end < 0:
                return None, f"checkpoint holds a negative flushed end ({end})"
            cp = Checkpoint(cp.physic_ms, cp.logics_ms, cp.index_ms, end)
    if len(raw) >= CONFIRM_AT + _END.size:
        magic, confirm, crc = _END.unpack_from(raw, CONFIRM_AT)
        if magic == CONFIRM_MAGIC and crc == _crc(CONFIRM_MAGIC, confirm) and confirm >= 0:
            cp = Checkpoint(cp.physic_ms, cp.logics_ms, cp.index_ms, cp.flushed_end, confirm)
    return cp, None


def _pack(physic_ms: int, logics_ms: int, index_ms: int, flushed_end: int | None) -> bytes:
    head = _LAYOUT.pack(physic_ms, logics_ms, index_ms)
    if flushed_end is None:
        return head
    return head + _END.pack(END_MAGIC, flushed_end, _end_crc(flushed_end))


def _end_crc(end: int) -> int:
    return _crc(END_MAGIC, end)


def _crc(magic: bytes, value: int) -> int:
    return zlib.crc32(magic + value.to_bytes(8, "big", signed=True))


def pack_confirm(confirm: int) -> bytes:
    """The confirm offset field (16 bytes at CONFIRM_AT)."""
    return _END.pack(CONFIRM_MAGIC, confirm, _crc(CONFIRM_MAGIC, confirm))


def lower_checkpoint(disk: Disk, path: str, checkpoint: Checkpoint,
                     timestamp_ms: int, *, end: int) -> Checkpoint:
    """Lower the checkpoint's timestamps to at most `timestamp_ms` and its
    flushed end to at most `end`, durably, and return it: done before
    recovery cuts flushed data at `end`, so that the checkpoint never names
    a record or a byte past the cut (a later recovery reads a checkpoint
    beyond its end of data as proof that data was flushed past it). Lower
    only ever widens a later recovery."""
    low = Checkpoint(min(checkpoint.physic_ms, timestamp_ms),
                     min(checkpoint.logics_ms, timestamp_ms),
                     min(checkpoint.index_ms, timestamp_ms),
                     min(checkpoint.flushed_end if checkpoint.flushed_end is not None else end,
                         end),
                     # Untouched (its field is not rewritten here): the
                     # store's recovery lowers it after the cut.
                     checkpoint.confirm_offset)
    f = disk.open(path, create=True)
    try:
        f.pwrite(_pack(low.physic_ms, low.logics_ms, low.index_ms, low.flushed_end), 0)
        f.fsync()
    finally:
        f.close()
    return low


class CheckpointFile:
    """The open checkpoint. Each field has one writer:
    - physic (and index, which this store has no service for and so keeps
      equal to physic) and the flushed end: `update`, after each CommitLog
      flush (after its fsync: both name fsynced data only);
    - logics: `update_logics`, after each ConsumeQueue flush, with the store
      timestamp of the last record whose unit — and every earlier record's
      unit — is in the queue files. Abnormal recovery starts from the min of
      the two (Checkpoint.min_timestamp_ms), so records that lost their units
      are re-dispatched.
    Writes are cheap pwrites of the whole 24 bytes under a lock (the two
    writers run on different threads); `sync` makes them durable (on the
    thorough interval and at shutdown). The confirm offset, controller
    mode's (`confirm_source`, set by the store), is written by `sync` and
    `lower` only, right before their fsync (module docstring). Under the power crash model each
    completed fsync is recorded in the durable mark (store/log/durable_mark.py)
    with the bytes it covered, so a harness's power cut can bring back
    exactly those."""

    def __init__(self, disk: Disk, path: str) -> None:
        self.path = path
        self.file = disk.open(path, create=True)
        if self.file.size() < FILE_SIZE:
            self.file.truncate(FILE_SIZE)
        # The opener sets both from a checkpoint read_checkpoint accepted;
        # an unusable one is overwritten from zero.
        self.last_ms = 0
        self.logics_ms = 0
        self.flushed_end = 0
        self._lock = threading.Lock()
        self.mark: DurableMark | None = None
        # Controller mode: the store's confirm offset now (None: classic
        # mode, no field written).
        self.confirm_source: Callable[[], int] | None = None

    def _write_confirm(self) -> None:
        """The confirm offset into its field (the caller fsyncs next)."""
        if self.confirm_source is not None:
            self.file.pwrite(pack_confirm(self.confirm_source()), CONFIRM_AT)

    def _packed(self) -> bytes:
        return _LAYOUT.pack(self.last_ms, self.logics_ms, self.last_ms)

    def _write(self) -> None:
        # One pwrite of 40 bytes in one page: a kill cannot tear it (a
        # crash of the machine might: the flushed end's CRC catches that). The
        # durable mark restores only the first 24 bytes after a power cut
        # (store/log/durable_mark.py); the end it leaves is still one a completed
        # fsync covered, as every end written here is.
        self.file.pwrite(_pack(self.last_ms, self.logics_ms, self.last_ms, self.flushed_end), 0)

    def update(self, timestamp_ms: int, end: int) -> None:
        """The CommitLog was flushed (fsynced) up to `end`, whose last record
        was stored at `timestamp_ms`."""
        with self._lock:
            if timestamp_ms > self.last_ms or end > self.flushed_end:
                self.last_ms = max(self.last_ms, timestamp_ms)
                self.flushed_end = max(self.flushed_end, end)
                self._write()

    def update_logics(self, timestamp_ms: int) -> None:
        """The ConsumeQueues were flushed up to a record stored at
        `timestamp_ms`. Written as given, not as a max: a lower value (a
        clock step back, a truncation) only widens the next recovery."""
        with self._lock:
            if timestamp_ms != self.logics_ms:
                self.logics_ms = timestamp_ms
                self._write()

    def lower(self, timestamp_ms: int, end: int) -> None:
        """Lower both timestamps to at most `timestamp_ms` and the flushed
        end to at most `end`, durably: before a cut at `end`, so the
        checkpoint never names a record or a byte past it (see
        lower_checkpoint)."""
        with self._lock:
            self.last_ms = min(self.last_ms, timestamp_ms)
            self.logics_ms = min(self.logics_ms, timestamp_ms)
            self.flushed_end = min(self.flushed_end, end)
            self._write()
            self._write_confirm()
            self.file.fsync()
            if self.mark is not None:
                self.mark.checkpoint_synced(self._packed())

    def sync(self) -> None:
        # What this fsync covers at least: the bytes written before it
        # starts (a later update may be covered too; restoring the older
        # value is what a power cut before that write-back leaves).
        with self._lock:
            covered = self._packed()
            self._write_confirm()
        self.file.fsync()
        if self.mark is not None:
            self.mark.checkpoint_synced(covered)

    def close(self) -> None:
        self.file.close()
