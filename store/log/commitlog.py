"""The CommitLog: segments on disk, the positions `wrote` and `flushed`, and
the bytes in between.

Invariants (asserted):
    0 <= min_offset <= flushed <= in_file <= wrote
    `in_file`: bytes below it have been handed to the OS (pwrite).
Under the POWER crash model, bytes in [in_file, wrote) live only in this
process (the `pending` chunks) until flush() writes and fsyncs them, so a
SIGKILL loses exactly what a power cut would. Under PROCESS, append writes at
once (in_file == wrote) and flush only fsyncs.

Ordering rules:
- flush() makes bytes durable BEFORE it advances `flushed` and BEFORE it
  writes the checkpoint; the checkpoint therefore never names a record that
  is not on disk. Under POWER it records each completed fsync's end in the
  durable mark (store/log/durable_mark.py) AFTER the fsync and BEFORE advancing
  `flushed`, so a harness can cut a SIGKILLed store to exactly what a power
  cut leaves (a flush killed between its write and its fsync loses its
  bytes). Only the planted fault `planted-ack-before-fsync` breaks the
  first rule (store/emulate.py): it advances `flushed` before the fsync,
  and the mark still follows the fsyncs.
- truncate_to() makes the cut durable (header zeroed, fsync; tail cleared,
  fsync; later segments unlinked, dir fsync) BEFORE any new byte may be
  appended, so a crash can never bring a truncated tail back.
- Under SYNC_FLUSH and POWER, flush() also keeps zeros written a little
  past the end it just wrote (never below it: nothing but the flush writes
  the file under POWER, so every byte there is unwritten or still pending).
- After any write or sync error the log stops accepting appends for good
  (`failed` says why); bytes already flushed are never touched again.
- A segment that cannot be created (a full disk, a file size limit) only
  refuses appends for now (`cannot_grow` says why): nothing was written,
  everything pending lies in segments that exist and flush() still writes
  it. The next append at least SEGMENT_RETRY_S later tries again, so appends
  resume by themselves once space is freed.

Thread model: appends and reads come from the event loop thread, flush() from
one flusher thread; `_lock` guards positions and pending chunks, `_flush_lock`
serialises flushes and truncation. `_flush_lock` is held across a flush's
failpoint stalls, so it comes from the flush executor (`new_lock`): a
threading.Lock, or on a simulated cluster a lock a parked task can hold.
"""

from __future__ import annotations

import bisect
import contextlib
import errno
import logging
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from store.config import MIB, CrashModel, FlushMode, StoreConfig
from store.emulate import (
    PLANTED_ACK_BEFORE_FSYNC,
    PLANTED_CHECKPOINT_BEFORE_FLUSH,
    RMQ_2706,
    RMQ_10666,
)
from store.failpoints import DISARMED, Failpoints
from store.log import native as native_codec
from store.log.checkpoint import CheckpointFile
from store.log.cuts import cut_on_disk, unlink_after
from store.log.durable_mark import DurableMark
from store.log.placement import end_limit, place
from store.log.record import (
    BLANK_MAGIC,
    BLANK_SIZE,
    MESSAGE_MAGIC,
    CorruptRecordError,
    Message,
    Record,
    decode,
    encode,
    encode_blank,
    ipv4_field,
    peek,
    verify,
)
from store.log.segments import Segment, segment_name
from store.log.writebuffers import WriteBuffers
from store.names import queue_id_problem, topic_problem
from store.seams.clock import Clock
from store.seams.disk import Disk
from store.seams.flush_executor import StoreLock
from store.status import PutResult, PutStatus

# SYNC_FLUSH under POWER: how far past the flushed end the flush keeps
# zeros written (see CommitLog._zero_ahead).
ZERO_AHEAD_BYTES = 1024 * 1024
# ... but only after writes smaller than this: a large write amortises its
# extent conversion, and zeros written ahead of it are written (and fsynced)
# twice: a slave applying and flushing 1 MiB ranges wrote every byte twice
# (see docs/performance-notes.md, "Group commit").
ZERO_AHEAD_MAX_WRITE = ZERO_AHEAD_BYTES // 4
# Written from, not allocated (and faulted in) at every step.
_ZEROS = memoryview(bytes(ZERO_AHEAD_BYTES))


def _host_field(host: tuple[str, int]) -> bytes | None:
    """STOREHOSTADDRESS as `encode` writes it (IPv4 + port), for the native
    encoder; None where the port does not fit, so the Python path says why."""
    try:
        return ipv4_field(host[0]) + host[1].to_bytes(4, "big", signed=True)
    except OverflowError:
        return None


class StoreFailedError(RuntimeError):
    """The log hit a write error earlier and accepts no more writes."""


class SegmentUnavailableError(StoreFailedError):
    """The next segment cannot be created (a full disk, a file size limit):
    nothing was written, and a later append tries again."""


# drop_flushed_pages advises in whole steps of this (see _drop_pages).
DROP_PAGES_STEP = 2 * MIB

# A segment that could not be created is tried again by the first append
# this long after the failure; appends before then are refused at once (a
# failing fallocate of a large segment is not free, and a full disk does
# not empty itself within milliseconds).
SEGMENT_RETRY_S = 1.0

