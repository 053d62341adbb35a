"""The one put path (store/put_path.py): a node's puts, MessageStore.put
and so the group-commit benchmark are coalesced, appended and answered by
the same layer; answers come from the loop, never from inside submit()."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from cluster.node.role import Role
from cluster.node.server import Node, NodeConfig
from ha.transport.memory import MemoryNetwork
from store.config import FlushMode, StoreConfig
from store.log.record import Message
from store.put_path import MAX_BATCH_MESSAGES, Answer, PutBatch, PutPath
from store.sim import loop as sim_loop
from store.sim.inline_executor import InlineFlushExecutor
from store.sim.loop import VirtualTimeLoop
from store.status import PutResult, PutStatus
from store.store import MessageStore

STORE = StoreConfig(segment_size_bytes=1 << 20, max_message_size_bytes=64 << 10,
                    flush_mode=FlushMode.SYNC_FLUSH)


def _msg(i: int) -> Message:
    return Message("t", b"x" * 100, {"UNIQ_KEY": f"m{i}"})


def _record_appends(store: MessageStore) -> list[int]:
    """Wrap the put path's append step: the sizes of the batches it appends."""
    sizes: list[int] = []
    append = store.puts._append

    def counting(messages: Sequence[Message]) -> list[PutResult]:
        sizes.append(len(messages))
        return append(messages)

    store.puts._append = counting
    return sizes


def test_a_nodes_puts_and_store_puts_take_the_same_path(tmp_path: Any) -> None:
    """40 puts sent to a master in one loop tick are appended by the store's
    put path in batches of at most MAX_BATCH_MESSAGES, exactly as 40
    store.put calls are; each put is answered after submit() returned."""

    async def main(loop: VirtualTimeLoop
                   ) -> tuple[list[int], list[int], list[PutResult], list[PutResult]]:
        node = Node(NodeConfig(name="m", role=Role.ASYNC_MASTER, listen="10.0.0.1:7001",
                               data_dir=str(tmp_path / "node"), token="t", store=STORE),
                    clock=loop.clock(), executor=InlineFlushExecutor(),
                    network=MemoryNetwork(loop))
        await node.start()
        assert node.store is not None
        node_sizes = _record_appends(node.store)
        answered_inside: list[int] = []
        futs: list[asyncio.Future[list[PutResult]]] = []
        for i in range(40):
            fut: asyncio.Future[list[PutResult]] = loop.create_future()
            node.submit([_msg(i)], fut.set_result)
            if fut.done():
                answered_inside.append(i)
            futs.append(fut)
        node_results = [r for f in futs for r in await f]
        assert answered_inside == [], "answered from inside submit()"
        await node.stop()

        store = MessageStore.open(str(tmp_path / "store"), STORE,
                                  executor=InlineFlushExecutor())
        await store.start()
        store_sizes = _record_appends(store)
        store_results = await asyncio.gather(*(store.put(_msg(i)) for i in range(40)))
        await store.close()
        return node_sizes, store_sizes, node_results, list(store_results)

    node_sizes, store_sizes, node_results, store_results = sim_loop.run(main)
    assert node_sizes == store_sizes == [MAX_BATCH_MESSAGES, 40 - MAX_BATCH_MESSAGES]
    for results in (node_results, store_results):
        assert [r.status for r in results] == [PutStatus.PUT_OK] * 40
        assert [r.msg_id for r in results] == [f"m{i}" for i in range(40)]
        ends = [r.end for r in results]
        assert [r.offset for r in results[1:]] == ends[:-1], "contiguous, in order"


class _Log:
    """What the put path reads of a CommitLog: how far it is flushed, and
    why it failed."""

    def __init__(self) -> None:
        self.flushed = 0
        self.failed: str | None = None


