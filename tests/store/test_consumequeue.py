"""ConsumeQueues and the consumer offset table: real files, real fsync, real
SIGKILLed children (tests/support/store_child.py), recovery checked against the
CommitLog it indexes."""

from __future__ import annotations

import json
import os
import signal
import struct
from pathlib import Path

import pytest
from support.consumequeue_helpers import SMALL, check_index, msgs, put_all, queue_file
from support.crash_writer import config_for, run_writer
from support.store_helpers import run_child

from store.config import TESTING, CrashModel, FlushMode
from store.consume.consumequeue import UNIT, UNIT_SIZE, tags_hash
from store.consume.consumer_offsets import FILE_NAME
from store.log.record import Message
from store.status import GetMessageStatus
from store.store import MessageStore, StoreOpenError


def test_units_are_rocketmq_layout_across_file_boundaries(tmp_path: Path) -> None:
    put_all(tmp_path, SMALL, msgs(40, tags="TagA"))
    qdir = tmp_path / "consumequeue" / "T" / "0"
    names = sorted(p.name for p in qdir.iterdir())
    # 20 units of queue 0 in files of 8 units: three files named by byte offset.
    assert names == [f"{0:020d}", f"{160:020d}", f"{320:020d}"]
    raw = b"".join((qdir / n).read_bytes() for n in names)
    assert len(raw) == 20 * UNIT_SIZE
    s = MessageStore.open(str(tmp_path), SMALL)
    try:
        records = [r for r in s.log.iter_records() if r.queue_id == 0]
        units = list(UNIT.iter_unpack(raw))
        assert units == [(r.offset, r.size, tags_hash("TagA")) for r in records]
        # Java's String.hashCode, checked with jshell.
        assert tags_hash("TagA") == 2_598_919
        assert tags_hash("héllo-標籤") == 394_521_034
        check_index(s)
    finally:
        s.close_sync()


def test_queue_offsets_continue_after_a_reopen(tmp_path: Path) -> None:
    put_all(tmp_path, SMALL, msgs(10))
    put_all(tmp_path, SMALL, msgs(10, prefix="again"))
    s = MessageStore.open(str(tmp_path), SMALL)
    try:
        assert check_index(s) == 20
        got = s.get_messages("T", 1, 0, 100)
        assert [m.record.msg_id for m in got.messages] == \
            [f"m{i}" for i in range(1, 10, 2)] + [f"again{i}" for i in range(1, 10, 2)]
        assert [m.queue_offset for m in got.messages] == list(range(10))
    finally:
        s.close_sync()


@pytest.mark.parametrize(("flush", "model", "seed"), [
    (FlushMode.SYNC_FLUSH, CrashModel.POWER, 21),
    (FlushMode.ASYNC_FLUSH, CrashModel.POWER, 22),
    (FlushMode.SYNC_FLUSH, CrashModel.PROCESS, 23),
    (FlushMode.ASYNC_FLUSH, CrashModel.PROCESS, 24),
], ids=lambda v: getattr(v, "value", str(v)))
def test_sigkill_then_recovery_gives_one_unit_per_recovered_record(
    tmp_path: Path, flush: FlushMode, model: CrashModel, seed: int
) -> None:
    run = run_writer(tmp_path, seed=seed, flush=flush, model=model, stop_after_acks=1500)
    assert run.returncode == -signal.SIGKILL, run.stderr[-2000:]
    s = MessageStore.open(str(tmp_path), config_for(flush, model))
    try:
        n = check_index(s)
        assert n >= (len(run.acks) if flush is FlushMode.SYNC_FLUSH else 1)
        # Consumers see every recovered record of a queue, in order, once.
        got = s.get_messages("crash", 0, 0, 100_000)
        ids = [m.record.msg_id for m in got.messages]
        assert len(ids) == len(set(ids)) == s.queues.get("crash", 0).count  # type: ignore[union-attr]
        qo_next = {k: q.count for k, q in s.queues.queues.items()}
    finally:
        s.close_sync()
    put_all(tmp_path, config_for(flush, model), [Message("crash", b"after", queue_id=0)])
    s = MessageStore.open(str(tmp_path), config_for(flush, model))
    try:
        last = list(s.log.iter_records())[-1]
        assert last.queue_offset == qo_next[("crash", 0)]
    finally:
        s.close_sync()


