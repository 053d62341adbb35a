"""Controller mode's confirm offset in the store (store/consume/consume_side.py):
dispatch and reads stop at it, the checkpoint keeps it, recovery lowers it
to a record boundary at or below the recovered end (apache/rocketmq#6704;
--emulate rmq-6703 brings back the rule before), and QUEUEOFFSETs continue
past the records after it (apache/rocketmq#7690; --emulate rmq-7689).
Real files and fsync; a crash is what a SIGKILL under the power model leaves
(files closed without a flush)."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.consumequeue_helpers import msgs

from store import GetMessageStatus
from store.config import TESTING, StoreConfig
from store.emulate import RMQ_6703, RMQ_7689
from store.log.checkpoint import read_checkpoint
from store.log.record import Message
from store.store import MessageStore
from store.tools.inspect import inspect_store

CONTROLLER = TESTING.with_(confirm_offset_by_acks=True)


def _crash(s: MessageStore) -> None:
    """What a SIGKILL leaves of an open store under the power model: files
    closed without a flush, a close or a persist; `abort` stays."""
    s.log.close()
    s.queues.close()
    s._executor.shutdown()
    s._lock.release()


def _ends(s: MessageStore) -> list[int]:
    """Each record's end offset, in log order."""
    return [r.offset + r.size for r in s.log.iter_records()]


def _keys(s: MessageStore, queue_id: int = 0) -> list[str]:
    """The UNIQ_KEYs consumers get from queue `queue_id`, in order."""
    got = s.get_messages("T", queue_id, 0, 1024)
    return [m.record.properties["UNIQ_KEY"] for m in got.messages]


def _config(*emulate: str) -> StoreConfig:
    return CONTROLLER.with_(emulate=frozenset(emulate))


# ------------------------------------------------------------ the bound
def test_dispatch_and_reads_stop_at_the_confirm_offset_a_whole_record_at_a_time(
    tmp_path: Path
) -> None:
    s = MessageStore.open(str(tmp_path), CONTROLLER)
    try:
        s.log.append(msgs(10, queues=1))
        ends = _ends(s)
        s.set_confirm_offset(ends[3])
        assert s.confirmed_offset() == ends[3]
        assert _keys(s) == ["m0", "m1", "m2", "m3"]
        # Inside record 6: records 4 and 5 are confirmed, 6 waits for all of it.
        s.set_confirm_offset(ends[5] + 10)
        assert len(_keys(s)) == 6 and s.queues.get("T", 0).count == 6  # type: ignore[union-attr]
        got = s.get_messages("T", 0, 6)
        assert got.status is GetMessageStatus.OFFSET_OVERFLOW_ONE
        s.confirm_written()  # a set of the master alone: everything it wrote
        assert s.confirmed_offset() == s.log.wrote and len(_keys(s)) == 10
    finally:
        s.close_sync()


def test_classic_mode_is_unchanged_dispatch_runs_to_wrote(tmp_path: Path) -> None:
    s = MessageStore.open(str(tmp_path), TESTING)
    try:
        s.log.append(msgs(5, queues=1))
        assert s.confirmed_offset() == s.log.wrote and len(_keys(s)) == 5
        assert s.state()["confirm_offset"] is None
    finally:
        s.close_sync()


# ------------------------------------------------------- the checkpoint
def test_the_checkpoint_keeps_the_confirm_offset_of_its_last_sync(tmp_path: Path) -> None:
    s = MessageStore.open(str(tmp_path), CONTROLLER)
    s.log.append(msgs(8, queues=1))
    s.log.flush()
    ends = _ends(s)
    s.set_confirm_offset(ends[2])
    s.log.sync_checkpoint()
    s.set_confirm_offset(ends[6])  # not synced: a crash keeps the older value
    s.reput()
    _crash(s)
    cp, problem = read_checkpoint(str(tmp_path / "checkpoint"))
    assert cp is not None, problem
    assert cp.confirm_offset == ends[2]
    s = MessageStore.open(str(tmp_path), CONTROLLER)
    try:
        assert s.recovery.abnormal and s.log.wrote == ends[-1]
        assert s.confirmed_offset() == ends[2]
        # The queue flush never ran: recovery re-dispatched up to the
        # recovered confirm offset only.
        assert s.queues.get("T", 0).count == 3  # type: ignore[union-attr]
    finally:
        s.close_sync()
    cp, _ = read_checkpoint(str(tmp_path / "checkpoint"))
    assert cp is not None and cp.confirm_offset == ends[2]  # a clean close syncs it
    shown = inspect_store(str(tmp_path)).to_json()["markers"]["checkpoint"]
    assert shown["confirm_offset"] == ends[2]  # `dlab store inspect` shows it


