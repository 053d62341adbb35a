"""The broker's epoch file: its format, and its writes through the store's
disk seam (store/seams/disk.py), so the simulation's MemoryDisk runs the same
code (docs/design.md, "Controller mode: the broker's epoch file and rejoin
truncation").

Format (RocketMQ's CheckpointFile, so a RocketMQ 5 broker's
`epochFileCheckpoint` reads here): UTF-8 text, lines ending in "\\n":
    <count>                  the number of entry lines that follow
    <crc>                    CRC-32 (zlib's, as java.util.zip.CRC32) of every
                             entry line with its "\\n", masked to 31 bits
                             (RocketMQ's UtilAll.crc32)
    <epoch>-<start offset>   one line per entry, oldest first
An empty list is the two lines "0" and the CRC of nothing. Every way a
decode can fail raises EpochFileCorruptError: a bad count line, a CRC that
does not match, a count that does not match, an unreadable entry, entries
out of order (ha/autoswitch/epochs.py's invariants).

Writes, crash-safe (the default): the new bytes go to `<path>.tmp`, which
is fsynced, renamed over `<path>`, and the directory fsynced. A crash at any
point leaves the old file or the new one whole: the rename is atomic, and
the temp file is durable before the rename can be. An open removes a temp
file a crash left (the old file still stands; that write never happened).

`--emulate rmq-epoch-in-place` writes as RocketMQ does from 5.1.0 on
(MixAll.string2File): the old contents copied to `<path>.bak`, then the
file overwritten in place, neither fsynced, the directory never synced; an
empty list is not written at all (CheckpointFile.write returns early). A
kill during the overwrite leaves an empty or partial file, a power cut a
torn one or none; the read checks the count and CRC and falls back to
`.bak`, as RocketMQ's read does, and when both fail RocketMQ's broker
starts with no epochs: a new replica, which truncates nothing when it
rejoins.

Under the `power` crash model those unsynced writes are lost by a power
cut on every backend: the simulated disk drops unsynced writes and
directory entries by itself (store/sim/memory_disk.py), and on a real disk,
where a SIGKILL leaves them in the page cache, the node records in the
store's durable mark what the file and its backup held before its first
in-place write, which the harness's power cut puts back
(store/log/durable_mark.py, "Unsynced files"). A file created by its
first, unsynced write is then gone, as on the simulated disk.
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Collection
from dataclasses import dataclass

from ha.autoswitch.epochs import EpochEntry, EpochList, problems
from store.emulate import RMQ_EPOCH_IN_PLACE
from store.failpoints import DISARMED, Failpoints
from store.log.durable_mark import DurableMark
from store.seams.disk import Disk, DiskFile

# RocketMQ's file name under the broker's store root (storePathEpochFile).
FILE_NAME = "epochFileCheckpoint"
TMP_SUFFIX = ".tmp"
BAK_SUFFIX = ".bak"
# Entry lines past this are refused: a real list holds one line per master
# change, and an untrusted count must not make the reader allocate.
MAX_ENTRIES = 1_000_000


class EpochFileCorruptError(ValueError):
    """Bytes that are not a whole, valid epoch file; the message says how."""


class EpochFileError(OSError):
    """The epoch file and its backup are both unreadable; the message names
    them and what to do."""


def _crc(body: bytes) -> int:
    return zlib.crc32(body) & 0x7FFFFFFF


def encode(epochs: EpochList) -> bytes:
    body = "".join(f"{e.epoch}-{e.start_offset}\n" for e in epochs.entries).encode()
    return f"{len(epochs)}\n{_crc(body)}\n".encode() + body


def _whole_number(text: str, what: str) -> int:
    """A number as `encode` writes it: ASCII digits, no sign, no leading
    zero (so one list has one encoding, and what decodes re-encodes to the
    same bytes)."""
    if not text.isdigit() or not text.isascii() or (len(text) > 1 and text[0] == "0"):
        raise EpochFileCorruptError(f"{what} {text[:40]!r} is not a whole number "
                                    "written plainly")
    return int(text)


def decode(data: bytes) -> EpochList:
    """The list `data` holds, or EpochFileCorruptError."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise EpochFileCorruptError("the file is not UTF-8 text") from None
    count_line, nl1, rest = text.partition("\n")
    crc_line, nl2, body = rest.partition("\n")
    if not nl1 or not nl2:
        raise EpochFileCorruptError(f"the file is cut short ({len(data)} bytes: no count "
                                    "and CRC lines)")
    count = _whole_number(count_line, "the count line")
    crc = _whole_number(crc_line, "the CRC line")
    if count > MAX_ENTRIES:
        raise EpochFileCorruptError(f"the count {count} is over {MAX_ENTRIES}")
    if _crc(body.encode()) != crc:
        raise EpochFileCorruptError(f"the entries' CRC is {_crc(body.encode())}, the file "
                                    f"says {crc}: the file is torn or damaged")
    lines = body.split("\n")
    if lines[-1] != "":
        raise EpochFileCorruptError("the last entry line has no line end: the file is cut")
    lines.pop()
    if len(lines) != count:
        raise EpochFileCorruptError(f"the file says {count} entries and holds {len(lines)}")
    entries = []
    for line in lines:
        epoch, dash, start = line.partition("-")
        if not dash:
            raise EpochFileCorruptError(f"entry line {line[:40]!r} is not <epoch>-<offset>")
        entries.append(EpochEntry(_whole_number(epoch, "an epoch"),
                                  _whole_number(start, "a start offset")))
    broken = problems(entries)
    if broken:
        raise EpochFileCorruptError("entries out of order: " + "; ".join(broken))
    return EpochList(tuple(entries))


