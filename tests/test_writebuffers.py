"""The reused write buffers (store/writebuffers.py) under the CommitLog.

What must hold: a buffer holding any unflushed chunk is never written again
(so pending bytes read back, and later flushed, are the bytes appended), and
flushed buffers are reused (so memory stays bounded over many flushes)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from store.config import TESTING, CrashModel, FlushMode
from store.record import Message, decode
from store.status import PutStatus
from store.store import MessageStore
from store.writebuffers import WriteBuffers


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
