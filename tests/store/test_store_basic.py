"""The store's everyday behaviour on real files: puts and their offsets,
segments that roll with a blank, the flush modes and crash models, reads for
replication, the abort/checkpoint lifecycle, and what it refuses."""

from __future__ import annotations

import asyncio
import os
import random
import struct
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from support.store_helpers import SEG, fill, ids, message, read_at, reopen

from store.config import TESTING, ConfigError, CrashModel, FlushMode, StoreConfig
from store.log.checkpoint import FILE_SIZE
from store.log.commitlog import OffsetMismatchError, RangeRejectedError
from store.log.record import BLANK_MAGIC, BLANK_SIZE, MESSAGE_MAGIC, Message, peek
from store.log.segments import segment_name
from store.sim.manual_clock import ManualClock
from store.status import PutStatus
from store.store import MessageStore, StoreOpenError


async def _wait_until(cond: Callable[[], bool], timeout_s: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return True
        await asyncio.sleep(0.01)
    return bool(cond())


def test_puts_get_contiguous_offsets_and_read_back(tmp_path: Path) -> None:
    async def run() -> None:
        s = MessageStore.open(str(tmp_path), TESTING.with_(flush_mode=FlushMode.SYNC_FLUSH))
        await s.start()
        try:
            first = await s.put(message(0))
            assert first.status is PutStatus.PUT_OK and first.offset == 0
            assert first.msg_id == "m000000" and first.size == 91 + 200 + 9 + 17
            rest = await asyncio.gather(*(s.put(message(i)) for i in range(1, 50)))
            results = [first, *rest]
            assert [r.offset for r in results] == [i * first.size for i in range(50)]
            rec = s.log.read_record(results[7].offset)
            assert rec.msg_id == "m000007" and rec.body == message(7).body
            assert rec.queue_offset == 7  # per (topic, queue) counter
            assert s.log.flushed >= results[-1].end  # SYNC_FLUSH: acked means flushed
        finally:
            await s.close()

    asyncio.run(run())


def test_segments_roll_with_a_blank_and_no_record_is_split(tmp_path: Path) -> None:
    results = fill(tmp_path, 700, body_size=333)
    files = sorted(os.listdir(tmp_path / "commitlog"))
    assert files == [segment_name(i * SEG) for i in range(len(files))] and len(files) >= 4
    assert all(len(f) == 20 for f in files)
    assert all((tmp_path / "commitlog" / f).stat().st_size == SEG for f in files)
    for r in results:
        assert r.offset // SEG == (r.end - 1) // SEG, f"record at {r.offset} crosses a segment"
    # every full segment ends with a blank that covers the rest of it exactly
    for seg_index in range(len(files) - 1):
        last = max(r for r in results if r.offset // SEG == seg_index)
        blank_at = last.end
        size, magic = peek(read_at(tmp_path, blank_at, 8), 0)
        assert magic == BLANK_MAGIC and size == (seg_index + 1) * SEG - blank_at
        assert size >= BLANK_SIZE
    records, report = reopen(tmp_path)
    assert ids(records) == [f"m{i:06d}" for i in range(700)]
    assert report.abnormal is False and report.first_bad_offset is None


def test_illegal_messages_are_refused_and_nothing_is_written(tmp_path: Path) -> None:
    async def run() -> None:
        s = MessageStore.open(str(tmp_path), TESTING)
        await s.start()
        try:
            before = s.log.wrote
            big = Message("t", bytes(TESTING.max_message_size_bytes + 1))
            r = await s.put(big)
            assert r.status is PutStatus.MESSAGE_ILLEGAL and "max_message_size" in r.detail
            r = await s.put(Message("t" * 200, b"x"))
            assert r.status is PutStatus.MESSAGE_ILLEGAL and "topic" in r.detail
            assert s.log.wrote == before
            ok = await s.put(Message("t", bytes(TESTING.max_message_size_bytes)))
            assert ok.status is PutStatus.PUT_OK  # the limit itself is allowed
        finally:
            await s.close()

    asyncio.run(run())


def test_group_commit_shares_fsyncs_between_concurrent_puts(tmp_path: Path) -> None:
    async def run() -> None:
        s = MessageStore.open(str(tmp_path), TESTING.with_(flush_mode=FlushMode.SYNC_FLUSH))
        await s.start()
        try:
            before = s.log.fsyncs

            async def producer(p: int) -> list[PutStatus]:
                return [(await s.put(message(p * 100 + i))).status for i in range(5)]

            statuses = await asyncio.gather(*(producer(p) for p in range(64)))
            assert {st for row in statuses for st in row} == {PutStatus.PUT_OK}
            fsyncs = s.log.fsyncs - before
            assert 1 <= fsyncs < 320 / 4, f"{fsyncs} fsyncs for 320 puts: no group commit"
        finally:
            await s.close()

    asyncio.run(run())


def test_async_flush_waits_for_least_pages_or_the_thorough_interval(tmp_path: Path) -> None:
    clock = ManualClock()
    config = TESTING.with_(flush_mode=FlushMode.ASYNC_FLUSH, flush_interval_ms=10,
                           flush_least_pages=4, flush_thorough_interval_ms=1000)

    async def run() -> None:
        s = MessageStore.open(str(tmp_path), config, clock=clock)
        await s.start()
        try:
            r = await s.put(message(0))
            assert r.status is PutStatus.PUT_OK and s.log.flushed < r.end  # ack before flush
            await asyncio.sleep(0.15)  # many intervals pass, but dirty < 4 pages
            assert s.log.flushed < r.end
            clock.advance(1.5)  # the thorough interval is due: flush whatever is dirty
            assert await _wait_until(lambda: s.log.flushed >= r.end)
            results = [await s.put(message(i)) for i in range(1, 100)]  # > 16 KiB dirty
            # Appends wake the flusher whenever 4 pages are dirty (RocketMQ's
            # wakeup): without the thorough interval, less than that stays.
            least = config.flush_least_pages * config.page_size_bytes
            assert await _wait_until(lambda: results[-1].end - s.log.flushed < least)
            assert s.log.flushed > r.end
        finally:
            await s.close()

    asyncio.run(run())


@pytest.mark.parametrize("model", [CrashModel.POWER, CrashModel.PROCESS])
def test_crash_models_decide_where_unflushed_bytes_live(tmp_path: Path, model: CrashModel) -> None:
    """POWER: appended bytes stay in process memory (the file still reads
    zeros) yet are readable through the store; PROCESS: they are in the file
    at once."""
    config = TESTING.with_(flush_mode=FlushMode.ASYNC_FLUSH, crash_model=model,
                           flush_interval_ms=10_000, flush_thorough_interval_ms=10_000)

    async def run() -> None:
        s = MessageStore.open(str(tmp_path), config)
        await s.start()
        try:
            r = await s.put(message(1))
            assert s.state()["crash_model"] == model.value
            assert s.log.read_record(r.offset).msg_id == "m000001"
            on_disk = read_at(tmp_path, r.offset, 8)
            if model is CrashModel.POWER:
                assert on_disk == bytes(8)
            else:
                assert peek(on_disk, 0) == (r.size, MESSAGE_MAGIC)
            await s.flush()
            assert peek(read_at(tmp_path, r.offset, 8), 0) == (r.size, MESSAGE_MAGIC)
        finally:
            await s.close()

    asyncio.run(run())


def test_unflushed_bytes_stay_bounded_when_appends_outrun_the_flusher(
        tmp_path: Path) -> None:
    """POWER keeps unflushed bytes in memory; with no flusher keeping up
    (none started here), an append that leaves more than
    max_unflushed_bytes unflushed flushes first: memory stays bounded, and
    everything appended is in the files."""
    limit = 32 * 1024
    config = TESTING.with_(flush_mode=FlushMode.ASYNC_FLUSH, crash_model=CrashModel.POWER,
                           max_unflushed_bytes=limit)
    s = MessageStore.open(str(tmp_path), config)
    appended = []
    try:
        for b in range(40):
            results = s.append([message(b * 10 + i, body_size=600) for i in range(10)])
            assert all(r.status is PutStatus.PUT_OK for r in results)
            appended += results
            batch_bytes = sum(r.size for r in results)
            assert s.log.dirty_bytes <= limit + batch_bytes
        assert s.backpressure_flushes >= 40 * 10 * 600 // (limit + 7000) - 1
        assert s.log.flushed > 0
    finally:
        s.close_sync()
    s = MessageStore.open(str(tmp_path), config)
    try:  # a clean close flushed the rest; every record reads back
        for r in appended:
            assert s.log.read_record(r.offset).msg_id == r.msg_id
    finally:
        s.close_sync()
    with pytest.raises(ConfigError, match="max_unflushed_bytes"):
        TESTING.with_(max_unflushed_bytes=-1)


def test_abort_and_checkpoint_lifecycle(tmp_path: Path) -> None:
    clock = ManualClock(wall_ms=1_712_345_678_901)
    s = MessageStore.open(str(tmp_path), TESTING, clock=clock)
    assert (tmp_path / "abort").read_text() == str(os.getpid())
    assert (tmp_path / "lock").exists()
    assert s.recovery.abnormal is False
    results = s.log.append([message(i) for i in range(10)])
    assert {r.store_timestamp_ms for r in results} == {1_712_345_678_901}
    s.close_sync()
    assert not (tmp_path / "abort").exists()
    raw = (tmp_path / "checkpoint").read_bytes()
    assert len(raw) == FILE_SIZE
    assert struct.unpack_from(">qqq", raw, 0) == (1_712_345_678_901,) * 3
    records, report = reopen(tmp_path)
    assert len(records) == 10 and report.abnormal is False


def test_state_reports_positions_and_modes(tmp_path: Path) -> None:
    async def run() -> None:
        config = TESTING.with_(flush_mode=FlushMode.SYNC_FLUSH, crash_model=CrashModel.PROCESS)
        s = MessageStore.open(str(tmp_path), config)
        await s.start()
        try:
            await s.put_batch([message(i) for i in range(20)])
            st = s.state()
            assert st["flush_mode"] == "SYNC_FLUSH" and st["crash_model"] == "process"
            assert st["min_offset"] <= st["flushed"] <= st["wrote"] and st["wrote"] > 0
            assert st["segment_size_bytes"] == SEG and st["failed"] is None
            assert st["recovery"]["abnormal"] is False
        finally:
            await s.close()

    asyncio.run(run())


def test_read_range_ships_whole_records_and_a_slave_verifies_them(tmp_path: Path) -> None:
    fill(tmp_path / "master", 400, body_size=250)
    master = MessageStore.open(str(tmp_path / "master"), TESTING)
    slave = MessageStore.open(str(tmp_path / "slave"), TESTING)
    try:
        offset = 0
        rounds = 0
        while offset < master.log.wrote:
            data, nxt = master.log.read_range(offset, 5000)
            assert data and nxt > offset
            if nxt % SEG == 0 and nxt != offset + len(data):  # ended with a blank
                assert peek(data, len(data) - BLANK_SIZE)[1] == BLANK_MAGIC
            assert slave.log.append_raw(offset, data) == nxt
            offset = nxt
            rounds += 1
        assert rounds > 10
        assert slave.log.wrote == master.log.wrote
        slave.log.flush()
        assert ids(list(slave.log.iter_records())) == ids(list(master.log.iter_records()))
        # A range at the wrong offset, or one that fails verification, is refused whole.
        data, _ = master.log.read_range(0, 2000)
        with pytest.raises(OffsetMismatchError):
            slave.log.append_raw(0, data)
        fresh = MessageStore.open(str(tmp_path / "fresh"), TESTING)
        try:
            bad = bytearray(data)
            last = len(data) - peek(master.log.read(0, 8), 0)[0]  # records are all one size
            bad[last + 100] ^= 0xFF  # inside the last record's body: its CRC fails
            with pytest.raises(RangeRejectedError, match="crc"):
                fresh.log.append_raw(0, bytes(bad))
            assert fresh.log.wrote == 0  # the good records before it were not taken either
            assert fresh.log.append_raw(0, data) == len(data)
        finally:
            fresh.close_sync()
    finally:
        master.close_sync()
        slave.close_sync()


def test_append_raw_keeps_what_it_verified_whatever_the_caller_does_after(
        tmp_path: Path) -> None:
    """A slave hands append_raw a view of the received message (no copy);
    a writable view is copied first, so a caller reusing its buffer cannot
    change bytes that were verified and are waiting for the flush."""
    fill(tmp_path / "master", 20, body_size=250)
    master = MessageStore.open(str(tmp_path / "master"), TESTING)
    slave = MessageStore.open(str(tmp_path / "slave"), TESTING)
    try:
        data, nxt = master.log.read_range(0, 3000)
        held = bytearray(data)
        assert slave.log.append_raw(0, memoryview(held)) == nxt
        held[:] = bytes(len(held))  # the caller reuses its buffer
        view = memoryview(bytes(master.log.read_range(nxt, 3000)[0]))  # read-only: kept as is
        end = slave.log.append_raw(nxt, view)
        slave.log.flush()
        assert end > nxt and slave.log.read(0, end) == master.log.read(0, end)
    finally:
        master.close_sync()
        slave.close_sync()


def test_config_errors_name_the_setting(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="segment_size_bytes"):
        StoreConfig(segment_size_bytes=1000).validate()
    with pytest.raises(ConfigError, match="max_message_size_bytes"):
        StoreConfig(segment_size_bytes=8192, max_message_size_bytes=8000).validate()
    with pytest.raises(ConfigError, match="flush_thorough_interval_ms"):
        TESTING.with_(flush_interval_ms=500, flush_thorough_interval_ms=100)
    fill(tmp_path, 5)
    with pytest.raises(StoreOpenError, match=f"open it with segment size {SEG}"):
        MessageStore.open(str(tmp_path), TESTING.with_(segment_size_bytes=2 * SEG))
    records, _ = reopen(tmp_path)  # the refused open changed nothing
    assert len(records) == 5


def test_unflushed_bytes_ship_from_memory_across_segment_ends(tmp_path: Path) -> None:
    """Under the power model with nothing flushed, read_range serves records
    and each segment's closing blank from process memory; a slave rebuilds
    the same log from them."""
    config = TESTING.with_(flush_mode=FlushMode.ASYNC_FLUSH, crash_model=CrashModel.POWER,
                           flush_interval_ms=60_000, flush_thorough_interval_ms=60_000)
    master = MessageStore.open(str(tmp_path / "master"), config)
    slave = MessageStore.open(str(tmp_path / "slave"), config)
    try:
        for lo in range(0, 600, 50):
            master.log.append([message(i, body_size=100 + i % 300) for i in range(lo, lo + 50)])
        assert master.log.flushed == 0 and master.log.wrote > 3 * SEG
        assert read_at(tmp_path / "master", 0, 8) == bytes(8)  # nothing in the file yet
        offset = 0
        while offset < master.log.wrote:
            data, nxt = master.log.read_range(offset, 3000)
            assert slave.log.append_raw(offset, data) == nxt
            offset = nxt
        assert ids(list(slave.log.iter_records())) == [f"m{i:06d}" for i in range(600)]
        assert ids(list(master.log.iter_records())) == [f"m{i:06d}" for i in range(600)]
    finally:
        master.close_sync()
        slave.close_sync()
    records, _ = reopen(tmp_path / "slave", config)
    assert ids(records) == [f"m{i:06d}" for i in range(600)]


@pytest.mark.parametrize("model", [CrashModel.POWER, CrashModel.PROCESS])
def test_truncate_to_cuts_pending_and_flushed_bytes_for_good(
    tmp_path: Path, model: CrashModel
) -> None:
    """A slave told to truncate (or recovery) cuts at a record boundary inside
    a batch that is partly flushed, partly pending; new appends continue
    from the cut and a reopen sees exactly that."""
    config = TESTING.with_(flush_mode=FlushMode.ASYNC_FLUSH, crash_model=model,
                           flush_interval_ms=60_000, flush_thorough_interval_ms=60_000)
    s = MessageStore.open(str(tmp_path), config)
    try:
        first = s.log.append([message(i) for i in range(150)])
        s.log.flush()
        second = s.log.append([message(i) for i in range(150, 400)])  # pending, rolls a segment
        assert s.log.flushed == first[-1].end < second[-1].end == s.log.wrote
        cut = second[100].offset  # inside the pending batch
        s.truncate_to(cut)
        assert s.log.wrote == s.log.flushed == cut
        s.log.append([message(i, prefix="n") for i in range(5)])
        s.log.flush()
    finally:
        s.close_sync()
    records, report = reopen(tmp_path, config)
    assert ids(records) == [f"m{i:06d}" for i in range(250)] + [f"n{i:06d}" for i in range(5)]
    assert report.first_bad_offset is None


def test_a_cancelled_put_leaves_the_rest_of_its_batch_alone(tmp_path: Path) -> None:
    """Puts of one loop tick share one append and one flush, but each waits
    on its own: cancelling one caller (a deadline) must not cancel or fail
    the others, and the cancelled put itself is still stored."""
    async def run() -> None:
        s = MessageStore.open(str(tmp_path), TESTING.with_(flush_mode=FlushMode.SYNC_FLUSH))
        await s.start()
        try:
            tasks = [asyncio.ensure_future(s.put(message(i))) for i in range(8)]
            await asyncio.sleep(0)  # every put has joined the tick's batch
            tasks[3].cancel()
            done = await asyncio.gather(*tasks, return_exceptions=True)
            assert isinstance(done[3], asyncio.CancelledError)
            others = [r for i, r in enumerate(done) if i != 3]
            assert all(not isinstance(r, BaseException) and r.status is PutStatus.PUT_OK
                       for r in others), others
            second = done[2]
            assert not isinstance(second, BaseException)
            # The cancelled put was appended all the same, between puts 2 and 4.
            after = s.log.read_record(second.offset + second.size)
            assert after.properties == message(3).properties
            assert await _wait_until(lambda: s.log.flushed == s.log.wrote)
        finally:
            await s.close()

    asyncio.run(run())


def test_a_large_write_is_made_in_steps_each_started_on_the_disk(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Segment.pwritev writes more than WRITEBACK_STEP in steps, asking the
    kernel (sync_file_range) to start each on the disk before the next is
    copied in; the bytes land exactly, across step and chunk boundaries."""
    from store.log import segments
    from store.seams import disk

    assert disk._SYNC_FILE_RANGE is not None, "Linux has sync_file_range"
    started: list[tuple[int, int]] = []
    real = disk._start_writeback

    def spy(fd: int, pos: int, n: int) -> None:
        started.append((pos, n))
        real(fd, pos, n)

    monkeypatch.setattr(disk, "_start_writeback", spy)
    step = segments.WRITEBACK_STEP
    seg = segments.Segment.create(disk.RealDisk(), str(tmp_path), 0, 8 * step)
    try:
        rng = random.Random(5)
        chunks = [rng.randbytes(rng.randint(1, step // 3)) for _ in range(20)]
        data = b"".join(chunks)
        assert 2 * step < len(data) < 8 * step - 100
        seg.pwritev(100, chunks)
        seg.sync()
        assert seg.pread(100, len(data)) == data
    finally:
        seg.close()
    # Steps cover the write contiguously, each at least WRITEBACK_STEP but
    # the last.
    assert started[0][0] == 100
    assert all(a + n == b for (a, n), (b, _) in zip(started, started[1:], strict=False))
    assert started[-1][0] + started[-1][1] == 100 + len(data)
    assert all(n >= step for _, n in started[:-1]) and len(started) >= 2
