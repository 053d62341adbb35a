"""What the flush keeps in memory and writes ahead: the reused write buffers
(store/log/writebuffers.py) and the zeros written past the flushed end.

What must hold: a buffer holding any unflushed chunk is never written again
(so pending bytes read back, and later flushed, are the bytes appended),
flushed buffers are reused (so memory stays bounded over many flushes), and
zeros written ahead never land on a record."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from store.config import TESTING, CrashModel, FlushMode
from store.log import commitlog
from store.log.record import Message, decode
from store.log.writebuffers import WriteBuffers
from store.status import PutStatus
from store.store import MessageStore


def test_a_buffer_with_unflushed_chunks_is_not_reused() -> None:
    wb = WriteBuffers(16, keep=4)
    first = wb.current
    first[0:10] = b"A" * 10
    wb.used = 10
    a = wb.chunk(0)
    wb.next_buffer()
    assert wb.current is not first
    wb.next_buffer()
    wb.next_buffer()
    assert wb.current is not first and bytes(a) == b"A" * 10
    wb.flushed([a])
    seen = set()
    for _ in range(5):
        wb.next_buffer()
        seen.add(id(wb.current))
    assert id(first) in seen  # released once its only chunk was flushed


def test_the_current_buffer_starts_over_once_everything_in_it_is_flushed() -> None:
    wb = WriteBuffers(16)
    wb.current[0:4] = b"abcd"
    wb.used = 4
    c = wb.chunk(0)
    assert wb.room == 12
    wb.flushed([c])
    assert wb.used == 0 and wb.room == 16


def _messages(n: int, size: int, tag: str) -> list[Message]:
    return [Message("wb", os.urandom(size), {"UNIQ_KEY": f"{tag}{i}"}) for i in range(n)]


def test_pending_bytes_survive_buffer_switches_and_match_the_files(tmp_path: Path) -> None:
    """TESTING uses 8 KiB buffers: batches of 1-3 KiB records switch buffers
    constantly and 12 KiB records (bigger than a buffer) go on their own."""
    asyncio.run(_pending_bytes(tmp_path))


async def _pending_bytes(tmp_path: Path) -> None:
    cfg = TESTING.with_(flush_mode=FlushMode.ASYNC_FLUSH, crash_model=CrashModel.POWER,
                        flush_interval_ms=3_600_000, flush_thorough_interval_ms=3_600_000,
                        flush_least_pages=1_000_000)
    store = MessageStore.open(str(tmp_path / "s"), cfg)
    await store.start()
    try:
        sent: list[tuple[int, bytes]] = []
        for round_ in range(6):
            batch = (_messages(7, 1024, f"r{round_}a") + _messages(2, 12 * 1024, f"r{round_}b")
                     + _messages(5, 3000, f"r{round_}c"))
            results = store.append(batch)
            assert all(r.status is PutStatus.PUT_OK for r in results)
            sent += [(r.offset, m.body) for r, m in zip(results, batch, strict=True)]
            # Before any flush: every pending record reads back intact.
            for offset, body in sent:
                assert store.log.read_record(offset).body == body
            if round_ % 2:
                await store.flush()
        await store.flush()
        for offset, body in sent:
            assert store.log.read_record(offset).body == body
        allocated = store.log._buffers.allocated
        for i in range(40):  # many append/flush cycles: buffers are reused
            store.append(_messages(20, 1024, f"x{i}-"))
            await store.flush()
        assert store.log._buffers.allocated <= allocated + cfg.write_buffers_kept + 2
    finally:
        await store.close()
    # What reached the files is what was appended.
    reopened = MessageStore.open(str(tmp_path / "s"), cfg)
    try:
        for offset, body in sent:
            data = reopened.log.read(offset, 64 * 1024)
            assert decode(data, 0, offset=offset).body == body
    finally:
        reopened.close_sync()


def test_zero_ahead_never_touches_a_record(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                          ) -> None:
    """SYNC_FLUSH under POWER keeps zeros written past the flushed end
    (CommitLog._zero_ahead). With a small step, every few flushes write zeros
    mid-segment; every record put must read back intact after a reopen, and
    the store must recover to exactly its end."""
    monkeypatch.setattr(commitlog, "ZERO_AHEAD_BYTES", 8 * 1024)
    cfg = TESTING.with_(segment_size_bytes=1024 * 1024, max_message_size_bytes=64 * 1024,
                        flush_mode=FlushMode.SYNC_FLUSH, crash_model=CrashModel.POWER)

    async def scenario() -> tuple[list[tuple[int, bytes]], int]:
        store = MessageStore.open(str(tmp_path / "z"), cfg)
        await store.start()
        sent: list[tuple[int, bytes]] = []
        try:
            for round_ in range(40):
                batch = [Message("z", os.urandom(100 + 997 * ((round_ + i) % 13)),
                                 {"UNIQ_KEY": f"z{round_}-{i}"}) for i in range(1 + round_ % 7)]
                results = await asyncio.gather(*(store.put(m) for m in batch))
                assert all(r.status is PutStatus.PUT_OK for r in results)
                sent += [(r.offset, m.body) for r, m in zip(results, batch, strict=True)]
            return sent, store.log.wrote
        finally:
            await store.close()

    sent, end = asyncio.run(scenario())
    assert end > 4 * 8 * 1024  # the zeros were written ahead many times
    reopened = MessageStore.open(str(tmp_path / "z"), cfg)
    try:
        assert reopened.log.wrote == end
        for offset, body in sent:
            assert reopened.log.read_record(offset).body == body
    finally:
        reopened.close_sync()


def test_zero_ahead_follows_small_writes_only(tmp_path: Path) -> None:
    """Zeros are written ahead after a small flush (a group commit's), not
    after a large one: a large write gains nothing from them, and they made
    a slave applying 1 MiB ranges write every byte twice."""
    cfg = TESTING.with_(segment_size_bytes=4 * 1024 * 1024, max_message_size_bytes=64 * 1024,
                        flush_mode=FlushMode.SYNC_FLUSH, crash_model=CrashModel.POWER)
    store = MessageStore.open(str(tmp_path / "z"), cfg)
    try:
        body = os.urandom(32 * 1024)
        store.append([Message("z", body, {"UNIQ_KEY": f"big{i}"}) for i in range(16)])
        end = store.log.flush()
        assert end > commitlog.ZERO_AHEAD_MAX_WRITE
        seg = store.log.segments[-1]
        assert seg.zeroed_to <= end - seg.start, "zeros were written after a large write"
        store.append([Message("z", b"small", {"UNIQ_KEY": "small"})])
        end = store.log.flush()
        assert seg.zeroed_to > end - seg.start, "no zeros written after a small write"
    finally:
        store.close_sync()
