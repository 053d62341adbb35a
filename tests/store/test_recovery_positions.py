"""Recovery decides "flushed or torn" from positions, not store timestamps
(docs/design.md, "Recovery"; store/log/checkpoint.py: the flushed end).

Many records share a store millisecond: zeros from a record inside the
checkpoint's millisecond must not pass for the end of data. A clean close
vouches for everything below the end it recorded; a segment of zeros in the
middle of the log is found at open; a refusal changes nothing (not even a
short last segment's length); a checkpoint ahead of the records (a clock
that stepped back) is not taken for lost data when positions say otherwise,
and an old checkpoint that only has timestamps says what it may be; a
truncation a kill interrupted is completed with a WARNING naming what it
cleared. Real stores, real files, damage planted on disk; the interrupted
cut is a real SIGKILL of a child at a failpoint."""

from __future__ import annotations

import logging
import os
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
    locate,
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
from store.log.checkpoint import END_AT, read_checkpoint
from store.log.record import encode
from store.log.recovery import DamageKind
from store.log.segments import segment_name
from store.sim.manual_clock import ManualClock
from store.store import CorruptionRefusedError, MessageStore
from store.tools.inspect import inspect_store


def zero_from(path: Path, offset: int) -> None:
    """Zero every byte of the segment holding `offset` from there on."""
    _file, pos = locate(path, offset)
    patch(path, offset, bytes(SEG - pos))


def strip_flushed_end(path: Path) -> None:
    """Make the checkpoint one an older version wrote: timestamps only."""
    fd = os.open(path / "checkpoint", os.O_RDWR)
    try:
        os.pwrite(fd, bytes(16), END_AT)
        os.fsync(fd)
    finally:
        os.close(fd)


def refused(path: Path) -> CorruptionRefusedError:
    before = snapshot(path)
    with pytest.raises(CorruptionRefusedError) as err:
        MessageStore.open(str(path), TESTING)  # refuse is the default
    after = snapshot(path)
    assert without_lock_pid(after) == without_lock_pid(before)
    assert set(after) == set(before)  # no abort made, no segment removed
    return err.value


@pytest.mark.parametrize("shutdown", ["clean", "crash"])
def test_zeros_from_inside_the_checkpoints_millisecond_are_refused(
        tmp_path: Path, shutdown: str) -> None:
    # A clock that never moves: every record is stored in one millisecond,
    # the one the checkpoint names.
    results = fill(tmp_path, 120, clock=ManualClock())
    assert len({r.store_timestamp_ms for r in results}) == 1
    victim = 117  # the third-last: three acknowledged records go
    bad = results[victim].offset
    if shutdown == "crash":
        mark_abnormal(tmp_path)  # a crash after everything was flushed
    zero_from(tmp_path, bad)
    err = refused(tmp_path)
    text = str(err)
    seg = bad - bad % SEG
    assert f"commitlog/{segment_name(seg)} at offset {bad}" in text
    assert f"every byte below offset {results[-1].end} as flushed" in text
    assert f"the {results[-1].end - bad} flushed bytes from there" in text
    assert "acknowledged records there are lost" in text
    assert f"losing {results[-1].end - bad} bytes" in text
    d = err.damage
    assert (d.kind, d.offset, d.reason) == (DamageKind.FLUSHED, bad, "zeros")

    # Under truncate the cut is made and its cost reported.
    records, report = reopen(tmp_path, TRUNCATE)
    assert ids(records) == names(0, victim)
    assert report.corruption_action == "truncated"
    assert report.bytes_lost == results[-1].end - bad
    # ... and the checkpoint no longer vouches past the cut: the next open is quiet.
    cp, _ = read_checkpoint(str(tmp_path / "checkpoint"))
    assert cp is not None and cp.flushed_end == bad
    records, report = reopen(tmp_path)
    assert ids(records) == names(0, victim) and report.first_bad_offset is None


def test_zeros_inside_the_last_millisecond_with_the_real_clock(tmp_path: Path) -> None:
    """The same through the store's own clock: a batch of puts shares its
    store millisecond, so zeroing from the second-last record of the last
    millisecond leaves the last good record in the checkpoint's millisecond."""
    results = fill(tmp_path, 200)
    last_ms = results[-1].store_timestamp_ms
    same = [i for i, r in enumerate(results) if r.store_timestamp_ms == last_ms]
    assert len(same) >= 2, "the last batch should share one store millisecond"
    victim = same[-2]
    zero_from(tmp_path, results[victim].offset)
    err = refused(tmp_path)
    assert err.damage.offset == results[victim].offset
    assert err.damage.kind is DamageKind.FLUSHED


