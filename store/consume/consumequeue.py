"""ConsumeQueue: the per-(topic, queue id) index consumers read through.

Layout (RocketMQ's): `<store root>/consumequeue/<topic>/<queue id>/` holds
fixed-size files named by the 20-digit byte offset of their first unit within
the queue. A unit is 20 bytes, big-endian:

    0  8  commitlog offset of the record
    8  4  record size
   12  8  tag hash (Java String.hashCode of the TAGS property; 0 without tags)

Unit i is the message at QUEUEOFFSET i; its bytes sit at i * 20.

The queues are derived data: every unit is rebuilt from the CommitLog by
dispatch (`ConsumeQueues.dispatch`, fed by `store.consume.reput`). So a unit is never
more durable than its record, and recovery:
  1. loads each queue up to its last valid unit (offset >= 0 and size > 0, as
     RocketMQ), stopping at one that points past the recovered CommitLog
     (RocketMQ's truncateDirtyLogicFiles);
  2. cuts everything after it crash-safely: the first dropped unit is zeroed
     and synced BEFORE the file is shortened and later files removed, so a
     crash mid-cut leaves a zero unit that stops the next scan (and the next
     recovery finishes the cut) — a cut tail never comes back;
  3. lets the store re-dispatch records from `reput_start()`: no queue can
     lack a unit for a record before it (units of a queue are contiguous and
     ordered by commitlog offset; see the method), and dispatch skips units it
     already holds, so nothing is duplicated.

Crash model, as the CommitLog's: under `power`, units not yet flushed live
only in memory and reach the files at flush (write + fsync); under `process`,
they are written at dispatch and flush only fsyncs.

All units are also kept in memory (compact arrays), so reads never touch the
files; the files are for recovery.
"""

from __future__ import annotations

import logging
import os
import struct
import sys
import threading
from array import array
from collections.abc import Callable, Iterable, Sequence

from store.names import queue_id_problem, topic_problem
from store.seams.disk import Disk, DiskFile

UNIT = struct.Struct(">qiq")
UNIT_SIZE = UNIT.size  # 20
assert UNIT_SIZE == 20
DIR_NAME = "consumequeue"
log = logging.getLogger("dlab.store.consumequeue")


class DispatchError(RuntimeError):
    """A record's QUEUEOFFSET does not fit its queue (a gap, or a different
    record already at that index): the CommitLog and its index disagree.
    Or the record's topic or queue id cannot name a queue directory
    (store/names.py): a store written before names were checked.
    `kind` is "gap", "conflict" or "name"; `index` the QUEUEOFFSET in question."""

    def __init__(self, message: str, *, topic: str, queue_id: int, index: int,
                 kind: str) -> None:
        super().__init__(message)
        self.topic = topic
        self.queue_id = queue_id
        self.index = index
        self.kind = kind


def _name_error(topic: str, queue_id: int, queue_offset: int) -> DispatchError | None:
    """The DispatchError (kind "name") for a record whose topic or queue id
    cannot name a queue directory (`../x`, `/tmp/x`, a NUL, -1), else None."""
    problem = topic_problem(topic) or queue_id_problem(queue_id)
    if problem is None:
        return None
    return DispatchError(f"record {topic[:80]!r}/{queue_id} #{queue_offset}: {problem}",
                         topic=topic, queue_id=queue_id, index=queue_offset, kind="name")