# The planted fault (--emulate planted-ack-before-fsync) leaves its fsyncs
# until this many acknowledged bytes wait for one (or a clean close). With
# a one-flush lag instead, a busy flusher synced each flush's bytes as the
# next flush began, often before the acks of the first had left, so a crash
# met an acknowledged, unsynced byte only by luck (a CI run on a loaded
# machine missed it). Bounded, so the unsynced bytes stay a bounded amount.
PLANTED_LAG_BYTES = MIB

_log = logging.getLogger("dlab.store.commitlog")


class OffsetMismatchError(ValueError):
    """A raw range from a master does not start at this log's `wrote`."""


class RangeRejectedError(ValueError):
    """A raw range from a master failed verification; nothing was appended."""


@dataclass(frozen=True)
class Positions:
    min_offset: int
    flushed: int
    wrote: int
    crash_model: str
    failed: str | None
    cannot_grow: str | None = None


class CommitLog:
    def __init__(
        self,
        directory: str,
        config: StoreConfig,
        clock: Clock,
        checkpoint: CheckpointFile,
        segments: list[Segment],
        end: int,
        last_store_timestamp_ms: int,
        failpoints: Failpoints = DISARMED,
        *,
        disk: Disk,
        mark: DurableMark | None = None,
        new_lock: Callable[[], StoreLock] = threading.Lock,
    ) -> None:
        self.directory = directory
        self.disk = disk
        self.config = config
        self.clock = clock
        self.checkpoint = checkpoint
        self.seg_size = config.segment_size_bytes
        self.segments = segments
        self._starts = [s.start for s in segments]
        self.min_offset = segments[0].start if segments else 0
        self.wrote = end
        self.flushed = end
        self.in_file = end
        self._power = config.crash_model == CrashModel.POWER
        self._sync_flush = config.flush_mode == FlushMode.SYNC_FLUSH
        # Where completed fsyncs are recorded (POWER; None: nowhere).
        self.mark = mark
        # The planted fault (store/emulate.py): flushes written but not yet
        # fsynced, with the end and timestamp their fsync will make durable.
        self._ack_before_fsync = PLANTED_ACK_BEFORE_FSYNC in config.emulate
        self._unsynced: dict[int, Segment] = {}
        self._unsynced_from = end
        self._unsynced_end = end
        self._unsynced_ts = last_store_timestamp_ms
        self._checkpoint_first = PLANTED_CHECKPOINT_BEFORE_FLUSH in config.emulate
        # The end the running flush has taken (== flushed between flushes);
        # read only by --emulate planted-dispatch-before-durable.
        self.flush_target = end
        # Pending chunks not yet in the file (POWER) or not yet fsynced (PROCESS):
        # parallel lists from index _head on; _p_end is the logical end (a blank
        # covers the rest of its segment).
        self._p_start: list[int] = []
        self._p_end: list[int] = []
        self._p_data: list[bytes | memoryview] = []
        self._buffers = WriteBuffers(config.write_buffer_bytes, keep=config.write_buffers_kept,
                                     preallocated=config.write_buffers_preallocated)
        self._head = 0
        self._last_ts = last_store_timestamp_ms
        self._host_field = _host_field(config.store_host)
        self._queue_offsets: dict[tuple[str, int], int] = {}
        self._lock = threading.Lock()
        self._flush_lock = new_lock()
        self.failed: str | None = None
        self._flush_failed = False
        # Why appends are refused for now: the segment at `wrote` could not
        # be created (see the module docstring); retried from _retry_at on.
        self.cannot_grow: str | None = None
        self._retry_at = 0.0
        self.fsyncs = 0
        self.failpoints = failpoints
        # drop_flushed_pages: how far the page cache was dropped, and the
        # offset below which nothing will soon read the log (the store sets
        # it to its consume-queue reput position, which reads every record
        # once: its pages must not be dropped before it has).
        self._dropped_to = end
        self.cold_below: Callable[[], int] = lambda: self.flushed
        self._check()

    # ---------------------------------------------------------------- state
    def _check(self) -> None:
        assert 0 <= self.min_offset <= self.flushed <= self.in_file <= self.wrote, (
            self.min_offset, self.flushed, self.in_file, self.wrote)

    def positions(self) -> Positions:
        with self._lock:
            return Positions(
                self.min_offset, self.flushed, self.wrote, self.config.crash_model.value,
                self.failed, self.cannot_grow,
            )

    @property
    def dirty_bytes(self) -> int:
        return self.wrote - self.flushed

    def _segment_for(self, offset: int) -> Segment:
        i = bisect.bisect_right(self._starts, offset) - 1
        if i < 0:
            raise ValueError(f"offset {offset} is below the first segment")
        seg = self.segments[i]
        if offset >= seg.end:
            raise ValueError(f"offset {offset} is past the last segment")
        return seg

    def _segment_at_wrote(self) -> Segment:
        """The segment `wrote` falls in, created if it does not exist yet.
        Raises SegmentUnavailableError when it cannot be created (and sets
        `cannot_grow`); nothing is written then."""
        if self.segments and self.wrote < self.segments[-1].end:
            return self.segments[-1]
        start = self.wrote
        assert start % self.seg_size == 0, start
        try:
            seg = Segment.create(self.disk, self.directory, start, self.seg_size)
        except OSError as exc:
            first = self.cannot_grow is None
            self.cannot_grow = self._explain_no_segment(start, exc)
            self._retry_at = self.clock.monotonic() + SEGMENT_RETRY_S
            if first:
                _log.error("%s", self.cannot_grow)
            raise SegmentUnavailableError(self.cannot_grow) from exc
        if self.cannot_grow is not None:
            _log.warning("segment %s created: the log accepts appends again", segment_name(start))
            self.cannot_grow = None
        self.segments.append(seg)
        self._starts.append(start)
        self.failpoints.hit("segment_roll")
        return seg

    def _explain_no_segment(self, start: int, exc: OSError) -> str:
        what = (f"cannot create CommitLog segment {segment_name(start)} "
                f"({self.seg_size} bytes) in {self.directory}: {exc.strerror or exc} "
                f"(errno {exc.errno})")
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            with contextlib.suppress(OSError):
                what += f"; {self.disk.free_bytes(self.directory)} bytes are free there"
            return (f"disk full: {what}; free space on that filesystem (or use a smaller "
                    "segment size): puts are refused until then and resume by themselves")
        return (f"{what}; puts are refused until a segment can be created, and resume by "
                "themselves then")

    def _fail(self, exc: OSError, during: str) -> None:
        """A write or sync failed: no more appends or flushes, ever."""
        self.failed = f"{during} failed: {exc.strerror or exc} (errno {exc.errno})"
        self._flush_failed = True

    def _refused(self) -> str | None:
        """Why an append must be refused right now (under the lock), if so."""
        if self.failed:
            return self.failed
        if self.cannot_grow is not None and self.clock.monotonic() < self._retry_at:
            return self.cannot_grow
        return None

    # --------------------------------------------------------------- append
    def _push(self, seg: Segment, start: int, data: bytes | memoryview,
              logical_end: int) -> None:
        """Queue a chunk at `start`; under PROCESS write it through now (and
        queue no bytes: nothing reads them again, so the buffer is free)."""
        if not self._power:
            seg.pwrite(start - seg.start, data)
            self.in_file = logical_end
            if isinstance(data, memoryview):
                self._buffers.flushed([data])
                data = b""
        self._p_start.append(start)
        self._p_end.append(logical_end)
        self._p_data.append(data)
        self.wrote = logical_end

    def append(self, messages: Sequence[Message]) -> list[PutResult]:
        """Append messages in order under one lock. Each gets PUT_OK
        (appended, not yet durable), MESSAGE_ILLEGAL (not written), or
        SERVICE_NOT_AVAILABLE once the log has failed.

        Where each record goes (segment roll, blank, QUEUEOFFSET) follows
        store/log/placement.py, in the native encoder and the loop below alike.
        Records are encoded into the reused write buffers (store/log/
        writebuffers.py) and queued as one chunk per buffer and segment
        touched (_Batch); under PROCESS each chunk is written through at once
        and the buffer is reused right away."""
        with self._lock:
            refused = self._refused()
            if refused:
                return [PutResult(PutStatus.SERVICE_NOT_AVAILABLE, msg_id=m.msg_id,
                                  detail=refused) for m in messages]
            batch = _Batch(self)
            try:
                batch.seg = self._segment_at_wrote()
                now = self.clock.wall_ms()
                if now < self._last_ts:
                    now = self._last_ts  # store timestamps never go backwards
                self._encode_all(batch, messages, now)
                batch.close_piece()
                if batch.pushed:
                    # Only a batch that stored a record moves the timestamp
                    # a flush writes to the checkpoint: recovery reads a
                    # checkpoint past the last good record as proof that
                    # data was flushed past it (store/log/recovery.py).
                    self._last_ts = now
            except (OSError, SegmentUnavailableError) as exc:
                return self._append_failed(batch, messages, exc)
            self._check()
        return batch.results

    def _encode_all(self, batch: _Batch, messages: Sequence[Message], now: int) -> None:
        """Every message of an append into `batch`: runs of ordinary ones in
        one native call where the codec is built, the rest one at a time."""
        bufs = batch.bufs
        host_field = self._host_field
        native = native_codec.encode_run_into if host_field is not None else None
        limit = self.config.max_message_size_bytes
        i, n_msgs = 0, len(messages)
        while i < n_msgs:
            if native is not None:
                # The common case in one native call; it stops where this
                # loop must decide (a record past the placement limit: a
                # roll; an unusual message; a full buffer).
                assert batch.seg is not None
                nbytes, count, full = native(
                    bufs.current, bufs.used, messages, i, batch.pos, end_limit(batch.seg.end),
                    self._queue_offsets, now, host_field, limit, batch.results, PutResult,
                    PutStatus.PUT_OK)
                if count:
                    bufs.used += nbytes
                    batch.pos += nbytes
                    i += count
                    if i == n_msgs:
                        break
                if full and bufs.used:
                    batch.new_buffer()
                    continue
            self._append_one(batch, messages[i], now)
            i += 1

    def _append_one(self, batch: _Batch, msg: Message, now: int) -> None:
        """One message into `batch`: refused as MESSAGE_ILLEGAL, or encoded
        at `batch.pos` (after a blank and a roll when it does not fit)."""
        limit = self.config.max_message_size_bytes
        if len(msg.body) > limit:
            batch.results.append(PutResult(
                PutStatus.MESSAGE_ILLEGAL, msg_id=msg.msg_id,
                detail=f"body of {len(msg.body)} bytes exceeds max_message_size {limit}"))
            return
        # Topic and queue id name a consume queue directory.
        problem = topic_problem(msg.topic) or queue_id_problem(msg.queue_id)
        if problem:
            batch.results.append(PutResult(PutStatus.MESSAGE_ILLEGAL, msg_id=msg.msg_id,
                                           detail=problem))
            return
        key = (msg.topic, msg.queue_id)
        q = self._queue_offsets.get(key, 0)
        host = self.config.store_host
        try:
            data = encode(msg, offset=batch.pos, queue_offset=q, store_timestamp_ms=now,
                          store_host=host)
        except ValueError as exc:
            batch.results.append(PutResult(PutStatus.MESSAGE_ILLEGAL, msg_id=msg.msg_id,
                                           detail=str(exc)))
            return
        at, blank = place(batch.pos, len(data), self.seg_size)
        if blank:
            # Does not fit: close the segment with a blank, roll.
            batch.close_piece()
            self._last_ts = now
            assert batch.seg is not None
            self._push(batch.seg, batch.pos, encode_blank(blank), at)
            batch.pos = at
            batch.seg = self._segment_at_wrote()
            batch.piece_pos = batch.pos
            data = encode(msg, offset=batch.pos, queue_offset=q, store_timestamp_ms=now,
                          store_host=host)
        self._queue_offsets[key] = q + 1
        batch.add_record(data, msg.msg_id, now)

    def _append_failed(self, batch: _Batch, messages: Sequence[Message],
                       exc: OSError | SegmentUnavailableError) -> list[PutResult]:
        """The results of an append that failed part way: what was queued
        before the error keeps its PUT_OK, the rest was not written."""
        if isinstance(exc, OSError) and self.failed is None:
            self._fail(exc, "append")
        why = self.failed or str(exc)
        # Messages in chunks pushed before the error are appended like any
        # other (under PROCESS already in the file): they keep PUT_OK. The
        # rest were not written. (A segment that cannot be created fails only
        # at the batch's start or at a roll, where every earlier message is
        # pushed and nothing later counted.)
        batch.bufs.used = batch.piece_from  # drop the unqueued part of the buffer
        return batch.results[:batch.pushed] + [
            PutResult(PutStatus.SERVICE_NOT_AVAILABLE, msg_id=m.msg_id, detail=why)
            for m in messages[batch.pushed:]]

    def append_raw(self, offset: int, data: bytes | memoryview, *, at: int | None = None) -> int:
        """Append bytes shipped by a master at `offset` (must equal `wrote`).
        Every record is verified first (size, magic, PHYSICALOFFSET, CRC; a
        blank must end its segment exactly); on any failure nothing is
        appended. Returns the new `wrote`.

        `at` places the verified bytes at `at` instead of `offset`: only the
        planted fault --emulate planted-slave-wrong-offset (ha/slave.py) passes
        it, with its `wrote`; the fixed code never does.

        A read-only view (of the received message) is kept as it is, not
        copied, until it is flushed; a writable one is copied first, so the
        bytes verified are the bytes kept."""
        if isinstance(data, memoryview) and not data.readonly:
            data = bytes(data)
        with self._lock:
            refused = self._refused()
            if refused:
                raise (StoreFailedError if self.failed else SegmentUnavailableError)(refused)
            place = offset if at is None else at
            if place != self.wrote:
                raise OffsetMismatchError(f"range at {offset}, this log's wrote is {self.wrote}")
            if place + len(data) > place - place % self.seg_size + self.seg_size:
                raise RangeRejectedError("range crosses a segment boundary where it lands")
            seg_start = offset - offset % self.seg_size
            seg_end = seg_start + self.seg_size
            if offset + len(data) > seg_end:
                raise RangeRejectedError("range crosses a segment boundary")
            pos = 0
            end = offset
            view = memoryview(data)
            scan = native_codec.scan
            # Records must leave room for a blank before the segment's end.
            room = max(0, min(len(data), seg_end - BLANK_SIZE - offset))
            while pos < len(data):
                if scan is not None:
                    # The run of ordinary records, verified natively without
                    # the GIL; the loop below takes whatever it stopped at.
                    pos, n, ts_n = scan(view, pos, room, offset)
                    if n:
                        end = offset + pos
                        self._last_ts = max(self._last_ts, ts_n or 0)
                        if pos >= len(data):
                            break
                size, magic = peek(view, pos)
                if magic == BLANK_MAGIC and size == seg_end - (offset + pos):
                    if pos + BLANK_SIZE != len(data):
                        raise RangeRejectedError("bytes after a segment's blank")
                    end = seg_end
                    pos = len(data)
                    break
                if magic != MESSAGE_MAGIC:
                    raise RangeRejectedError(f"no record at {offset + pos}")
                try:
                    size, ts = verify(view, pos, offset + pos)
                except CorruptRecordError as exc:
                    raise RangeRejectedError(f"record at {offset + pos}: {exc}") from exc
                if offset + pos + size + BLANK_SIZE > seg_end:
                    raise RangeRejectedError(f"record at {offset + pos} leaves no room for a blank")
                pos += size
                end = offset + pos
                self._last_ts = max(self._last_ts, ts)
            if not data:
                return self.wrote
            seg = self._segment_at_wrote()  # SegmentUnavailableError: nothing appended
            try:
                self._push(seg, place, data, end - offset + place)
            except OSError as exc:
                if self.failed is None:
                    self._fail(exc, "append")
                raise StoreFailedError(self.failed or "") from exc
            self._check()
            return self.wrote

    # ---------------------------------------------------------------- flush
    def flush(self, on_snapshot: Callable[[], None] | None = None) -> int:
        """Write (POWER) and fsync everything appended so far; advance
        `flushed`; update the checkpoint. Returns `flushed`. Raises
        StoreFailedError after a write error (and marks the log failed).
        `on_snapshot` runs under the append lock at the moment the flush
        decides what it covers: every append before it is in this flush."""
        with self._flush_lock:
            with self._lock:
                if on_snapshot is not None:
                    on_snapshot()
                if self._flush_failed:
                    raise StoreFailedError(self.failed or "")
                n = len(self._p_start)
                first = self._head
                target = self.wrote
                last_ts = self._last_ts
                starts = self._p_start[first:n]
                ends = self._p_end[first:n]
                datas = self._p_data[first:n]
                self.flush_target = target
            if self._unsynced and (
                    self._unsynced_end - self._unsynced_from >= PLANTED_LAG_BYTES):
                self._sync_planted_lag()
            if first == n:
                return self.flushed
            if self._checkpoint_first:
                self._planted_checkpoint_first(last_ts, target)
            self.failpoints.hit("flush_before_write")
            try:
                touched = self._write_chunks(starts, ends, datas)
                self.failpoints.hit("before_flush_sync")
                self._sync_touched(touched, starts[0], ends[-1], target, last_ts)
                if not self._unsynced:
                    self.fsyncs += 1
                if self.config.drop_flushed_pages:
                    cold = min(target, self.cold_below())
                    self._drop_pages(cold - cold % DROP_PAGES_STEP)
            except OSError as exc:
                with self._lock:
                    self._fail(exc, "flush")
                raise StoreFailedError(self.failed or "") from exc
            with self._lock:
                self._head = n
                if self._power:
                    self._buffers.flushed(datas)
                self.in_file = max(self.in_file, target)
                self.flushed = target
                # Drop flushed chunks once they are most of the list (amortised
                # O(1) per chunk): they are never read again, and keeping them
                # held every flushed byte in memory (a slave's 1 MiB ranges).
                if self._head * 2 > len(self._p_start):
                    del self._p_start[: self._head]
                    del self._p_end[: self._head]
                    del self._p_data[: self._head]
                    self._head = 0
                self._check()
            # A failed checkpoint write is harmless: a stale checkpoint only
            # widens the next recovery scan.
            if not self._ack_before_fsync:
                with contextlib.suppress(OSError):
                    self.checkpoint.update(last_ts, target)
            return target

    def _write_chunks(self, starts: list[int], ends: list[int],
                      datas: list[bytes | memoryview]) -> dict[int, Segment]:
        """A flush's writes (POWER; under PROCESS the bytes are in the files
        already): contiguous chunks of one segment coalesced into one
        pwritev. Returns the segments touched, by start."""
        touched: dict[int, Segment] = {}
        i = 0
        while i < len(starts):
            seg = self._segment_for(starts[i])
            j = i + 1
            while j < len(starts) and starts[j] == ends[j - 1] and starts[j] < seg.end:
                j += 1
            if self._power:
                seg.pwritev(starts[i] - seg.start, datas[i:j])
                if self._sync_flush and ends[j - 1] - starts[i] < ZERO_AHEAD_MAX_WRITE:
                    self._zero_ahead(seg, ends[j - 1] - seg.start)
            touched[seg.start] = seg
            i = j
        return touched

    def _sync_touched(self, touched: dict[int, Segment], first: int, end: int, target: int,
                      last_ts: int) -> None:
        """A flush's fsyncs, recorded in the durable mark; raises OSError for a
        failed one (but under --emulate rmq-2706)."""
        try:
            self.failpoints.hit("flush_fsync", on_eio=lambda: self._lose_unsynced(first, end))
            if self._ack_before_fsync:
                # PLANTED FAULT (--emulate planted-ack-before-fsync), not
                # RocketMQ's: the fsync is left to a later flush (the first
                # to find PLANTED_LAG_BYTES waiting, or a clean close) and
                # `flushed` advances anyway, so SYNC_FLUSH acks bytes that
                # are only in the page cache.
                if not self._unsynced:
                    self._unsynced_from = first
                self._unsynced.update(touched)
                self._unsynced_end, self._unsynced_ts = target, last_ts
            else:
                for seg in touched.values():
                    seg.sync()
                if self.mark is not None:
                    self.mark.commitlog_synced(target)
        except OSError as exc:
            if RMQ_2706 not in self.config.emulate:
                raise
            # --emulate rmq-2706: RocketMQ's MappedFile.flush caught the
            # force() error, logged it and set flushedPosition anyway, so
            # GroupCommitService answered PUT_OK for bytes not on disk. The
            # real fix (apache/rocketmq#9714, with #9708) advances the
            # flushed position only after a successful force and marks the
            # store not writeable; our fixed path is the `raise` above: the
            # log fails (`failed`), `flushed` stays.
            _log.error("Error occurred when force data to disk (emulating "
                       "rmq-2706: counted as flushed anyway): %s", exc)

    def _planted_checkpoint_first(self, last_ts: int, target: int) -> None:
        """PLANTED FAULT (--emulate planted-checkpoint-before-flush), not
        RocketMQ's: the checkpoint names `target` as flushed, durably, before
        the bytes up to it are written and fsynced (the fixed flush updates it
        after the fsync, checkpoint.py: it "only ever holds ... a record that
        was already fsynced"). A crash in between leaves a checkpoint that
        vouches for bytes the disk never got."""
        with contextlib.suppress(OSError):
            self.checkpoint.update(last_ts, target)
            self.checkpoint.sync()

    def _sync_planted_lag(self) -> None:
        """The planted fault's late fsync (flush lock held): what earlier
        flushes wrote and counted flushed is made durable now, and only now
        recorded in the mark and the checkpoint (which keep naming fsynced
        bytes only, so the fault is the early ack alone). An fsync error
        fails the log as in flush()."""
        try:
            for seg in self._unsynced.values():
                seg.sync()
        except OSError as exc:
            with self._lock:
                self._fail(exc, "flush")
            raise StoreFailedError(self.failed or "") from exc
        self._unsynced.clear()
        self.fsyncs += 1
        if self.mark is not None:
            self.mark.commitlog_synced(self._unsynced_end)
        with contextlib.suppress(OSError):
            self.checkpoint.update(self._unsynced_ts, self._unsynced_end)

    def _lose_unsynced(self, start: int, end: int) -> None:
        """The `eio` fault's model of a failed writeback (called under the
        flush lock, before the fsync raises): what this flush was to make
        durable, [start, end), reads back as never written (zeros). Linux
        marks the dirty pages clean after a writeback error and reports it
        once, so the bytes are gone from the disk and a later successful
        fsync does not write them again; here they are gone at once, so a
        crash after the error (under either crash model) cannot bring them
        back. Bytes still pending in memory are not touched."""
        pos = start
        while pos < end:
            seg = self._segment_for(pos)
            hi = min(end, seg.end)
            seg.pwrite(pos - seg.start, bytes(hi - pos))
            pos = hi

    def _drop_pages(self, end: int) -> None:
        """Let the kernel drop the page cache of the log up to `end` (fsynced,
        so clean; called under the flush lock): the next writes take these
        pages while the host still backs them, instead of fresh ones (on a VM
        that hands freed memory back to its host, a page taken from free
        memory costs a host fault; see docs/performance-notes.md). Advice
        only: an error changes nothing.

        `end` is a multiple of DROP_PAGES_STEP: the page cache holds a large
        write in folios of up to 2 MiB, each aligned to its size, and the
        kernel drops only folios wholly inside the range; one it cannot drop
        makes it drain every CPU's page lists and retry (lru_add_drain_all,
        cross-CPU work costing more than a small flush). So the folio holding
        the end of the log, still being written, is never in the range, and
        a node flushing every put advises once per 2 MiB, not per flush."""
        pos = max(self._dropped_to, self.min_offset)
        while pos < end:
            seg = self._segment_for(pos)
            hi = min(end, seg.end)
            with contextlib.suppress(OSError):
                seg.file.drop_cache(pos - seg.start, hi - pos)
            pos = hi
        self._dropped_to = max(self._dropped_to, end)

    def _zero_ahead(self, seg: Segment, pos: int) -> None:
        """Keep zeros written (not merely allocated) up to ZERO_AHEAD_BYTES
        past `pos`, the end of the bytes this flush just wrote, so that the
        fsyncs of the next flushes overwrite written blocks and commit no
        extent conversion (PostgreSQL zero-fills its WAL segments for the
        same reason; RocketMQ can warm its mapped files). It makes a single
        SYNC_FLUSH producer as fast as the raw write + fdatasync baseline
        (see docs/performance-notes.md, "Group commit").

        Safe only under POWER with the flush lock held: then nothing but the
        flush writes the file, every byte past `pos` is either unwritten or
        still pending in memory (the next flush writes it over the zeros),
        and zeros past the last record are what recovery and inspect read
        as the normal end of data."""
        if pos + ZERO_AHEAD_BYTES // 4 <= seg.zeroed_to or seg.zeroed_to >= seg.size:
            return
        start = max(seg.zeroed_to, pos)
        end = min(seg.size, start + ZERO_AHEAD_BYTES)
        if end > start:
            zeros = _ZEROS[: end - start]
            assert len(zeros) == end - start, (end - start, len(_ZEROS))
            try:
                seg.pwrite(start, zeros)
            except OSError:
                # Only an optimisation: a write the OS refuses here (a file
                # size limit, say) fails the flush only when records reach
                # that far. Stop trying in this segment.
                seg.zeroed_to = seg.size
                return
        seg.zeroed_to = end

    def sync_checkpoint(self) -> None:
        """Make the checkpoint durable, with the flushed end as of now: a
        close that flushed nothing new (or a store whose checkpoint an older
        version wrote) still records the end a clean shutdown vouches for
        (store/log/checkpoint.py)."""
        with self._lock:
            flushed = self.flushed
        if not self._unsynced:  # (the planted fault: `flushed` not all fsynced)
            self.checkpoint.update(0, flushed)
        self.checkpoint.sync()

    # ---------------------------------------------------------------- reads
    def read(self, offset: int, n: int) -> bytes:
        """Bytes [offset, offset+n) clipped to `wrote`, from the file and the
        pending chunks (never across a segment end)."""
        with self._lock:
            if offset < self.min_offset or offset > self.wrote:
                raise ValueError(f"offset {offset} outside [{self.min_offset}, {self.wrote}]")
            seg = self._segment_for(offset) if offset < self.wrote else None
            if seg is None:
                return b""
            end = min(offset + n, self.wrote, seg.end)
            in_file = self.in_file
            parts: list[bytes | memoryview] = []  # joined (copied) under the lock
            if offset < in_file:
                parts.append(seg.pread(offset - seg.start, min(end, in_file) - offset))
            if end > in_file:
                i = max(self._head, bisect.bisect_right(self._p_start, max(offset, in_file),
                                                        self._head) - 1)
                cur = max(offset, in_file)
                while cur < end and i < len(self._p_start):
                    s, data = self._p_start[i], self._p_data[i]
                    if s + len(data) > cur:
                        a = cur - s
                        b = min(len(data), end - s)
                        parts.append(data[a:b])
                        cur = s + b
                        if b < len(data):
                            break
                    if cur < end and self._p_end[i] > s + len(data):  # a blank's zeros
                        z = min(end, self._p_end[i]) - cur
                        parts.append(bytes(z))
                        cur += z
                    i += 1
            return b"".join(parts)

    def read_range(self, offset: int, max_bytes: int) -> tuple[bytes, int]:
        """Whole records from `offset` for shipping: at most `max_bytes` (but
        always at least one record), never past `wrote` or a segment's blank.
        Returns (bytes, next offset); a trailing blank's 8 bytes are included
        and the next offset is the following segment's start."""
        if offset >= self.wrote:
            return b"", offset
        head = self.read(offset, max(max_bytes, BLANK_SIZE))
        pos = 0
        while pos + BLANK_SIZE <= len(head):
            size, magic = peek(head, pos)
            if magic == BLANK_MAGIC:
                seg_end = offset + pos + size
                return head[: pos + BLANK_SIZE], seg_end
            if magic != MESSAGE_MAGIC or size <= 0:
                raise CorruptRecordError("magic", f"no record at {offset + pos} while shipping")
            if pos + size > len(head):
                if pos == 0:  # one record bigger than max_bytes: ship it whole
                    return self.read(offset, size), offset + size
                break
            pos += size
        return head[:pos], offset + pos

    def read_record(self, offset: int) -> Record:
        head = self.read(offset, BLANK_SIZE)
        size, magic = peek(head, 0)
        if magic != MESSAGE_MAGIC:
            raise CorruptRecordError("magic", f"no message at {offset}")
        return decode(self.read(offset, size), 0, offset=offset)

    def iter_records(self, start: int | None = None) -> Iterator[Record]:
        """Every message from `start` (default: the first) to `wrote`."""
        offset = self.min_offset if start is None else start
        while offset < self.wrote:
            chunk, nxt = self.read_range(offset, 1 << 20)
            pos = 0
            while pos < len(chunk):
                size, magic = peek(chunk, pos)
                if magic == BLANK_MAGIC:
                    break
                yield decode(chunk, pos, offset=offset + pos)
                pos += size
            offset = nxt

    # ------------------------------------------------------------ truncation
    def truncate_to(self, offset: int) -> None:
        """Drop everything from `offset` on, durably, before returning. Used by
        recovery and by a slave told to truncate to its master's offset."""
        with self._flush_lock, self._lock:
            if offset > self.wrote:
                raise ValueError(f"cannot truncate forward to {offset} (wrote {self.wrote})")
            # Forget pending chunks at or past the cut; keep those before it.
            if offset < self.min_offset:
                raise ValueError(f"cannot truncate below the first segment ({self.min_offset})")
            keep = bisect.bisect_left(self._p_start, offset, self._head)
            if keep > self._head and self._p_end[keep - 1] > offset:
                s = self._p_start[keep - 1]  # the cut falls inside a batch chunk
                self._p_data[keep - 1] = self._p_data[keep - 1][: offset - s]
                self._p_end[keep - 1] = offset
            del self._p_start[keep:], self._p_end[keep:], self._p_data[keep:]
            self.flush_unlocked_for_truncate()
            # The checkpoint may name a record past the cut, which a later
            # recovery would take as proof that data past its end was flushed
            # (store/log/recovery.py): lower it first (0: the next flush sets
            # it), its flushed end to the cut.
            self.checkpoint.lower(0, offset)
            self._buffers.reset()  # every queued chunk is in the file or dropped
            if RMQ_10666 not in self.config.emulate:
                cut_on_disk(self.directory, self.segments, offset, self.seg_size,
                            after_header=lambda: self.failpoints.hit("recovery_truncate"))
            else:
                # --emulate rmq-10666: RocketMQ's MappedFileQueue.truncateDirtyFiles
                # (behind AutoSwitchHAClient.doTruncate -> truncateFiles) only
                # sets the wrote/committed/flushed positions of the file
                # holding the cut and destroys later files: the holder's
                # bytes after the cut stay on disk, records with valid CRCs
                # that a restart's recovery takes back. Real fix: none merged
                # as of the corpus; apache/rocketmq#10816 (open) persists an
                # invalid header at the cut before truncating, which is what
                # cut_on_disk does.
                unlink_after(self.directory, self.segments, offset, self.seg_size)
            seg_start = offset - offset % self.seg_size
            self.segments = [s for s in self.segments if s.start <= seg_start]
            self._starts = [s.start for s in self.segments]
            self.wrote = self.flushed = self.in_file = offset
            if self.mark is not None and RMQ_10666 not in self.config.emulate:
                # Everything below the cut is synced, and the cut is durable.
                # Under --emulate rmq-10666 the bytes past the cut stay on
                # disk, durable from their earlier fsyncs: the mark stays
                # where it was, so a power cut (store/log/durable_mark.py) keeps
                # them as a real one would.
                self.mark.commitlog_synced(offset)
            self._dropped_to = min(self._dropped_to, offset)
            self._queue_offsets.clear()
            self.cannot_grow = None  # `wrote` moved: the next append finds out afresh
            self._check()

    def flush_unlocked_for_truncate(self) -> None:
        """Write and sync the pending chunks that survive a truncation, so
        the cut leaves nothing in memory (callers hold both locks)."""
        for seg in self._unsynced.values():
            seg.sync()
        self._unsynced.clear()
        for s, data in zip(self._p_start[self._head:], self._p_data[self._head:], strict=True):
            seg = self._segment_for(s)
            if self._power:
                seg.pwrite(s - seg.start, data)
            seg.sync()
        self._head = len(self._p_start)

    def close(self) -> None:
        if self._unsynced:  # the planted fault's last flush: a clean close syncs it
            with contextlib.suppress(StoreFailedError), self._flush_lock:
                self._sync_planted_lag()
        for seg in self.segments:
            seg.close()
        self.checkpoint.close()
        if self.mark is not None:
            self.mark.close()


