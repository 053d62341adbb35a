"""Protocol-aware recovery (docs/design.md, Recovery): a flipped bit in the middle of
flushed data is corruption, not a torn tail, and the store's
corruption_policy decides: refuse (the default: nothing changes on disk),
truncate (RocketMQ's cut, logged at ERROR with its cost) or repair (the range
fetched from a replica's files, CRC-verified). A torn tail after a crash is
still cut silently. Real stores, real files, faults planted on disk; crashes
are real SIGKILLs of a child process at a failpoint."""

from __future__ import annotations

import logging
import shutil
import signal
from pathlib import Path

import pytest
from support.store_helpers import (
    REPAIR,
    SEG,
    TRUNCATE,
    fill,
    flip_bit,
    ids,
    mark_abnormal,
    message,
    names,
    patch,
    read_at,
    reopen,
    replica_files_source,
    run_child,
    snapshot,
    without_lock_pid,
)

from store.config import TESTING
from store.log.checkpoint import Checkpoint, read_checkpoint
from store.log.record import Message, encode
from store.log.recovery import DamageKind, plan_recovery
from store.log.segments import segment_name
from store.sim.manual_clock import ManualClock
from store.status import PutStatus
from store.store import CorruptionRefusedError, MessageStore


def flipped_store(tmp_path: Path, shutdown: str, n: int = 600, victim_at: int = SEG + 9000
                  ) -> tuple[Path, Path, list, int]:
    """A store of n records over several segments, a replica copy of its
    files, then one bit flipped in the body of a record in the middle."""
    store = tmp_path / "store"
    results = fill(store, n)
    replica = tmp_path / "replica"
    shutil.copytree(store, replica)
    victim = next(i for i, r in enumerate(results) if r.offset >= victim_at)
    if shutdown == "crash":
        mark_abnormal(store)
    flip_bit(store, results[victim].offset + 88 + 40, bit=5)
    return store, replica, results, victim


@pytest.mark.parametrize("shutdown", ["clean", "crash"])
def test_refuse_leaves_the_directory_unchanged_and_names_the_damage(
        tmp_path: Path, shutdown: str) -> None:
    store, _replica, results, victim = flipped_store(tmp_path, shutdown)
    bad = results[victim].offset
    before = snapshot(store)
    with pytest.raises(CorruptionRefusedError) as err:
        MessageStore.open(str(store), TESTING)  # refuse is the default
    after = snapshot(store)
    assert without_lock_pid(after) == without_lock_pid(before)
    assert set(after) == set(before)  # no abort created, no segment removed
    lost_records = len(results) - victim - 1
    lost_bytes = results[-1].end - bad
    text = str(err.value)
    assert f"commitlog/{segment_name(SEG)} at offset {bad}" in text
    assert f"would lose {lost_bytes} bytes holding {lost_records} valid record(s)" in text
    assert "--corruption-policy repair" in text and "--corruption-policy truncate" in text
    d = err.value.damage
    assert (d.kind, d.segment, d.offset, d.records_past, d.bytes_past) == (
        DamageKind.FLUSHED, SEG, bad, lost_records, lost_bytes)
    assert d.resume_offset == results[victim + 1].offset
    # Refused again and again: nothing moved.
    with pytest.raises(CorruptionRefusedError):
        MessageStore.open(str(store), TESTING)
    assert without_lock_pid(snapshot(store)) == without_lock_pid(before)


