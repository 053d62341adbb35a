"""MessageStore: a store directory opened, recovered and served.

Layout of the directory (RocketMQ's store root): `commitlog/` (segments),
`checkpoint`, `abort` (exists while open; a clean close removes it), `lock`.

Opening takes the lock, decides normal or abnormal recovery from `abort`,
recovers the CommitLog (store/recovery.py decides, commitlog.py cuts
crash-safely), then creates `abort`. Closing flushes everything, syncs the
checkpoint, removes `abort`, releases the lock.

Flush services run on the event loop; file IO runs on the flush executor
(store/flush_executor.py: a flusher thread in production, inline on the
loop in a simulation).
SYNC_FLUSH is group commit: every put waiting at the moment a flush starts
waits on the same future, so one fsync and one wake-up serve them all.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import errno
import logging
import mmap
import os
import pwd
import threading
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from store import native as native_codec
from store.checkpoint import Checkpoint, CheckpointFile, lower_checkpoint, read_checkpoint
from store.clock import Clock, SystemClock
from store.commitlog import CommitLog, StoreFailedError, apply_plan, open_segments
from store.config import KIB, ConfigError, CorruptionPolicy, CrashModel, FlushMode, StoreConfig
from store.consumequeue import ConsumeQueues, DispatchError
from store.consumer_offsets import ConsumerOffsetTable, OffsetTableError
from store.disk import Disk, DiskLock, RealDisk
from store.emulate import RMQ_8239
from store.failpoints import DISARMED, Failpoints
from store.flush_executor import FlushExecutor, ThreadFlushExecutor
from store.lock import StoreLockedError
from store.record import CorruptRecordError, Message
from store.recovery import (
    Damage,
    DamageKind,
    RecoveryPlan,
    plan_recovery,
    verify_range,
)
from store.reput import units as reput_units
from store.segments import Segment, list_segments, segment_name
from store.status import (
    GetMessagesResult,
    GetMessageStatus,
    PutResult,
    PutStatus,
    QueuedMessage,
)

__all__ = ["MessageStore", "StoreOpenError", "StoreLockedError", "ConfigError",
           "CorruptionRefusedError", "RepairUnavailableError"]
_log = logging.getLogger("dlab.store")


class StoreOpenError(RuntimeError):
    """The directory cannot be opened as a store without risking data; the
    message says what is wrong and what to do."""


class CorruptionRefusedError(StoreOpenError):
    """Recovery found corruption of flushed data and the corruption policy
    (or a failed repair) refuses to open; nothing in the directory was
    changed. `damage` holds the figures."""

    def __init__(self, message: str, damage: Damage) -> None:
        super().__init__(message)
        self.damage = damage


class RepairUnavailableError(RuntimeError):
    """No replica could provide a damaged range (the message says why)."""


# Fetches [offset, end) of the CommitLog from a replica: whole records from
# `offset`, at most up to `end` (fewer when the replica holds less). Raises
# RepairUnavailableError. The node implements it over gRPC (cluster/repair.py).
RepairSource = Callable[[int, int], bytes]
# Repairs one open may make before it gives up (each fixes one damaged range).
MAX_REPAIRS = 64


@dataclass(frozen=True)
class RecoveryReport:
    abnormal: bool
    max_valid_offset: int
    records_scanned: int
    first_bad_offset: int | None
    bad_reason: str | None
    segments_dropped: list[int]
    problems: list[str]
    summary: str
    # Corruption of flushed data found at open, and what the policy did:
    # "truncated" (with the records and bytes that cost) or "repaired".
    corruption: str | None = None
    corruption_action: str | None = None
    records_lost: int = 0
    bytes_lost: int = 0
    repaired_ranges: list[tuple[int, int]] = dataclasses.field(default_factory=list)


class _Generation:
    """The puts waiting for one group-commit flush share it: callbacks run
    at once, on the loop, when the flush resolves it (one wake-up per flush,
    no extra loop iteration)."""

    __slots__ = ("resolved", "timer", "waiters")

    def __init__(self) -> None:
        self.resolved = False
        self.timer: asyncio.TimerHandle | None = None
        self.waiters: list[Callable[[str], None]] = []

    def resolve(self, outcome: str) -> None:
        if self.timer is not None:
            self.timer.cancel()
        if self.resolved:
            return
        self.resolved = True
        waiters, self.waiters = self.waiters, []
        for waiter in waiters:
            try:
                waiter(outcome)
            except Exception:  # one batch's bug must not keep the others waiting
                _log.exception("a group-commit waiter failed")


class _PutBatch:
    """Puts of one loop tick, appended together by MessageStore._drain. Each
    put awaits its own future, so a caller cancelled while it waits cancels
    only its own wait, never the batch's (the put itself stands)."""

    __slots__ = ("messages", "waiting", "drained")

    def __init__(self) -> None:
        self.messages: list[Message] = []
        self.waiting: list[asyncio.Future[PutResult]] = []
        self.drained = False

    def finish(self, results: list[PutResult], status: PutStatus, detail: str) -> None:
        """Hand each put its result; a PUT_OK record takes `status` (the
        flush's) when that is worse."""
        for fut, r in zip(self.waiting, results, strict=True):
            if not fut.done():
                fut.set_result(r if status is PutStatus.PUT_OK or r.status is not PutStatus.PUT_OK
                               else r._replace(status=status, detail=detail))


# A flush with more than this to write runs on the flush thread even when the
# loop is idle: an fsync of a few puts is worth running inline (no
# cross-thread wake-up), copying megabytes into the page cache is not (a
# catching-up slave stopped receiving while the loop wrote its ranges).
INLINE_FLUSH_MAX_BYTES = 256 * KIB


