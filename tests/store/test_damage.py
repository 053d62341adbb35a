"""Damaged stores: a bit flip inside a record, a torn tail, a file cut short,
a zero-filled tail, a missing checkpoint, stray files, wrong-size and missing
segments, damage in the middle of a multi-segment log. Recovery must keep
every record before the damage, drop everything from it on, and say what it
dropped; a layout it cannot trust makes it refuse to open and touch nothing."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.store_helpers import (
    SEG,
    fill,
    flip_bit,
    ids,
    locate,
    mark_abnormal,
    message,
    patch,
    read_at,
    reopen,
    snapshot,
)

from store.config import TESTING, CorruptionPolicy
from store.log.record import BLANK_MAGIC, BLANK_SIZE, encode, encode_blank, peek, verify
from store.log.recovery import plan_recovery, scan_segment
from store.log.segments import segment_name
from store.sim.manual_clock import ManualClock
from store.store import MessageStore, StoreOpenError

# Damage to flushed data is refused by default (tests/store/test_corruption_policy.py);
# these tests are about how the cut is made, so they accept it (RocketMQ's way).
TRUNCATING = TESTING.with_(corruption_policy=CorruptionPolicy.TRUNCATE)


def names(n: int) -> list[str | None]:
    return [f"m{i:06d}" for i in range(n)]


@pytest.mark.parametrize("shutdown", ["clean", "crash"])
def test_bit_flip_inside_a_record_keeps_everything_before_it(tmp_path: Path, shutdown: str) -> None:
    results = fill(tmp_path, 150)
    bad = results[100]
    if shutdown == "crash":
        mark_abnormal(tmp_path)
    flip_bit(tmp_path, bad.offset + 88 + 17, bit=3)  # a body byte
    records, report = reopen(tmp_path, TRUNCATING)
    assert ids(records) == names(100)
    assert report.first_bad_offset == bad.offset and report.bad_reason == "crc"
    assert report.max_valid_offset == bad.offset
    assert f"damage at {bad.offset} (crc" in report.summary
    assert report.abnormal is (shutdown == "crash")
    tail = read_at(tmp_path, bad.offset, SEG - bad.offset)
    assert tail == bytes(len(tail))  # the dropped records are gone from the file
    records, report = reopen(tmp_path, TRUNCATING)  # and the next open finds a clean log
    assert ids(records) == names(100) and report.first_bad_offset is None


@pytest.mark.parametrize("torn_bytes", [3, 60, 250])
def test_torn_tail_is_cut_and_every_complete_record_kept(tmp_path: Path, torn_bytes: int) -> None:
    """After a kill mid-write: the first bytes of the next record at the end
    of data, zeros after them."""
    results = fill(tmp_path, 80)
    end = results[-1].end
    nxt = encode(message(80), offset=end, queue_offset=80, store_timestamp_ms=1)
    patch(tmp_path, end, nxt[:torn_bytes])
    mark_abnormal(tmp_path)
    records, report = reopen(tmp_path)
    assert ids(records) == names(80)
    assert report.first_bad_offset == end and report.max_valid_offset == end
    assert report.bad_reason in {"magic", "layout", "crc"}
    assert read_at(tmp_path, end, torn_bytes) == bytes(torn_bytes)


def test_last_segment_cut_short_mid_record(tmp_path: Path) -> None:
    results = fill(tmp_path, 300)  # two segments and a bit
    last = results[-1]
    assert last.offset >= SEG
    file, pos = locate(tmp_path, last.offset)
    os.truncate(file, pos + 40)  # the file ends 40 bytes into the last record
    records, report = reopen(tmp_path, TRUNCATING)
    assert ids(records) == names(299)
    assert report.first_bad_offset == last.offset
    assert any("last segment is short" in p for p in report.problems)
    assert file.stat().st_size == SEG  # extended back to full size, zeros after the cut


def test_zero_filled_tail_is_the_normal_end_of_data(tmp_path: Path) -> None:
    results = fill(tmp_path, 120)
    mark_abnormal(tmp_path)
    records, report = reopen(tmp_path)
    assert ids(records) == names(120)
    assert report.abnormal and report.first_bad_offset is None and report.bad_reason is None
    assert report.max_valid_offset == results[-1].end and report.segments_dropped == []
    assert "damage" not in report.summary


@pytest.mark.parametrize("how", ["missing", "short"])
def test_unusable_checkpoint_after_a_crash_scans_every_segment(tmp_path: Path, how: str) -> None:
    results = fill(tmp_path, 500)
    assert results[-1].offset >= 2 * SEG
    if how == "missing":
        (tmp_path / "checkpoint").unlink()
        expect = "checkpoint file is missing: scanning every segment"
    else:
        (tmp_path / "checkpoint").write_bytes(b"\x01" * 5)
        expect = "checkpoint is 5 bytes, needs 24: scanning every segment"
    mark_abnormal(tmp_path)
    records, report = reopen(tmp_path)
    assert ids(records) == names(500)
    assert report.records_scanned == 500
    assert expect in report.problems


def test_stray_files_in_commitlog_are_ignored_and_reported(tmp_path: Path) -> None:
    fill(tmp_path, 50)
    stray = {"notes.txt": b"hello", f"{segment_name(0)}.bak": b"\x00" * 100, "123": b"x"}
    for name, data in stray.items():
        (tmp_path / "commitlog" / name).write_bytes(data)
    (tmp_path / "commitlog" / "subdir").mkdir()
    mark_abnormal(tmp_path)
    records, report = reopen(tmp_path)
    assert ids(records) == names(50)
    for name in [*stray, "subdir"]:
        assert f"stray file ignored: commitlog/{name}" in report.problems
    for name, data in stray.items():
        assert (tmp_path / "commitlog" / name).read_bytes() == data


def _unchanged_but_lock(before: dict[str, str], after: dict[str, str]) -> None:
    # The refused open did take the lock, which rewrites the pid in `lock`;
    # every other byte must be as it was.
    before = {k: v for k, v in before.items() if k != "lock"}
    after = {k: v for k, v in after.items() if k != "lock"}
    assert after == before


@pytest.mark.parametrize("case", ["last_longer", "middle_short", "first_of_two_short", "missing"])
def test_wrong_size_or_missing_segment_refuses_to_open_and_changes_nothing(
    tmp_path: Path, case: str
) -> None:
    n = 250 if case == "first_of_two_short" else 650
    fill(tmp_path, n)
    log = tmp_path / "commitlog"
    files = sorted(log.iterdir())
    assert len(files) == (2 if case == "first_of_two_short" else 4)
    if case == "last_longer":
        with open(files[-1], "ab") as f:
            f.write(b"\x00" * 100)
        culprit, expect = files[-1].name, f"{SEG + 100} bytes, segments here are {SEG}"
    elif case == "middle_short":
        os.truncate(files[1], 30_000)
        culprit, expect = files[1].name, f"30000 bytes, segments here are {SEG}"
    elif case == "first_of_two_short":
        os.truncate(files[0], 1000)
        culprit, expect = files[0].name, f"1000 bytes, segments here are {SEG}"
    else:
        files[1].unlink()
        culprit, expect = files[2].name, "a segment is missing"
    mark_abnormal(tmp_path)
    before = snapshot(tmp_path)
    with pytest.raises(StoreOpenError) as err:
        MessageStore.open(str(tmp_path), TESTING)
    message_text = str(err.value)
    assert f"commitlog/{culprit}" in message_text and expect in message_text
    assert "open it with segment size" not in message_text  # the size was inferred right
    _unchanged_but_lock(before, snapshot(tmp_path))
    # the lock was released: a second attempt fails the same way, not as "locked"
    with pytest.raises(StoreOpenError):
        MessageStore.open(str(tmp_path), TESTING)


@pytest.mark.parametrize("shutdown", ["clean", "crash"])
def test_damage_in_a_middle_segment_drops_the_later_segments(tmp_path: Path, shutdown: str) -> None:
    results = fill(tmp_path, 1000)
    log = tmp_path / "commitlog"
    count = len(list(log.iterdir()))
    assert count == 5
    victim = next(i for i, r in enumerate(results) if r.offset >= 2 * SEG + 5000)
    flip_bit(tmp_path, results[victim].offset + 88 + 50)
    if shutdown == "crash":
        mark_abnormal(tmp_path)
    records, report = reopen(tmp_path, TRUNCATING)
    assert ids(records) == names(victim)
    assert report.first_bad_offset == results[victim].offset and report.bad_reason == "crc"
    assert report.segments_dropped == [3 * SEG, 4 * SEG]
    assert "2 later segment(s) removed" in report.summary
    assert sorted(p.name for p in log.iterdir()) == [segment_name(i * SEG) for i in range(3)]


def test_a_blank_of_the_wrong_size_is_damage(tmp_path: Path) -> None:
    results = fill(tmp_path, 300)
    last_in_first = max(r for r in results if r.end <= SEG)
    blank_at = last_in_first.end
    patch(tmp_path, blank_at, encode_blank(SEG - blank_at - 1))
    mark_abnormal(tmp_path)
    records, report = reopen(tmp_path, TRUNCATING)
    assert len(records) == results.index(last_in_first) + 1
    assert report.first_bad_offset == blank_at and report.bad_reason == "size"
    assert report.segments_dropped == [SEG * i for i in range(1, len(report.segments_dropped) + 1)]


def test_records_at_the_wrong_offset_are_damage(tmp_path: Path) -> None:
    """A segment file holding another segment's bytes (a bad copy or rename):
    every record's PHYSICALOFFSET disagrees with where it sits."""
    fill(tmp_path, 650)
    files = sorted((tmp_path / "commitlog").iterdir())
    files[2].write_bytes(files[1].read_bytes())
    mark_abnormal(tmp_path)
    records, report = reopen(tmp_path, TRUNCATING)
    assert report.first_bad_offset == 2 * SEG and report.bad_reason == "position"
    assert all(r.offset < 2 * SEG for r in records) and records
    assert report.segments_dropped == [3 * SEG]