def test_a_classic_store_writes_no_confirm_offset(tmp_path: Path) -> None:
    s = MessageStore.open(str(tmp_path), TESTING)
    s.log.append(msgs(3))
    s.close_sync()
    cp, _ = read_checkpoint(str(tmp_path / "checkpoint"))
    assert cp is not None and cp.confirm_offset is None


# ------------------------------------------------ recovery (#6703, #6704)
@pytest.mark.parametrize("emulate", [(), (RMQ_6703,)], ids=["fixed", "rmq-6703"])
def test_a_confirm_offset_past_the_recovered_end_is_cut_to_it_by_either_rule(
    tmp_path: Path, emulate: tuple[str, ...]
) -> None:
    """#6703's setting: ASYNC_FLUSH, the slaves acked bytes the master had
    not flushed, the checkpoint kept that confirm offset, and a crash took
    the unflushed tail. Both rules lower the offset to the recovered end:
    the code before apache/rocketmq#6704 already cut it when it was past
    processOffset, so on an offset at a record boundary the fix changes
    nothing (docs/known-bugs.md, rmq-6703)."""
    cfg = _config(*emulate)
    s = MessageStore.open(str(tmp_path), cfg)
    s.log.append(msgs(4, queues=1))
    s.log.flush()
    flushed = s.log.flushed
    s.log.append(msgs(4, queues=1, prefix="lost"))
    s.set_confirm_offset(s.log.wrote)
    s.log.sync_checkpoint()
    _crash(s)
    s = MessageStore.open(str(tmp_path), cfg)
    try:
        assert s.log.wrote == flushed
        assert s.confirmed_offset() == flushed
        assert len(_keys(s)) == 4
        s.log.append(msgs(2, queues=1, prefix="new"))  # new records where the lost ones were
        assert s.confirmed_offset() == flushed and len(_keys(s)) == 4
    finally:
        s.close_sync()


@pytest.mark.parametrize("emulate", [(), (RMQ_6703,)], ids=["fixed", "rmq-6703"])
def test_a_confirm_offset_inside_a_record_is_lowered_to_its_start_unless_rmq_6703(
    tmp_path: Path, emulate: tuple[str, ...]
) -> None:
    """Where the two rules differ: an offset inside a record, which
    RocketMQ's byte-range acks produce (this lab ships whole records, so
    here the checkpoint is given one). Fixed: the record is not dispatched
    and the offset drops to its start. rmq-6703: it is dispatched (a
    consumer reads a message not all members hold) and the offset stays."""
    cfg = _config(*emulate)
    s = MessageStore.open(str(tmp_path), cfg)
    s.log.append(msgs(6, queues=1))
    s.log.flush()
    ends = _ends(s)
    inside = ends[3] + 7  # inside record 4
    s.set_confirm_offset(inside)
    s.log.sync_checkpoint()
    _crash(s)
    s = MessageStore.open(str(tmp_path), cfg)
    try:
        if emulate:
            assert s.confirmed_offset() == inside
            assert _keys(s) == [f"m{i}" for i in range(5)]
        else:
            assert s.confirmed_offset() == ends[3]
            assert _keys(s) == [f"m{i}" for i in range(4)]
            assert any("lowered" in p for p in s.recovery.problems)
    finally:
        s.close_sync()