class _GroupCommit:
    """SYNC_FLUSH group commit: on the event loop when it is idle, else on the
    flush executor's worker (a thread in production).

    Ordering: a put appends, THEN joins the open generation (both on the loop
    thread). A flush closes the open generation under the append lock at the
    moment it snapshots what it will write, so a put found in a closed
    generation was appended before that snapshot and is covered by its fsync.
    A put that finds no open generation opens the next one.

    Where the flush runs: a new generation schedules a check at the end of
    the loop's current work, which looks again one loop iteration later. If
    no more puts came in that iteration (`puts_coming`, the put path's
    signal: bytes appended since, or puts submitted and not yet appended)
    and at most INLINE_FLUSH_MAX_BYTES wait to be written, the loop flushes
    inline: every waiting put is waiting for this
    fsync anyway, and each cross-thread wake-up (kicking the thread, the
    thread waking the loop) costs more than it saves (see
    docs/performance-notes.md, "Group commit"). If puts keep coming, or the
    worker is flushing, the worker takes it and the fsync overlaps the
    loop's work; it hands results back with one to_loop call per flush. A
    store with the before_flush_sync or flush_before_write failpoint armed
    (a delay there is a slow disk or a stalled flusher) always uses the
    worker, so a slow fsync never blocks the loop."""

    def __init__(self, log: CommitLog, loop: asyncio.AbstractEventLoop,
                 executor: FlushExecutor, puts_coming: Callable[[int], bool],
                 activity: Callable[[], int], *, inline: bool = True) -> None:
        self.log = log
        self.loop = loop
        self.inline = inline
        self.open: _Generation | None = None
        self._closed: _Generation | None = None
        self._puts_coming = puts_coming
        self._activity = activity
        self._mark = 0
        self._busy = False  # the worker is flushing
        self._stopped = False
        self._worker = executor.worker(loop, self._flush_on_worker)

    def join_generation(self) -> _Generation:
        gen = self.open
        if gen is None:
            gen = self.open = _Generation()
            if self.inline:
                self.loop.call_soon(self._flush_when_idle, False)
                return gen
        if not self.inline and not self._worker.kicked():
            # No time.sleep(0) to hand the flush thread the GIL at once: it
            # made the loop wait for the switch on every generation, fewer
            # puts/s than letting the thread start when the loop next blocks
            # (see docs/performance-notes.md, "Group commit").
            self._worker.kick()
        return gen

    def _flush_when_idle(self, retried: bool) -> None:
        if self._stopped or self.open is None:
            return
        big = self.log.dirty_bytes > INLINE_FLUSH_MAX_BYTES
        if self._busy or big or (retried and self._puts_coming(self._mark)):
            self._worker.kick()
            return
        if not retried:
            # One more loop iteration first: what this one scheduled (the
            # rest of a tick's puts, the HA shippers an append woke) runs
            # before the loop may block in an fsync.
            self._mark = self._activity()
            self.loop.call_soon(self._flush_when_idle, True)
            return
        closed: list[_Generation | None] = []

        def close_open() -> None:  # under the append lock
            closed.append(self.open)
            self.open = None

        try:
            self.log.flush(close_open)
            outcome = "ok"
        except StoreFailedError:
            outcome = "failed"
        gen = closed[0] if closed else None
        if gen is not None:
            gen.resolve(outcome)
        if outcome == "failed":
            self._fail_open()

    def _close_open(self) -> None:  # on the worker, under the append lock
        self._closed, self.open = self.open, None

    def _flush_on_worker(self) -> bool:
        """One flush on the worker; False ends the worker."""
        self._busy = True
        try:
            self.log.flush(self._close_open)
            outcome = "ok"
        except StoreFailedError:
            outcome = "failed"
        finally:
            self._busy = False
        gen, self._closed = self._closed, None
        if gen is not None and not self._worker.to_loop(gen.resolve, outcome):
            return False  # the loop is gone: nobody is waiting
        if outcome == "failed":
            # Fail everyone still waiting; new puts are refused by append.
            self._fail_open()
            return False
        return True

    def _fail_open(self) -> None:
        with self.log._lock:
            self._close_open()
        gen, self._closed = self._closed, None
        if gen is not None:
            self._worker.to_loop(gen.resolve, "failed")

    def stop(self) -> None:
        self._stopped = True
        self._worker.stop()