# ------------------------------------------------------- the pure core, fuzzed
def _build_log() -> tuple[list[bytes], list[int]]:
    """Two in-memory segments: records of varied sizes, a blank closing the
    first, zeros after the last record of the second."""
    segs, starts = [], []
    offset, i = 0, 0
    for seg_start in (0, SEG):
        buf = bytearray(SEG)
        pos = 0
        while True:
            raw = encode(message(i, body_size=50 + (i * 37) % 700), offset=seg_start + pos,
                         queue_offset=i, store_timestamp_ms=1_700_000_000_000 + i)
            if pos + len(raw) + BLANK_SIZE > SEG or (seg_start and pos > SEG // 2):
                break
            buf[pos : pos + len(raw)] = raw
            starts.append(seg_start + pos)
            pos += len(raw)
            i += 1
        if seg_start == 0:
            buf[pos : pos + BLANK_SIZE] = encode_blank(SEG - pos)
        segs.append(bytes(buf))
        offset = seg_start + pos
    starts.append(offset)  # the end of data
    return segs, starts


_SEGS, _STARTS = _build_log()


@given(st.lists(st.tuples(st.integers(0, 2 * SEG - 1), st.integers(1, 255)), min_size=1,
                max_size=6))
@settings(max_examples=150, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow])
def test_recovery_keeps_every_record_before_the_first_damaged_byte(
    flips: list[tuple[int, int]],
) -> None:
    segs = [bytearray(s) for s in _SEGS]
    for at, xor in flips:
        segs[at // SEG][at % SEG] ^= xor
    first = min(at for at, _ in flips)
    plan = plan_recovery([0, SEG], lambda start: bytes(segs[start // SEG]), seg_size=SEG,
                         abnormal=True, checkpoint=None)
    data_end = _STARTS[-1]
    if first < data_end:
        # every record wholly before the first flipped byte survives
        whole_before = max(s for s in _STARTS if s <= first)
        assert plan.max_valid_offset >= whole_before
    else:
        assert plan.max_valid_offset == data_end and plan.first_bad_offset is None
    # and everything kept verifies, record by record, up to exactly the end
    offset = 0
    while offset < plan.max_valid_offset:
        buf = bytes(segs[offset // SEG])
        pos = offset % SEG
        size, magic = peek(buf, pos)
        if magic == BLANK_MAGIC:
            assert size == SEG - pos
        else:
            size, _ts = verify(buf, pos, offset)
        offset += size
    assert offset == plan.max_valid_offset


@given(st.binary(min_size=0, max_size=3000), st.integers(0, 40))
@settings(max_examples=300, deadline=None, database=None)
def test_scan_of_arbitrary_bytes_never_raises(data: bytes, pad: int) -> None:
    scan = scan_segment(data + bytes(pad), SEG, SEG, check_trailing=True)
    assert scan.stop in {"blank", "end", "damage"}
    assert SEG <= scan.end <= SEG + len(data) + pad


def test_abnormal_recovery_starts_at_the_checkpoint(tmp_path: Path) -> None:
    """With a usable checkpoint, abnormal recovery walks back only to the
    first segment whose first record is older than the checkpoint minus 3 s
    (RocketMQ's margin), not to the first segment."""
    clock = ManualClock(wall_ms=1_700_000_000_000)
    s = MessageStore.open(str(tmp_path), TESTING, clock=clock)
    try:
        for lo in range(0, 1000, 50):  # ten seconds between batches
            s.log.append([message(i) for i in range(lo, lo + 50)])
            clock.advance(10)
        s.log.flush()
    finally:
        s.close_sync()
    mark_abnormal(tmp_path)
    records, report = reopen(tmp_path)
    assert ids(records) == names(1000)  # every record is still there to read
    assert report.abnormal and report.first_bad_offset is None
    last_seg_records = sum(1 for r in records if r.offset >= 4 * SEG)
    assert report.records_scanned == last_seg_records < 1000