# ------------------------------------------- queue offsets (#7689, #7690)
@pytest.mark.parametrize("emulate", [(), (RMQ_7689,)], ids=["fixed", "rmq-7689"])
def test_new_records_never_share_a_queue_offset_with_records_past_the_confirm_offset(
    tmp_path: Path, emulate: tuple[str, ...]
) -> None:
    """A master crashes holding records its SyncStateSet had not all
    acknowledged; restarted, it takes puts before they are confirmed.
    Fixed: the new records' QUEUEOFFSETs follow the unconfirmed ones', and
    once everything is confirmed every record has its unit. rmq-7689: they
    reuse the unconfirmed records' offsets, and dispatch, which reaches the
    old records first, leaves the new ones without a unit: stored, never
    delivered."""
    cfg = _config(*emulate)
    s = MessageStore.open(str(tmp_path), cfg)
    s.log.append(msgs(6, queues=1, prefix="old"))
    s.log.flush()
    ends = _ends(s)
    s.set_confirm_offset(ends[1])  # the slaves acked two records
    s.log.sync_checkpoint()
    s.reput()
    _crash(s)
    s = MessageStore.open(str(tmp_path), cfg)
    try:
        assert s.confirmed_offset() == ends[1]
        s.recover_topic_queue_table()  # becoming master again (Node.become_master)
        s.log.append(msgs(3, queues=1, prefix="new"))
        qos = [r.queue_offset for r in s.log.iter_records()]
        s.confirm_written()  # now all confirmed (the set shrank to the master)
        keys = _keys(s)
        olds = [f"old{i}" for i in range(6)]
        if emulate:
            assert qos == [0, 1, 2, 3, 4, 5, 2, 3, 4]
            assert keys == olds and s.queues.skipped == 3
        else:
            assert qos == list(range(9))
            assert keys == [*olds, "new0", "new1", "new2"] and s.queues.skipped == 0
    finally:
        s.close_sync()


def test_a_truncation_lowers_the_confirm_offset_to_the_cut(tmp_path: Path) -> None:
    s = MessageStore.open(str(tmp_path), CONTROLLER)
    try:
        s.log.append(msgs(6, queues=1))
        s.log.flush()
        ends = _ends(s)
        s.set_confirm_offset(ends[4])
        s.truncate_to(ends[2])
        assert s.confirmed_offset() == ends[2]
        cp, _ = read_checkpoint(str(tmp_path / "checkpoint"))
        assert cp is not None and cp.confirm_offset == ends[2]
    finally:
        s.close_sync()


@pytest.mark.parametrize("emulate", [(), (RMQ_6703,)], ids=["fixed", "rmq-6703"])
def test_a_stale_checkpoint_after_two_crashes_can_name_an_offset_inside_a_record(
    tmp_path: Path, emulate: tuple[str, ...]
) -> None:
    """The one path to an offset inside a record on this model, whose HA
    ships whole records: the checkpoint's confirm offset (C) is past what the
    first crash left (the slaves had acked unflushed bytes); the second life
    cuts it in memory, writes other records from the recovered end and
    crashes before its first checkpoint sync; the third reads C again, now
    inside one of the second life's records. Fixed: lowered to that
    record's start. rmq-6703: kept, and that record is dispatched."""
    cfg = _config(*emulate)
    s = MessageStore.open(str(tmp_path), cfg)
    s.log.append(msgs(3, queues=1, prefix="a"))
    s.log.flush()
    e1 = s.log.flushed
    s.log.append(msgs(2, queues=1, prefix="lost"))
    c = s.log.wrote  # the slave acked the two unflushed records
    s.set_confirm_offset(c)
    s.log.sync_checkpoint()
    _crash(s)
    s = MessageStore.open(str(tmp_path), cfg)  # second life
    assert s.log.wrote == e1 and s.confirmed_offset() == e1
    big = [Message(m.topic, m.body * 40, m.properties, queue_id=m.queue_id)
           for m in msgs(3, queues=1, prefix="b")]
    s.log.append(big)
    s.log.flush()
    ends = _ends(s)
    straddler = next(i for i, end in enumerate(ends) if end > c)
    assert ends[straddler - 1] < c < ends[straddler]  # C falls inside a new record
    _crash(s)  # before the second life's first checkpoint sync
    cp, _ = read_checkpoint(str(tmp_path / "checkpoint"))
    assert cp is not None and cp.confirm_offset == c
    s = MessageStore.open(str(tmp_path), cfg)  # third life
    try:
        if emulate:
            assert s.confirmed_offset() == c
            assert len(_keys(s)) == straddler + 1
        else:
            assert s.confirmed_offset() == ends[straddler - 1]
            assert len(_keys(s)) == straddler
    finally:
        s.close_sync()
