"""The answer a master gives a put after its flush and replica waits
(ha/sync_master.py), as a pure function: every flush outcome x replica
outcome x role, each case citing the rule of the design brief (DESIGN.md:
"SYNC_MASTER put", "Flush", "Statuses") it checks.

The batch is two stored puts, p1 = [1000, 1100) and p2 = [1100, 1200): the
waits cover the batch's last end (1200), and the table is about p1, so a
wait that ended short of the batch's end can still cover p1's own end."""

from __future__ import annotations

import pytest

from ha.config import HAConfig
from ha.sync_master import (
    NO_REPLICA_WAIT,
    FlushOutcome,
    ReplicaOutcome,
    SyncMasterRules,
    answer,
    answered_before_replica,
    plan_replica_wait,
    slave_ok,
)
from store.status import PutResult, PutStatus

GAP = 4096
SLAVE_TIMEOUT_MS = 3000
FLUSH_TIMEOUT_DETAIL = "appended, but not flushed within 5000 ms"
FLUSH_FAILED_DETAIL = "flush failed: Input/output error"
P1 = PutResult(PutStatus.PUT_OK, offset=1000, size=100, msg_id="p1")
P2 = PutResult(PutStatus.PUT_OK, offset=1100, size=100, msg_id="p2")
BATCH = [P1, P2]

OK = PutStatus.PUT_OK
FDT = PutStatus.FLUSH_DISK_TIMEOUT
FST = PutStatus.FLUSH_SLAVE_TIMEOUT
SNA = PutStatus.SLAVE_NOT_AVAILABLE
SVC = PutStatus.SERVICE_NOT_AVAILABLE


def _rules(*, sync_master: bool) -> SyncMasterRules:
    return SyncMasterRules(sync_master=sync_master, max_gap_not_in_sync_bytes=GAP,
                           slave_timeout_ms=SLAVE_TIMEOUT_MS)


# How the flush wait for the batch's end (1200) ended.
FLUSH = {
    # "SYNC_FLUSH: a put waits until `flushed` covers it" (or ASYNC_FLUSH,
    # which waits for nothing).
    "flushed": FlushOutcome(OK, flushed=1200),
    # "... or `sync_flush_timeout` (5 s) passes -> FLUSH_DISK_TIMEOUT".
    "flush timed out": FlushOutcome(FDT, flushed=1000, detail=FLUSH_TIMEOUT_DETAIL),
    # Group commit: a put whose own end was flushed when the wait ended
    # was flushed, whatever the batch's end (store/put_path.py flush_status).
    "flush timed out, p1 flushed": FlushOutcome(FDT, flushed=1100,
                                                detail=FLUSH_TIMEOUT_DETAIL),
    # A failed flush: the store stops taking puts (SERVICE_NOT_AVAILABLE).
    "flush failed": FlushOutcome(SVC, flushed=1000, detail=FLUSH_FAILED_DETAIL),
}

# (best acked offset at append, the replica wait's status, best acked when
# the answer is made).
REPLICA = {
    # "if no slave is connected ... -> SLAVE_NOT_AVAILABLE at once".
    "no slave": (None, OK, None),
    # "or the best slave is more than ha_max_gap_not_in_sync behind ->
    # SLAVE_NOT_AVAILABLE at once".
    "slave beyond the gap": (1100 - GAP, OK, 1100 - GAP),
    # "else wait until some slave's acked offset covers the message".
    "slave acked": (1000, OK, 1200),
    # "up to slave_timeout (3 s) -> FLUSH_SLAVE_TIMEOUT".
    "slave timed out": (1000, FST, 1050),
    # The wait for the batch's end timed out, but an acked offset covers
    # p1's own end: p1 is on a slave, as the rule asks.
    "slave timed out, p1 acked": (1000, FST, 1100),
}