class MessageStore:
    def __init__(
        self,
        path: str,
        config: StoreConfig,
        log: CommitLog,
        lock: DiskLock,
        recovery: RecoveryReport,
        clock: Clock,
        failpoints: Failpoints,
        executor: FlushExecutor | None = None,
    ) -> None:
        self.path = path
        self.config = config
        self.log = log
        self._lock = lock
        self.recovery = recovery
        self.clock = clock
        self.failpoints = failpoints
        self._executor: FlushExecutor = executor or ThreadFlushExecutor()
        self._tasks: list[asyncio.Task[None]] = []
        self._closing = False
        self._closed = False
        self._group: _GroupCommit | None = None
        # The loop start() ran on: the store's services and group commit
        # live there, and put() runs there. Kept because CPython 3.11's
        # asyncio.get_running_loop() makes a getpid() system call each time
        # (it checks for a fork), which put() would pay once per put (see
        # docs/performance-notes.md, "Group commit").
        self._loop: asyncio.AbstractEventLoop | None = None
        self._flush_wakeup: asyncio.Event | None = None  # ASYNC_FLUSH, not flush_timed
        self._least_dirty = config.flush_least_pages * config.page_size_bytes
        self.backpressure_flushes = 0  # appends that flushed (max_unflushed_bytes)
        self._open_batch: _PutBatch | None = None
        # The put path's signal to group commit that more puts are coming:
        # batches of puts submitted and not yet appended (store.put's and
        # the node's coalescing count theirs here).
        self.batches_pending = 0
        # A cap on coalesced puts, so that under load several flush groups
        # are in flight: one group's fsync runs while the next is encoded.
        self._max_coalesce = 32
        self.offsets_error: str | None = None  # the last failed periodic persist
        # After close(): None if it was clean (`abort` removed), else why
        # `abort` stays (the next open then runs abnormal recovery).
        self.close_problem: str | None = None

    # ------------------------------------------------------------------ open
    @classmethod
    def open(
        cls,
        path: str,
        config: StoreConfig | None = None,
        *,
        clock: Clock | None = None,
        failpoints: Failpoints | None = None,
        repair_source: RepairSource | None = None,
        disk: Disk | None = None,
        executor: FlushExecutor | None = None,
    ) -> MessageStore:
        """Open (creating if needed) and recover the store at `path` on
        `disk` (the real filesystem by default). Raises
        StoreLockedError, StoreOpenError or ConfigError with a message a user
        can act on; on any error the directory is left as it was found.
        Corruption of flushed data is handled by config.corruption_policy
        (CorruptionRefusedError when refused); `repair_source` fetches a
        damaged range from a replica (the REPAIR policy)."""
        config = (config or StoreConfig()).validate()
        clock = clock or SystemClock()
        failpoints = failpoints or DISARMED
        disk = disk or RealDisk()
        commitlog_dir = os.path.join(path, "commitlog")
        found = _entries(disk, path)
        try:
            disk.makedirs(commitlog_dir)
            lock = disk.lock(os.path.join(path, "lock"))
        except OSError as exc:
            _undo_open(disk, path, found, holding_lock=False)
            raise StoreOpenError(_os_error_message(path, exc)) from None
        # StoreLockedError: another process holds the store; nothing to undo.
        try:
            store = cls._open_locked(path, config, clock, failpoints, lock, disk, repair_source)
        except BaseException as exc:
            # Leave the directory as found: every entry this open created
            # (`abort` above all, which would make the next open abnormal)
            # goes, while the lock is still held.
            _undo_open(disk, path, found, holding_lock=True)
            lock.release()
            if isinstance(exc, OSError):
                raise StoreOpenError(_os_error_message(path, exc)) from None
            raise
        if executor is not None:  # where file IO runs (store/flush_executor.py)
            store._executor = executor
        return store

    @classmethod
    def _open_locked(
        cls, path: str, config: StoreConfig, clock: Clock, failpoints: Failpoints,
        lock: DiskLock, disk: Disk, repair_source: RepairSource | None = None,
    ) -> MessageStore:
        commitlog_dir = os.path.join(path, "commitlog")
        abort_path = os.path.join(path, "abort")
        abnormal = disk.exists(abort_path)
        seg_size = config.segment_size_bytes
        listing = list_segments(commitlog_dir, disk=disk)
        if listing.segment_size and listing.segment_size != seg_size:
            raise StoreOpenError(
                f"segments in {commitlog_dir} are {listing.segment_size} bytes but the "
                f"configured segment size is {seg_size}; open it with segment size "
                f"{listing.segment_size}"
            )
        if listing.fatal:
            raise StoreOpenError(
                f"store {path} cannot be opened safely:\n  " + "\n  ".join(listing.fatal)
            )
        segments = open_segments(disk, commitlog_dir, listing.starts, seg_size)
        try:
            checkpoint, cp_problem = read_checkpoint(os.path.join(path, "checkpoint"), disk)
            plan, checkpoint, corruption = _recover(
                path, listing.starts, segments, config, abnormal=abnormal,
                checkpoint=checkpoint, checkpoint_problem=cp_problem,
                repair_source=repair_source, failpoints=failpoints, disk=disk)
            segments = apply_plan(plan, commitlog_dir, segments, seg_size, failpoints)
            if config.crash_model.value == "process" and segments:
                segments[-1].sync()  # what the OS held is now durable too
            report = _report(plan, listing.problems)
            if corruption.get("corruption_action"):
                corruption["summary"] = (f"{report.summary}; corruption of flushed data "
                                         f"{corruption['corruption_action']}")
            report = dataclasses.replace(report, **corruption)
            disk.write_file(abort_path, str(os.getpid()).encode())
            disk.fsync_dir(path)
            cpf = CheckpointFile(disk, os.path.join(path, "checkpoint"))
            if checkpoint:
                cpf.last_ms = checkpoint.physic_ms
                cpf.logics_ms = checkpoint.logics_ms
            log = CommitLog(
                commitlog_dir, config, clock, cpf, segments, plan.max_valid_offset,
                plan.last_store_timestamp_ms or 0, failpoints, disk=disk,
            )
            queues = ConsumeQueues(path, file_units=config.consume_queue_file_units,
                                   write_through=config.crash_model == CrashModel.PROCESS,
                                   disk=disk)
            queues.load(log.wrote, lambda: failpoints.hit("consume_queue_truncate"))
            floor = _reput_floor(plan, queues.max_end(), log.min_offset, log.wrote)
            try:
                offsets = ConsumerOffsetTable.load(
                    os.path.join(path, "config"),
                    before_rename=lambda: failpoints.hit("consumer_offsets_before_rename"),
                    disk=disk)
            except OffsetTableError as exc:
                raise StoreOpenError(str(exc)) from None
            notes = queues.notes + ([offsets.note] if offsets.note else [])
            if notes:
                report = dataclasses.replace(report, problems=report.problems + notes)
        except BaseException:
            for s in segments:
                s.close()
            raise
        store = cls(path, config, log, lock, report, clock, failpoints)
        store._attach_queues(queues, offsets, floor)
        return store

    def _attach_queues(self, queues: ConsumeQueues, offsets: ConsumerOffsetTable,
                       floor: int) -> None:
        """Re-dispatch what recovery left without units, then let QUEUEOFFSET
        continue from the queues (they survive restarts; memory does not)."""
        self.queues = queues
        self.consumer_offsets = offsets
        self._reput_lock = threading.Lock()
        self._reput_at = queues.reput_start(self.log.min_offset, floor=floor)
        self.log.cold_below = lambda: self._reput_at
        self.reput_from = self._reput_at  # where open-time re-dispatch started
        try:
            notes = self._rebuild()
        except (DispatchError, CorruptRecordError, OSError) as exc:
            self.log.close()
            queues.close()
            raise StoreOpenError(f"rebuilding the consume queues of {self.path} failed: {exc}; "
                                 "remove its consumequeue/ directory to rebuild them from the "
                                 "CommitLog") from None
        if notes:
            self.recovery = dataclasses.replace(
                self.recovery, problems=self.recovery.problems + notes)
        with self.log._lock:
            self.log._queue_offsets = queues.next_queue_offsets()

    def _rebuild(self) -> list[str]:
        """Open-time re-dispatch, strict: the CommitLog is the truth.
        - a unit the CommitLog contradicts (a record with that QUEUEOFFSET
          sits elsewhere) is cut with everything after it in its queue, and
          dispatch goes on: the records re-create the units;
        - a gap (a record's QUEUEOFFSET beyond its queue) means the start
          was too late: one more pass from the first record;
        - a gap that remains is in the CommitLog itself: logged, noted, and
          dispatch goes on without those records (non-strict).
        Returns notes for the recovery report."""
        notes: list[str] = []
        start = self._reput_at
        from_first = start <= self.log.min_offset
        on_cut = lambda: self.failpoints.hit("consume_queue_truncate")  # noqa: E731
        for _ in range(10_000):
            try:
                self._reput_from_here(strict=True)
                if self.queues.skipped:  # records whose topic or queue id names no queue
                    notes.append(f"{self.queues.skipped} record(s) left without a consume "
                                 f"queue unit: {self.queues.dispatch_error}")
                return notes
            except DispatchError as exc:
                if exc.kind == "conflict":
                    notes.append(f"{exc}: queue cut to {exc.index} units and rebuilt from "
                                 "the CommitLog")
                    self.queues.truncate_queue(exc.topic, exc.queue_id, exc.index, on_cut)
                elif not from_first:
                    notes.append(f"{exc}: re-dispatching from the first record "
                                 f"(the start {start} was too late)")
                    self._reput_at, from_first = self.log.min_offset, True
                else:
                    break
        self._reput_from_here(strict=False)
        notes.append(f"{self.queues.skipped} record(s) left without a consume queue unit: "
                     f"{self.queues.dispatch_error}")
        return notes

    # --------------------------------------------------------------- service
    async def start(self) -> None:
        """Start the flush service for the configured mode (on this loop,
        where put() must then be called)."""
        loop = self._loop = asyncio.get_running_loop()
        if self.config.flush_mode == FlushMode.SYNC_FLUSH:
            stalls = ("before_flush_sync", "flush_before_write")
            self._group = _GroupCommit(
                self.log, loop, self._executor, self._puts_coming, lambda: self.log.wrote,
                inline=not any(map(self.failpoints.armed, stalls)))
        else:
            if not self.config.flush_timed:
                self._flush_wakeup = asyncio.Event()
            self._tasks.append(loop.create_task(self._interval_flush()))
        self._tasks.append(loop.create_task(self._checkpoint_sync()))
        self._tasks.append(loop.create_task(self._consume_side_service()))

    async def _consume_side_service(self) -> None:
        """Dispatch and flush the consume queues every
        consume_queue_flush_interval_ms; persist the consumer offset table
        every consumer_offset_persist_interval_ms (when it changed). Errors
        are logged and kept in state(); the service keeps running (a dead
        service would stop both silently)."""
        cfg = self.config
        last_persist = self.clock.monotonic()
        while not self._closing:
            await asyncio.sleep(cfg.consume_queue_flush_interval_ms / 1000)
            try:
                self.reput()
                await self._run(self._flush_queues)
            except Exception:  # a bug: say so, keep serving
                _log.exception("consume queue dispatch/flush failed")
            now = self.clock.monotonic()
            if (self.consumer_offsets.dirty
                    and now - last_persist >= cfg.consumer_offset_persist_interval_ms / 1000):
                last_persist = now
                try:
                    await self._run(self.consumer_offsets.persist)
                    self.offsets_error = None
                except OSError as exc:
                    if self.offsets_error is None:
                        _log.warning("persisting consumer offsets failed (%s); retrying", exc)
                    self.offsets_error = f"consumer offset persist failed: {exc}"

    def _flush_queues(self) -> None:
        """Flush the consume queues, then record in the checkpoint
        (logicsMsgTimestamp) up to which record their units are durable."""
        ts = self.queues.flush()
        if ts is not None:
            with contextlib.suppress(OSError):  # stale only widens recovery
                self.log.checkpoint.update_logics(ts)

    # ------------------------------------------------------------ consume side
    def reput(self) -> None:
        """Dispatch every record appended since the last call into its
        ConsumeQueue (RocketMQ's ReputMessageService; off the put path). A
        record that does not fit its queue is logged and counted
        (state()["consume_queue_dispatch_error"]), never raised."""
        self._reput_from_here(strict=False)

    def _reput_from_here(self, *, strict: bool) -> None:
        # One walker at a time: the loop (reads) and the flusher thread
        # (close) both call it, and dispatch checks-then-appends.
        with self._reput_lock:
            end = self.log.wrote
            pos = self._reput_at
            native = native_codec.reput_groups
            while pos < end:
                if native is not None:
                    # The units of the whole ordinary records at the start of
                    # the next MiB, gathered natively per queue (it stops at
                    # a record cut by the read, a blank, or anything the
                    # Python walk below must decide, which then takes over
                    # from there).
                    stop, last_ts, groups = native(self.log.read(pos, 1 << 20), pos)
                    if stop:
                        self.queues.dispatch_groups(groups, last_ts, strict=strict)
                        pos += stop
                        self._reput_at = pos
                        continue
                data, nxt = self.log.read_range(pos, 1 << 20)
                if nxt <= pos:
                    break
                self.queues.dispatch(reput_units(data, pos), strict=strict)
                pos = nxt
                self._reput_at = pos

    def confirmed_offset(self) -> int:
        """How far consumers may read: `flushed` under SYNC_FLUSH, so nothing
        a crash can still take is ever consumed (apache/rocketmq#8239);
        `wrote` otherwise, as RocketMQ."""
        if self.config.flush_mode == FlushMode.SYNC_FLUSH and RMQ_8239 not in self.config.emulate:
            return self.log.flushed
        # --emulate rmq-8239: RocketMQ's CommitLog.getConfirmOffset() was the
        # written end even under SYNC_FLUSH, so ReputMessageService made
        # unflushed records pullable. The real fix (apache/rocketmq#8240,
        # 5.3.0) bounds dispatch by the flushed position under SYNC_FLUSH
        # (readUnCommitted=true, default false, brings the old behaviour back).
        return self.log.wrote

    def topic_queues(self) -> dict[str, list[int]]:
        self.reput()
        out: dict[str, list[int]] = {}
        for topic, qid in sorted(self.queues.queues):
            out.setdefault(topic, []).append(qid)
        return out

    def queue_offsets(self, topic: str, queue_id: int) -> tuple[int, int]:
        """(min, consumable max) of one queue; (0, 0) for an unknown one."""
        self.reput()
        q = self.queues.get(topic, queue_id)
        return (0, 0) if q is None else (0, q.consumable(self.confirmed_offset()))

    def get_messages(self, topic: str, queue_id: int, offset: int, max_count: int = 32
                     ) -> GetMessagesResult:
        """Up to `max_count` messages of one queue from queue offset `offset`,
        only those whose record ends at or before confirmed_offset(). Statuses
        and next offsets as RocketMQ's DefaultMessageStore.getMessage."""
        if max_count < 1:
            raise ValueError("max_count must be at least 1")
        self.reput()
        q = self.queues.get(topic, queue_id)
        if q is None:
            return GetMessagesResult(GetMessageStatus.NO_MATCHED_LOGIC_QUEUE, [], 0, 0, 0)
        low, high = 0, q.consumable(self.confirmed_offset())
        if high == 0:
            return GetMessagesResult(GetMessageStatus.NO_MESSAGE_IN_QUEUE, [], 0, low, high)
        if offset < low:
            return GetMessagesResult(GetMessageStatus.OFFSET_TOO_SMALL, [], low, low, high)
        if offset == high:
            return GetMessagesResult(GetMessageStatus.OFFSET_OVERFLOW_ONE, [], offset, low, high)
        if offset > high:
            return GetMessagesResult(GetMessageStatus.OFFSET_OVERFLOW_BADLY, [], high, low, high)
        found: list[QueuedMessage] = []
        for i in range(offset, min(high, offset + max_count)):
            cl_offset, size, _tag = q.unit(i)
            try:
                record = self.log.read_record(cl_offset)
            except (CorruptRecordError, ValueError) as exc:
                problem = f"cannot read: {exc}"
            else:
                if (record.size, record.topic, record.queue_id, record.queue_offset) == \
                        (size, topic, queue_id, i):
                    found.append(QueuedMessage(i, cl_offset, record))
                    continue
                problem = (f"the record there is {record.topic}/{record.queue_id} "
                           f"#{record.queue_offset}, size {record.size}")
            if found:  # serve what was read; the next pull starts at the bad unit
                break
            # RocketMQ's OFFSET_FOUND_NULL: the unit has no readable record of
            # its own; the consumer moves past it (a message it never gets).
            _log.warning("%s/%d unit %d at %d: %s", topic, queue_id, i, cl_offset, problem)
            return GetMessagesResult(GetMessageStatus.OFFSET_FOUND_NULL, [], i + 1, low, high)
        return GetMessagesResult(GetMessageStatus.FOUND, found, offset + len(found), low, high)

    def truncate_to(self, offset: int) -> None:
        """Drop the CommitLog from `offset` on and every unit pointing there,
        durably (a slave told to truncate to its master's offset)."""
        self.reput()  # every record before the cut has its unit: counts stay right
        self.log.truncate_to(offset)
        with self._reput_lock:
            self.queues.truncate_after(
                offset, lambda: self.failpoints.hit("consume_queue_truncate"))
            self._reput_at = min(self._reput_at, offset)
        # The logics timestamp may name a record just cut: claim nothing
        # until the queues are flushed again (a stale-low value only widens
        # the next recovery).
        with contextlib.suppress(OSError):
            self.log.checkpoint.update_logics(0)
        with self.log._lock:
            self.log._queue_offsets = self.queues.next_queue_offsets()

    async def _run(self, fn: Any) -> Any:
        return await self._executor.run(fn)

    async def _interval_flush(self) -> None:
        cfg = self.config
        least = cfg.flush_least_pages * cfg.page_size_bytes
        last_thorough = self.clock.monotonic()
        wakeup = self._flush_wakeup
        while not self._closing:
            if wakeup is None:
                await asyncio.sleep(cfg.flush_interval_ms / 1000)
            else:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(cfg.flush_interval_ms / 1000):
                        await wakeup.wait()
                wakeup.clear()
            now = self.clock.monotonic()
            thorough = now - last_thorough >= cfg.flush_thorough_interval_ms / 1000
            dirty = self.log.dirty_bytes
            if dirty and (dirty >= least or thorough):
                if thorough:
                    last_thorough = now
                try:
                    await self._run(self.log.flush)
                except StoreFailedError:
                    return

    async def _checkpoint_sync(self) -> None:
        while not self._closing:
            await asyncio.sleep(self.config.flush_thorough_interval_ms / 1000)
            with contextlib.suppress(OSError):
                await self._run(self.log.sync_checkpoint)

    # ------------------------------------------------------------------ puts
    def _puts_coming(self, mark: int) -> bool:
        """More puts are on their way: appended since `mark` (a `wrote`
        position; a slave's ranges count too), or batches submitted and not
        yet appended."""
        return self.log.wrote != mark or self.batches_pending > 0

    def append(self, messages: Sequence[Message]) -> list[PutResult]:
        """Append without waiting for any flush (the node's building block)."""
        if self._closing:
            return [PutResult(PutStatus.SERVICE_NOT_AVAILABLE, detail="store is shutting down")
                    for _ in messages]
        results = self.log.append(messages)
        self.failpoints.hit("after_append_before_flush")
        dirty = self.log.dirty_bytes
        limit = self.config.max_unflushed_bytes
        if limit and dirty > limit and self.config.crash_model == CrashModel.POWER:
            # Backpressure: the flusher has fallen `limit` behind. Flush here
            # (after any flush in progress) rather than let unflushed bytes
            # pile up in fresh memory. The appends above stand either way: a
            # failed flush fails the log, as it would in the flusher.
            with contextlib.suppress(StoreFailedError):
                self.log.flush()
            self.backpressure_flushes += 1
            return results
        wakeup = self._flush_wakeup
        if wakeup is not None and dirty >= self._least_dirty:
            wakeup.set()
        return results

    def on_flushed(self, end: int, done: Callable[[PutStatus], None]) -> None:
        """The flush wait as a callback (wait_flushed awaits it; the node's
        put path and put() use it directly, with no task or coroutine):
        `done` gets the status once, from the loop, at once when the mode
        waits for nothing or `flushed` already covers `end`."""
        if self.config.flush_mode != FlushMode.SYNC_FLUSH:
            done(PutStatus.PUT_OK)
            return
        if self._group is None:
            raise RuntimeError("store.start() was not called")
        deadline = self.clock.monotonic() + self.config.sync_flush_timeout_ms / 1000
        self._flush_callback(end, done, deadline)

    async def wait_flushed(self, end: int) -> PutStatus:
        """PUT_OK once `flushed` covers `end`. Under SYNC_FLUSH waits for the
        group commit (FLUSH_DISK_TIMEOUT after sync_flush_timeout_ms;
        SERVICE_NOT_AVAILABLE if the flush failed). Under ASYNC_FLUSH returns
        PUT_OK at once: the mode promises nothing about the disk."""
        fut: asyncio.Future[PutStatus] = (self._loop or asyncio.get_running_loop()
                                          ).create_future()

        def done(status: PutStatus) -> None:
            if not fut.done():  # the caller may have been cancelled
                fut.set_result(status)

        self.on_flushed(end, done)
        return await fut

    async def put(self, message: Message) -> PutResult:
        """Append one message and wait as the flush mode says.

        Concurrent puts are coalesced: the first put of a loop tick schedules
        one drain, every put of that tick joins its batch, and the drain
        appends them with one lock and one buffer (what put_batch does) and
        waits for the flush once for all of them. Each put still gets its
        own offset and status."""
        loop = self._loop or asyncio.get_running_loop()
        batch = self._open_batch
        if batch is None or len(batch.messages) >= self._max_coalesce:
            batch = self._open_batch = _PutBatch()
            self.batches_pending += 1
            loop.call_soon(self._drain, batch)
        fut: asyncio.Future[PutResult] = loop.create_future()
        batch.messages.append(message)
        batch.waiting.append(fut)
        if len(batch.messages) >= self._max_coalesce:
            # Full: append it now, so its flush can start while the puts
            # still to come in this tick are encoded (left to the end of the
            # tick, every flush waited for every producer).
            self._drain(batch)
        return await fut

    def _drain(self, batch: _PutBatch) -> None:
        if batch.drained:
            return  # drained early, when it filled up
        batch.drained = True
        self.batches_pending -= 1
        if self._open_batch is batch:
            self._open_batch = None
        results = self.append(batch.messages)
        end = 0
        for r in reversed(results):  # in offset order: the last PUT_OK ends furthest
            if r.status is PutStatus.PUT_OK:
                end = r.offset + r.size
                break
        if not end:
            batch.finish(results, PutStatus.PUT_OK, "")
            return

        def done(status: PutStatus) -> None:
            batch.finish(results, status, "" if status is PutStatus.PUT_OK
                         else self.log.failed or "")

        self.on_flushed(end, done)

    def _flush_callback(self, end: int, done: Callable[[PutStatus], None],
                        deadline: float) -> None:
        """Call `done` with PUT_OK once `flushed` covers `end` (or with what
        went wrong), from the flush's resolution itself: one wake-up per
        batch, no task, no extra loop iteration."""
        group = self._group
        assert group is not None
        if self.log.flushed >= end:
            done(PutStatus.PUT_OK)
            return
        gen = group.join_generation()
        if gen.timer is None:
            # One timer per generation: puts that join later get at most one
            # flush cycle less than sync_flush_timeout_ms.
            gen.timer = group.loop.call_later(deadline - self.clock.monotonic(),
                                              gen.resolve, "timeout")

        def on_flush(outcome: str) -> None:
            if outcome == "failed":
                done(PutStatus.SERVICE_NOT_AVAILABLE)
            elif self.log.flushed >= end:
                done(PutStatus.PUT_OK)
            elif outcome == "timeout" or self.clock.monotonic() >= deadline:
                done(PutStatus.FLUSH_DISK_TIMEOUT)
            else:
                self._flush_callback(end, done, deadline)

        gen.waiters.append(on_flush)

    async def put_batch(self, messages: Sequence[Message]) -> list[PutResult]:
        results = self.append(messages)
        ends = [r.end for r in results if r.status == PutStatus.PUT_OK]
        if not ends:
            return results
        status = await self.wait_flushed(max(ends))
        if status == PutStatus.PUT_OK:
            return results
        return [PutResult(status, r.offset, r.size, r.msg_id, r.store_timestamp_ms)
                if r.status == PutStatus.PUT_OK else r for r in results]

    async def flush(self) -> int:
        return int(await self._run(self.log.flush))

    # ----------------------------------------------------------------- state
    def state(self) -> dict[str, Any]:
        pos = self.log.positions()
        return {
            "path": self.path,
            "min_offset": pos.min_offset,
            "flushed": pos.flushed,
            "wrote": pos.wrote,
            "crash_model": pos.crash_model,
            "flush_mode": self.config.flush_mode.value,
            "drop_flushed_pages": self.config.drop_flushed_pages,
            "segment_size_bytes": self.config.segment_size_bytes,
            "failed": pos.failed,
            "cannot_grow": pos.cannot_grow,
            "consume_queue_error": self.queues.write_error,
            "consume_queue_reput_from": self.reput_from,
            "consume_queue_dispatch_error": self.queues.dispatch_error,
            "consume_queue_records_skipped": self.queues.skipped,
            "consumer_offsets_error": self.offsets_error,
            "recovery": asdict(self.recovery),
        }

    # ----------------------------------------------------------------- close
    async def close(self) -> None:
        """Clean shutdown: flush everything, sync the checkpoint, remove
        `abort`, release the lock. A log whose flush failed keeps its `abort`, so
        the next open runs the abnormal (full-checking) recovery."""
        if self._closed:
            return
        self._closing = True
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        if self._group is not None:
            await self._executor.run_blocking(self._group.stop)
            if self._group.open is not None:
                self._group.open.resolve("failed")
        try:
            await self._run(self._close_files)
        finally:
            self._executor.shutdown()
            self._closed = True

    def close_sync(self) -> None:
        """Clean shutdown outside an event loop (tools, tests)."""
        if self._closed:
            return
        self._closing = True
        if self._group is not None:
            self._group.stop()
        try:
            self._close_files()
        finally:
            self._executor.shutdown()
            self._closed = True

    def _close_files(self) -> None:
        problem: str | None = "closing was interrupted"
        try:
            self.log.flush()
            self.log.sync_checkpoint()
            self.reput()
            self._flush_queues()  # a failure is kept in queues.write_error
            problem = self.queues.write_error
            try:
                self.consumer_offsets.persist()
            except OSError as exc:
                problem = problem or f"persisting the consumer offsets failed: {exc}"
        except StoreFailedError as exc:
            problem = f"the CommitLog could not be flushed: {exc}"
        except CorruptRecordError as exc:
            # The dispatch read a bad record below `wrote` (the log lost bytes
            # it counted flushed: --emulate rmq-2706): keep `abort`, so the
            # next open runs the full recovery.
            problem = f"the CommitLog holds a bad record: {exc}"
        except OSError as exc:
            problem = f"closing failed: {exc}"
        finally:
            self.log.close()
            self.queues.close()
            if problem is None:
                try:
                    with contextlib.suppress(FileNotFoundError):
                        self.log.disk.unlink(os.path.join(self.path, "abort"))
                    self.log.disk.fsync_dir(self.path)
                except OSError as exc:
                    problem = f"removing `abort` failed: {exc}"
            self.close_problem = problem
            self._lock.release()