@dataclass(frozen=True)
class Loaded:
    """What an open read: the list, which file it came from ("main", "bak"
    or "none": neither exists), and a note for the log when it was not the
    main file."""

    epochs: EpochList
    source: str
    note: str | None = None


class EpochFile:
    """The epoch list of one broker, held in memory and written whole on
    every change (RocketMQ's EpochFileCache over its CheckpointFile).

    Not thread-safe: its one caller is the broker's HA role switch."""

    def __init__(self, disk: Disk, path: str, *, failpoints: Failpoints = DISARMED,
                 emulate: Collection[str] = (), mark: DurableMark | None = None) -> None:
        self.disk = disk
        self.path = path
        self.failpoints = failpoints
        self.in_place = RMQ_EPOCH_IN_PLACE in emulate
        # The store's durable mark under the power crash model (None
        # otherwise), for the in-place writes no fsync covers; the file must
        # then be in the store's root.
        self.mark = mark
        loaded = self._load()
        self.epochs = loaded.epochs
        self.loaded_from = loaded.source
        self.note = loaded.note

    # ---------------------------------------------------------------- read
    def _load(self) -> Loaded:
        tmp = self.path + TMP_SUFFIX
        if self.disk.exists(tmp):
            self.disk.unlink(tmp)  # a write a crash stopped before its rename
        main = self._read(self.path)
        if isinstance(main, EpochList):
            return Loaded(main, "main")
        bak_path = self.path + BAK_SUFFIX
        bak = self._read(bak_path)
        if isinstance(bak, EpochList):
            return Loaded(bak, "bak", f"epoch file {self.path} {main}: read its backup "
                                      f"{bak_path}")
        if not self.disk.exists(self.path) and not self.disk.exists(bak_path):
            return Loaded(EpochList(), "none")
        if self.in_place:
            # RocketMQ: initCacheFromFile's IOException is logged and the
            # cache stays empty, so the broker rejoins as a new replica.
            return Loaded(EpochList(), "none",
                          f"epoch file {self.path} {main} and {bak_path} {bak}: "
                          "starting with no epochs (RocketMQ's behaviour)")
        raise EpochFileError(
            f"epoch file {self.path} {main}, and its backup {bak_path} {bak}. "
            "The broker cannot tell which epochs its log holds: restore the file from a "
            "copy, or remove both and the store's log to rejoin as a new replica")

    def _read(self, path: str) -> EpochList | str:
        """The list `path` holds, or why it cannot be read."""
        if not self.disk.exists(path):
            return "does not exist"
        try:
            return decode(self.disk.read_file(path))
        except EpochFileCorruptError as exc:
            return f"is unreadable ({exc})"

    # --------------------------------------------------------------- write
    def replace(self, epochs: EpochList) -> None:
        """Make `epochs` the list, durably before returning (unless emulating
        RocketMQ's in-place write, which makes nothing durable)."""
        if self.in_place:
            self._write_in_place(epochs)
        else:
            self._write_atomically(encode(epochs))
        self.epochs = epochs

    def append(self, entry: EpochEntry) -> None:
        self.replace(self.epochs.append(entry))

    def begin_epoch(self, epoch: int, max_offset: int) -> None:
        """Becoming master (epochs.py EpochList.begin_epoch), written."""
        new = self.epochs.begin_epoch(epoch, max_offset)
        if new != self.epochs:
            self.replace(new)

    def truncate_from(self, offset: int) -> None:
        new = self.epochs.truncate_from(offset)
        if new != self.epochs:
            self.replace(new)

    def _write_atomically(self, data: bytes) -> None:
        """Temp file, fsync, rename, directory fsync (module docstring)."""
        tmp = self.path + TMP_SUFFIX
        if self.disk.exists(tmp):
            self.disk.unlink(tmp)
        f = self.disk.create(tmp)
        try:
            _write_all(f, data)
            self.failpoints.hit("epoch_file_before_fsync")
            f.fsync()
        finally:
            f.close()
        self.failpoints.hit("epoch_file_before_rename")
        self.disk.rename(tmp, self.path)
        self.failpoints.hit("epoch_file_before_dir_fsync")
        self.disk.fsync_dir(os.path.dirname(self.path) or ".")

    def _write_in_place(self, epochs: EpochList) -> None:
        """--emulate rmq-epoch-in-place: RocketMQ's CheckpointFile.write over
        MixAll.string2File (module docstring). Real fix: none in RocketMQ as
        of the corpus; the default path above is the fix."""
        if not epochs.entries:
            return  # CheckpointFile.write: `if (entries.isEmpty()) return;`
        self._before_unsynced_write()
        if self.disk.exists(self.path):
            old = self.disk.read_file(self.path)
            _overwrite(self.disk, self.path + BAK_SUFFIX, old)
        self.failpoints.hit("epoch_file_before_overwrite")
        f = self.disk.open(self.path, create=True)
        try:
            f.truncate(0)
            self.failpoints.hit("epoch_file_mid_overwrite")
            _write_all(f, encode(epochs))
        finally:
            f.close()


    def _before_unsynced_write(self) -> None:
        """Under the power crash model, before the first write that no
        fsync will cover: what the file and its backup hold now goes to the
        durable mark, for a power cut to put back (module docstring). Now
        is before any write of them since the open, so it is what the
        previous run durably left."""
        if self.mark is None or self.mark.unsynced_recorded:
            return
        self.mark.unsynced_files({p: self.disk.read_file(p) if self.disk.exists(p) else None
                                  for p in (self.path, self.path + BAK_SUFFIX)})


def _write_all(f: DiskFile, data: bytes) -> None:
    pos = 0
    while pos < len(data):
        n = f.pwrite(memoryview(data)[pos:], pos)
        if n <= 0:
            raise OSError(f"short write of the epoch file at byte {pos}")
        pos += n


def _overwrite(disk: Disk, path: str, data: bytes) -> None:
    """FileOutputStream over `path` and one write: truncated, then written,
    no fsync."""
    f = disk.open(path, create=True)
    try:
        f.truncate(0)
        _write_all(f, data)
    finally:
        f.close()
