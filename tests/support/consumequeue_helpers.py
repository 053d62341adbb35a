"""Consume-queue test helpers: stores filled through MessageStore, and the
check that every CommitLog record has exactly one consume-queue unit."""

from __future__ import annotations

import asyncio
from pathlib import Path

from store.config import TESTING, StoreConfig
from store.log.record import Message
from store.store import MessageStore

SMALL = TESTING.with_(consume_queue_file_units=8)


def put_all(path: Path, config: StoreConfig, messages: list[Message]) -> None:
    async def run() -> None:
        s = MessageStore.open(str(path), config)
        await s.start()
        for m in messages:
            r = await s.put(m)
            assert r.status.value == "PUT_OK", r
        await s.close()
    asyncio.run(run())


def msgs(n: int, *, queues: int = 2, prefix: str = "m", tags: str | None = None) -> list[Message]:
    props = {"TAGS": tags} if tags else {}
    return [Message("T", f"body-{i}".encode(), {"UNIQ_KEY": f"{prefix}{i}", **props},
                    queue_id=i % queues) for i in range(n)]


def check_index(store: MessageStore) -> int:
    """Every record of the CommitLog has exactly one unit, at its
    QUEUEOFFSET, and no unit points elsewhere. Returns the record count."""
    per_queue: dict[tuple[str, int], list[tuple[int, int, int]]] = {}
    n = 0
    for rec in store.log.iter_records():
        per_queue.setdefault((rec.topic, rec.queue_id), []).append(
            (rec.queue_offset, rec.offset, rec.size))
        n += 1
    store.reput()
    assert set(per_queue) <= set(store.queues.queues)
    for key, q in store.queues.queues.items():
        expect = per_queue.get(key, [])
        assert [qo for qo, _, _ in expect] == list(range(len(expect))), f"{key}: QUEUEOFFSETs"
        assert [(q.offsets[i], q.sizes[i]) for i in range(q.count)] == \
            [(o, s) for _, o, s in expect], f"{key}: units differ from the records"
    return n


def queue_file(tmp_path: Path, topic: str = "T", qid: int = 0) -> Path:
    return tmp_path / "consumequeue" / topic / str(qid) / f"{0:020d}"
