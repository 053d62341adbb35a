"""The consume side's recovery and error paths: the checkpoint's logics
timestamp and where re-dispatch starts, units the CommitLog contradicts,
dispatch errors at runtime, unreadable records behind units, reads during a
stalled SYNC_FLUSH, the offset table killed between its temp file and the
rename (a real SIGKILLed child), and `dlab store inspect`'s queue table.
Real files and fsync throughout (tests/store/test_consumequeue.py has the basics)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import struct
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from support.consumequeue_helpers import SMALL, check_index, msgs, put_all, queue_file
from support.crash_writer import config_for
from support.store_helpers import run_child

from store import GetMessageStatus
from store.config import TESTING, CrashModel, FlushMode
from store.consume.consumequeue import UNIT, UNIT_SIZE
from store.consume.consumer_offsets import FILE_NAME, ConsumerOffsetTable
from store.failpoints import Failpoints
from store.log.checkpoint import read_checkpoint
from store.log.record import V4_FIXED_SIZE, Message
from store.sim.manual_clock import ManualClock
from store.store import MessageStore
from store.tools.inspect import inspect_store

SEG = TESTING.segment_size_bytes
ROOT = Path(__file__).resolve().parents[2]


def _crash(s: MessageStore) -> None:
    """What a SIGKILL leaves of an open store in this process: files closed
    without a flush, a close or a persist; `abort` stays."""
    s.log.close()
    s.queues.close()
    s._executor.shutdown()
    s._lock.release()


def _logics(path: Path) -> int:
    cp, problem = read_checkpoint(str(path / "checkpoint"))
    assert cp is not None, problem
    return cp.logics_ms


# ------------------------------------------------ checkpoint and reput start
def test_logics_timestamp_is_written_by_the_queue_flush_not_the_log_flush(
    tmp_path: Path
) -> None:
    clock = ManualClock(wall_ms=1_700_000_000_000)
    s = MessageStore.open(str(tmp_path), TESTING, clock=clock)
    try:
        s.log.append(msgs(3, queues=1))
        s.reput()
        s._flush_queues()
        first = s.log.read_record(0).store_timestamp_ms
        assert _logics(tmp_path) == first == 1_700_000_000_000
        clock.advance(60)
        s.log.append(msgs(3, queues=1, prefix="later"))
        s.log.flush()  # the log's flush moves physic only
        cp, _ = read_checkpoint(str(tmp_path / "checkpoint"))
        assert cp is not None and cp.physic_ms == first + 60_000
        assert cp.logics_ms == first
    finally:
        _crash(s)


def test_after_a_crash_redispatch_starts_at_the_checkpoint_segment(tmp_path: Path) -> None:
    """Units flushed early, the log flushed much later over several segments,
    then a crash (power: the later units were only in memory). min(physic,
    logics) picks the segment to re-dispatch from: every record gets its
    unit without falling back to a walk from the first record."""
    clock = ManualClock(wall_ms=1_700_000_000_000)
    s = MessageStore.open(str(tmp_path), TESTING, clock=clock)
    try:
        for lo in range(0, 40, 10):
            s.log.append([Message("T", bytes(2000), {"UNIQ_KEY": f"a{i}"}, queue_id=0)
                          for i in range(lo, lo + 10)])
            clock.advance(10)
        s.reput()
        s._flush_queues()  # units of a0..a39 are durable; logics names a39
        for lo in range(0, 100, 10):
            s.log.append([Message("T", bytes(2000), {"UNIQ_KEY": f"b{i}"}, queue_id=0)
                          for i in range(lo, lo + 10)])
            clock.advance(10)
        s.log.flush()
        s.reput()  # b's units exist in memory only (power)
        assert s.log.wrote > 3 * SEG
    finally:
        _crash(s)
    s = MessageStore.open(str(tmp_path), TESTING)
    try:
        assert s.recovery.abnormal
        assert check_index(s) == 140
        q = s.queues.get("T", 0)
        assert q is not None
        a39_end = q.offsets[39] + q.sizes[39]
        assert s.reput_from <= a39_end  # no record lacking a unit was skipped
        assert s.reput_from > 0 or a39_end < SEG
        assert not any("too late" in p for p in s.recovery.problems), s.recovery.problems
    finally:
        s.close_sync()


def test_a_quiet_queue_does_not_make_a_clean_open_walk_the_whole_log(tmp_path: Path) -> None:
    batch = [Message("quiet", b"once", queue_id=0)] + msgs(300)
    put_all(tmp_path, TESTING, [Message(m.topic, bytes(500), m.properties, queue_id=m.queue_id)
                                for m in batch])
    s = MessageStore.open(str(tmp_path), TESTING)
    try:
        assert s.log.wrote > 2 * SEG
        assert not s.recovery.abnormal
        assert s.reput_from == s.log.wrote  # nothing to re-dispatch after a clean close
        assert check_index(s) == 301
    finally:
        s.close_sync()


def test_queue_offsets_continue_after_an_abnormal_reopen(tmp_path: Path) -> None:
    s = MessageStore.open(str(tmp_path), SMALL)
    s.log.append(msgs(10))
    s.log.flush()  # records durable, units never flushed
    _crash(s)
    s = MessageStore.open(str(tmp_path), SMALL)
    try:
        assert s.recovery.abnormal
        s.log.append(msgs(4, prefix="n"))
        assert [r.queue_offset for r in list(s.log.iter_records())[-4:]] == [5, 5, 6, 6]
        assert check_index(s) == 14
    finally:
        s.close_sync()


def test_a_slave_truncation_cuts_units_and_resets_logics(tmp_path: Path) -> None:
    put_all(tmp_path, SMALL, msgs(20, queues=1))
    s = MessageStore.open(str(tmp_path), SMALL)
    try:
        assert _logics(tmp_path) > 0
        cut = list(s.log.iter_records())[12].offset
        s.truncate_to(cut)
        assert s.queues.get("T", 0).count == 12  # type: ignore[union-attr]
        assert _logics(tmp_path) == 0  # may have named a record just cut
        s.log.append(msgs(1, queues=1, prefix="new"))
        assert list(s.log.iter_records())[-1].queue_offset == 12
    finally:
        s.close_sync()
    size = sum(p.stat().st_size for p in (tmp_path / "consumequeue" / "T" / "0").iterdir())
    assert size == 13 * UNIT_SIZE


# --------------------------------------------------- units that do not fit
def test_a_unit_the_commitlog_contradicts_is_cut_and_rebuilt_at_open(tmp_path: Path) -> None:
    """The last unit is plausible (a valid offset and size) but names the
    record before it: re-dispatch after a crash finds the CommitLog's
    record 5 claims that QUEUEOFFSET, cuts the unit and rebuilds it — the
    log is the truth, and the open does not fail (it used to)."""
    put_all(tmp_path, TESTING, msgs(6, queues=1))
    f = queue_file(tmp_path)
    raw = f.read_bytes()
    f.write_bytes(raw[:5 * UNIT_SIZE] + raw[4 * UNIT_SIZE:5 * UNIT_SIZE])
    (tmp_path / "abort").write_text("crashed")
    s = MessageStore.open(str(tmp_path), TESTING)
    try:
        assert check_index(s) == 6
        assert any("cut to 5 units" in p for p in s.recovery.problems), s.recovery.problems
    finally:
        s.close_sync()


def test_unreadable_or_wrong_records_behind_units_are_offset_found_null(
    tmp_path: Path
) -> None:
    put_all(tmp_path, TESTING, msgs(6, queues=1))
    f = queue_file(tmp_path)
    raw = bytearray(f.read_bytes())
    u2, u3 = raw[2 * UNIT_SIZE:3 * UNIT_SIZE], raw[3 * UNIT_SIZE:4 * UNIT_SIZE]
    raw[2 * UNIT_SIZE:4 * UNIT_SIZE] = u3 + u2  # a clean open keeps them (RocketMQ too)
    f.write_bytes(bytes(raw))
    s = MessageStore.open(str(tmp_path), TESTING)
    try:
        got = s.get_messages("T", 0, 0, 10)
        assert got.status is GetMessageStatus.FOUND
        assert [m.queue_offset for m in got.messages] == [0, 1]  # stops before the bad unit
        assert got.next_offset == 2
        got = s.get_messages("T", 0, 2, 10)
        assert got.status is GetMessageStatus.OFFSET_FOUND_NULL and got.next_offset == 3
    finally:
        s.close_sync()
    # A flipped body bit in the first segment, which normal recovery does not
    # scan (it checks the last three): the record fails its CRC on read.
    b = tmp_path / "b"
    put_all(b, TESTING, [Message("T", bytes(500), {"UNIQ_KEY": f"m{i}"}) for i in range(600)])
    s = MessageStore.open(str(b), TESTING)
    rec = list(s.log.iter_records())[1]
    assert s.log.wrote > 4 * SEG
    s.close_sync()
    seg = b / "commitlog" / f"{0:020d}"
    data = bytearray(seg.read_bytes())
    data[rec.offset + V4_FIXED_SIZE + 10] ^= 0x01  # a body byte
    seg.write_bytes(bytes(data))
    s = MessageStore.open(str(b), TESTING)
    try:
        got = s.get_messages("T", 0, 0, 10)
        assert [m.queue_offset for m in got.messages] == [0]
        got = s.get_messages("T", 0, 1, 10)
        assert got.status is GetMessageStatus.OFFSET_FOUND_NULL and got.next_offset == 2
        assert s.get_messages("T", 0, 2, 1).messages[0].record.msg_id == "m2"
    finally:
        s.close_sync()


def test_a_dispatch_error_at_runtime_is_logged_and_shown_not_raised(tmp_path: Path) -> None:
    s = MessageStore.open(str(tmp_path), TESTING)
    try:
        s.log.append(msgs(3, queues=1))
        s.reput()
        q = s.queues.get("T", 0)
        assert q is not None
        q.offsets[2] += 1  # the index now disagrees with the record at QUEUEOFFSET 2
        s._reput_at = 0
        s.log.append(msgs(1, queues=1, prefix="x"))
        got = s.get_messages("T", 0, 0, 10)  # must not raise
        assert got.max_offset == 4  # the new record was still dispatched
        state = s.state()
        assert state["consume_queue_records_skipped"] == 1
        assert "QUEUEOFFSET" in state["consume_queue_dispatch_error"]
        q.offsets[2] -= 1
    finally:
        s.close_sync()


def test_the_background_service_survives_a_failed_offset_persist(tmp_path: Path) -> None:
    cfg = TESTING.with_(consume_queue_flush_interval_ms=10,
                        consumer_offset_persist_interval_ms=10)
    tmp = tmp_path / "config" / (FILE_NAME + ".tmp")

    async def run() -> None:
        s = MessageStore.open(str(tmp_path), cfg)
        await s.start()
        try:
            tmp.mkdir(parents=True)  # open(tmp, "w") now fails, even for root
            s.consumer_offsets.commit("g", "T", 0, 7)
            # Persists every 10 ms; the 20 s bounds are for a loaded machine.
            for _ in range(2000):
                await asyncio.sleep(0.01)
                if s.state()["consumer_offsets_error"]:
                    break
            assert s.state()["consumer_offsets_error"]
            assert s.consumer_offsets.dirty  # not persisted: still to do
            tmp.rmdir()
            for _ in range(2000):
                await asyncio.sleep(0.01)
                if not s.consumer_offsets.dirty:
                    break
            assert not s.consumer_offsets.dirty and s.state()["consumer_offsets_error"] is None
        finally:
            await s.close()

    asyncio.run(run())
    doc = json.loads((tmp_path / "config" / FILE_NAME).read_text())
    assert doc == {"offsetTable": {"T@g": {"0": 7}}}


# ------------------------------------------------------ reads, SYNC_FLUSH
def test_a_stalled_sync_flush_hides_the_message_until_it_is_durable(tmp_path: Path) -> None:
    """The group commit's fsync is held for 4 s (failpoint): during it the
    record is appended (and, power, already written) but not flushed, and a
    consumer must not get it. (4 s, and a flush timeout far above it: the
    checks 0.5 s in must fall inside the stall on a loaded machine too.)"""
    cfg = TESTING.with_(flush_mode=FlushMode.SYNC_FLUSH, sync_flush_timeout_ms=30_000)

    async def run() -> None:
        s = MessageStore.open(str(tmp_path), cfg,
                              failpoints=Failpoints("before_flush_sync=delay:4000@1"))
        await s.start()
        try:
            put = asyncio.create_task(s.put(Message("T", b"x", {"UNIQ_KEY": "x"})))
            await asyncio.sleep(0.5)
            assert not put.done() and s.log.flushed < s.log.wrote
            got = s.get_messages("T", 0, 0)
            assert got.status is GetMessageStatus.NO_MESSAGE_IN_QUEUE and got.max_offset == 0
            assert s.queue_offsets("T", 0) == (0, 0)
            assert (await put).status.value == "PUT_OK"
            got = s.get_messages("T", 0, 0)
            assert got.status is GetMessageStatus.FOUND and got.max_offset == 1
        finally:
            await s.close()

    asyncio.run(run())


# ------------------------------------------------------ consumer offsets
_CHILD = """
import sys
from store.config import TESTING
from store.failpoints import Failpoints
from store.store import MessageStore
s = MessageStore.open(sys.argv[1], TESTING,
                      failpoints=Failpoints("consumer_offsets_before_rename=crash@2"))