def test_a_fully_zeroed_last_segment_after_a_clean_stop_is_refused(tmp_path: Path) -> None:
    results = fill(tmp_path, 700, clock=ManualClock())
    last_seg = results[-1].offset - results[-1].offset % SEG
    assert last_seg > 0 and results[0].offset < last_seg
    zero_from(tmp_path, last_seg)
    err = refused(tmp_path)
    assert f"commitlog/{segment_name(last_seg)} at offset {last_seg}" in str(err)
    assert err.damage.bytes_lost == results[-1].end - last_seg


@pytest.mark.parametrize("checkpoint", ["current", "older version"])
def test_a_zeroed_middle_segment_after_a_clean_stop_is_refused_at_open(
        tmp_path: Path, checkpoint: str) -> None:
    results = fill(tmp_path, 1500)
    starts = sorted({r.offset - r.offset % SEG for r in results})
    assert len(starts) >= 5  # the zeroed one lies before the last three
    victim = starts[1]
    kept = [i for i, r in enumerate(results) if r.offset < victim]
    after = [r for r in results if r.offset >= victim + SEG]
    zero_from(tmp_path, victim)
    if checkpoint == "older version":
        strip_flushed_end(tmp_path)
    err = refused(tmp_path)
    text = str(err)
    assert f"commitlog/{segment_name(victim)} at offset {victim}" in text
    assert f"holding {len(after)} valid record(s)" in text
    assert (err.damage.offset, err.damage.records_past) == (victim, len(after))

    records, report = reopen(tmp_path, TRUNCATE)
    assert ids(records) == names(0, len(kept))
    assert report.records_lost == len(after)


def test_a_refusal_leaves_a_short_last_segment_short(tmp_path: Path) -> None:
    results = fill(tmp_path, 700)
    last = results[-1]
    file, pos = locate(tmp_path, last.offset)
    os.truncate(file, pos + last.size + 100)  # short, but every record kept
    flip_bit(tmp_path, results[300].offset + 120)  # flushed data damaged
    size = file.stat().st_size
    err = refused(tmp_path)  # (compares every file's size and bytes)
    assert "Nothing was changed" in str(err)
    assert file.stat().st_size == size


def checkpoint_ahead(path: Path, n: int = 50) -> int:
    """A slave's store left with its checkpoint ahead of its last record:
    n records applied from a master at T, then n more from a master whose
    clock is 60 s behind (a clock that stepped back, or a failover to a
    machine whose clock is behind). The checkpoint keeps the largest store
    timestamp it saw. Returns the end of the log."""
    t = 1_700_000_000_000
    store = MessageStore.open(str(path), TESTING, clock=ManualClock(t))
    try:
        for ts, lo in ((t, 0), (t - 60_000, n)):
            data = b""
            for i in range(lo, lo + n):
                data += encode(message(i), offset=store.log.wrote + len(data), queue_offset=i,
                               store_timestamp_ms=ts)
            store.log.append_raw(store.log.wrote, data)
            store.log.flush()
        end = store.log.wrote
    finally:
        store.close_sync()
    cp, _ = read_checkpoint(str(path / "checkpoint"))
    assert cp is not None and cp.physic_ms == t
    return end


def test_a_checkpoint_ahead_of_the_records_is_not_taken_for_lost_data(tmp_path: Path) -> None:
    """Positions say nothing is missing: the store opens with every record
    (the timestamps alone refused it, "losing 0 record(s)")."""
    checkpoint_ahead(tmp_path)
    mark_abnormal(tmp_path)
    records, report = reopen(tmp_path)
    assert ids(records) == names(0, 100)
    assert report.first_bad_offset is None


def test_an_older_checkpoint_ahead_of_the_records_says_what_it_may_be(tmp_path: Path) -> None:
    end = checkpoint_ahead(tmp_path)
    mark_abnormal(tmp_path)
    strip_flushed_end(tmp_path)
    text = str(refused(tmp_path))
    assert "clock stepped back" in text
    assert "No valid record lies past it on this disk" in text
    assert f"--corruption-policy truncate, which cuts at {end}" in text
    assert "drops nothing found on this disk" in text
    assert "--corruption-policy repair" in text
    records, _ = reopen(tmp_path, TRUNCATE)
    assert ids(records) == names(0, 100)


