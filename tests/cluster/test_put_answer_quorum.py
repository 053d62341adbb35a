"""A controller-mode PUT_OK's evidence names the quorum the put waited for
(cluster/node/put_answer.py): the one its batch was planned with, or the
one in force when its replica wait was satisfied, not the one in force
when its flush happens to end.

Found on a local isolated-master run (SYNC_FLUSH, 2026-11-27): a newly
elected master, its SyncStateSet itself alone, answered puts that waited
for no slave; by the time their fsync ended, the other slave had caught
up and joined the set, and their evidence said they had waited for its
ack, which the evidence checker took for a broken replica promise. A real
store (SYNC_FLUSH) and a real HAMaster with no stream; the set grows right
after the batch is planned, before its flush can end."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, replace
from pathlib import Path

from cluster.node.put_answer import PutAnswer
from ha.autoswitch.acks import AckQuorum
from ha.config import HAConfig
from ha.master import HAMaster
from ha.sync_master import SyncMasterRules
from store.config import FlushMode, StoreConfig
from store.failpoints import Failpoints
from store.log.record import UNIQ_KEY, Message
from store.put_path import PutBatch
from store.sim import loop as sim_loop
from store.sim.inline_executor import InlineFlushExecutor
from store.sim.loop import VirtualTimeLoop
from store.status import AnsweredPut, PutResult, PutStatus, Quorum
from store.store import MessageStore

STORE = StoreConfig(segment_size_bytes=1 << 20, max_message_size_bytes=64 << 10,
                    flush_mode=FlushMode.SYNC_FLUSH)


@dataclass
class _Node:
    """What PutAnswer reads of its node (AnsweringNode)."""

    store: MessageStore | None = None
    ha_master: HAMaster | None = None


def test_a_put_planned_to_wait_for_no_slave_keeps_that_quorum_as_the_set_grows(
        tmp_path: Path) -> None:
    node = _Node()
    # The set of the master alone: the quorum waits for no one.
    answer = PutAnswer(node, replace(SyncMasterRules.of(HAConfig(), sync_master=False),
                                     controller=True))

    def planned_then_the_set_grows(batch: PutBatch, results: list[PutResult]) -> None:
        answer(batch, results)
        assert node.ha_master is not None
        node.ha_master.set_quorum(AckQuorum(1, frozenset({"slave1"})))

    async def main(loop: VirtualTimeLoop) -> PutResult:
        store = MessageStore.open(str(tmp_path / "store"), STORE,
                                  executor=InlineFlushExecutor(),
                                  answer=planned_then_the_set_grows)
        await store.start()
        node.store = store
        node.ha_master = HAMaster(store, HAConfig(), clock=loop.clock(),
                                  failpoints=Failpoints(""))
        node.ha_master.set_quorum(AckQuorum(0, frozenset()))
        try:
            put = store.put(Message("t", b"x" * 100, {UNIQ_KEY: "m0"}))
            return await asyncio.wait_for(put, 10)
        finally:
            await store.close()

    result = sim_loop.run(main)
    assert result.status is PutStatus.PUT_OK
    assert isinstance(result, AnsweredPut)
    assert result.evidence.quorum == Quorum(0, ())
