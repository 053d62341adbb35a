"""The evidence checker's rules (chaos/check/evidence.py) on hand-made
history rows: each rule fires on the answer that breaks it and on nothing
else; a position going back is excused only by a fault between the two
answers."""

from __future__ import annotations

from typing import Any

from chaos.check import evidence

PARAMS = {"role": "SYNC_MASTER", "flush": "SYNC_FLUSH", "started_ms": 0,
          "nodes": [{"name": "master", "role": "SYNC_MASTER"},
                    {"name": "slave1", "role": "SLAVE"}]}


def _row(op: int, offset: int, *, flushed: int, wrote: int | None = None,
         acks: tuple[tuple[str, int, int], ...] = (), by: str = "",
         invoke: int | None = None, complete: int | None = None) -> dict[str, Any]:
    invoke = op * 10 if invoke is None else invoke
    return {"op_id": op, "msg_id": f"m{op}", "status": "PUT_OK", "offset": offset,
            "size": 100, "node": "master", "invoke_ms": invoke,
            "complete_ms": invoke + 5 if complete is None else complete,
            "evidence": {"wrote": offset + 100 if wrote is None else wrote,
                         "flushed": flushed, "by": by,
                         "acks": [{"slave": s, "acked": a, "shipped": sh}
                                  for s, a, sh in acks]}}


def _rules(rows: list[dict[str, Any]], faults: tuple[dict[str, Any], ...] = (),
           **params: str) -> list[tuple[str, int]]:
    return [(b.rule, b.op_id) for b in evidence.breaches({**PARAMS, **params}, rows, faults)]


def test_an_answer_its_evidence_covers_breaks_nothing() -> None:
    rows = [_row(0, 0, flushed=100, acks=(("slave1", 100, 100),), by="slave1"),
            _row(1, 100, flushed=200, acks=(("slave1", 200, 200),), by="slave1")]
    assert _rules(rows) == []


def test_a_sync_flush_put_ok_before_the_flush_covers_it_is_a_flush_breach() -> None:
    rows = [_row(0, 0, flushed=99)]
    assert _rules(rows, role="ASYNC_MASTER") == [("flush", 0)]
    # The same answer under ASYNC_FLUSH promised no flush.
    assert _rules(rows, role="ASYNC_MASTER", flush="ASYNC_FLUSH") == []


def test_a_sync_master_put_ok_needs_a_real_report_of_a_slave_of_the_run() -> None:
    covered = (("slave1", 100, 100),)
    assert _rules([_row(0, 0, flushed=100, acks=covered, by="")]) == [("replica", 0)]
    assert _rules([_row(0, 0, flushed=100, acks=(("slave1", 99, 99),), by="slave1")]) == [
        ("replica", 0)]
    # Credited to a stream that is no node of the run (a rogue HA peer).
    assert _rules([_row(0, 0, flushed=100, acks=(("rogue", 100, 100),), by="rogue")]) == [
        ("replica", 0)]
    # A report beyond what the master shipped that slave (apache/rocketmq#3015).
    assert _rules([_row(0, 0, flushed=100, acks=(("slave1", 150, 100),), by="slave1")]) == [
        ("replica", 0)]
    # ... or beyond what the master holds (a trusted slave ahead, #3349).
    assert _rules([_row(0, 0, flushed=100, wrote=100, acks=(("slave1", 500, 500),),
                        by="slave1")]) == [("replica", 0)]


def test_a_position_beyond_what_the_node_holds_is_a_held_breach() -> None:
    assert _rules([_row(0, 0, flushed=100, wrote=50, acks=(("slave1", 100, 100),),
                        by="slave1")], role="ASYNC_MASTER") == [("held", 0)]


