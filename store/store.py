"""MessageStore: a store directory opened, recovered and served.

Layout of the directory (RocketMQ's store root): `commitlog/` (segments),
`checkpoint`, `abort` (exists while open; a clean close removes it), `lock`,
and under the power crash model `durable-mark` (store/log/durable_mark.py).

Opening takes the lock, decides normal or abnormal recovery from `abort`,
recovers the CommitLog (store/log/recovery.py decides, store/log/corruption_policy.py
applies the corruption policy, commitlog.py cuts crash-safely), then
creates `abort` (store/log/opening.py: errors and undoing a failed open).
Closing flushes everything, syncs the checkpoint, removes `abort`, releases
the lock.

Flush services run on the event loop (store/services.py); file IO runs on
the flush executor (store/seams/flush_executor.py: a flusher thread in
production, inline on the loop in a simulation). SYNC_FLUSH is group
commit (store/log/group_commit.py). The consume side (dispatch, reads) is
store/consume/consume_side.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import asdict
from typing import Any

from store.config import ConfigError, CrashModel, FlushMode, StoreConfig
from store.consume.consume_side import ConsumeSide
from store.consume.consumequeue import ConsumeQueues
from store.consume.consumer_offsets import ConsumerOffsetTable, OffsetTableError
from store.emulate import RMQ_405
from store.failpoints import DISARMED, Failpoints
from store.layout import layout_problems, refusal
from store.log.checkpoint import CheckpointFile, read_checkpoint
from store.log.commitlog import CommitLog, StoreFailedError
from store.log.corruption_policy import (
    CorruptionRefusedError,
    RepairSource,
    RepairUnavailableError,
    recover,
)
from store.log.cuts import apply_plan, open_segments
from store.log.durable_mark import DurableMark
from store.log.group_commit import GroupCommit
from store.log.opening import (
    RecoveryReport,
    StoreOpenError,
    entries,
    os_error_message,
    recovery_report,
    reput_floor,
    undo_open,
)
from store.log.record import CorruptRecordError, Message
from store.log.recovery import RecoveryPlan
from store.log.segments import list_segments, segment_name
from store.put_path import Answer, PutPath
from store.seams.clock import Clock, SystemClock
from store.seams.disk import Disk, DiskLock, RealDisk
from store.seams.flush_executor import FlushExecutor, StoreLock, ThreadFlushExecutor
from store.seams.lock import StoreLockedError
from store.services import FlushServices
from store.status import PutResult, PutStatus

__all__ = ["MessageStore", "StoreOpenError", "StoreLockedError", "ConfigError",
           "CorruptionRefusedError", "RepairUnavailableError", "RepairSource",
           "RecoveryReport"]
_log = logging.getLogger("dlab.store")


def _log_completed_cut(path: str, plan: RecoveryPlan) -> None:
    """A cut a kill interrupted (store/log/cuts.py: header zeroed, the rest
    not yet cleared) was completed: data the store held is gone now, so say
    what, at WARNING."""
    end = plan.max_valid_offset
    removed = ", ".join(f"commitlog/{segment_name(s)}" for s in plan.segments_to_drop)
    _log.warning(
        "store %s: completed a truncation at offset %d that a crash interrupted: cleared the "
        "stale bytes [%d, %d) after it%s", path, end, end, plan.stale_end or end,
        f" and removed {len(plan.segments_to_drop)} later segment(s) ({removed})"
        if removed else "")


class MessageStore(ConsumeSide, FlushServices):
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
        answer: Answer | None = None,
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
        self._group: GroupCommit | None = None
        # The loop start() ran on: the store's services and group commit
        # live there, and put() runs there. Kept because CPython 3.11's
        # asyncio.get_running_loop() makes a getpid() system call each time
        # (it checks for a fork), which put() would pay once per put (see
        # docs/performance-notes.md, "Group commit").
        self._loop: asyncio.AbstractEventLoop | None = None
        self._flush_wakeup: asyncio.Event | None = None  # ASYNC_FLUSH, not flush_timed
        self._least_dirty = config.flush_least_pages * config.page_size_bytes
        self.backpressure_flushes = 0  # appends that flushed (max_unflushed_bytes)
        # The one put path (store/put_path.py): the node's puts, put() and
        # put_batch() are coalesced, appended and answered there (by
        # `answer` when given: a node's answer after its flush and replica
        # waits; by default once the flush wait is over).
        self.puts = PutPath(log, config, self.append, self.on_flushed, answer=answer)
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
        answer: Answer | None = None,
    ) -> MessageStore:
        """Open (creating if needed) and recover the store at `path` on
        `disk` (the real filesystem by default). Raises
        StoreLockedError, StoreOpenError or ConfigError with a message a user
        can act on; on any error the directory is left as it was found.
        Corruption of flushed data is handled by config.corruption_policy
        (CorruptionRefusedError when refused); `repair_source` fetches a
        damaged range from a replica (the REPAIR policy). `answer` answers
        each appended batch of puts (store/put_path.py Answer; default: once
        the flush the mode asks for covers it)."""
        config = (config or StoreConfig()).validate()
        clock = clock or SystemClock()
        failpoints = failpoints or DISARMED
        disk = disk or RealDisk()
        commitlog_dir = os.path.join(path, "commitlog")
        # Before the lock file is written or anything created: a link would
        # take those writes out of the store (store/layout.py).
        problems = layout_problems(disk, path)
        if problems:
            raise StoreOpenError(refusal(path, problems))
        found = entries(disk, path)
        try:
            disk.makedirs(commitlog_dir)
            lock = disk.lock(os.path.join(path, "lock"))
        except OSError as exc:
            undo_open(disk, path, found, holding_lock=False)
            raise StoreOpenError(os_error_message(path, exc)) from None
        # StoreLockedError: another process holds the store; nothing to undo.
        try:
            store = cls._open_locked(path, config, clock, failpoints, lock, disk, repair_source,
                                     new_lock=executor.lock if executor else threading.Lock,
                                     answer=answer)
        except BaseException as exc:
            # Leave the directory as found: every entry this open created
            # (`abort` above all, which would make the next open abnormal)
            # goes, while the lock is still held.
            undo_open(disk, path, found, holding_lock=True)
            lock.release()
            if isinstance(exc, OSError):
                raise StoreOpenError(os_error_message(path, exc)) from None
            raise
        if executor is not None:  # where file IO runs (store/seams/flush_executor.py)
            store._executor = executor
        return store

    @classmethod
    def _open_locked(
        cls, path: str, config: StoreConfig, clock: Clock, failpoints: Failpoints,
        lock: DiskLock, disk: Disk, repair_source: RepairSource | None = None,
        new_lock: Callable[[], StoreLock] = threading.Lock, answer: Answer | None = None,
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
        cpf: CheckpointFile | None = None
        queues: ConsumeQueues | None = None
        try:
            checkpoint, cp_problem = read_checkpoint(os.path.join(path, "checkpoint"), disk)
            plan, checkpoint, corruption = recover(
                path, listing.starts, segments, config, abnormal=abnormal,
                checkpoint=checkpoint, checkpoint_problem=cp_problem,
                repair_source=repair_source, failpoints=failpoints, disk=disk)
            segments = apply_plan(plan, commitlog_dir, segments, seg_size, failpoints)
            if plan.stale_tail:
                _log_completed_cut(path, plan)
            # Only now, with the decision made (a refusal changed nothing): a
            # short last segment gets its missing end, as zeros.
            for seg in segments:
                seg.extend()
            if config.crash_model.value == "process" and segments:
                segments[-1].sync()  # what the OS held is now durable too
            report = recovery_report(plan, listing.problems)
            if corruption.get("corruption_action"):
                corruption["summary"] = (f"{report.summary}; corruption of flushed data "
                                         f"{corruption['corruption_action']}")
            report = dataclasses.replace(report, **corruption)
            disk.write_file(abort_path, str(os.getpid()).encode())
            cpf = CheckpointFile(disk, os.path.join(path, "checkpoint"))
            # Both entries durable before any flush relies on them: a new
            # checkpoint's entry lost in a crash of the store's first life
            # would take the flushed end with it, the position recovery
            # tells a torn tail from damaged flushed data by (docs/design.md).
            disk.fsync_dir(path)
            if checkpoint:
                cpf.last_ms = checkpoint.physic_ms
                cpf.logics_ms = checkpoint.logics_ms
                cpf.flushed_end = min(checkpoint.flushed_end or 0, plan.max_valid_offset)
            log = CommitLog(
                commitlog_dir, config, clock, cpf, segments, plan.max_valid_offset,
                plan.last_store_timestamp_ms or 0, failpoints, disk=disk, new_lock=new_lock,
            )
            queues = ConsumeQueues(path, file_units=config.consume_queue_file_units,
                                   write_through=config.crash_model == CrashModel.PROCESS,
                                   disk=disk)
            queues.load(log.wrote, lambda: failpoints.hit("consume_queue_truncate"))
            floor = reput_floor(plan, queues.max_end(), log.min_offset, log.wrote,
                                rmq_405=RMQ_405 in config.emulate)
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
            # Under POWER completed fsyncs are recorded for a harness's power
            # cut (store/log/durable_mark.py); recovery's cuts are durable by now.
            # Last, so an open that refuses leaves the old mark as it was.
            if config.crash_model == CrashModel.POWER:
                cpf.mark = log.mark = DurableMark.open(disk, path, log.wrote)
            else:
                DurableMark.remove(disk, path)
        except BaseException:
            for s in segments:
                s.close()
            if queues is not None:
                queues.close()
            if cpf is not None:
                cpf.close()
            raise
        store = cls(path, config, log, lock, report, clock, failpoints, answer=answer)
        store._attach_queues(queues, offsets, floor, new_lock,
                             persisted_confirm=checkpoint.confirm_offset if checkpoint else None)
        return store


    # --------------------------------------------------------------- service
    async def start(self) -> None:
        """Start the flush service for the configured mode (on this loop,
        where put() must then be called)."""
        loop = self._loop = self.puts.loop = asyncio.get_running_loop()
        if self.config.flush_mode == FlushMode.SYNC_FLUSH:
            stalls = ("before_flush_sync", "flush_before_write")
            self._group = GroupCommit(
                self.log, loop, self._executor, self._puts_coming, lambda: self.log.wrote,
                inline=not (any(map(self.failpoints.armed, stalls))
                            or self._executor.timed_flushes))
        else:
            if not self.config.flush_timed:
                self._flush_wakeup = asyncio.Event()
            self._tasks.append(loop.create_task(self._interval_flush()))
        self._tasks.append(loop.create_task(self._checkpoint_sync()))
        self._tasks.append(loop.create_task(self._consume_side_service()))


    # ------------------------------------------------------------------ puts
    def _puts_coming(self, mark: int) -> bool:
        """More puts are on their way: appended since `mark` (a `wrote`
        position; a slave's ranges count too), or batches submitted and not
        yet appended."""
        return self.log.wrote != mark or self.puts.pending > 0

    def append(self, messages: Sequence[Message]) -> list[PutResult]:
        """Append without waiting for any flush (the put path's append step;
        a batch of puts is appended with one call)."""
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
        """The flush wait as a callback (wait_flushed awaits it; the put path
        and the node's answer use it directly, with no task or coroutine):
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
        """Put one message through the put path (store/put_path.py: coalesced
        with the other puts of this loop tick) and wait as the flush mode
        says."""
        fut: asyncio.Future[PutResult] = (self._loop or asyncio.get_running_loop()
                                          ).create_future()

        def done(results: list[PutResult]) -> None:
            if not fut.done():  # the caller may have been cancelled
                fut.set_result(results[0])

        self.puts.submit((message,), done)
        return await fut

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
        """Put `messages` through the put path as one submission (as a
        node's SendBatch) and wait as the flush mode says; results in
        order."""
        fut: asyncio.Future[list[PutResult]] = (self._loop or asyncio.get_running_loop()
                                                ).create_future()

        def done(results: list[PutResult]) -> None:
            if not fut.done():  # the caller may have been cancelled
                fut.set_result(results)

        self.puts.submit(messages, done)
        return await fut

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
            "confirm_offset": (self.confirmed_offset() if self.config.confirm_offset_by_acks
                               else None),
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
            self._drain_dispatch()
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