def tags_hash(tags: str | None) -> int:
    """RocketMQ's tagsString2tagsCode: Java String.hashCode (UTF-16 code
    units, 32-bit signed), 0 for no tags."""
    if not tags:
        return 0
    h = 0
    raw = tags.encode("utf-16-be", "surrogatepass")
    for i in range(0, len(raw), 2):
        h = (31 * h + (raw[i] << 8 | raw[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h


def _columns(data: bytes) -> tuple[array[int], array[int], array[int]]:
    """The three fields of every unit in `data` as arrays, without a Python
    loop per unit: strided byte copies gather each field contiguously, then
    one byteswap turns big-endian into native order."""
    n = len(data) // UNIT_SIZE
    cols = []
    for start, width, code in ((0, 8, "q"), (8, 4, "i"), (12, 8, "q")):
        buf = bytearray(n * width)
        for b in range(width):
            buf[b::width] = data[start + b::UNIT_SIZE]
        col = array(code)
        col.frombytes(bytes(buf))
        if UNIT_BYTE_ORDER_SWAP:
            col.byteswap()
        cols.append(col)
    return cols[0], cols[1], cols[2]


UNIT_BYTE_ORDER_SWAP = sys.byteorder == "little"


def _name(start_byte: int) -> str:
    return f"{start_byte:020d}"


class ConsumeQueue:
    """One queue's units: in memory, and in its files up to `_written`."""

    def __init__(self, directory: str, topic: str, queue_id: int, *, file_units: int,
                 write_through: bool, disk: Disk) -> None:
        self.disk = disk
        self.directory = directory
        self.topic = topic
        self.queue_id = queue_id
        self.file_units = file_units
        self.write_through = write_through
        self.offsets = array("q")
        self.sizes = array("i")
        self.tags = array("q")
        self._written = 0  # units [0, _written) are in the files (maybe not synced)
        self._synced = 0  # units [0, _synced) are fsynced
        self._files: dict[int, DiskFile] = {}

    # ------------------------------------------------------------- basics
    @property
    def count(self) -> int:
        """Units held: the next QUEUEOFFSET of this queue."""
        return len(self.offsets)

    def unit(self, index: int) -> tuple[int, int, int]:
        return self.offsets[index], self.sizes[index], self.tags[index]

    def consumable(self, confirmed: int) -> int:
        """How many units point at records that end at or before `confirmed`
        (units are ordered by commitlog offset, so a binary search)."""
        lo, hi = 0, len(self.offsets)
        offsets, sizes = self.offsets, self.sizes
        if hi == 0 or offsets[hi - 1] + sizes[hi - 1] <= confirmed:
            return hi
        while lo < hi:
            mid = (lo + hi) // 2
            if offsets[mid] + sizes[mid] <= confirmed:
                lo = mid + 1
            else:
                hi = mid
        return lo

    def last_end(self) -> int | None:
        n = len(self.offsets)
        return None if n == 0 else self.offsets[n - 1] + self.sizes[n - 1]

    # ----------------------------------------------------------- dispatch
    def dispatch(self, queue_offset: int, offset: int, size: int, tag: int) -> bool:
        """Add the unit for one record. False when it is already there (a
        re-dispatch after recovery); DispatchError on a gap or a conflict."""
        n = len(self.offsets)
        if queue_offset < n:
            if self.offsets[queue_offset] == offset and self.sizes[queue_offset] == size:
                return False
            raise DispatchError(
                f"{self.topic}/{self.queue_id}: unit {queue_offset} points at "
                f"{self.offsets[queue_offset]} (size {self.sizes[queue_offset]}), but the "
                f"record at {offset} (size {size}) has that QUEUEOFFSET",
                topic=self.topic, queue_id=self.queue_id, index=queue_offset, kind="conflict")
        if queue_offset > n:
            raise DispatchError(
                f"{self.topic}/{self.queue_id}: record at {offset} has QUEUEOFFSET "
                f"{queue_offset} but the queue holds {n} units (a gap)",
                topic=self.topic, queue_id=self.queue_id, index=queue_offset, kind="gap")
        self.offsets.append(offset)
        self.sizes.append(size)
        self.tags.append(tag)
        return True

    # -------------------------------------------------------------- files
    def _file(self, file_index: int) -> DiskFile:
        f = self._files.get(file_index)
        if f is None:
            disk = self.disk
            disk.makedirs(self.directory)
            path = os.path.join(self.directory, _name(file_index * self.file_units * UNIT_SIZE))
            existed = disk.exists(path)
            f = disk.open(path, create=True)
            self._files[file_index] = f
            if not existed:
                disk.fsync_dir(self.directory)
        return f

    def write_pending(self) -> set[int]:
        """Write units not yet in the files; returns the file indexes touched."""
        touched: set[int] = set()
        i, n = self._written, len(self.offsets)
        while i < n:
            f = i // self.file_units
            end = min(n, (f + 1) * self.file_units)
            buf = b"".join(UNIT.pack(self.offsets[j], self.sizes[j], self.tags[j])
                           for j in range(i, end))
            self._file(f).pwrite(buf, (i - f * self.file_units) * UNIT_SIZE)
            touched.add(f)
            i = end
        self._written = n
        return touched

    def flush(self) -> None:
        touched = self.write_pending()
        if self._synced < self._written:
            first = self._synced // self.file_units
            for f in sorted(touched | {first}):
                if f in self._files:
                    self._files[f].fdatasync()
        self._synced = self._written

    def close(self) -> None:
        for f in self._files.values():
            f.close()
        self._files.clear()

    # ----------------------------------------------------------- recovery
    def load(self, commitlog_end: int, on_cut: Callable[[], None]) -> str | None:
        """Read the files, keep units up to the last valid one, cut the rest
        crash-safely. Returns a note when something was cut, else None."""
        names = [n for n in self.disk.listdir(self.directory) if n.isdigit() and len(n) == 20]
        span = self.file_units * UNIT_SIZE
        starts = [int(n) for n in names]
        note = None
        stop_reason = None
        for k, start in enumerate(starts):
            if start != k * span:
                stop_reason = f"file {_name(start)} out of sequence"
                break
            data = self.disk.read_file(os.path.join(self.directory, _name(start)), span)
            ok = True
            whole = data[: len(data) - len(data) % UNIT_SIZE]
            offs, sizes, tags = _columns(whole)
            units: Iterable[tuple[int, int, int]] = ()
            if offs and (min(offs) < 0 or min(sizes) <= 0
                         or offs[-1] + sizes[-1] > commitlog_end):
                units = UNIT.iter_unpack(whole)  # find the first bad unit one by one
            else:
                # The common case, checked in bulk (recovery time matters).
                self.offsets.extend(offs)
                self.sizes.extend(sizes)
                self.tags.extend(tags)
            for offset, size, tag in units:
                if offset < 0 or size <= 0:
                    ok = False
                    if offset or size or tag:
                        stop_reason = f"invalid unit {len(self.offsets)}"
                    break
                if offset + size > commitlog_end:
                    ok = False
                    stop_reason = (f"unit {len(self.offsets)} points past the CommitLog end "
                                   f"{commitlog_end}")
                    break
                self.offsets.append(offset)
                self.sizes.append(size)
                self.tags.append(tag)
            if not ok or len(data) < span:
                break
        self._written = self._synced = len(self.offsets)
        if self._cut_needed(starts, span):
            self._cut(starts, span, on_cut)
            note = (f"{self.topic}/{self.queue_id}: units from {len(self.offsets)} dropped"
                    + (f" ({stop_reason})" if stop_reason else ""))
        return note

    def _cut_needed(self, starts: list[int], span: int) -> bool:
        """Whether anything beyond the kept units is on disk: a later (or
        misnamed) file, or bytes after the last kept unit in its file."""
        n = len(self.offsets)
        keep_file, at = divmod(n, self.file_units)
        for start in starts:
            k, rem = divmod(start, span)
            if rem or k > keep_file:
                return True
            if k == keep_file:
                size = self.disk.size(os.path.join(self.directory, _name(start)))
                if size > at * UNIT_SIZE:
                    return True
        return False

    def _cut(self, starts: list[int], span: int, on_cut: Callable[[], None]) -> None:
        n = len(self.offsets)
        keep_file = n // self.file_units
        at = (n - keep_file * self.file_units) * UNIT_SIZE
        path = os.path.join(self.directory, _name(keep_file * span))
        disk = self.disk
        if disk.exists(path):
            f = disk.open(path)
            try:
                if disk.size(path) > at:
                    # Zero the first dropped unit durably first: from here on a
                    # crash leaves a stop mark, never a readable tail.
                    f.pwrite(bytes(UNIT_SIZE), at)
                    f.fdatasync()
                    on_cut()
                    f.truncate(at)
                    f.fsync()
            finally:
                f.close()
        for start in starts:
            if start // span > keep_file or start % span:
                disk.unlink(os.path.join(self.directory, _name(start)))
        disk.fsync_dir(self.directory)

    def truncate_after(self, commitlog_offset: int, on_cut: Callable[[], None]) -> None:
        """Drop units whose record ends past `commitlog_offset` (a slave
        truncating its log), memory and files, crash-safely."""
        self.truncate_units(self.consumable(commitlog_offset), on_cut)

    def truncate_units(self, keep: int, on_cut: Callable[[], None]) -> None:
        """Keep units [0, keep), drop the rest from memory and files,
        crash-safely (see _cut). The caller holds ConsumeQueues' IO lock."""
        if keep >= len(self.offsets):
            return
        self.flush()
        del self.offsets[keep:], self.sizes[keep:], self.tags[keep:]
        self._written = self._synced = keep
        self.close()
        names = [n for n in self.disk.listdir(self.directory) if n.isdigit() and len(n) == 20]
        self._cut([int(n) for n in names], self.file_units * UNIT_SIZE, on_cut)


class ConsumeQueues:
    """Every queue of one store."""

    def __init__(self, root: str, *, file_units: int, write_through: bool, disk: Disk) -> None:
        self.disk = disk
        self.root = os.path.join(root, DIR_NAME)
        self.file_units = file_units
        self.write_through = write_through
        self.queues: dict[tuple[str, int], ConsumeQueue] = {}
        self.notes: list[str] = []
        self.write_error: str | None = None
        # Store timestamp of the last record dispatched (its unit, and every
        # earlier record's, is in memory); None until one is.
        self.last_ts: int | None = None
        # Records dispatch could not index (non-strict dispatch): how many,
        # and the first one's error.
        self.skipped = 0
        self.dispatch_error: str | None = None
        # Per queue, one past the largest QUEUEOFFSET of a skipped record:
        # the CommitLog must not hand that offset out again.
        self.skipped_next: dict[tuple[str, int], int] = {}
        # File IO and cuts run on the flusher thread and the event loop:
        # one at a time. Dispatch appends without it (an append never moves
        # a unit a concurrent write is copying).
        self._io_lock = threading.Lock()

    def _new(self, topic: str, queue_id: int, queue_offset: int = 0) -> ConsumeQueue:
        """A new queue; DispatchError (kind "name") where the topic or queue
        id would make a path outside the rule (`../x`, `/tmp/x`, a NUL)."""
        bad = _name_error(topic, queue_id, queue_offset)
        if bad is not None:
            raise bad
        q = ConsumeQueue(os.path.join(self.root, topic, str(queue_id)), topic, queue_id,
                         file_units=self.file_units, write_through=self.write_through,
                         disk=self.disk)
        self.queues[(topic, queue_id)] = q
        return q

    def load(self, commitlog_end: int, on_cut: Callable[[], None]) -> None:
        disk = self.disk
        if not disk.isdir(self.root):
            return
        for topic in disk.listdir(self.root):
            tdir = os.path.join(self.root, topic)
            if not disk.isdir(tdir):
                continue
            # Never followed out of the store: a name the rule refuses, or a
            # symbolic link, is left alone (the CommitLog rebuilds the queues).
            problem = topic_problem(topic) or ("a symbolic link" if disk.islink(tdir)
                                               else None)
            if problem:
                self.notes.append(f"ignored {DIR_NAME}/{topic[:80]!r}: {problem}")
                continue
            for qid in disk.listdir(tdir):
                qdir = os.path.join(tdir, qid)
                if (not qid.isdigit() or qid != str(int(qid)) or queue_id_problem(int(qid))
                        or disk.islink(qdir) or not disk.isdir(qdir)):
                    self.notes.append(f"ignored {os.path.join(topic, qid)}: not a queue directory")
                    continue
                note = self._new(topic, int(qid)).load(commitlog_end, on_cut)
                if note:
                    self.notes.append(note)

    def get(self, topic: str, queue_id: int) -> ConsumeQueue | None:
        return self.queues.get((topic, queue_id))

    def dispatch(self, units: Iterable[tuple[str, int, int, int, int, int, int]], *,
                 strict: bool = True) -> int:
        """(topic, queue_id, queue_offset, offset, size, tag, store timestamp)
        per record, in commitlog order. Returns how many units were added.

        A record that does not fit its queue (DispatchError): `strict`
        raises at the first one (units before it stay dispatched); otherwise
        the record gets no unit, the error is logged and counted in
        `skipped` / `dispatch_error`, and dispatch goes on — the store keeps
        serving every queue, and the problem shows in its state."""
        added = 0
        queues = self.queues
        try:
            for topic, qid, qo, offset, size, tag, ts in units:
                q = queues.get((topic, qid))
                try:
                    if q is None:
                        q = self._new(topic, qid, qo)
                    added += q.dispatch(qo, offset, size, tag)
                except DispatchError as exc:
                    # A bad name stays bad however often dispatch is retried:
                    # skipped even when strict.
                    if strict and exc.kind != "name":
                        raise
                    self._skip(exc)
                self.last_ts = ts  # after the unit: flush reads it before writing
        finally:
            if self.write_through and added:
                with self._io_lock:
                    self._guarded(lambda: [q.write_pending() for q in list(queues.values())
                                           if q._written < q.count])
        return added

    def dispatch_groups(self, groups: Sequence[tuple[str, int, bool, bytes, bytes, bytes, bytes]],
                        last_ts: int | None, *, strict: bool = True) -> int:
        """The same as `dispatch`, for units the native reput gathered per
        queue: (topic, queue_id, contiguous, qos, offsets, sizes, tags), the
        last four native-endian arrays. A group that continues its queue
        exactly is appended in bulk; any other goes unit by unit, with
        dispatch's checks."""
        added = 0
        try:
            for topic, qid, contiguous, qos_b, offs_b, sizes_b, tags_b in groups:
                qos, offs, sizes, tags = array("q"), array("q"), array("i"), array("q")
                qos.frombytes(qos_b)
                q = self.queues.get((topic, qid))
                if q is None:
                    bad = _name_error(topic, qid, qos[0])
                    if bad is not None:  # each record skipped, as dispatch skips it
                        for qo in qos:
                            self._skip(_name_error(topic, qid, qo) or bad)
                        continue
                    q = self._new(topic, qid)
                offs.frombytes(offs_b)
                sizes.frombytes(sizes_b)
                tags.frombytes(tags_b)
                if contiguous and qos[0] == q.count:
                    q.offsets.extend(offs)
                    q.sizes.extend(sizes)
                    q.tags.extend(tags)
                    added += len(qos)
                    continue
                for i in range(len(qos)):
                    try:
                        added += q.dispatch(qos[i], offs[i], sizes[i], tags[i])
                    except DispatchError as exc:
                        if strict:
                            raise
                        self._skip(exc)
            if last_ts is not None:
                self.last_ts = last_ts
        finally:
            if self.write_through and added:
                with self._io_lock:
                    self._guarded(lambda: [q.write_pending() for q in list(self.queues.values())
                                           if q._written < q.count])
        return added

    def _skip(self, exc: DispatchError) -> None:
        key = (exc.topic, exc.queue_id)
        self.skipped_next[key] = max(self.skipped_next.get(key, 0), exc.index + 1)
        self.skipped += 1
        if self.dispatch_error is None:
            self.dispatch_error = f"record without a consume queue unit: {exc}"
        if self.skipped <= 10:
            log.error("dispatch: %s; the record gets no unit (consumers of that queue will "
                      "not see it)%s", exc, "; further ones are counted only"
                      if self.skipped == 10 else "")

    def _guarded(self, fn: Callable[[], object]) -> bool:
        """Run a file write of the queues. A failure (a full disk) is kept
        as `write_error` and logged, never raised: the units stay in memory
        for reads, later flushes retry, and recovery rebuilds whatever the
        files lack from the CommitLog (see reput_start)."""
        try:
            fn()
        except OSError as exc:
            if self.write_error is None:
                log.warning("consume queue write failed (%s); the queues are rebuilt from "
                            "the CommitLog at the next open", exc)
            self.write_error = f"consume queue write failed: {exc}"
            return False
        self.write_error = None
        return True

    def max_end(self) -> int | None:
        """The largest end of a record any queue indexes (RocketMQ's
        maxPhysicOffset over the queues)."""
        ends = [e for q in self.queues.values() if (e := q.last_end()) is not None]
        return max(ends) if ends else None

    def reput_start(self, commitlog_min: int, *, floor: int) -> int:
        """Where re-dispatch must start so that every record gets its unit:
        the larger of two starts that are each safe.

        Structural: a record lacking a unit lies after its own queue's last
        unit (a queue's units are contiguous and ordered), so after the
        smallest such end — or, for a queue with no unit at all, after the
        last queue flush, which no queue's last end can exceed under `power`
        (units after it were lost with memory) and which loses nothing under
        `process` (units reach the OS at dispatch). One quiet queue holds
        this back to its last message, so alone it could mean walking the
        whole log at every open.

        `floor`, from the store: after a clean shutdown every record had a
        unit in the files, so the queues' largest end (RocketMQ's
        reputFromOffset); after a crash, the segment abnormal recovery
        started from, chosen by min(physic, logics) of the checkpoint — the
        logics timestamp is written only after the units of every record up
        to it were flushed (RocketMQ's recoverAbnormally re-dispatches from
        there too)."""
        ends = [e for q in self.queues.values() if (e := q.last_end()) is not None]
        structural = min(ends) if ends else commitlog_min
        return max(structural, floor)

    def flush(self) -> int | None:
        """Write and fsync every queue. Returns the store timestamp of the
        last record whose unit — and every earlier record's — is now in the
        files (the checkpoint's logicsMsgTimestamp), or None when the write
        failed or nothing was dispatched yet. The timestamp is read BEFORE
        writing: units dispatched meanwhile are written too, never fewer."""
        ts = self.last_ts

        def flush_all() -> None:
            for q in list(self.queues.values()):
                q.flush()

        with self._io_lock:
            ok = self._guarded(flush_all)
        return ts if ok else None

    def truncate_after(self, commitlog_offset: int, on_cut: Callable[[], None]) -> None:
        with self._io_lock:
            for q in self.queues.values():
                q.truncate_after(commitlog_offset, on_cut)
            # The last dispatched record may be gone: claim nothing until the
            # next dispatch.
            self.last_ts = None

    def truncate_queue(self, topic: str, queue_id: int, keep: int,
                       on_cut: Callable[[], None]) -> None:
        """Keep the first `keep` units of one queue (a unit the CommitLog
        contradicts, found by re-dispatch at open)."""
        q = self.queues.get((topic, queue_id))
        if q is not None:
            with self._io_lock:
                q.truncate_units(keep, on_cut)

    def next_queue_offsets(self) -> dict[tuple[str, int], int]:
        """The QUEUEOFFSET each queue's next record takes (what
        CommitLog._queue_offsets must continue from)."""
        out = {k: q.count for k, q in self.queues.items()}
        for k, n in self.skipped_next.items():
            out[k] = max(out.get(k, 0), n)
        return out

    def close(self) -> None:
        with self._io_lock:
            for q in self.queues.values():
                q.close()