def _entries(disk: Disk, path: str) -> set[str] | None:
    """The names in `path` before an open (an empty set when it does not
    exist); None when they cannot be listed (nothing is undone then)."""
    try:
        return set(disk.listdir(path))
    except FileNotFoundError:
        return set()
    except OSError:
        return None


def _undo_open(disk: Disk, path: str, found: set[str] | None, *, holding_lock: bool) -> None:
    """Remove what a failed open created in `path`: new files (`abort`,
    `lock`, `checkpoint`), new directories if empty (never a file in one),
    and `path` itself if the open made it. Best effort: the open's own error
    is what the caller reports."""
    if found is None:
        return
    try:
        names = set(disk.listdir(path))
    except OSError:
        return
    if not holding_lock:
        names &= {"commitlog"}  # made before the lock was taken
    for name in sorted(names - found):
        full = os.path.join(path, name)
        with contextlib.suppress(OSError):
            if disk.isdir(full) and not disk.islink(full):
                _remove_empty_dirs(disk, full)
            else:
                disk.unlink(full)
    with contextlib.suppress(OSError):
        if not found and not disk.listdir(path):
            disk.rmdir(path)
            return
        disk.fsync_dir(path)


def _remove_empty_dirs(disk: Disk, top: str) -> None:
    """rmdir every directory under `top` (deepest first) and `top`; a
    directory that holds a file stays, with its parents."""
    for name in disk.listdir(top):
        sub = os.path.join(top, name)
        if disk.isdir(sub) and not disk.islink(sub):
            _remove_empty_dirs(disk, sub)
    with contextlib.suppress(OSError):
        disk.rmdir(top)