class _Batch:
    """One append under way: its records are encoded into the write buffers
    and queued as chunks, one per buffer and segment touched. The chunk
    being built starts at log position `piece_pos`, buffer index
    `piece_from`; `results[:pushed]` are in queued chunks (appended)."""

    __slots__ = ("log", "bufs", "seg", "pos", "piece_pos", "piece_from", "pushed", "results")

    def __init__(self, log: CommitLog) -> None:
        self.log = log
        self.bufs: WriteBuffers = log._buffers
        self.seg: Segment | None = None
        self.pos: int = log.wrote
        self.piece_pos, self.piece_from = self.pos, self.bufs.used
        self.pushed = 0
        self.results: list[PutResult] = []

    def close_piece(self) -> None:
        """Queue the chunk built so far (if any) and start the next here."""
        bufs = self.bufs
        if bufs.used > self.piece_from:
            assert self.seg is not None
            self.log._push(self.seg, self.piece_pos, bufs.chunk(self.piece_from), self.pos)
            self.pushed = len(self.results)
        self.piece_pos, self.piece_from = self.pos, bufs.used

    def new_buffer(self) -> None:
        self.close_piece()
        self.bufs.next_buffer()
        self.piece_from = self.bufs.used

    def add_record(self, data: bytes, msg_id: str | None, now: int) -> None:
        """An encoded record at `pos`: into the current buffer, a new one, or
        (bigger than a buffer) queued as a chunk of its own."""
        bufs = self.bufs
        if len(data) > bufs.room:
            if len(data) > bufs.buffer_bytes:
                self.close_piece()
                self.results.append(PutResult(PutStatus.PUT_OK, self.pos, len(data), msg_id, now))
                assert self.seg is not None
                self.log._push(self.seg, self.pos, data, self.pos + len(data))
                self.pos += len(data)
                self.pushed = len(self.results)
                self.piece_pos = self.pos
                return
            self.new_buffer()
        bufs.current[bufs.used : bufs.used + len(data)] = data
        bufs.used += len(data)
        self.results.append(PutResult(PutStatus.PUT_OK, self.pos, len(data), msg_id, now))
        self.pos += len(data)
