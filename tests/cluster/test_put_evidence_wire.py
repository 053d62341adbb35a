"""A PUT_OK's evidence (store/status.py AnsweredPut) crosses the wire
whole (cluster/node/wire.py), and a result without it stays without."""

from __future__ import annotations

import pickle

from cluster.node.wire import evidence_from_pb, result_to_pb
from proto import broker_pb2
from store.status import AnsweredPut, Evidence, PutResult, PutStatus, Quorum, SlaveAck

EV = Evidence(wrote=500, flushed=400, acks=(SlaveAck("slave1", 450, 480),
                                           SlaveAck("slave2", 300, 300)), by="slave1")


def test_evidence_survives_the_wire() -> None:
    r = AnsweredPut(PutResult(PutStatus.PUT_OK, 300, 100, "m1", 7), EV)
    pb = broker_pb2.SendResult.FromString(result_to_pb(r).SerializeToString())
    assert evidence_from_pb(pb) == EV
    assert EV.as_json() == {"wrote": 500, "flushed": 400, "by": "slave1",
                            "acks": [{"slave": "slave1", "acked": 450, "shipped": 480},
                                     {"slave": "slave2", "acked": 300, "shipped": 300}]}


def test_a_controller_quorum_survives_the_wire_members_or_any_slave() -> None:
    """Controller mode's quorum (the acks the put waited for) crosses too:
    named members (all-ack), or any slave (in-sync-replicas), or none."""
    for quorum in (Quorum(2, ("slave1", "slave2")), Quorum(1, None), Quorum(0, ())):
        ev = EV._replace(quorum=quorum)
        r = AnsweredPut(PutResult(PutStatus.PUT_OK, 300, 100, "m1", 7), ev)
        pb = broker_pb2.SendResult.FromString(result_to_pb(r).SerializeToString())
        assert evidence_from_pb(pb) == ev
    assert EV._replace(quorum=Quorum(1, None)).as_json()["quorum"] == {
        "needed": 1, "members": None}
    assert "quorum" not in EV.as_json()


def test_a_result_without_evidence_sends_none() -> None:
    pb = result_to_pb(PutResult(PutStatus.FLUSH_DISK_TIMEOUT, 0, 100, "m1"))
    assert evidence_from_pb(pb) is None


def test_an_answered_put_is_a_put_result_and_derives_plain_ones() -> None:
    r = AnsweredPut(PutResult(PutStatus.PUT_OK, 300, 100, "m1", 7), EV)
    assert r.evidence == EV and r.end == 400 and r.status is PutStatus.PUT_OK
    assert pickle.loads(pickle.dumps(r)).evidence == EV
    derived = r._replace(status=PutStatus.UNKNOWN_ERROR)
    assert type(derived) is PutResult and derived.evidence is None
    assert "evidence=" in repr(r)
