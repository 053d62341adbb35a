"""The answer a master gives a put after its flush and replica waits: a
pure function of data (no store, no stream, no clock), so every
combination of outcomes is unit-tested (tests/ha/test_sync_master_answer.py).
The waits themselves run at the edge (cluster/node/put_answer.py).

The rules (the design brief, DESIGN.md: "SYNC_MASTER put", "Flush",
"Statuses"; docs/design.md "Replication"; RocketMQ 4.x's
CommitLog.handleHA and HAService.isSlaveOK):

1. At append, for each stored put, once: on a SYNC_MASTER a put waits for a
   slave only if one is connected and the best acked offset is less than
   `ha_max_gap_not_in_sync` behind the put's end (`slave_ok`); otherwise it
   is SLAVE_NOT_AVAILABLE at once. An ASYNC_MASTER never waits for a slave.
   A controller-mode master whose quorum waits (ha/autoswitch/acks.py)
   admits every stored put: its quorum's ack, else FLUSH_SLAVE_TIMEOUT.
2. The flush wait and the replica wait run in parallel; a batch waits for
   its last put's end (`ReplicaPlan.wait_end`, the flush wait's end).
3. When the waits are over, each put gets the worse of its two outcomes
   (store/status.py SEVERITY):
   - flush: PUT_OK, FLUSH_DISK_TIMEOUT (SYNC_FLUSH not covered within
     sync_flush_timeout) or the flush failure's status; a put whose own end
     was flushed when the wait ended is PUT_OK even if the batch's end was
     not (store/put_path.py flush_status);
   - replica: PUT_OK when the replica wait succeeded, or when the best
     acked offset covers the put's own end when the answer is made; else
     the wait's status (FLUSH_SLAVE_TIMEOUT after slave_timeout).
4. A put that was not stored keeps its own status; PUT_OK keeps its detail.

Ordering: a submitter none of whose stored puts waits for a slave may be
answered once the flush wait is over (`answered_before_replica`); every
other submitter only once both waits are.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from ha.config import HAConfig
from store.emulate import PLANTED_STALE_ACK
from store.put_path import flush_status as put_flush_status
from store.status import PutResult, PutStatus, worse


@dataclass(frozen=True, kw_only=True)
class SyncMasterRules:
    """What the answer depends on in a node's configuration."""

    sync_master: bool  # the role is SYNC_MASTER (ASYNC_MASTER: never waits for a slave)
    max_gap_not_in_sync_bytes: int
    slave_timeout_ms: int
    # --emulate planted-stale-ack (store/emulate.py): wait for the puts' start.
    planted_stale_ack: bool = False
    # Controller mode (ha/autoswitch/acks.py): every stored put waits for its
    # quorum of acks (no SLAVE_NOT_AVAILABLE: the SyncStateSet, not the
    # gap, says who is in sync); `sync_master` is whether the quorum waits.
    controller: bool = False

    @classmethod
    def of(cls, ha: HAConfig, *, sync_master: bool) -> SyncMasterRules:
        return cls(sync_master=sync_master,
                   max_gap_not_in_sync_bytes=ha.max_gap_not_in_sync_bytes,
                   slave_timeout_ms=ha.slave_timeout_ms,
                   planted_stale_ack=PLANTED_STALE_ACK in ha.emulate)


def slave_ok(end: int, best_acked: int | None, max_gap_not_in_sync_bytes: int) -> bool:
    """RocketMQ's HAService.isSlaveOK: a slave is connected (`best_acked`
    is not None) and the best one is less than the gap behind `end`."""
    return best_acked is not None and end - best_acked < max_gap_not_in_sync_bytes


class ReplicaPlan(NamedTuple):
    """Decided at append (rule 1): which stored puts wait for a slave."""

    waits: bool  # the mode waits for a slave at all
    admitted: frozenset[int]  # offsets of the stored puts that wait for one
    wait_end: int | None  # the end the one replica wait covers (None: no wait)


NO_REPLICA_WAIT = ReplicaPlan(waits=False, admitted=frozenset(), wait_end=None)