def _os_error_message(path: str, exc: OSError) -> str:
    """What an OSError during an open means for the user, and the fix."""
    where = exc.filename or path
    what = f"cannot open store {path}: {exc.strerror or exc} on {where}"
    if exc.errno in (errno.EACCES, errno.EPERM):
        user = _user_name()
        return (f"{what}; this process runs as {user} (uid {os.geteuid()}): make the store "
                f"directory and every file in it readable and writable by that user (e.g. "
                f"chown -R {user} {path}), or run as their owner")
    if exc.errno == errno.EROFS:
        return f"{what}; the filesystem is read-only: remount it read-write or copy the store"
    if exc.errno == errno.EISDIR:
        note = (" (without a checkpoint, recovery only scans more)"
                if os.path.basename(where) == "checkpoint" else "")
        return f"{what}; a directory stands where the store keeps a file: move it aside{note}"
    if exc.errno == errno.ENOTDIR:
        return f"{what}; a file stands where a directory belongs: move it aside"
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return f"{what}; the disk is full: free space on it and start again"
    return f"{what}; fix that path and start again"


def _user_name() -> str:
    try:
        return pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:  # no name: chown takes the number too
        return str(os.geteuid())


def _reput_floor(plan: RecoveryPlan, queues_max_end: int | None, log_min: int,
                 log_end: int) -> int:
    """The later of the safe re-dispatch starts the store knows (see
    ConsumeQueues.reput_start): after a clean shutdown, the queues' largest
    end; after a crash, the segment abnormal recovery started from (the
    checkpoint's min of physic and logics timestamps picked it)."""
    if plan.abnormal:
        floor = log_min if plan.start_segment is None else plan.start_segment
    else:
        floor = log_min if queues_max_end is None else queues_max_end
    return max(log_min, min(floor, log_end))