def test_truncate_cuts_logs_at_error_and_reports_the_cost(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    store, _replica, results, victim = flipped_store(tmp_path, "crash")
    bad = results[victim].offset
    with caplog.at_level(logging.ERROR, logger="dlab.store"):
        records, report = reopen(store, TRUNCATE)
    assert ids(records) == names(0, victim)
    assert report.corruption_action == "truncated"
    assert report.records_lost == len(results) - victim - 1
    assert report.bytes_lost == results[-1].end - bad
    assert report.corruption is not None and f"at offset {bad}" in report.corruption
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert any(f"cutting at {bad}" in r.getMessage()
               and f"{report.records_lost} valid record(s)" in r.getMessage() for r in errors)
    # The checkpoint no longer names a record past the cut.
    cp, _ = read_checkpoint(str(store / "checkpoint"))
    assert cp is not None and cp.physic_ms <= records[-1].store_timestamp_ms


@pytest.mark.parametrize("shutdown", ["clean", "crash"])
def test_repair_restores_the_range_from_a_replica_and_keeps_every_record(
        tmp_path: Path, shutdown: str) -> None:
    store, replica, results, victim = flipped_store(tmp_path, shutdown)
    bad = results[victim].offset
    s = MessageStore.open(str(store), REPAIR, repair_source=replica_files_source(replica))
    try:
        records = list(s.log.iter_records())
        report = s.recovery
    finally:
        s.close_sync()
    assert ids(records) == names(0, len(results))
    assert report.corruption_action == "repaired"
    assert report.repaired_ranges == [(bad, results[victim + 1].offset)]
    assert read_at(store, bad, results[victim].size) == read_at(replica, bad,
                                                                 results[victim].size)
    records, report = reopen(store)  # and it opens under the default policy now
    assert ids(records) == names(0, len(results)) and report.corruption is None


def test_repair_without_a_replica_that_holds_the_range_refuses(tmp_path: Path) -> None:
    store, replica, results, victim = flipped_store(tmp_path, "clean")
    before = snapshot(store)
    with pytest.raises(CorruptionRefusedError, match="no replica is configured"):
        MessageStore.open(str(store), REPAIR)
    # A replica that never got that far (its log ends before the damage).
    short = tmp_path / "short"
    fill(short, 10)
    with pytest.raises(CorruptionRefusedError, match="Repair was not possible"):
        MessageStore.open(str(store), REPAIR, repair_source=replica_files_source(short))
    # A replica whose copy is damaged too: refused, nothing written.
    flip_bit(replica, results[victim].offset + 88 + 3)
    with pytest.raises(CorruptionRefusedError, match="repair failed"):
        MessageStore.open(str(store), REPAIR, repair_source=replica_files_source(replica))
    assert without_lock_pid(snapshot(store)) == without_lock_pid(before)


@pytest.mark.parametrize("where", ["body", "size"])
def test_a_crash_during_repair_never_leaves_a_half_repaired_record(
        tmp_path: Path, where: str) -> None:
    """SIGKILL between writing the repaired range and its first header: the
    next open either finds the record whole or refuses; a repair then
    finishes, and every record is there."""
    store, replica, results, victim = flipped_store(tmp_path, "clean")
    bad = results[victim].offset
    if where == "size":
        flip_bit(store, results[victim].offset + 88 + 40, bit=5)  # undo the body flip
        flip_bit(store, bad + 2, bit=1)  # TOTALSIZE
    child = run_child(["open", "--dir", str(store), "--corruption-policy", "repair",
                       "--repair-from-dir", str(replica),
                       "--failpoints", "recovery_repair=crash@1"])
    assert child.returncode == -signal.SIGKILL, child.stderr
    assert "failpoint recovery_repair fired" in child.stderr
    if where == "size":
        # The header is still the damaged one: refused, nothing lost.
        with pytest.raises(CorruptionRefusedError):
            MessageStore.open(str(store), TESTING)
    s = MessageStore.open(str(store), REPAIR, repair_source=replica_files_source(replica))
    try:
        records = list(s.log.iter_records())
    finally:
        s.close_sync()
    assert ids(records) == names(0, len(results))


def test_torn_tail_after_a_crash_is_still_cut_silently(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """No regression: partial bytes of a next record after the last flushed
    one are a tail (the checkpoint names the last good record), cut under
    the default policy without an error."""
    results = fill(tmp_path, 300)
    end = results[-1].end
    nxt = encode(message(300), offset=end, queue_offset=300, store_timestamp_ms=1)
    patch(tmp_path, end, nxt[:150])
    mark_abnormal(tmp_path)
    with caplog.at_level(logging.WARNING, logger="dlab.store"):
        records, report = reopen(tmp_path)
    assert ids(records) == names(0, 300)
    assert report.first_bad_offset == end and report.corruption is None
    assert "(a torn tail)" in report.summary
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert read_at(tmp_path, end, 150) == bytes(150)


def test_a_real_kill_mid_load_recovers_under_the_default_policy(tmp_path: Path) -> None:
    """A store SIGKILLed by a failpoint in its flush (power crash model: the
    unflushed bytes are lost) opens again under refuse: what a crash leaves
    is never taken for corruption."""
    child = run_child(["write", "--dir", str(tmp_path), "--flush", "ASYNC_FLUSH",
                       "--producers", "8", "--per-producer", "400",
                       "--failpoints", "before_flush_sync=crash@5"])
    assert child.returncode == -signal.SIGKILL, child.stderr
    records, report = reopen(tmp_path)
    assert report.abnormal and report.corruption is None
    assert records


def test_the_checkpoint_tells_a_flushed_last_record_from_a_torn_one(tmp_path: Path) -> None:
    """The LAST record damaged, nothing valid after it, after a crash: a
    torn tail unless the checkpoint names a record stored later than the
    last good one as flushed (pure planner, the log's real bytes)."""
    results = fill(tmp_path, 50)
    good_ts = results[-2].store_timestamp_ms
    flip = bytearray((tmp_path / "commitlog" / segment_name(0)).read_bytes())
    flip[results[-1].offset + 88 + 5] ^= 1

    def kind_for(physic: int) -> DamageKind:
        plan = plan_recovery([0], lambda _s: bytes(flip), seg_size=SEG, abnormal=True,
                             checkpoint=Checkpoint(physic, physic, physic))
        assert plan.damage is not None and plan.first_bad_offset == results[-1].offset
        return plan.damage.kind

    assert kind_for(0) is DamageKind.TAIL
    assert kind_for(good_ts) is DamageKind.TAIL
    assert kind_for(good_ts + 1) is DamageKind.FLUSHED  # a later record was flushed


def test_a_refused_batch_does_not_make_the_checkpoint_claim_a_later_record(
        tmp_path: Path) -> None:
    """A batch whose every message was refused (MESSAGE_ILLEGAL) appends no
    record, so it must not move the store timestamp a flush writes to the
    checkpoint: a crash after that flush is a healthy store, not a hole in
    flushed data."""
    clock = ManualClock()
    s = MessageStore.open(str(tmp_path), TESTING, clock=clock)
    ok = s.append([message(i) for i in range(20)])
    assert all(r.status is PutStatus.PUT_OK for r in ok)
    clock.advance(5)
    too_big = Message("TopicTest", bytes(TESTING.max_message_size_bytes + 1))
    assert s.append([too_big])[0].status is PutStatus.MESSAGE_ILLEGAL
    s.log.flush()
    cp, _ = read_checkpoint(str(tmp_path / "checkpoint"))
    assert cp is not None and cp.physic_ms == ok[-1].store_timestamp_ms
    s.log.close()  # a crash: `abort` stays, nothing more is written
    s._lock.release()
    records, report = reopen(tmp_path)
    assert ids(records) == names(0, 20) and report.abnormal and report.corruption is None


class TickingClock(ManualClock):
    """A clock whose wall time moves one millisecond at every reading."""

    def wall_ms(self) -> int:
        self.advance(0.001)
        return super().wall_ms()


def test_zeros_where_the_checkpoint_says_records_were_flushed_are_a_hole(tmp_path: Path) -> None:
    """A zeroed block in the middle of flushed data (a lost write) reads as a
    zero header, which normally ends the data; the checkpoint naming a later
    record tells it from the end: refused, not silently cut. The store
    timestamps rise by a millisecond each, so the checkpoint's names a record
    later than the hole however fast the machine (on the system clock every
    record could share one millisecond, and no later record be provable)."""
    results = fill(tmp_path, 300, clock=TickingClock())
    victim = results[150]
    patch(tmp_path, victim.offset, bytes(4096))
    mark_abnormal(tmp_path)
    with pytest.raises(CorruptionRefusedError, match=f"at offset {victim.offset} \\(zeros"):
        MessageStore.open(str(tmp_path), TESTING)
    records, report = reopen(tmp_path, TRUNCATE)
    assert ids(records) == names(0, 150) and report.corruption_action == "truncated"