def plan_replica_wait(results: Sequence[PutResult], best_acked: int | None,
                      rules: SyncMasterRules) -> ReplicaPlan:
    """Rule 1 for a batch's `results` (as appended) and the best acked
    offset at append (None: no slave connected)."""
    if not rules.sync_master:
        return NO_REPLICA_WAIT
    admitted = [r for r in results if r.status is PutStatus.PUT_OK
                and (rules.controller
                     or slave_ok(r.end, best_acked, rules.max_gap_not_in_sync_bytes))]
    if rules.planted_stale_ack and admitted:
        # PLANTED FAULT (--emulate planted-stale-ack), not RocketMQ's: the
        # wait is for an ack covering the first put's start, the log's end
        # before the batch, which a slave may have acked before the batch
        # was even shipped (rule 2 and RocketMQ's GroupTransferService wait
        # for the end: `req.getNextOffset()`).
        return ReplicaPlan(waits=True, admitted=frozenset(r.offset for r in admitted),
                           wait_end=min(r.offset for r in admitted))
    return ReplicaPlan(waits=True, admitted=frozenset(r.offset for r in admitted),
                       wait_end=max(r.end for r in admitted) if admitted else None)


def answered_before_replica(plan: ReplicaPlan, mine: Sequence[PutResult]) -> bool:
    """A submitter's slice that need not wait for the replica wait: none of
    its stored puts waits for a slave."""
    return not any(r.offset in plan.admitted for r in mine if r.status is PutStatus.PUT_OK)


class FlushOutcome(NamedTuple):
    """How the flush wait ended."""

    status: PutStatus  # PUT_OK, FLUSH_DISK_TIMEOUT, or the flush failure's status
    flushed: int  # the store's flushed offset when the answer is made
    detail: str = ""  # what a put that gets `status` is told (not PUT_OK)


class ReplicaOutcome(NamedTuple):
    """How the replica wait ended (PUT_OK when there was none)."""

    status: PutStatus  # PUT_OK or FLUSH_SLAVE_TIMEOUT
    best_acked: int | None  # the best acked offset when the answer is made


def answer(results: Sequence[PutResult], plan: ReplicaPlan, flush: FlushOutcome,
           replica: ReplicaOutcome, rules: SyncMasterRules) -> list[PutResult]:
    """Rules 3 and 4: each put's status, and what it is told, in order."""
    out: list[PutResult] = []
    for r in results:
        if r.status is not PutStatus.PUT_OK:
            out.append(r)
            continue
        status = worse(put_flush_status(r, flush.status, flush.flushed),
                       replica_status(r, plan, replica))
        if status is PutStatus.PUT_OK:
            out.append(r)
        else:
            out.append(r._replace(status=status, detail=explain(status, r, replica.best_acked,
                                                                flush, rules)))
    return out


def replica_status(r: PutResult, plan: ReplicaPlan, replica: ReplicaOutcome) -> PutStatus:
    """The replica side of one stored put (rule 3)."""
    if not plan.waits:
        return PutStatus.PUT_OK
    if r.offset not in plan.admitted:
        return PutStatus.SLAVE_NOT_AVAILABLE
    best = replica.best_acked
    if replica.status is not PutStatus.PUT_OK and not (best is not None and best >= r.end):
        return replica.status
    return PutStatus.PUT_OK


def explain(status: PutStatus, r: PutResult, best_acked: int | None, flush: FlushOutcome,
            rules: SyncMasterRules) -> str:
    """What a stored put that is answered `status` is told: where it is and
    which promise was not met."""
    if status is PutStatus.SLAVE_NOT_AVAILABLE:
        if best_acked is None:
            return "stored on the master; no slave is connected"
        return (f"stored on the master; the best slave is {r.end - best_acked} bytes behind "
                f"(ha_max_gap_not_in_sync {rules.max_gap_not_in_sync_bytes})")
    if status is PutStatus.FLUSH_SLAVE_TIMEOUT:
        return (f"stored on the master; no slave acknowledged it within "
                f"{rules.slave_timeout_ms} ms")
    return flush.detail or status.value