s.consumer_offsets.commit("g", "T", 0, 5)
s.consumer_offsets.persist()
s.consumer_offsets.commit("g", "T", 0, 9)
s.consumer_offsets.persist()
print("not killed")
"""


def test_a_kill_between_the_temp_file_and_the_rename_keeps_the_old_table(
    tmp_path: Path
) -> None:
    child = subprocess.run([sys.executable, "-c", _CHILD, str(tmp_path)], capture_output=True,
                           text=True, timeout=60, cwd=ROOT, check=False)
    assert child.returncode == -signal.SIGKILL, child.stdout + child.stderr
    cfg_dir = tmp_path / "config"
    assert json.loads((cfg_dir / (FILE_NAME + ".tmp")).read_text()) == \
        {"offsetTable": {"T@g": {"0": 9}}}  # written and synced, never renamed
    s = MessageStore.open(str(tmp_path), TESTING)
    try:
        assert s.consumer_offsets.query("g", "T", 0) == 5
        assert s.recovery.abnormal
    finally:
        s.close_sync()


def test_concurrent_persists_never_leave_a_torn_file(tmp_path: Path) -> None:
    t = ConsumerOffsetTable(str(tmp_path))
    errors: list[BaseException] = []

    def worker(n: int) -> None:
        try:
            for i in range(60):
                t.commit(f"g{n}", "T" * 200, i % 8, i)
                t.persist()
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors
    t.persist()
    loaded = ConsumerOffsetTable.load(str(tmp_path))
    assert loaded.snapshot() == t.snapshot() and loaded.note is None
    assert not os.path.exists(t.path + ".tmp")


def test_replace_all_then_persist_round_trips(tmp_path: Path) -> None:
    t = ConsumerOffsetTable(str(tmp_path))
    t.replace_all({"T@g": {0: 3, 1: 4}, "U@h": {2: 0}})
    assert t.dirty
    t.persist()
    assert not t.dirty
    assert ConsumerOffsetTable.load(str(tmp_path)).snapshot() == {"T@g": {0: 3, 1: 4},
                                                                  "U@h": {2: 0}}
    assert ConsumerOffsetTable.load(str(tmp_path)).query("h", "U", 2) == 0


# --------------------------------------------------------------- inspect
def test_inspect_shows_each_queue_and_its_first_bad_unit(tmp_path: Path) -> None:
    from store.tools.cli import format_report

    put_all(tmp_path, SMALL, msgs(20, queues=2))
    f = tmp_path / "consumequeue" / "T" / "1" / f"{(8 * UNIT_SIZE):020d}"
    f.write_bytes(f.read_bytes() + UNIT.pack(10**9, 100, 0))  # unit 10 of queue 1
    r = inspect_store(str(tmp_path))
    by = {(q.topic, q.queue_id): q for q in r.consume_queues}
    assert set(by) == {("T", 0), ("T", 1)}
    assert (by["T", 0].files, by["T", 0].units, by["T", 0].max_offset) == (2, 10, 10)
    assert by["T", 0].first_bad_unit is None
    assert by["T", 1].units == 10 and by["T", 1].first_bad_unit == 10
    assert "past the end" in (by["T", 1].reason or "")
    assert any("consumequeue/T/1: unit 10" in p for p in r.problems)
    text = format_report(r)
    assert "consume queues:" in text and "T/1" in text
    assert json.loads(json.dumps(r.to_json()))["consume_queues"][1]["first_bad_unit"] == 10


def test_units_round_trip_across_files_of_one_unit(tmp_path: Path) -> None:
    cfg = TESTING.with_(consume_queue_file_units=1)
    put_all(tmp_path, cfg, msgs(5, queues=1))
    qdir = tmp_path / "consumequeue" / "T" / "0"
    assert sorted(p.name for p in qdir.iterdir()) == [f"{i * UNIT_SIZE:020d}" for i in range(5)]
    s = MessageStore.open(str(tmp_path), cfg)
    try:
        assert check_index(s) == 5
        got = s.get_messages("T", 0, 3, 10)
        assert [m.record.msg_id for m in got.messages] == ["m3", "m4"]
        assert struct.unpack(">qiq", (qdir / f"{3 * UNIT_SIZE:020d}").read_bytes()) == \
            (got.messages[0].commitlog_offset, got.messages[0].record.size, 0)
    finally:
        s.close_sync()


# ------------------------------------------- failpoint crashes, real children
@pytest.mark.parametrize(("flush", "model", "failpoint"), [
    (FlushMode.SYNC_FLUSH, CrashModel.POWER, "after_append_before_flush=crash@1500"),
    (FlushMode.SYNC_FLUSH, CrashModel.PROCESS, "before_flush_sync=crash@1500"),
    (FlushMode.ASYNC_FLUSH, CrashModel.POWER, "before_flush_sync=crash@150"),
    (FlushMode.ASYNC_FLUSH, CrashModel.PROCESS, "after_append_before_flush=crash@8000"),
], ids=lambda v: getattr(v, "value", str(v).split("=")[0]))
def test_a_failpoint_kill_leaves_one_unit_per_recovered_record(
    tmp_path: Path, flush: FlushMode, model: CrashModel, failpoint: str
) -> None:
    """Killed at a named point (in the put path, or inside a flush between
    its write and its fsync), the counts chosen so that the queues were
    usually flushed (1 s) before the kill (on a loaded machine not always:
    then every unit is rebuilt, also a valid case): recovery keeps only
    units whose records survived and re-creates the rest, each once, and
    QUEUEOFFSET continues."""
    child = run_child(["write", "--dir", str(tmp_path), "--flush", flush.value,
                       "--crash-model", model.value, "--producers", "8",
                       "--per-producer", "20000", "--flush-interval-ms", "20",
                       "--failpoints", failpoint])
    assert child.returncode == -signal.SIGKILL, child.stderr[-2000:]
    assert "fired (crash)" in child.stderr
    cfg = config_for(flush, model)
    s = MessageStore.open(str(tmp_path), cfg)
    try:
        assert s.recovery.abnormal
        n = check_index(s)
        assert n == sum(q.count for q in s.queues.queues.values()) > 0
        assert all(q.last_end() is None or q.last_end() <= s.log.wrote  # type: ignore[operator]
                   for q in s.queues.queues.values())
        nxt = s.queues.next_queue_offsets()[("crash", 1)]
        s.log.append([Message("crash", b"after", queue_id=1)])
        assert list(s.log.iter_records())[-1].queue_offset == nxt
    finally:
        s.close_sync()