@pytest.mark.parametrize("damage", ["garbage", "past-end", "zeros-then-unit"])
def test_dirty_units_are_cut_and_rebuilt_from_the_commitlog(tmp_path: Path, damage: str) -> None:
    """A planted bad unit after the good ones: recovery must drop it (and
    whatever follows) and the index must equal the CommitLog again."""
    cfg = TESTING
    put_all(tmp_path, cfg, msgs(6, queues=1))
    f = queue_file(tmp_path)
    good = f.read_bytes()
    assert len(good) == 6 * UNIT_SIZE
    if damage == "garbage":
        bad = struct.pack(">qiq", -5, 7, 0)
    elif damage == "past-end":
        bad = UNIT.pack(10**9, 100, 0)
    else:
        bad = bytes(UNIT_SIZE) + UNIT.pack(0, 100, 0)
    f.write_bytes(good + bad)
    (tmp_path / "abort").write_text("crashed")
    s = MessageStore.open(str(tmp_path), cfg)
    try:
        assert check_index(s) == 6
        assert s.queues.get("T", 0).count == 6  # type: ignore[union-attr]
        assert any("dropped" in p for p in s.recovery.problems), s.recovery.problems
    finally:
        s.close_sync()
    assert f.read_bytes() == good


def test_units_for_lost_records_go_and_new_ones_take_their_queue_offsets(
    tmp_path: Path
) -> None:
    """The queue files survive but the CommitLog tail does not (a power cut
    after the queues' flush): units pointing past the recovered end go."""
    put_all(tmp_path, TESTING, msgs(10, queues=1))
    s = MessageStore.open(str(tmp_path), TESTING)
    cut = list(s.log.iter_records())[6].offset
    s.truncate_to(cut)
    s.close_sync()
    f = queue_file(tmp_path)
    assert len(f.read_bytes()) == 6 * UNIT_SIZE
    put_all(tmp_path, TESTING, [Message("T", b"new", {"UNIQ_KEY": "new"})])
    s = MessageStore.open(str(tmp_path), TESTING)
    try:
        assert check_index(s) == 7
        assert s.get_messages("T", 0, 6).messages[0].record.msg_id == "new"
    finally:
        s.close_sync()


def test_a_crash_inside_the_queue_cut_never_brings_units_back(tmp_path: Path) -> None:
    """Recovery is killed (SIGKILL, a real child) between zeroing the first
    dropped unit and shortening the file; the next recovery finishes the cut
    and the dropped units stay dropped."""
    put_all(tmp_path, TESTING, msgs(5, queues=1))
    f = queue_file(tmp_path)
    good = f.read_bytes()
    f.write_bytes(good + UNIT.pack(10**9, 50, 0) + UNIT.pack(10**9 + 50, 50, 0))
    (tmp_path / "abort").write_text("crashed")
    child = run_child(["open", "--dir", str(tmp_path), "--failpoints",
                       "consume_queue_truncate=crash@1"])
    assert child.returncode == -signal.SIGKILL, child.stderr[-2000:]
    mid = f.read_bytes()
    assert mid[len(good):len(good) + UNIT_SIZE] == bytes(UNIT_SIZE)  # the stop mark
    s = MessageStore.open(str(tmp_path), TESTING)
    try:
        assert check_index(s) == 5
    finally:
        s.close_sync()
    assert f.read_bytes() == good


