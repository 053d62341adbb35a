"""The edge of a master's put answer: runs the flush wait and the replica
wait in parallel and hands their outcomes to the pure decision
(ha/sync_master.py), which says what each put is answered.

A node gives its PutAnswer to the store's put path when the store is built
(MessageStore.open(answer=...), store/put_path.py); the put path calls it
once a batch is appended. Callbacks all the way, no task per batch: each
task cost the put a loop iteration (docs/performance-notes.md).
"""

from __future__ import annotations

import asyncio
from typing import Protocol

from ha.master import HAMaster
from ha.sync_master import (
    NO_REPLICA_WAIT,
    FlushOutcome,
    ReplicaOutcome,
    ReplicaPlan,
    SyncMasterRules,
    answer,
    answered_before_replica,
    plan_replica_wait,
)
from store.put_path import PutBatch
from store.status import PutResult, PutStatus
from store.store import MessageStore


class AnsweringNode(Protocol):
    """What the answer reads of its node when a batch is appended: the
    store and, on a master, its HA side (both set once the node started)."""

    store: MessageStore | None
    ha_master: HAMaster | None


class PutAnswer:
    """store/put_path.py's Answer for a node (see the module docstring)."""

    def __init__(self, node: AnsweringNode, rules: SyncMasterRules) -> None:
        self._node = node
        self._rules = rules

    def __call__(self, batch: PutBatch, results: list[PutResult]) -> None:
        """Wakes the HA shippers, then answers the batch's submitters as the
        mode promises (ha/sync_master.py). A submitter none of whose puts
        waits for a slave (refused SLAVE_NOT_AVAILABLE, or failed) is
        answered once the flush wait is over, without waiting for the
        others' replica wait."""
        store = self._node.store
        assert store is not None
        ha = self._node.ha_master
        if ha is not None:
            ha.notify_appended()
        ends = [r.end for r in results if r.status is PutStatus.PUT_OK]
        if not ends:
            batch.deliver(results)
            return
        replicas = ha if self._rules.sync_master else None
        plan = (plan_replica_wait(results, replicas.best_acked(), self._rules)
                if replicas is not None else NO_REPLICA_WAIT)
        # Resolved by the HA reader's callbacks: it progresses while the
        # flush is waited for (the two run in parallel).
        replica = (replicas.wait_replicated(plan.wait_end)
                   if replicas is not None and plan.wait_end is not None else None)

        def finish(flush_status: PutStatus, replica_status: PutStatus) -> None:
            try:
                batch.deliver(self._answer(results, plan, flush_status, replica_status))
            except Exception as exc:
                batch.fail(results, exc)

        def flushed(flush_status: PutStatus) -> None:
            try:
                if replica is None:
                    finish(flush_status, PutStatus.PUT_OK)
                elif replica.done():
                    finish(flush_status, replica.result())
                else:
                    batch.deliver(self._answer(results, plan, flush_status, PutStatus.PUT_OK),
                                  only=lambda mine: answered_before_replica(plan, mine))
                    replica.add_done_callback(lambda f: finish(flush_status, _replica_status(f)))
            except Exception as exc:
                batch.fail(results, exc)

        store.on_flushed(max(ends), flushed)

    def _answer(self, results: list[PutResult], plan: ReplicaPlan, flush_status: PutStatus,
                replica_status: PutStatus) -> list[PutResult]:
        """The outcomes as they stand now, decided by ha/sync_master.py."""
        store = self._node.store
        assert store is not None
        ha = self._node.ha_master if plan.waits else None
        flush = FlushOutcome(flush_status, store.log.flushed,
                             "" if flush_status is PutStatus.PUT_OK
                             else store.puts.explain(flush_status))
        replica = ReplicaOutcome(replica_status, ha.best_acked() if ha is not None else None)
        return answer(results, plan, flush, replica, self._rules)


def _replica_status(fut: asyncio.Future[PutStatus]) -> PutStatus:
    # Never cancelled today; if it were, no slave acknowledged.
    return PutStatus.FLUSH_SLAVE_TIMEOUT if fut.cancelled() else fut.result()
