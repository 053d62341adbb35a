"""The edge of a master's put answer: runs the flush wait and the replica
wait in parallel and hands their outcomes to the pure decision
(ha/sync_master.py), which says what each put is answered; each PUT_OK
carries the positions it was answered on (ha/evidence.py).

A node gives its PutAnswer to the store's put path when the store is built
(MessageStore.open(answer=...), store/put_path.py); the put path calls it
once a batch is appended. Callbacks all the way, no task per batch: each
task cost the put a loop iteration (docs/performance-notes.md).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Protocol

from ha.evidence import with_evidence
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
from store.config import FlushMode
from store.emulate import PLANTED_ACK_BEFORE_FLUSH
from store.put_path import PutBatch
from store.status import PutResult, PutStatus, Quorum, SlaveAck
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

    @property
    def rules(self) -> SyncMasterRules:
        return self._rules

    def set_rules(self, rules: SyncMasterRules) -> None:
        """From the next batch on (controller mode: a role or SyncStateSet
        change); a batch already appended is answered by the rules it was
        planned with."""
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
        rules = self._rules
        replicas = ha if rules.sync_master else None
        plan = (plan_replica_wait(results, replicas.best_acked(), rules)
                if replicas is not None else NO_REPLICA_WAIT)
        # Controller mode: the quorum the batch was planned with. A put that
        # waits for no slave is answered after its flush, by when the
        # SyncStateSet (so the quorum) may have grown: its evidence says
        # what it waited for, not what a later put would.
        planned = _quorum(ha)
        # The slaves' acks and the quorum when the replica wait was
        # satisfied: what its answer relied on (the slave may be gone, the
        # set changed, by the time the flush is), taken by the HA side at
        # that very moment.
        seen: list[tuple[list[SlaveAck], Quorum | None]] = []
        # Resolved by the HA reader's callbacks: it progresses while the
        # flush is waited for (the two run in parallel).
        replica = (replicas.wait_replicated(
                       plan.wait_end, lambda acks: seen.append((acks, _quorum(replicas))))
                   if replicas is not None and plan.wait_end is not None else None)

        def finish(flush_status: PutStatus, replica_status: PutStatus) -> None:
            try:
                batch.deliver(self._answer(results, plan, flush_status, replica_status, rules,
                                           planned, seen[0] if seen else None))
            except Exception as exc:
                batch.fail(results, exc)

        def flushed(flush_status: PutStatus) -> None:
            try:
                if replica is None:
                    finish(flush_status, PutStatus.PUT_OK)
                elif replica.done():
                    finish(flush_status, replica.result())
                else:
                    batch.deliver(self._answer(results, plan, flush_status, PutStatus.PUT_OK,
                                               rules, planned),
                                  only=lambda mine: answered_before_replica(plan, mine))
                    replica.add_done_callback(lambda f: finish(flush_status, _replica_status(f)))
            except Exception as exc:
                batch.fail(results, exc)

        _flush_wait(store, max(ends), flushed)

    def _answer(self, results: list[PutResult], plan: ReplicaPlan, flush_status: PutStatus,
                replica_status: PutStatus, rules: SyncMasterRules, planned: Quorum | None,
                seen: tuple[list[SlaveAck], Quorum | None] | None = None) -> list[PutResult]:
        """The outcomes as they stand now, decided by ha/sync_master.py,
        each PUT_OK with its evidence: the positions now, and the slaves'
        acks and quorum when the replica wait succeeded (`seen`), else the
        acks now and the quorum the batch was `planned` with."""
        store = self._node.store
        assert store is not None
        ha = self._node.ha_master if plan.waits else None
        flush = FlushOutcome(flush_status, store.log.flushed,
                             "" if flush_status is PutStatus.PUT_OK
                             else store.puts.explain(flush_status))
        replica = ReplicaOutcome(replica_status, ha.best_acked() if ha is not None else None)
        # What the answer relied on, read when it is made (ha/evidence.py).
        relied = seen if seen is not None and replica_status is PutStatus.PUT_OK else None
        acks = None if ha is None else relied[0] if relied is not None else ha.acks()
        return with_evidence(answer(results, plan, flush, replica, rules),
                             wrote=store.log.wrote, flushed=flush.flushed, acks=acks,
                             quorum=relied[1] if relied is not None else planned)


def _quorum(ha: HAMaster | None) -> Quorum | None:
    """Controller mode: the acks a put waits for, as the evidence records
    them (None in classic mode, where a master has no quorum)."""
    q = None if ha is None else ha.quorum
    if q is None:
        return None
    return Quorum(q.needed, None if q.members is None else tuple(sorted(q.members)))


def _flush_wait(store: MessageStore, end: int, done: Callable[[PutStatus], None]) -> None:
    """`done` once the flush covers `end` (MessageStore.on_flushed)."""
    if (PLANTED_ACK_BEFORE_FLUSH in store.config.emulate
            and store.config.flush_mode is FlushMode.SYNC_FLUSH):
        # PLANTED FAULT (--emulate planted-ack-before-flush, store/emulate.py):
        # the flush wait is skipped, so SYNC_FLUSH puts are answered PUT_OK
        # before the flush covers them. The fixed code waits (the line below).
        done(PutStatus.PUT_OK)
        return
    store.on_flushed(end, done)


def _replica_status(fut: asyncio.Future[PutStatus]) -> PutStatus:
    # Never cancelled today; if it were, no slave acknowledged.
    return PutStatus.FLUSH_SLAVE_TIMEOUT if fut.cancelled() else fut.result()