def _report(plan: RecoveryPlan, problems: list[str]) -> RecoveryReport:
    return RecoveryReport(
        abnormal=plan.abnormal,
        max_valid_offset=plan.max_valid_offset,
        records_scanned=plan.records_scanned,
        first_bad_offset=plan.first_bad_offset,
        bad_reason=plan.bad_reason,
        segments_dropped=list(plan.segments_to_drop),
        problems=problems + plan.notes,
        summary=plan.describe(),
    )


def _plan(starts: list[int], segments: list[Segment], seg_size: int, *, abnormal: bool,
          checkpoint: Checkpoint | None, checkpoint_problem: str | None) -> RecoveryPlan:
    """plan_recovery over the segments' files, mapped read-only."""
    maps: dict[int, mmap.mmap] = {}

    def read(start: int) -> memoryview:
        if start not in maps:
            seg = next(s for s in segments if s.start == start)
            maps[start] = seg.file.map()
        return memoryview(maps[start])

    try:
        return plan_recovery(starts, read, seg_size=seg_size, abnormal=abnormal,
                             checkpoint=checkpoint, checkpoint_problem=checkpoint_problem)
    finally:
        for m in maps.values():
            with contextlib.suppress(BufferError):
                m.close()


def _recover(
    path: str,
    starts: list[int],
    segments: list[Segment],
    config: StoreConfig,
    *,
    abnormal: bool,
    checkpoint: Checkpoint | None,
    checkpoint_problem: str | None,
    repair_source: RepairSource | None,
    failpoints: Failpoints = DISARMED,
    disk: Disk,
) -> tuple[RecoveryPlan, Checkpoint | None, dict[str, Any]]:
    """Plan recovery and apply the corruption policy to corruption of flushed
    data. Returns the plan to apply (a torn tail, or the damage TRUNCATE
    accepts to cut), the checkpoint to continue from, and the recovery
    report's corruption fields.

    Ordering: REFUSE raises before any byte changes. REPAIR writes only
    ranges a replica returned and that verified (CRC, PHYSICALOFFSET, whole
    records ending where valid data resumes), fsyncs each BEFORE planning
    again; a crash mid-write leaves a range that fails its CRC, found and
    repaired again on the next open. TRUNCATE lowers the checkpoint to the
    last good record durably BEFORE the cut, so that no later recovery takes
    the (stale) checkpoint as a claim that data past the cut was flushed."""
    seg_size = config.segment_size_bytes
    policy = config.corruption_policy
    repaired: list[tuple[int, int]] = []
    for _ in range(MAX_REPAIRS + 1):
        plan = _plan(starts, segments, seg_size, abnormal=abnormal, checkpoint=checkpoint,
                     checkpoint_problem=checkpoint_problem)
        damage = plan.damage
        if damage is None or damage.kind is DamageKind.TAIL:
            fields: dict[str, Any] = {}
            if repaired:
                fields = {"corruption_action": "repaired", "repaired_ranges": repaired,
                          "corruption": f"{len(repaired)} damaged range(s) of flushed data "
                          "repaired from a replica: " + ", ".join(
                              f"[{a}, {b})" for a, b in repaired)}
            return plan, checkpoint, fields
        what = damage.describe(segment_name)
        if policy is CorruptionPolicy.TRUNCATE:
            _log.error("store %s: %s; corruption policy truncate: cutting at %d, %d valid "
                       "record(s) (%d bytes) past it are lost", path, what, damage.offset,
                       damage.records_past, damage.bytes_past)
            if checkpoint is not None:
                checkpoint = lower_checkpoint(disk, os.path.join(path, "checkpoint"),
                                              checkpoint, plan.last_store_timestamp_ms or 0)
            return plan, checkpoint, {
                "corruption": what, "corruption_action": "truncated",
                "records_lost": damage.records_past, "bytes_lost": damage.bytes_past,
                "repaired_ranges": repaired}
        if policy is CorruptionPolicy.REFUSE:
            raise CorruptionRefusedError(_refusal(path, what, damage, repaired), damage)
        if repair_source is None:
            raise CorruptionRefusedError(
                _refusal(path, what, damage, repaired, "no replica is configured to repair "
                         "from"), damage)
        try:
            _repair(damage, segments, seg_size, repair_source, failpoints)
        except (RepairUnavailableError, CorruptRecordError) as exc:
            raise CorruptionRefusedError(
                _refusal(path, what, damage, repaired, f"repair failed: {exc}"), damage) from None
        except OSError as exc:
            raise CorruptionRefusedError(
                _refusal(path, what, damage, repaired, f"writing the repaired range failed: "
                         f"{exc.strerror or exc}"), damage) from None
        end = damage.resume_offset if damage.resume_offset is not None else damage.offset
        _log.warning("store %s: %s; repaired [%d, %d) from a replica (CRC-verified)",
                     path, what, damage.offset, end)
        if repaired and repaired[-1][0] == damage.offset:
            raise CorruptionRefusedError(
                _refusal(path, what, damage, repaired, "the range was repaired once and is "
                         "still damaged"), damage)
        repaired.append((damage.offset, end))
    assert damage is not None
    raise CorruptionRefusedError(
        _refusal(path, what, damage, repaired, f"more than {MAX_REPAIRS} damaged ranges"), damage)


