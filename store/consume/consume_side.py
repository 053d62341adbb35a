"""The consume side of a store: dispatch of CommitLog records into their
consume queues (reput), the open-time rebuild, and the reads consumers make
(queue offsets, get_messages), plus a slave's truncation.

A mixin of MessageStore (store/store.py), which owns the attributes
declared below.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Callable

from store.config import FlushMode, StoreConfig
from store.consume.consumequeue import ConsumeQueues, DispatchError
from store.consume.consumer_offsets import ConsumerOffsetTable
from store.consume.reput import units as reput_units
from store.emulate import PLANTED_DISPATCH_BEFORE_DURABLE, RMQ_405, RMQ_8239
from store.failpoints import Failpoints
from store.log import native as native_codec
from store.log.commitlog import CommitLog
from store.log.opening import RecoveryReport, StoreOpenError
from store.log.record import CorruptRecordError
from store.seams.flush_executor import FlushExecutor, StoreLock
from store.status import GetMessagesResult, GetMessageStatus, QueuedMessage

_log = logging.getLogger("dlab.store")
# --emulate rmq-405: how long a clean close waits for dispatch to catch up
# (RocketMQ's ReputMessageService.shutdown: 50 x 100 ms).
RMQ_405_DRAIN_S = 5.0


class ConsumeSide:
    path: str
    config: StoreConfig
    log: CommitLog
    failpoints: Failpoints
    recovery: RecoveryReport
    queues: ConsumeQueues
    consumer_offsets: ConsumerOffsetTable
    reput_from: int
    _reput_lock: StoreLock
    _executor: FlushExecutor
    _reput_at: int
    _closing: bool

    def _attach_queues(self, queues: ConsumeQueues, offsets: ConsumerOffsetTable,
                       floor: int, new_lock: Callable[[], StoreLock]) -> None:
        """Re-dispatch what recovery left without units, then let QUEUEOFFSET
        continue from the queues (they survive restarts; memory does not).
        `new_lock` is the flush executor's: a stalled dispatch pass holds
        `_reput_lock` across its stall."""
        self.queues = queues
        self.consumer_offsets = offsets
        self._reput_lock = new_lock()
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


    # ------------------------------------------------------------ consume side
    def reput(self) -> None:
        """Dispatch every record appended since the last call into its
        ConsumeQueue (RocketMQ's ReputMessageService; off the put path). A
        record that does not fit its queue is logged and counted
        (state()["consume_queue_dispatch_error"]), never raised.

        It does not wait for a dispatch pass already running elsewhere (only
        a stalled one runs elsewhere for long: failpoint
        reput_before_dispatch): a read then serves what is dispatched, as
        RocketMQ's consumers see what its reput service has dispatched."""
        if not self._reput_lock.acquire(blocking=False):
            return
        try:
            self._dispatch_locked(strict=False)
        finally:
            self._reput_lock.release()

    def recover_topic_queue_table(self) -> None:
        """A replica about to take puts in place (controller mode's
        become-master; RocketMQ's changeToMaster calls its
        recoverTopicQueueTable): dispatch every record it received, then let
        QUEUEOFFSET continue from the queues. A replica appends what it
        receives without assigning queue offsets, so the table it opened
        with is behind what its log holds: its first puts as master would
        take QUEUEOFFSETs its queues already have, and get no unit
        (consumers would never see them)."""
        self._reput_from_here(strict=False)
        with self.log._lock:
            self.log._queue_offsets = self.queues.next_queue_offsets()

    def _reput_from_here(self, *, strict: bool) -> None:
        # One walker at a time: the loop (reads) and the flusher thread
        # (close) both call it, and dispatch checks-then-appends.
        with self._reput_lock:
            self._dispatch_locked(strict=strict)

    async def _dispatch_pass(self) -> None:
        """The consume-side service's dispatch pass. With the failpoint
        reput_before_dispatch armed it runs on a thread of its own (the flush
        executor's run_alone, as RocketMQ's ReputMessageService runs on its
        own), so a stall there holds back dispatch, not the node: puts and
        reads go on."""
        if not self.failpoints.armed("reput_before_dispatch"):
            self.reput()
            return

        def run() -> None:
            try:
                self._stallable_pass()
            except Exception:  # a bug: say so; the next pass tries again
                _log.exception("consume queue dispatch failed")

        await self._executor.run_alone(run)

    def _stallable_pass(self) -> None:
        with self._reput_lock:
            if self._reput_at >= self.log.wrote:
                return
            self.failpoints.hit("reput_before_dispatch")
            if self._closing:  # a stall outlived the close: the files are gone
                return
            self._dispatch_locked(strict=False)

    def _drain_dispatch(self) -> None:
        """At close: dispatch what is left, waiting for a pass in progress."""
        if RMQ_405 in self.config.emulate:
            # --emulate rmq-405: RocketMQ's ReputMessageService.shutdown
            # waits at most 50 x 100 ms for dispatch to catch up, then warns
            # and stops; the store still shuts down cleanly (no `abort`), and
            # the next normal open starts dispatch at the CommitLog's end
            # (see store/log/opening.py reput_floor), so what was not dispatched
            # never is. Real fix: see reput_floor.
            if not self._reput_lock.acquire(timeout=RMQ_405_DRAIN_S):
                _log.warning("shutdown: dispatch did not finish within %g s (--emulate "
                             "rmq-405): records from %d to %d have no consume queue unit",
                             RMQ_405_DRAIN_S, self._reput_at, self.log.wrote)
                return
        else:
            self._reput_lock.acquire()
        try:
            self._dispatch_locked(strict=False)
        finally:
            self._reput_lock.release()

    def _dispatch_locked(self, *, strict: bool) -> None:
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
            if PLANTED_DISPATCH_BEFORE_DURABLE in self.config.emulate:
                # PLANTED FAULT (--emulate planted-dispatch-before-durable),
                # not RocketMQ's: the end the running flush has taken stands
                # for the flushed one, so records its write and fsync have not
                # made durable yet are served to consumers.
                return min(self.log.wrote, max(self.log.flushed, self.log.flush_target))
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
        self._reput_from_here(strict=False)  # every record before the cut has its unit
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
