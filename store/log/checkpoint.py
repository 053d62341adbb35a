"""The `checkpoint` file, RocketMQ's StoreCheckpoint layout: a 4 KiB page with
three big-endian longs: physicMsgTimestamp at 0, logicsMsgTimestamp at 8,
indexMsgTimestamp at 16 (ms). It only ever holds the store timestamp of a
record that was already fsynced, so a stale checkpoint makes recovery scan
more, never less."""

from __future__ import annotations

import struct
import threading
from dataclasses import dataclass

from store.log.durable_mark import DurableMark
from store.seams.disk import Disk, RealDisk

FILE_SIZE = 4096
_LAYOUT = struct.Struct(">qqq")
# RocketMQ starts abnormal recovery at the first segment older than the
# checkpoint minus 3 s, to cover clock steps between records.
SAFETY_MARGIN_MS = 3000


@dataclass(frozen=True)
class Checkpoint:
    physic_ms: int = 0
    logics_ms: int = 0
    index_ms: int = 0

    @property
    def min_timestamp_ms(self) -> int:
        return max(0, min(self.physic_ms, self.logics_ms) - SAFETY_MARGIN_MS)


def read_checkpoint(path: str, disk: Disk | None = None) -> tuple[Checkpoint | None, str | None]:
    """(checkpoint, None), or (None, why it could not be used)."""
    try:
        raw = (disk or RealDisk()).read_file(path, _LAYOUT.size)
    except FileNotFoundError:
        return None, "checkpoint file is missing"
    except OSError as exc:
        return None, f"checkpoint unreadable: {exc.strerror}"
    if len(raw) < _LAYOUT.size:
        return None, f"checkpoint is {len(raw)} bytes, needs {_LAYOUT.size}"
    cp = Checkpoint(*_LAYOUT.unpack(raw))
    if min(cp.physic_ms, cp.logics_ms) < 0:
        return None, "checkpoint holds negative timestamps"
    return cp, None


def lower_checkpoint(disk: Disk, path: str, checkpoint: Checkpoint,
                     timestamp_ms: int) -> Checkpoint:
    """Lower the checkpoint's timestamps to at most `timestamp_ms`, durably,
    and return it: done before recovery cuts flushed data, so that the
    checkpoint never names a record past the cut (a later recovery reads a
    checkpoint beyond its last good record as proof that data was flushed
    past it). Lower only ever widens a later recovery."""
    low = Checkpoint(min(checkpoint.physic_ms, timestamp_ms),
                     min(checkpoint.logics_ms, timestamp_ms),
                     min(checkpoint.index_ms, timestamp_ms))
    f = disk.open(path, create=True)
    try:
        f.pwrite(_LAYOUT.pack(low.physic_ms, low.logics_ms, low.index_ms), 0)
        f.fsync()
    finally:
        f.close()
    return low


class CheckpointFile:
    """The open checkpoint. Each field has one writer:
    - physic (and index, which this store has no service for and so keeps
      equal to physic): `update`, after each CommitLog flush;
    - logics: `update_logics`, after each ConsumeQueue flush, with the store
      timestamp of the last record whose unit — and every earlier record's
      unit — is in the queue files. Abnormal recovery starts from the min of
      the two (Checkpoint.min_timestamp_ms), so records that lost their units
      are re-dispatched.
    Writes are cheap pwrites of the whole 24 bytes under a lock (the two
    writers run on different threads); `sync` makes them durable (on the
    thorough interval and at shutdown). Under the power crash model each
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
        self._lock = threading.Lock()
        self.mark: DurableMark | None = None

    def _packed(self) -> bytes:
        return _LAYOUT.pack(self.last_ms, self.logics_ms, self.last_ms)

    def _write(self) -> None:
        self.file.pwrite(self._packed(), 0)

    def update(self, timestamp_ms: int) -> None:
        """The CommitLog was flushed up to a record stored at `timestamp_ms`."""
        with self._lock:
            if timestamp_ms > self.last_ms:
                self.last_ms = timestamp_ms
                self._write()

    def update_logics(self, timestamp_ms: int) -> None:
        """The ConsumeQueues were flushed up to a record stored at
        `timestamp_ms`. Written as given, not as a max: a lower value (a
        clock step back, a truncation) only widens the next recovery."""
        with self._lock:
            if timestamp_ms != self.logics_ms:
                self.logics_ms = timestamp_ms
                self._write()

    def lower(self, timestamp_ms: int) -> None:
        """Lower both timestamps to at most `timestamp_ms`, durably: before
        a cut, so the checkpoint never names a record past it (see
        lower_checkpoint)."""
        with self._lock:
            self.last_ms = min(self.last_ms, timestamp_ms)
            self.logics_ms = min(self.logics_ms, timestamp_ms)
            self._write()
            self.file.fsync()
            if self.mark is not None:
                self.mark.checkpoint_synced(self._packed())

    def sync(self) -> None:
        # What this fsync covers at least: the bytes written before it
        # starts (a later update may be covered too; restoring the older
        # value is what a power cut before that write-back leaves).
        with self._lock:
            covered = self._packed()
        self.file.fsync()
        if self.mark is not None:
            self.mark.checkpoint_synced(covered)

    def close(self) -> None:
        self.file.close()