def test_an_interrupted_truncation_is_completed_with_a_warning(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    results = fill(tmp_path, 100, body_size=300)
    size = results[0].size
    cut = results[50].offset
    flip_bit(tmp_path, cut + 120)
    child = run_child(["open", "--dir", str(tmp_path), "--failpoints", "recovery_truncate=crash@1",
                       "--corruption-policy", "truncate"])
    assert child.returncode == -signal.SIGKILL, child.stderr
    assert read_at(tmp_path, cut, 8) == bytes(8)
    assert read_at(tmp_path, cut + size, 8) != bytes(8)
    seg_end = cut - cut % SEG + SEG
    stale_end = min(results[-1].end, seg_end)
    with caplog.at_level(logging.WARNING, logger="dlab.store"):
        records, report = reopen(tmp_path)  # refuse, the default
    assert ids(records) == names(0, 50)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(f"completed a truncation at offset {cut}" in m
               and f"[{cut}, {stale_end})" in m for m in warnings), warnings
    assert f"[{cut}, {stale_end}) cleared" in report.summary


@pytest.mark.parametrize("damage", ["zeros in the last millisecond", "zeroed middle segment"])
def test_inspect_says_what_recovery_decides(tmp_path: Path, damage: str) -> None:
    results = fill(tmp_path, 1500, clock=ManualClock())
    bad = SEG if damage == "zeroed middle segment" else results[-3].offset
    zero_from(tmp_path, bad)
    r = inspect_store(str(tmp_path))
    assert r.recovery.truncates_at == bad  # not "truncates nothing"
    assert r.recovery.first_bad_offset == bad
    assert any("corruption of flushed data" in n and "does not open" in n
               for n in r.recovery.notes), r.recovery.notes
    assert any(f"every byte below offset {results[-1].end} as flushed" in p
               for p in r.problems), r.problems


def test_a_torn_flushed_end_reads_as_not_recorded(tmp_path: Path) -> None:
    """A crash that keeps a prefix of the checkpoint's write can mix an old
    and a new end into a larger one; its CRC says so, and the checkpoint is
    read as one that does not tell (timestamps only), never as a claim."""
    results = fill(tmp_path, 20)
    cp, _ = read_checkpoint(str(tmp_path / "checkpoint"))
    assert cp is not None and cp.flushed_end == results[-1].end
    fd = os.open(tmp_path / "checkpoint", os.O_RDWR)
    try:
        os.pwrite(fd, b"\x7f", END_AT + 4 + 6)  # a high byte of the end
    finally:
        os.close(fd)
    torn, problem = read_checkpoint(str(tmp_path / "checkpoint"))
    assert problem is None and torn is not None
    assert torn.flushed_end is None and torn.physic_ms == cp.physic_ms
    records, _report = reopen(tmp_path)
    assert ids(records) == names(0, 20)


def test_a_refusal_after_a_repair_says_what_was_written(tmp_path: Path) -> None:
    """A repair writes verified records before a later range fails to
    repair: the refusal names what was written instead of claiming that
    nothing was changed."""
    store = tmp_path / "store"
    results = fill(store, 600)
    replica = tmp_path / "replica"
    shutil.copytree(store, replica)
    a, b = results[100], results[400]
    flip_bit(store, a.offset + 120)  # the replica holds this one intact
    flip_bit(store, b.offset + 120)
    flip_bit(replica, b.offset + 120)  # ... but not this one
    with pytest.raises(CorruptionRefusedError) as err:
        MessageStore.open(str(store), REPAIR, repair_source=replica_files_source(replica))
    text = str(err.value)
    assert f"at offset {b.offset}" in text and "Repair was not possible" in text
    assert "Nothing was changed" not in text
    assert (f"1 earlier damaged range(s) were repaired in place from a replica "
            f"(CRC-verified records): [{a.offset}, {a.end}); nothing else was changed") in text
    assert read_at(store, a.offset, a.size) == read_at(replica, a.offset, a.size)


def test_an_older_checkpoint_says_what_it_cannot_tell_and_is_upgraded(tmp_path: Path) -> None:
    results = fill(tmp_path, 120, clock=ManualClock())
    strip_flushed_end(tmp_path)
    records, report = reopen(tmp_path)  # closes cleanly, recording the end
    assert ids(records) == names(0, 120)
    assert any("cannot tell whether records stored in the same millisecond" in p
               and f"past offset {results[-1].end}" in p for p in report.problems), report.problems
    cp, _ = read_checkpoint(str(tmp_path / "checkpoint"))
    assert cp is not None and cp.flushed_end == results[-1].end
    records, report = reopen(tmp_path)
    assert not any("cannot tell" in p for p in report.problems)