def _refusal(path: str, what: str, damage: Damage, repaired: list[tuple[int, int]],
             why: str | None = None) -> str:
    text = f"store {path} refused to open: {what}."
    if why:
        text += f" Repair was not possible: {why}."
    if repaired:
        text += f" ({len(repaired)} earlier range(s) were repaired.)"
    return text + (
        " Nothing was changed. Two ways on: repair the range from a replica that holds it "
        "(start again with --corruption-policy repair: `dlab cluster start NODE "
        "--corruption-policy repair`; `dlab node` repairs a master from its --repair-from "
        "replicas, a slave from its master), or accept the loss and start again with "
        "--corruption-policy truncate (RocketMQ's behaviour: cuts at "
        f"{damage.offset}, losing {damage.records_past} record(s), {damage.bytes_past} bytes).")


def _repair(damage: Damage, segments: list[Segment], seg_size: int,
            source: RepairSource, failpoints: Failpoints = DISARMED) -> None:
    """Fetch the damaged range from a replica, verify it, write it in place
    and fsync. Raises RepairUnavailableError, CorruptRecordError (what the
    replica sent does not verify) or OSError; nothing is written unless the
    whole range verified.

    The first record's 8-byte header is written last, after the rest is
    durable: a crash in between (failpoint recovery_repair) leaves a range
    that is either whole or still fails its CRC, never a record that
    verifies with bytes of both."""
    seg_end = damage.segment + seg_size
    end = damage.resume_offset if damage.resume_offset is not None else seg_end
    data = source(damage.offset, end)
    if not data:
        raise RepairUnavailableError(f"no replica holds offset {damage.offset}")
    # With no valid record past the damage, whatever whole records the
    # replica holds from the damage on are taken (the checkpoint says some
    # of them were flushed here).
    verify_range(data, damage.offset,
                 end if damage.resume_offset is not None else damage.offset + len(data), seg_end)
    seg = next(s for s in segments if s.start == damage.segment)
    pos = damage.offset - seg.start
    seg.pwrite(pos + 8, memoryview(data)[8:])
    seg.sync()
    failpoints.hit("recovery_repair")
    seg.pwrite(pos, memoryview(data)[:8])
    seg.sync()
