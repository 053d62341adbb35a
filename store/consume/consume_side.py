"""The consume side of a store: dispatch of CommitLog records into their
consume queues (reput), the open-time rebuild, and the reads consumers make
(queue offsets, get_messages), plus a slave's truncation.

How far consumers may read (`confirmed_offset`):
- classic mode: `flushed` under SYNC_FLUSH, `wrote` otherwise. Dispatch
  runs to `wrote`; reads stop at the units whose record ends at or before
  that bound.
- controller mode (`StoreConfig.confirm_offset_by_acks`; RocketMQ 5's
  CommitLog.confirmOffset with allAckInSyncStateSet): the confirm offset,
  how far every SyncStateSet member acknowledged, which the node sets
  (ha/autoswitch/confirm.py decides it). Dispatch stops at it, a record
  at a time (a record ending past it waits: RocketMQ's ReputMessageService
  bound), and reads serve every unit, as RocketMQ serves its consume
  queues. It is kept in the checkpoint at every sync
  (store/log/checkpoint.py) and recovered at open (`_recover_confirm_offset`,
  apache/rocketmq#6704's rule). On a master whose set is itself alone,
  and on a slave, it follows `wrote` (`confirm_written`).
Rules for controller mode:
- `_dispatch_end() <= wrote`; nothing is dispatched past it except, under
  --emulate rmq-6703, the one record straddling a recovered offset;
- the recovered offset is a record boundary at or below the persisted one
  and at or below the recovered end (when the scan started at or below it);
- QUEUEOFFSETs continue past every record dispatch has not reached
  (`_continue_queue_offsets`, apache/rocketmq#7690's compensation), so no
  two records of a queue share one.

A mixin of MessageStore (store/store.py), which owns the attributes
declared below.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Callable

from store.config import FlushMode, StoreConfig
from store.consume.consumequeue import ConsumeQueue, ConsumeQueues, DispatchError
from store.consume.consumer_offsets import ConsumerOffsetTable
from store.consume.reput import units as reput_units
from store.emulate import (
    PLANTED_DISPATCH_BEFORE_DURABLE,
    RMQ_405,
    RMQ_6703,
    RMQ_7689,
    RMQ_8239,
)
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
    # Controller mode (module docstring): the confirm offset, and whether it
    # follows `wrote` instead.
    confirm: int
    _confirm_follows_wrote: bool
    # Open-time dispatch under --emulate rmq-6703: a record that starts
    # below the bound and ends past it is dispatched too.
    _straddle: bool

    def _attach_queues(self, queues: ConsumeQueues, offsets: ConsumerOffsetTable,
                       floor: int, new_lock: Callable[[], StoreLock],
                       persisted_confirm: int | None = None) -> None:
        """Re-dispatch what recovery left without units, then let QUEUEOFFSET
        continue from the queues (they survive restarts; memory does not)
        and past the records not dispatched yet. `new_lock` is the flush
        executor's: a stalled dispatch pass holds `_reput_lock` across its
        stall. `persisted_confirm`: the checkpoint's confirm offset
        (controller mode; None: the page held none)."""
        self.queues = queues
        self.consumer_offsets = offsets
        self._reput_lock = new_lock()
        self._reput_at = queues.reput_start(self.log.min_offset, floor=floor)
        self.log.cold_below = lambda: self._reput_at
        self.reput_from = self._reput_at  # where open-time re-dispatch started
        self._confirm_follows_wrote = False
        self._straddle = False
        self.confirm = self.log.wrote
        try:
            if self.config.confirm_offset_by_acks:
                notes = self._recover_confirm_offset(persisted_confirm)
                self.log.checkpoint.confirm_source = self.confirmed_offset
            else:
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
        self._continue_queue_offsets()

    def _recover_confirm_offset(self, persisted: int | None) -> list[str]:
        """Controller mode, at open: the confirm offset from the checkpoint
        (0 when the page holds none, as RocketMQ's reads), then the
        re-dispatch up to it. Fixed rule (apache/rocketmq#6704, 5.1.1 and
        later): dispatch the records that END at or below it, and lower it
        to the end of the last of them, which is the recovered end when it
        was past that (a crash took the unflushed tail), and the start of
        the record it falls inside when it does (RocketMQ's HA ships bytes,
        not records, so acks and the offset can fall inside one). A scan
        that started above it leaves it as it is (RocketMQ's
        lastConfirmValidMsgPhyOffset starts at the scanned file). Returns
        notes for the recovery report."""
        lo, end = self.log.min_offset, self.log.wrote
        wanted = max(lo, 0 if persisted is None else persisted)
        start = self._reput_at
        if RMQ_6703 in self.config.emulate:
            # --emulate rmq-6703: before apache/rocketmq#6704 (5.1.0 and the
            # #6618 code it followed), CommitLog.recoverAbnormally
            # dispatched every record that STARTS below the confirm offset
            # (dispatchRequest.getCommitLogOffset() < getConfirmOffset())
            # and lowered the offset only when it was past the recovered end
            # (to processOffset). An offset inside a record stays there, and
            # that record gets its unit although not all of it was
            # acknowledged. The fix dispatches records that end at or below
            # the offset and cuts it to the last one's end (the other branch).
            self.confirm = min(wanted, end)
            self._straddle = True
            try:
                return self._rebuild()
            finally:
                self._straddle = False
        self.confirm = min(wanted, end)
        notes = self._rebuild()
        if start <= wanted and self._reput_at < self.confirm:
            notes.append(f"confirm offset {wanted} from the checkpoint lowered to "
                         f"{self._reput_at}, the end of the last whole record at or below it")
            self.confirm = self._reput_at
        elif wanted > end:
            notes.append(f"confirm offset {wanted} from the checkpoint lowered to the "
                         f"recovered end {end}")
        return notes

    def _continue_queue_offsets(self) -> None:
        """The QUEUEOFFSET each queue's next record takes: after the queue's
        units, and after every record dispatch has not reached yet (in
        controller mode, those past the confirm offset: a restarted master
        holds records its SyncStateSet had not all acknowledged; classic
        dispatch reaches `wrote` before this runs)."""
        nxt = self.queues.next_queue_offsets()
        if RMQ_7689 not in self.config.emulate:
            # apache/rocketmq#7690 (5.2.0): ConsumeQueueStore.recoverOffsetTable
            # also reads the records from the confirm offset on
            # (compensateForHA) and moves each queue's offset past theirs.
            # --emulate rmq-7689 leaves it out: the queues alone, which stop
            # at the confirm offset, so the master's next puts take the
            # QUEUEOFFSETs of the records after it; when dispatch reaches
            # those, two records share each offset and the later one gets no
            # unit (never delivered).
            pos, end = self._reput_at, self.log.wrote
            while pos < end:
                data, nxt_pos = self.log.read_range(pos, 1 << 20)
                if nxt_pos <= pos:
                    break
                for topic, qid, qo, *_ in reput_units(data, pos):
                    if qo + 1 > nxt.get((topic, qid), 0):
                        nxt[(topic, qid)] = qo + 1
                pos = nxt_pos
        with self.log._lock:
            self.log._queue_offsets = nxt

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
        self._continue_queue_offsets()

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
            if self._reput_at >= self._dispatch_end():
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

    def _dispatch_end(self) -> int:
        """How far dispatch goes: `wrote` in classic mode (reads apply
        confirmed_offset), the confirm offset in controller mode."""
        if self.config.confirm_offset_by_acks:
            return self.confirmed_offset()
        return self.log.wrote

    def _dispatch_locked(self, *, strict: bool) -> None:
        end = self._dispatch_end()
        pos = self._reput_at
        native = native_codec.reput_groups
        while pos < end:
            room = min(1 << 20, end - pos)
            if native is not None:
                # The units of the whole ordinary records at the start of
                # the next MiB (or up to the bound), gathered natively per
                # queue (it stops at a record cut by the read, a blank, or
                # anything the Python walk below must decide, which then
                # takes over from there).
                stop, last_ts, groups = native(self.log.read(pos, room), pos)
                if stop:
                    self.queues.dispatch_groups(groups, last_ts, strict=strict)
                    pos += stop
                    self._reput_at = pos
                    continue
            data, nxt = self.log.read_range(pos, room)
            if nxt <= pos:
                break
            if nxt > end and not self._straddle:
                break  # a record that ends past the bound waits for it
            self.queues.dispatch(reput_units(data, pos), strict=strict)
            pos = nxt
            self._reput_at = pos

    def confirmed_offset(self) -> int:
        """How far consumers may read (module docstring). Classic mode:
        `flushed` under SYNC_FLUSH, so nothing a crash can still take is
        ever consumed (apache/rocketmq#8239); `wrote` otherwise, as
        RocketMQ. Controller mode: the confirm offset, at most `wrote`."""
        if self.config.confirm_offset_by_acks:
            wrote = self.log.wrote
            return wrote if self._confirm_follows_wrote else min(self.confirm, wrote)
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

    def set_confirm_offset(self, offset: int) -> None:
        """Controller mode, on a master: every SyncStateSet member acked up
        to `offset` (the node decides it: ha/autoswitch/confirm.py).
        Dispatch goes on to it at the next pass or read."""
        assert self.config.confirm_offset_by_acks, "the confirm offset is controller mode's"
        assert offset >= 0, offset
        self.confirm = offset
        self._confirm_follows_wrote = False

    def confirm_written(self) -> None:
        """Controller mode: consumers may read all this store wrote (a
        master whose SyncStateSet is itself alone, RocketMQ's
        getConfirmOffset returning the max offset; a slave, which holds
        only what it received)."""
        assert self.config.confirm_offset_by_acks, "the confirm offset is controller mode's"
        self._confirm_follows_wrote = True

    def _readable(self, q: ConsumeQueue) -> int:
        """How many units of `q` consumers may read: in controller mode
        every unit (dispatch applied the bound), as RocketMQ's consume
        queue; in classic mode those whose record ends at or before
        confirmed_offset() (dispatch ran to `wrote`)."""
        if self.config.confirm_offset_by_acks:
            return q.count
        return q.consumable(self.confirmed_offset())

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
        return (0, 0) if q is None else (0, self._readable(q))

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
        low, high = 0, self._readable(q)
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
        if self.config.confirm_offset_by_acks:
            # RocketMQ's CommitLog.truncateDirtyFiles: nothing past the cut
            # is confirmed (the checkpoint's field is lowered with it).
            self.confirm = min(self.confirm, offset)
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
        self._continue_queue_offsets()