def _path(log: _Log, flush_status: PutStatus, size: int = 100,
          answer: Answer | None = None) -> tuple[PutPath, list[int]]:
    appended: list[int] = []

    def append(messages: Sequence[Message]) -> list[PutResult]:
        out = []
        for m in messages:
            offset = len(appended) * size
            appended.append(1)
            out.append(PutResult(PutStatus.PUT_OK, offset, size, m.msg_id))
        return out

    def on_flushed(end: int, done: Any) -> None:
        done(flush_status)

    config = StoreConfig(sync_flush_timeout_ms=250)
    return (PutPath(log, config, append, on_flushed, answer=answer),  # type: ignore[arg-type]
            appended)


def test_a_full_batch_is_appended_at_once_but_answered_from_the_loop() -> None:
    async def main() -> tuple[int, bool, list[PutResult]]:
        path, appended = _path(_Log(), PutStatus.PUT_OK)
        got: list[list[PutResult]] = []
        path.submit([_msg(i) for i in range(MAX_BATCH_MESSAGES)], got.append)
        appended_at_once, answered_inside = len(appended), bool(got)
        await asyncio.sleep(0)
        return appended_at_once, answered_inside, got[0]

    appended_at_once, answered_inside, results = asyncio.run(main())
    assert appended_at_once == MAX_BATCH_MESSAGES
    assert not answered_inside
    assert [r.status for r in results] == [PutStatus.PUT_OK] * MAX_BATCH_MESSAGES


def test_a_put_whose_own_end_was_flushed_is_ok_when_its_batch_timed_out() -> None:
    async def main() -> list[PutResult]:
        log = _Log()
        log.flushed = 100  # the first put's end
        path, _ = _path(log, PutStatus.FLUSH_DISK_TIMEOUT)
        fut: asyncio.Future[list[PutResult]] = asyncio.get_running_loop().create_future()
        path.submit([_msg(0), _msg(1)], fut.set_result)
        return await fut

    first, second = asyncio.run(main())
    assert first.status is PutStatus.PUT_OK
    assert second.status is PutStatus.FLUSH_DISK_TIMEOUT
    assert second.detail == "appended, but not flushed within 250 ms"


def test_a_bug_in_the_answer_answers_every_put_unknown_error() -> None:
    async def main() -> tuple[list[PutResult], int]:
        def broken(batch: Any, results: list[PutResult]) -> None:
            raise RuntimeError("a bug")

        path, _ = _path(_Log(), PutStatus.PUT_OK, answer=broken)
        fut: asyncio.Future[list[PutResult]] = asyncio.get_running_loop().create_future()
        path.submit([_msg(0), _msg(1)], fut.set_result)
        results = await fut
        return results, len(path.unanswered)

    results, unanswered = asyncio.run(main())
    assert [(r.status, r.detail) for r in results] == [(PutStatus.UNKNOWN_ERROR, "a bug")] * 2
    assert unanswered == 0


def test_the_answer_given_when_the_store_opens_answers_its_puts(tmp_path: Any) -> None:
    """A node's answer is given to the put path when the store is built
    (MessageStore.open(answer=...)), not swapped in afterwards: every batch
    the store appends is answered by it, with the batch's results."""
    answered: list[list[str]] = []

    def tagging(batch: PutBatch, results: list[PutResult]) -> None:
        answered.append([r.msg_id or "" for r in results])
        batch.deliver([r._replace(detail="answered by the node") for r in results])

    async def main() -> list[PutResult]:
        store = MessageStore.open(str(tmp_path / "store"), STORE,
                                  executor=InlineFlushExecutor(), answer=tagging)
        await store.start()
        try:
            return list(await asyncio.gather(*(store.put(_msg(i)) for i in range(3))))
        finally:
            await store.close()

    results = sim_loop.run(lambda loop: main())
    assert answered == [["m0", "m1", "m2"]]  # one batch: the puts of one loop tick
    assert [(r.status, r.detail) for r in results] == [
        (PutStatus.PUT_OK, "answered by the node")] * 3