# p1's status on a SYNC_MASTER, by flush outcome (rows) and replica outcome
# (columns, in REPLICA's order). "Flush waiting and replica waiting run in
# parallel": the worse outcome wins (SERVICE_NOT_AVAILABLE > FLUSH_DISK_TIMEOUT
# > SLAVE_NOT_AVAILABLE > FLUSH_SLAVE_TIMEOUT > PUT_OK, store/status.py).
SYNC_MASTER_TABLE = {
    "flushed": (SNA, SNA, OK, FST, OK),
    "flush timed out": (FDT, FDT, FDT, FDT, FDT),
    "flush timed out, p1 flushed": (SNA, SNA, OK, FST, OK),
    "flush failed": (SVC, SVC, SVC, SVC, SVC),
}
# "ASYNC_MASTER never waits for a slave": only the flush outcome counts.
ASYNC_MASTER_TABLE = {
    "flushed": OK,
    "flush timed out": FDT,
    "flush timed out, p1 flushed": OK,
    "flush failed": SVC,
}

DETAILS = {
    OK: "",
    FDT: FLUSH_TIMEOUT_DETAIL,
    SVC: FLUSH_FAILED_DETAIL,
    FST: f"stored on the master; no slave acknowledged it within {SLAVE_TIMEOUT_MS} ms",
}


def _answer_p1(flush_case: str, replica_case: str, *, sync_master: bool) -> PutResult:
    best_at_append, replica_status, best_at_answer = REPLICA[replica_case]
    rules = _rules(sync_master=sync_master)
    plan = plan_replica_wait(BATCH, best_at_append, rules)
    if plan.wait_end is None:
        replica_status = OK  # no replica wait ran (the edge passes PUT_OK)
    out = answer(BATCH, plan, FLUSH[flush_case], ReplicaOutcome(replica_status, best_at_answer),
                 rules)
    assert [r.msg_id for r in out] == ["p1", "p2"]
    assert all((r.offset, r.size) == (p.offset, p.size) for r, p in zip(out, BATCH, strict=True))
    return out[0]


@pytest.mark.parametrize("flush_case", list(FLUSH))
@pytest.mark.parametrize("replica_case", list(REPLICA))
@pytest.mark.parametrize("sync_master", [True, False], ids=["SYNC_MASTER", "ASYNC_MASTER"])
def test_every_flush_outcome_by_replica_outcome_by_role(flush_case: str, replica_case: str,
                                                        sync_master: bool) -> None:
    p1 = _answer_p1(flush_case, replica_case, sync_master=sync_master)
    if sync_master:
        want = SYNC_MASTER_TABLE[flush_case][list(REPLICA).index(replica_case)]
    else:
        want = ASYNC_MASTER_TABLE[flush_case]
    assert p1.status is want
    if want is SNA:
        # "Statuses": stored on the master, not guaranteed; says why.
        assert p1.detail == ("stored on the master; no slave is connected"
                             if replica_case == "no slave" else
                             f"stored on the master; the best slave is {GAP} bytes behind "
                             f"(ha_max_gap_not_in_sync {GAP})")
    else:
        assert p1.detail == DETAILS[want]


def test_the_batch_end_decides_the_wait_but_each_put_its_own_status() -> None:
    """Group commit and the replica wait cover the batch's last end; a put
    already flushed and acked is PUT_OK while the one after it timed out
    (DESIGN.md "Flush": group commit; "SYNC_MASTER put")."""
    rules = _rules(sync_master=True)
    plan = plan_replica_wait(BATCH, 1000, rules)
    assert plan.wait_end == 1200
    p1, p2 = answer(BATCH, plan, FlushOutcome(FDT, flushed=1100, detail=FLUSH_TIMEOUT_DETAIL),
                    ReplicaOutcome(FST, best_acked=1100), rules)
    assert (p1.status, p2.status) == (OK, FDT)
    p1, p2 = answer(BATCH, plan, FlushOutcome(OK, flushed=1200),
                    ReplicaOutcome(FST, best_acked=1100), rules)
    assert (p1.status, p2.status) == (OK, FST)