def test_consumers_never_see_past_the_flushed_position_under_sync_flush(tmp_path: Path) -> None:
    cfg = TESTING.with_(flush_mode=FlushMode.SYNC_FLUSH)
    s = MessageStore.open(str(tmp_path), cfg)
    try:
        s.log.append(msgs(3, queues=1))  # appended, not flushed
        assert s.confirmed_offset() == s.log.flushed < s.log.wrote
        got = s.get_messages("T", 0, 0)
        assert got.status is GetMessageStatus.NO_MESSAGE_IN_QUEUE and not got.messages
        s.log.flush()
        got = s.get_messages("T", 0, 0)
        assert got.status is GetMessageStatus.FOUND and len(got.messages) == 3
        assert got.next_offset == got.max_offset == 3
        assert s.get_messages("T", 0, 3).status is GetMessageStatus.OFFSET_OVERFLOW_ONE
        assert s.get_messages("T", 0, 9).status is GetMessageStatus.OFFSET_OVERFLOW_BADLY
        assert s.get_messages("T", 7, 0).status is GetMessageStatus.NO_MATCHED_LOGIC_QUEUE
    finally:
        s.close_sync()
    s = MessageStore.open(str(tmp_path), cfg.with_(flush_mode=FlushMode.ASYNC_FLUSH))
    try:
        s.log.append(msgs(2, queues=1, prefix="x"))  # ASYNC_FLUSH reads up to `wrote`
        assert s.get_messages("T", 0, 3).status is GetMessageStatus.FOUND
    finally:
        s.close_sync()


def test_a_slave_fed_raw_bytes_builds_the_same_queue_files(tmp_path: Path) -> None:
    master, slave = tmp_path / "m", tmp_path / "s"
    put_all(master, SMALL, msgs(30, queues=3, tags="x"))
    m = MessageStore.open(str(master), SMALL)
    s = MessageStore.open(str(slave), SMALL)
    try:
        pos = 0
        while pos < m.log.wrote:
            data, nxt = m.log.read_range(pos, 700)
            s.log.append_raw(pos, data)
            pos = nxt
        s.log.flush()
    finally:
        m.close_sync()
        s.close_sync()
    for qid in range(3):
        assert queue_file(slave, qid=qid).read_bytes() == queue_file(master, qid=qid).read_bytes()


# ------------------------------------------------------- consumer offsets
def test_offsets_persist_at_clean_close_and_not_on_a_crash(tmp_path: Path) -> None:
    s = MessageStore.open(str(tmp_path), TESTING)
    s.consumer_offsets.commit("g", "T", 0, 5)
    s.close_sync()
    s = MessageStore.open(str(tmp_path), TESTING)
    try:
        assert s.consumer_offsets.query("g", "T", 0) == 5
        s.consumer_offsets.commit("g", "T", 0, 9)  # committed, never persisted
    finally:
        s.log.close()  # a crash: no close, no persist
        s._lock.release()
    s = MessageStore.open(str(tmp_path), TESTING)
    try:
        assert s.consumer_offsets.query("g", "T", 0) == 5
    finally:
        s.close_sync()
    doc = json.loads((tmp_path / "config" / FILE_NAME).read_text())
    assert doc == {"offsetTable": {"T@g": {"0": 5}}}


def test_a_crash_before_the_rename_keeps_the_old_table(tmp_path: Path) -> None:
    s = MessageStore.open(str(tmp_path), TESTING)
    s.consumer_offsets.commit("g", "T", 1, 3)
    s.close_sync()
    # What a crash between writing the temp file and renaming it leaves.
    (tmp_path / "config" / (FILE_NAME + ".tmp")).write_text('{"offsetTable": {"T@g": {"1": 99}}')
    s = MessageStore.open(str(tmp_path), TESTING)
    try:
        assert s.consumer_offsets.query("g", "T", 1) == 3
    finally:
        s.close_sync()


def test_a_corrupt_table_falls_back_to_the_backup_and_says_so(tmp_path: Path) -> None:
    s = MessageStore.open(str(tmp_path), TESTING)
    s.consumer_offsets.commit("g", "T", 0, 1)
    s.consumer_offsets.persist()
    s.consumer_offsets.commit("g", "T", 0, 2)
    s.close_sync()  # the .bak holds 1, the file 2
    path = tmp_path / "config" / FILE_NAME
    path.write_text("{not json")
    s = MessageStore.open(str(tmp_path), TESTING)
    try:
        assert s.consumer_offsets.query("g", "T", 0) == 1
        assert any(FILE_NAME in p and ".bak" in p for p in s.recovery.problems)
    finally:
        s.close_sync()
    path.write_text("[]")
    Path(str(path) + ".bak").write_text("also broken")
    with pytest.raises(StoreOpenError, match=FILE_NAME):
        MessageStore.open(str(tmp_path), TESTING)
    assert os.path.exists(path)  # nothing removed on the way out