def test_positions_going_back_need_a_fault_between_the_answers() -> None:
    a = _row(0, 0, flushed=300, wrote=300, invoke=0, complete=10)
    b = _row(1, 100, flushed=200, wrote=200, invoke=20, complete=30)
    rules = _rules([a, b], role="ASYNC_MASTER")
    assert ("backwards", 1) in rules and ("backwards", 0) not in rules
    kill = {"kind": "kill", "node": "master", "peer": None, "start_ms": 15}
    assert _rules([a, b], (kill,), role="ASYNC_MASTER") == []
    # A fault before the first answer was invoked excuses nothing.
    early = {**kill, "start_ms": -5}
    assert ("backwards", 1) in _rules([a, b], (early,), role="ASYNC_MASTER")
    # Answers that overlapped in time may arrive in either order.
    overlapping = _row(1, 100, flushed=200, wrote=200, invoke=5, complete=30)
    assert _rules([a, overlapping], role="ASYNC_MASTER") == []


def test_a_slaves_ack_going_back_is_excused_by_a_fault_on_that_slave() -> None:
    a = _row(0, 0, flushed=100, wrote=300, acks=(("slave1", 300, 300),), by="slave1",
             invoke=0, complete=10)
    b = _row(1, 0, flushed=100, wrote=300, acks=(("slave1", 200, 200),), by="slave1",
             invoke=20, complete=30)
    assert _rules([a, b]) == [("backwards", 1)]
    crash = {"kind": "kill", "node": "slave1", "peer": None, "start_ms": 12}
    assert _rules([a, b], (crash,)) == []


def test_rows_without_evidence_and_other_statuses_are_not_judged() -> None:
    old = {**_row(0, 0, flushed=0), "evidence": None}
    failed = {**_row(1, 100, flushed=0), "status": "FLUSH_DISK_TIMEOUT"}
    assert _rules([old, failed]) == []


def _quorum(row: dict[str, Any], needed: int, members: list[str] | None) -> dict[str, Any]:
    row["evidence"]["quorum"] = {"needed": needed, "members": members}
    return row


CONTROLLER = {"config": {"ha_mode": "controller"},
              "nodes": [{"name": "master", "role": "SYNC_MASTER"},
                        {"name": "slave1", "role": "SLAVE"}, {"name": "slave2", "role": "SLAVE"}]}


def test_a_controller_put_ok_needs_the_acks_of_the_quorum_it_recorded() -> None:
    """Controller mode: the answer names the quorum it waited for; that many
    acks of counted slaves must cover the message as real reports."""
    both = (("slave1", 100, 100), ("slave2", 100, 100))
    ok = _quorum(_row(0, 0, flushed=100, acks=both, by="slave1"), 2, ["slave1", "slave2"])
    assert _rules([ok], **CONTROLLER) == []
    # all-ack with two members: one ack short.
    short = _quorum(_row(0, 0, flushed=100, acks=(("slave1", 100, 100), ("slave2", 60, 100)),
                         by="slave1"), 2, ["slave1", "slave2"])
    assert _rules([short], **CONTROLLER) == [("replica", 0)]
    # An ack from a slave that is not a member does not count.
    outsider = _quorum(_row(0, 0, flushed=100, acks=both, by="slave2"), 1, ["slave1"])
    outsider["evidence"]["acks"][0]["acked"] = 40
    assert _rules([outsider], **CONTROLLER) == [("replica", 0)]
    # in-sync-replicas 2: any slave's covering report counts ...
    assert _rules([_quorum(_row(0, 0, flushed=100, acks=both, by="slave2"), 1, None)],
                  **CONTROLLER) == []
    # ... but not a report beyond what the master shipped it (#3015).
    beyond = _quorum(_row(0, 0, flushed=100, acks=(("slave1", 150, 100),), by="slave1"), 1,
                     None)
    assert _rules([beyond], **CONTROLLER) == [("replica", 0)]


def test_a_controller_quorum_of_none_promises_no_copy_and_is_not_judged() -> None:
    """in-sync-replicas 1, or a SyncStateSet of the master alone: no ack was
    waited for, so none is asked of the evidence (the promise checkers judge
    what such a put lost); classic SYNC_MASTER's rule does not apply."""
    alone = _quorum(_row(0, 0, flushed=100), 0, [])
    assert _rules([alone], **CONTROLLER) == []
    assert _rules([_row(0, 0, flushed=100)], **CONTROLLER) == []