def test_the_gap_is_measured_from_each_puts_end_at_append() -> None:
    """RocketMQ's HAService.isSlaveOK: less than ha_max_gap_not_in_sync
    behind is in sync; exactly the gap behind is not ("SYNC_MASTER put")."""
    assert slave_ok(1100, 1100 - GAP + 1, GAP)
    assert not slave_ok(1100, 1100 - GAP, GAP)
    assert not slave_ok(1100, None, GAP)
    rules = _rules(sync_master=True)
    # p1 is within the gap, p2 is not: only p1 waits, and the wait covers p1.
    plan = plan_replica_wait(BATCH, 1200 - GAP, rules)
    assert plan.admitted == frozenset({1000}) and plan.wait_end == 1100
    p1, p2 = answer(BATCH, plan, FlushOutcome(OK, flushed=1200),
                    ReplicaOutcome(OK, best_acked=1200 - GAP), rules)
    assert (p1.status, p2.status) == (OK, SNA)
    assert p2.detail.endswith(f"{GAP} bytes behind (ha_max_gap_not_in_sync {GAP})")


def test_a_slave_gone_during_the_wait_times_out() -> None:
    """Admitted at append, but no slave is connected when the wait timed
    out: FLUSH_SLAVE_TIMEOUT (waited, and no slave acknowledged it), not
    SLAVE_NOT_AVAILABLE (that is decided at once, at append)."""
    rules = _rules(sync_master=True)
    plan = plan_replica_wait(BATCH, 1000, rules)
    out = answer(BATCH, plan, FlushOutcome(OK, flushed=1200),
                 ReplicaOutcome(FST, best_acked=None), rules)
    assert [r.status for r in out] == [FST, FST]


@pytest.mark.parametrize("sync_master", [True, False], ids=["SYNC_MASTER", "ASYNC_MASTER"])
@pytest.mark.parametrize("status", [PutStatus.MESSAGE_ILLEGAL, PutStatus.SERVICE_NOT_AVAILABLE,
                                    PutStatus.UNKNOWN_ERROR])
def test_a_put_that_was_not_stored_keeps_its_status(sync_master: bool,
                                                    status: PutStatus) -> None:
    """"Statuses": MESSAGE_ILLEGAL, SERVICE_NOT_AVAILABLE, UNKNOWN_ERROR are
    not stored; no wait changes what such a put was told."""
    refused = PutResult(status, msg_id="bad", detail="why it was refused")
    rules = _rules(sync_master=sync_master)
    results = [P1, refused]
    plan = plan_replica_wait(results, None, rules)
    assert 0 not in plan.admitted and plan.wait_end is None
    for flush in FLUSH.values():
        out = answer(results, plan, flush, ReplicaOutcome(OK, None), rules)
        assert out[1] is refused


def test_only_a_submitter_with_no_put_waiting_for_a_slave_is_answered_before_the_replica_wait(
        ) -> None:
    """"Flush waiting and replica waiting run in parallel": a submitter none
    of whose stored puts waits for a slave need not wait for the others'."""
    rules = _rules(sync_master=True)
    plan = plan_replica_wait(BATCH, 1200 - GAP, rules)  # p1 waits, p2 does not
    assert not answered_before_replica(plan, [P1])
    assert answered_before_replica(plan, [P2])
    assert answered_before_replica(plan, [PutResult(PutStatus.MESSAGE_ILLEGAL, offset=1000)])
    assert not answered_before_replica(plan, [P1, P2])
    assert not answered_before_replica(plan, [P2, P1])  # any of its puts, not only the first


def test_an_async_master_plans_no_replica_wait() -> None:
    """"ASYNC_MASTER never waits for a slave", whatever its slaves do."""
    for best in (None, 0, 1000, 1200):
        assert plan_replica_wait(BATCH, best, _rules(sync_master=False)) == NO_REPLICA_WAIT


def test_rules_come_from_the_ha_config() -> None:
    ha = HAConfig(max_gap_not_in_sync_bytes=123, slave_timeout_ms=456)
    assert SyncMasterRules.of(ha, sync_master=True) == SyncMasterRules(
        sync_master=True, max_gap_not_in_sync_bytes=123, slave_timeout_ms=456)
